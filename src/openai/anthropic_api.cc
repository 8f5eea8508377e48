#include "openai/anthropic_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "openai/text.h"

namespace pagoda::server {
namespace {

using ojson = nlohmann::ordered_json;

ApiError bad(std::string msg, std::string param) {
  return ApiError{400, std::move(msg), "invalid_request_error", std::move(param), "invalid_value"};
}

// Anthropic allows at most this many cache_control breakpoints in one request.
constexpr int kMaxBreakpoints = 4;
constexpr size_t kMaxUserIdBytes = 256;

std::optional<ApiError> get_number(const ojson& j, const char* key, double lo, double hi, float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad(std::string("'") + key + "' must be a number", key);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "'%s' is %g, outside [%g, %g]", key, v, lo, hi);
    return bad(buf, key);
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> get_int(const ojson& j, const char* key, int64_t lo, int64_t hi, int64_t* out, bool* present) {
  *present = false;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!it->is_number_integer()) return bad(std::string("'") + key + "' must be an integer", key);
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi))
    return bad(std::string("'") + key + "' is outside " + range, key);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return bad(std::string("'") + key + "' is " + std::to_string(v) + ", outside " + range, key);
  *out = v;
  *present = true;
  return std::nullopt;
}

std::string at(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// The chat messages as they are built from Anthropic's turns: one Anthropic
// message may become several (a user turn with tool_result blocks becomes tool
// messages, then a user message with its text).
struct Builder {
  std::vector<ChatMessage> out;
  std::optional<ChatMessage> pending;
  std::map<std::string, std::string> tool_name_by_id;  // tool_use id -> name (for tool messages)
  void flush() {
    if (pending) out.push_back(std::move(*pending));
    pending.reset();
  }
  ChatMessage& open(const char* role) {
    if (!pending || pending->role != role) {
      flush();
      pending.emplace();
      pending->role = role;
    }
    return *pending;
  }
  std::vector<ChatMessage> snapshot() const {
    std::vector<ChatMessage> v = out;
    if (pending) v.push_back(*pending);
    return v;
  }
};

// A block's cache_control ({"type": "ephemeral", "ttl": "5m" | "1h"}). can_end: the
// block may end a cached prefix. *ttl_s set (and true returned in *has) when present.
std::optional<ApiError> parse_cache_control(const ojson& block, const std::string& where, bool can_end, bool* has,
                                            double* ttl_s) {
  *has = false;
  auto it = block.find("cache_control");
  if (it == block.end() || it->is_null()) return std::nullopt;
  const std::string f = where.empty() ? "cache_control" : where + ".cache_control";
  if (!can_end) return bad("'" + f + "': a block of this type cannot end a cached prefix", f);
  if (!it->is_object()) return bad("'" + f + "' must be {\"type\": \"ephemeral\", \"ttl\": \"5m\" | \"1h\"}", f);
  auto t = it->find("type");
  if (t == it->end() || !t->is_string() || t->get<std::string>() != "ephemeral")
    return bad("'" + f + ".type' must be \"ephemeral\"", f + ".type");
  *ttl_s = 300;
  if (auto ttl = it->find("ttl"); ttl != it->end() && !ttl->is_null()) {
    const std::string v = ttl->is_string() ? ttl->get<std::string>() : std::string();
    if (v == "5m") *ttl_s = 300;
    else if (v == "1h") *ttl_s = 3600;
    else return bad("'" + f + ".ttl' must be \"5m\" or \"1h\"", f + ".ttl");
  }
  *has = true;
  return std::nullopt;
}

// {"type": "text", "text": "..."} -> its text.
std::optional<ApiError> text_of(const ojson& block, const std::string& where, std::string* out) {
  auto t = block.find("text");
  if (t == block.end() || !t->is_string()) return bad("'" + where + ".text' must be a string", where + ".text");
  *out = t->get<std::string>();
  return std::nullopt;
}

// A tool_result's content: a string or a list of text blocks.
std::optional<ApiError> tool_result_text(const ojson& block, const std::string& where, std::string* out) {
  auto c = block.find("content");
  if (c == block.end() || c->is_null()) return std::nullopt;
  if (c->is_string()) {
    *out = c->get<std::string>();
    return std::nullopt;
  }
  if (!c->is_array())
    return bad("'" + where + ".content' must be a string or a list of text blocks", where + ".content");
  for (size_t k = 0; k < c->size(); ++k) {
    const ojson& b = (*c)[k];
    const std::string w = at(where + ".content", k);
    if (!b.is_object() || b.value("type", "") != "text")
      return bad("'" + w + "' must be a text block (only text tool results are supported)", w + ".type");
    bool has = false;
    double ttl = 0;
    if (auto e = parse_cache_control(b, w, false, &has, &ttl)) return e;
    std::string s;
    if (auto e = text_of(b, w, &s)) return e;
    *out += s;
  }
  return std::nullopt;
}

#define PAGODA_ANTH_TRY(x)         \
  do {                             \
    if (auto _e = (x)) return *_e; \
  } while (0)

}  // namespace

std::variant<MessagesRequest, ApiError> parse_messages_request(const std::string& body, const RequestLimits& limits,
                                                               bool count_only) {
  if (json_too_deep(body, limits.max_json_depth))
    return bad("request body nests arrays/objects deeper than " + std::to_string(limits.max_json_depth) + " levels",
               "");
  // Ordered: a tool's input_schema keeps its property order (the order the output
  // writes them in), and tool_use inputs reach the template as sent.
  const ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("request body is not valid JSON (or not valid UTF-8)", "");
  if (!j.is_object()) return bad("request body must be a JSON object", "");

  MessagesRequest m;
  ParsedRequest& r = m.base;
  r.endpoint = Endpoint::kChat;
  sample::RequestParams& p = r.params;
  CacheBreakpoint& bp = m.cache;
  int breakpoints = 0;
  // Records the conversation so far as the latest breakpoint.
  auto mark = [&](bool has, double ttl, const std::string& field, std::vector<ChatMessage> msgs,
                  ojson tools) -> std::optional<ApiError> {
    if (!has) return std::nullopt;
    if (++breakpoints > kMaxBreakpoints)
      return bad("'" + field + "': at most " + std::to_string(kMaxBreakpoints) + " blocks may carry cache_control",
                 field);
    bp.present = true;
    bp.ttl_s = ttl;
    bp.field = field;
    bp.messages = std::move(msgs);
    bp.tools = std::move(tools);
    return std::nullopt;
  };

  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return bad("'model' must be a string", "model");
    r.model = it->get<std::string>();
  }

  // tools: Anthropic's {name, description, input_schema} as the chat path's functions.
  ojson tools_openai = nullptr;
  if (auto it = j.find("tools"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return bad("'tools' must be a list of {name, description, input_schema}", "tools");
    tools_openai = ojson::array();
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& t = (*it)[i];
      const std::string w = at("tools", i);
      if (!t.is_object()) return bad("'" + w + "' must be an object", w);
      if (auto ty = t.find("type"); ty != t.end() && !ty->is_null() && *ty != "custom")
        return bad("'" + w + ".type': only client tools (type \"custom\" or absent) are supported", w + ".type");
      auto name = t.find("name");
      if (name == t.end() || !name->is_string()) return bad("'" + w + ".name' must be a string", w + ".name");
      auto schema = t.find("input_schema");
      if (schema == t.end() || !schema->is_object())
        return bad("'" + w + ".input_schema' must be a JSON schema object", w + ".input_schema");
      ojson fn = {{"name", *name}};
      if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
        if (!d->is_string()) return bad("'" + w + ".description' must be a string", w + ".description");
        fn["description"] = *d;
      }
      fn["parameters"] = *schema;
      tools_openai.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
      bool has = false;
      double ttl = 0;
      PAGODA_ANTH_TRY(parse_cache_control(t, w, true, &has, &ttl));
      PAGODA_ANTH_TRY(mark(has, ttl, w + ".cache_control", {}, tools_openai));
    }
  }
  ojson tool_choice_openai = nullptr;
  if (auto it = j.find("tool_choice"); it != j.end() && !it->is_null()) {
    const char* shape =
        "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}";
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) return bad(shape, "tool_choice");
    const std::string type = (*it)["type"].get<std::string>();
    if (auto d = it->find("disable_parallel_tool_use"); d != it->end() && !d->is_null() && !d->is_boolean())
      return bad("'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice.disable_parallel_tool_use");
    if (type == "auto" || type == "none") {
      tool_choice_openai = type;
    } else if (type == "any") {
      tool_choice_openai = "required";  // forced: one call to any of the tools
    } else if (type == "tool") {
      auto n = it->find("name");
      if (n == it->end() || !n->is_string()) return bad("'tool_choice.name' must be a string", "tool_choice.name");
      tool_choice_openai = ojson{{"type", "function"}, {"function", {{"name", *n}}}};
    } else {
      return bad("'tool_choice.type' is '" + type.substr(0, 32) + "': expected auto, any, tool or none",
                 "tool_choice.type");
    }
  }
  if (!tools_openai.is_null() || !tool_choice_openai.is_null()) {
    // The chat path's own parser: the same names, schemas and forced-call grammar.
    ojson synth = ojson::object();
    if (!tools_openai.is_null()) synth["tools"] = tools_openai;
    if (!tool_choice_openai.is_null()) synth["tool_choice"] = tool_choice_openai;
    const std::string raw = synth.dump();
    PAGODA_ANTH_TRY(parse_output_constraint(json::parse(raw), /*chat=*/true, raw, &r.constraint));
  }
  const ojson& all_tools = r.constraint.tools.tools;  // null without tools

  Builder b;
  if (auto it = j.find("system"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      b.open("system").content = it->get<std::string>();
    } else if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        const ojson& blk = (*it)[i];
        const std::string w = at("system", i);
        if (!blk.is_object() || blk.value("type", "") != "text")
          return bad("'" + w + "' must be a text block {\"type\": \"text\", \"text\": ...}", w);
        std::string s;
        PAGODA_ANTH_TRY(text_of(blk, w, &s));
        b.open("system").content += s;
        bool has = false;
        double ttl = 0;
        PAGODA_ANTH_TRY(parse_cache_control(blk, w, !s.empty(), &has, &ttl));
        PAGODA_ANTH_TRY(mark(has, ttl, w + ".cache_control", b.snapshot(), all_tools));
      }
    } else {
      return bad("'system' must be a string or a list of text blocks", "system");
    }
    b.flush();
  }

  auto msgs = j.find("messages");
  if (msgs == j.end() || msgs->is_null()) return bad("'messages' is required", "messages");
  if (!msgs->is_array() || msgs->empty()) return bad("'messages' must be a non-empty list", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& msg = (*msgs)[i];
    const std::string w = at("messages", i);
    if (!msg.is_object()) return bad("'" + w + "' must be an object", w);
    auto role_it = msg.find("role");
    const std::string role = role_it != msg.end() && role_it->is_string() ? role_it->get<std::string>() : "";
    if (role != "user" && role != "assistant")
      return bad("'" + w + ".role' must be \"user\" or \"assistant\"", w + ".role");
    const bool user = role == "user";
    if (!user && i + 1 == msgs->size())
      return bad("'" + w + "': a final assistant message (prefill) is not supported", w + ".role");
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) return bad("'" + w + ".content' is required", w + ".content");
    b.flush();
    if (content->is_string()) {
      b.open(user ? "user" : "assistant").content = content->get<std::string>();
      b.flush();
      continue;
    }
    if (!content->is_array()) return bad("'" + w + ".content' must be a string or a list of blocks", w + ".content");
    if (!user) b.open("assistant");
    for (size_t k = 0; k < content->size(); ++k) {
      const ojson& blk = (*content)[k];
      const std::string wb = at(w + ".content", k);
      if (!blk.is_object() || !blk.contains("type") || !blk["type"].is_string())
        return bad("'" + wb + "' must be a block with a string 'type'", wb + ".type");
      const std::string type = blk["type"].get<std::string>();
      bool can_end = true;
      if (type == "text") {
        std::string s;
        PAGODA_ANTH_TRY(text_of(blk, wb, &s));
        can_end = !s.empty();  // Anthropic too: no cache_control on an empty text block
        b.open(user ? "user" : "assistant").content += s;
      } else if (type == "tool_result" && user) {
        auto id = blk.find("tool_use_id");
        if (id == blk.end() || !id->is_string())
          return bad("'" + wb + ".tool_use_id' must be a string", wb + ".tool_use_id");
        if (auto e = blk.find("is_error"); e != blk.end() && !e->is_null() && !e->is_boolean())
          return bad("'" + wb + ".is_error' must be a boolean", wb + ".is_error");
        b.flush();
        ChatMessage& tm = b.open("tool");
        tm.tool_call_id = id->get<std::string>();
        if (auto n = b.tool_name_by_id.find(tm.tool_call_id); n != b.tool_name_by_id.end()) tm.name = n->second;
        PAGODA_ANTH_TRY(tool_result_text(blk, wb, &tm.content));
      } else if (type == "tool_use" && !user) {
        auto id = blk.find("id");
        auto name = blk.find("name");
        auto input = blk.find("input");
        if (id == blk.end() || !id->is_string()) return bad("'" + wb + ".id' must be a string", wb + ".id");
        if (name == blk.end() || !name->is_string()) return bad("'" + wb + ".name' must be a string", wb + ".name");
        if (input == blk.end() || !input->is_object())
          return bad("'" + wb + ".input' must be an object", wb + ".input");
        ChatMessage& am = b.open("assistant");
        if (!am.tool_calls.is_array()) am.tool_calls = ojson::array();
        // The template's tool-call form: arguments as the object (as HF passes it).
        am.tool_calls.push_back(
            ojson{{"id", *id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *input}}}});
        b.tool_name_by_id[id->get<std::string>()] = name->get<std::string>();
      } else if ((type == "thinking" || type == "redacted_thinking") && !user) {
        can_end = false;  // dropped: earlier turns' reasoning is not rendered
      } else {
        return bad("'" + wb + ".type' is '" + type.substr(0, 32) + "': " + role +
                       " messages take text" + (user ? ", tool_result" : ", tool_use") + " blocks only",
                   wb + ".type");
      }
      bool has = false;
      double ttl = 0;
      PAGODA_ANTH_TRY(parse_cache_control(blk, wb, can_end, &has, &ttl));
      PAGODA_ANTH_TRY(mark(has, ttl, wb + ".cache_control", b.snapshot(), all_tools));
    }
    b.flush();
  }
  // Top-level cache_control (Anthropic's automatic caching): a breakpoint on the last block.
  if (auto it = j.find("cache_control"); it != j.end() && !it->is_null()) {
    bool has = false;
    double ttl = 0;
    PAGODA_ANTH_TRY(parse_cache_control(j, "", true, &has, &ttl));
    PAGODA_ANTH_TRY(mark(has, ttl, "cache_control", b.out, all_tools));
  }
  r.messages = std::move(b.out);

  int64_t v = 0;
  bool present = false;
  PAGODA_ANTH_TRY(get_int(j, "max_tokens", 1, INT32_MAX, &v, &present));
  if (!present && !count_only) return bad("'max_tokens' is required", "max_tokens");
  if (present) {
    p.max_tokens = static_cast<int>(v);
    r.max_tokens_given = true;
  }
  PAGODA_ANTH_TRY(get_number(j, "temperature", 0.0, 1.0, &p.temperature));
  PAGODA_ANTH_TRY(get_number(j, "top_p", 1e-9, 1.0, &p.top_p));
  PAGODA_ANTH_TRY(get_int(j, "top_k", 0, 1 << 20, &v, &present));
  if (present) p.top_k = static_cast<int>(v);
  if (auto it = j.find("stream"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("'stream' must be a boolean", "stream");
    r.stream = it->get<bool>();
  }
  if (auto it = j.find("stop_sequences"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return bad("'stop_sequences' must be a list of strings", "stop_sequences");
    if (it->size() > limits.max_stop_strings)
      return bad("at most " + std::to_string(limits.max_stop_strings) + " stop sequences", "stop_sequences");
    std::vector<std::string> stops;
    for (const auto& s : *it) {
      if (!s.is_string()) return bad("'stop_sequences' must be a list of strings", "stop_sequences");
      const std::string& str = s.get_ref<const std::string&>();
      if (str.size() > limits.max_stop_bytes)
        return bad("a stop sequence is " + std::to_string(str.size()) + " bytes; the limit is " +
                       std::to_string(limits.max_stop_bytes),
                   "stop_sequences");
      if (str.empty()) return bad("'stop_sequences' must not hold an empty string", "stop_sequences");
      stops.push_back(str);
    }
    p.stop = std::move(stops);
  }
  if (auto it = j.find("metadata"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("'metadata' must be an object", "metadata");
    for (const auto& [k, val] : it->items()) {
      if (k != "user_id")
        return bad("'metadata." + k.substr(0, 32) + "' is not a metadata field (only user_id)",
                   "metadata." + k.substr(0, 32));
      if (val.is_null()) continue;
      if (!val.is_string() || val.get_ref<const std::string&>().size() > kMaxUserIdBytes)
        return bad("'metadata.user_id' must be a string of at most " + std::to_string(kMaxUserIdBytes) + " bytes",
                   "metadata.user_id");
      m.user_id = val.get<std::string>();
    }
  }
  {  // vLLM's priority, as an extension (lower is served first)
    const json jp = j.contains("priority") ? json{{"priority", json::parse(j["priority"].dump())}} : json::object();
    PAGODA_ANTH_TRY(parse_priority(jp, &p.priority));
  }
  if (bp.present) p.pin_ttl_s = bp.ttl_s;  // pin_tokens: the server, once the prompt is tokenized
  if (!count_only && p.max_tokens > 0) PAGODA_ANTH_TRY(check_output_cost(1, p, p.max_tokens, limits));

  static const char* const kKnown[] = {"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
                                       "stop_sequences", "stream", "metadata", "tools", "tool_choice", "priority",
                                       "cache_control"};
  for (const auto& item : j.items())
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return item.key() == k; }) ==
        std::end(kKnown))
      r.ignored_fields.push_back(item.key());
  return m;
}

int32_t cache_prefix_tokens(const TextCodec& text, const CacheBreakpoint& bp, const std::vector<int32_t>& prompt,
                            bool parse_special, bool* exact) {
  if (exact) *exact = false;
  if (!bp.present) return 0;
  // The cut conversation without a generation prompt: with a template whose turns
  // only append, its ids are a prefix of the full prompt's. Otherwise (the cut falls
  // inside a message, whose end-of-turn marker the full prompt does not have there,
  // or a template that renders earlier turns differently) the longest common token
  // prefix is what the two share, and what can be kept.
  auto ids = text.encode_chat(bp.messages, parse_special, bp.tools, /*add_generation_prompt=*/false);
  if (!ids.ok()) return 0;  // e.g. a template that cannot render no messages (a breakpoint on a tool)
  size_t n = 0;
  while (n < ids->size() && n < prompt.size() && (*ids)[n] == prompt[n]) ++n;
  if (exact) *exact = n == ids->size();
  return static_cast<int32_t>(n);
}

MessagesUsage messages_usage(int64_t prompt_tokens, int64_t cached_tokens, int64_t pin_tokens, int64_t output_tokens) {
  MessagesUsage u;
  u.cache_read_input_tokens = std::clamp<int64_t>(cached_tokens, 0, prompt_tokens);
  u.cache_creation_input_tokens =
      std::max<int64_t>(0, std::min(pin_tokens, prompt_tokens) - u.cache_read_input_tokens);
  u.input_tokens = prompt_tokens - u.cache_read_input_tokens - u.cache_creation_input_tokens;
  u.output_tokens = output_tokens;
  return u;
}

nlohmann::json usage_json(const MessagesUsage& u) {
  return nlohmann::json{{"input_tokens", u.input_tokens},
                        {"cache_creation_input_tokens", u.cache_creation_input_tokens},
                        {"cache_read_input_tokens", u.cache_read_input_tokens},
                        {"output_tokens", u.output_tokens}};
}

int anthropic_status(const ApiError& e) { return e.status == 503 ? 529 : e.status; }

std::string anthropic_error_body(const ApiError& e) {
  const int s = anthropic_status(e);
  const char* type = s == 401   ? "authentication_error"
                     : s == 403 ? "permission_error"
                     : s == 404 ? "not_found_error"
                     : s == 413 ? "request_too_large"
                     : s == 429 ? "rate_limit_error"
                     : s == 529 ? "overloaded_error"
                     : s >= 500 ? "api_error"
                                : "invalid_request_error";
  return dump_json(json{{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}});
}

std::string anthropic_sse(const char* event, const nlohmann::json& data) {
  return std::string("event: ") + event + "\ndata: " + dump_json(data) + "\n\n";
}

}  // namespace pagoda::server
