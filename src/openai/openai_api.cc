#include "openai/openai_api.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "grammar/json_text.h"
#include "tok/tokenizer.h"

namespace pagoda::server {
namespace {

ApiError bad(std::string msg, std::string param = "") {
  ApiError e;
  e.status = 400;
  e.message = std::move(msg);
  e.param = std::move(param);
  e.code = "invalid_value";
  return e;
}

// Reads an optional integer field within [lo, hi]. Rejects floats, strings, bools.
std::optional<ApiError> get_int(const json& j, const char* key, int64_t lo, int64_t hi, int64_t* out,
                                bool* present = nullptr) {
  auto it = j.find(key);
  if (present) *present = false;
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    if (it->is_number_float()) {
      double d = it->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) {
        *out = static_cast<int64_t>(d);
        if (present) *present = true;
        return std::nullopt;
      }
    }
    return bad(std::string("'") + key + "' must be an integer", key);
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return bad(std::string("'") + key + "' is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", key);
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return bad(std::string("'") + key + "' is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]",
               key);
  *out = v;
  if (present) *present = true;
  return std::nullopt;
}

std::optional<ApiError> get_float(const json& j, const char* key, double lo, double hi, float* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad(std::string("'") + key + "' must be a number", key);
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "'%s' is %g, outside [%g, %g]", key, v, lo, hi);
    return bad(buf, key);
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad(std::string("'") + key + "' must be a boolean", key);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_string(const json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return bad(std::string("'") + key + "' must be a string", key);
  *out = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> parse_token_list(const json& a, std::vector<int32_t>* out) {
  for (const auto& t : a) {
    if (!t.is_number_integer()) return bad("token ids in 'prompt' must be integers", "prompt");
    int64_t v = t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX ? -1 : t.get<int64_t>();
    if (v < 0 || v > INT32_MAX) return bad("token id out of range in 'prompt'", "prompt");
    out->push_back(static_cast<int32_t>(v));
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}; the ids are checked against
// the vocabulary once the model is known (check_logit_bias).
std::optional<ApiError> parse_logit_bias(const json& j, const RequestLimits& limits,
                                         std::vector<std::pair<int32_t, float>>* out) {
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return bad("'logit_bias' must be an object of token id -> bias", "logit_bias");
  if (it->size() > limits.max_logit_bias)
    return bad("'logit_bias' has " + std::to_string(it->size()) + " entries; the limit is " +
                   std::to_string(limits.max_logit_bias),
               "logit_bias");
  for (const auto& [key, val] : it->items()) {
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > INT32_MAX)
      return bad("'logit_bias' keys must be token ids (non-negative integers), got '" + key.substr(0, 32) + "'",
                 "logit_bias");
    if (!val.is_number()) return bad("'logit_bias' values must be numbers", "logit_bias");
    const double b = val.get<double>();
    if (!(b >= -100.0 && b <= 100.0))
      return bad("'logit_bias' value for token " + key + " is outside [-100, 100]", "logit_bias");
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  std::sort(out->begin(), out->end());
  for (size_t i = 1; i < out->size(); ++i)
    if ((*out)[i].first == (*out)[i - 1].first)
      return bad("'logit_bias' names token id " + std::to_string((*out)[i].first) + " twice", "logit_bias");
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& j, std::vector<ChatMessage>* out) {
  auto it = j.find("messages");
  if (it == j.end()) return bad("'messages' is required", "messages");
  if (!it->is_array()) return bad("'messages' must be an array", "messages");
  if (it->empty()) return bad("'messages' must not be empty", "messages");
  for (const auto& m : *it) {
    if (!m.is_object()) return bad("each message must be an object", "messages");
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) return bad("each message needs a string 'role'", "messages");
    std::string role = r->get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
      return bad("unknown message role '" + role + "' (expected system, user, assistant, developer or tool)",
                 "messages");
    if (role == "developer") role = "system";
    ChatMessage msg;
    msg.role = role;
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      if (role != "assistant") return bad("message with role '" + role + "' needs 'content'", "messages");
    } else if (c->is_string()) {
      msg.content = c->get<std::string>();
    } else if (c->is_array()) {
      for (const auto& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return bad("only text content parts are supported", "messages");
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return bad("message 'content' must be a string or an array of text parts", "messages");
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (!tc->is_array()) return bad("message 'tool_calls' must be a list", "messages");
      msg.tool_calls = nlohmann::ordered_json::parse(tc->dump());
      // Templates read function.arguments as a mapping (HF passes dicts); the API
      // sends a JSON string: give the template the object it encodes.
      for (auto& call : msg.tool_calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          return bad("each message tool call must be {\"type\": \"function\", \"function\": {...}}", "messages");
        auto& args = call["function"]["arguments"];
        if (args.is_string()) {
          auto obj = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
          if (!obj.is_discarded() && obj.is_object()) args = std::move(obj);
        }
      }
    }
    if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) msg.tool_call_id = id->get<std::string>();
    if (auto nm = m.find("name"); nm != m.end() && nm->is_string()) msg.name = nm->get<std::string>();
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

#define PAGODA_API_TRY(x)             \
  do {                                \
    if (auto _e = (x)) return *_e;    \
  } while (0)

}  // namespace

bool json_too_deep(const std::string& body, int max_depth) {
  return grammar::json_nesting_depth(body, max_depth) > max_depth;
}

namespace {
// Parses a body into a JSON object; the depth check runs first so a "[[[[...]]]]"
// body costs no parser stack or tree.
std::variant<json, ApiError> parse_object(const std::string& body, const RequestLimits& limits) {
  if (json_too_deep(body, limits.max_json_depth))
    return bad("request body nests arrays/objects deeper than " + std::to_string(limits.max_json_depth) + " levels");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("request body is not valid JSON (or not valid UTF-8)");
  if (!j.is_object()) return bad("request body must be a JSON object");
  return j;
}
}  // namespace

std::optional<ApiError> check_output_cost(size_t num_prompts, const sample::RequestParams& p, int64_t max_tokens,
                                          const RequestLimits& limits) {
  // Each factor is bounded (prompts <= max_prompts, n <= 16, logprobs <= 20, max_tokens <
  // 2^31), so the product fits in a double exactly enough to compare.
  const double entries = static_cast<double>(num_prompts) * std::max(1, p.n) *
                         static_cast<double>(std::max<int64_t>(max_tokens, 1)) * (1 + std::max(0, p.logprobs));
  if (entries <= static_cast<double>(limits.max_output_entries)) return std::nullopt;
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "the request asks for up to %.0f output entries (%zu prompts x n %d x max_tokens %lld x (1 + logprobs "
                "%d)); the limit is %lld: lower max_tokens, n, logprobs or the number of prompts",
                entries, num_prompts, std::max(1, p.n), static_cast<long long>(max_tokens), std::max(0, p.logprobs),
                static_cast<long long>(limits.max_output_entries));
  return bad(buf, "max_tokens");
}

std::variant<ParsedRequest, ApiError> parse_request(Endpoint ep, const std::string& body, const RequestLimits& limits) {
  auto parsed = parse_object(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);

  ParsedRequest r;
  r.endpoint = ep;
  sample::RequestParams& p = r.params;
  PAGODA_API_TRY(get_string(j, "model", &r.model));

  if (ep == Endpoint::kCompletions) {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return bad("'prompt' is required", "prompt");
    if (it->is_string()) {
      r.prompt_texts.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->empty()) return bad("'prompt' must not be empty", "prompt");
      if ((*it)[0].is_number()) {
        r.prompt_is_tokens = true;
        r.prompt_tokens.emplace_back();
        PAGODA_API_TRY(parse_token_list(*it, &r.prompt_tokens.back()));
      } else if ((*it)[0].is_string()) {
        for (const auto& s : *it) {
          if (!s.is_string()) return bad("'prompt' list must hold only strings", "prompt");
          r.prompt_texts.push_back(s.get<std::string>());
        }
      } else if ((*it)[0].is_array()) {
        r.prompt_is_tokens = true;
        for (const auto& s : *it) {
          if (!s.is_array() || s.empty()) return bad("'prompt' must be a list of non-empty token lists", "prompt");
          r.prompt_tokens.emplace_back();
          PAGODA_API_TRY(parse_token_list(s, &r.prompt_tokens.back()));
        }
      } else {
        return bad("'prompt' must be a string, a list of strings or token ids", "prompt");
      }
    } else {
      return bad("'prompt' must be a string, a list of strings or token ids", "prompt");
    }
    if (r.prompt_texts.size() + r.prompt_tokens.size() > limits.max_prompts)
      return bad("at most " + std::to_string(limits.max_prompts) + " prompts per request", "prompt");
    PAGODA_API_TRY(get_bool(j, "echo", &r.echo));
    int64_t lp = -1;
    bool lp_present = false;
    PAGODA_API_TRY(get_int(j, "logprobs", 0, 20, &lp, &lp_present));
    p.logprobs = lp_present ? static_cast<int>(lp) : -1;
    p.max_tokens = 16;
  } else {
    PAGODA_API_TRY(parse_messages(j, &r.messages));
    PAGODA_API_TRY(get_bool(j, "logprobs", &r.chat_logprobs));
    int64_t tlp = 0;
    bool tlp_present = false;
    PAGODA_API_TRY(get_int(j, "top_logprobs", 0, 20, &tlp, &tlp_present));
    if (tlp_present && !r.chat_logprobs) return bad("'top_logprobs' requires 'logprobs': true", "top_logprobs");
    p.logprobs = r.chat_logprobs ? static_cast<int>(tlp) : -1;
    p.max_tokens = -1;  // until context - prompt
  }

  int64_t v = 0;
  bool present = false;
  PAGODA_API_TRY(get_int(j, "max_tokens", 1, INT32_MAX, &v, &present));
  if (present) { p.max_tokens = static_cast<int>(v); r.max_tokens_given = true; }
  // OpenAI's newer name; completions take it too (clients send it to both).
  PAGODA_API_TRY(get_int(j, "max_completion_tokens", 1, INT32_MAX, &v, &present));
  if (present) { p.max_tokens = static_cast<int>(v); r.max_tokens_given = true; }
  PAGODA_API_TRY(get_float(j, "temperature", 0.0, 2.0, &p.temperature));
  PAGODA_API_TRY(get_float(j, "top_p", 1e-9, 1.0, &p.top_p));
  PAGODA_API_TRY(get_float(j, "min_p", 0.0, 1.0, &p.min_p));
  PAGODA_API_TRY(get_float(j, "presence_penalty", -2.0, 2.0, &p.presence_penalty));
  PAGODA_API_TRY(get_float(j, "frequency_penalty", -2.0, 2.0, &p.frequency_penalty));
  PAGODA_API_TRY(get_float(j, "repetition_penalty", 1e-6, 10.0, &p.repetition_penalty));
  PAGODA_API_TRY(get_int(j, "top_k", -1, 1 << 20, &v, &present));
  if (present) p.top_k = v < 0 ? 0 : static_cast<int>(v);
  PAGODA_API_TRY(get_int(j, "n", 1, 16, &v, &present));
  if (present) p.n = static_cast<int>(v);
  // best_of (the legacy completions API: best_of candidates ranked by cumulative
  // logprob, n returned). vLLM V1 dropped it (best_of other than 1 is an error there;
  // its RFC: use n and logprobs instead), as the current OpenAI, Anthropic and
  // Gemini APIs have; pagoda takes best_of equal to n (the same answer) and
  // refuses any other value with a 400, never ignoring it.
  PAGODA_API_TRY(get_int(j, "best_of", 1, 16, &v, &present));
  if (present && v != p.n)
    return bad("'best_of' is " + std::to_string(v) + ", but only best_of equal to n (" + std::to_string(p.n) +
                   ") is supported",
               "best_of");
  PAGODA_API_TRY(parse_logit_bias(j, limits, &p.logit_bias));
  PAGODA_API_TRY(get_int(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &v,
                         &present));
  if (present) { p.seed = static_cast<uint64_t>(v); p.has_seed = true; }
  PAGODA_API_TRY(get_bool(j, "ignore_eos", &p.ignore_eos));
  PAGODA_API_TRY(get_bool(j, "return_token_ids", &r.return_token_ids));
  PAGODA_API_TRY(get_string(j, "cache_salt", &p.cache_salt));
  if (p.cache_salt.size() > limits.max_cache_salt_bytes)
    return bad("'cache_salt' is " + std::to_string(p.cache_salt.size()) + " bytes; the limit is " +
                   std::to_string(limits.max_cache_salt_bytes),
               "cache_salt");
  PAGODA_API_TRY(get_bool(j, "stream", &r.stream));
  PAGODA_API_TRY(parse_priority(j, &p.priority));
  PAGODA_API_TRY(parse_cache_fields(j, &r.cache));
  if (r.cache.pin_prompt) p.pin_ttl_s = r.cache.pin_ttl_s;

  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    std::vector<std::string> stops;
    auto add_stop = [&](const json& s) -> std::optional<ApiError> {
      if (!s.is_string()) return bad("'stop' must be a string or a list of strings", "stop");
      const std::string& str = s.get_ref<const std::string&>();
      if (str.size() > limits.max_stop_bytes)
        return bad("a stop string is " + std::to_string(str.size()) + " bytes; the limit is " +
                       std::to_string(limits.max_stop_bytes) + " (--max-stop-bytes)",
                   "stop");
      if (!str.empty()) stops.push_back(str);
      return std::nullopt;
    };
    if (it->is_array()) {
      if (it->size() > limits.max_stop_strings)
        return bad("at most " + std::to_string(limits.max_stop_strings) + " stop strings", "stop");
      for (const auto& s : *it) PAGODA_API_TRY(add_stop(s));
    } else {
      PAGODA_API_TRY(add_stop(*it));
    }
    // Built once per HTTP request; every prompt and choice shares it.
    p.stop = std::move(stops);
  }
  const int64_t num_prompts =
      ep == Endpoint::kChat ? 1 : static_cast<int64_t>(r.prompt_texts.size() + r.prompt_tokens.size());
  if (num_prompts * p.n > limits.max_choices)
    return bad(std::to_string(num_prompts) + " prompts x n " + std::to_string(p.n) + " = " +
                   std::to_string(num_prompts * p.n) + " choices; the limit is " + std::to_string(limits.max_choices),
               "n");
  if (p.max_tokens > 0) PAGODA_API_TRY(check_output_cost(static_cast<size_t>(num_prompts), p, p.max_tokens, limits));
  PAGODA_API_TRY(parse_output_constraint(j, ep == Endpoint::kChat, body, &r.constraint));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("'stream_options' must be an object", "stream_options");
    if (!r.stream) return bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    PAGODA_API_TRY(get_bool(*it, "include_usage", &r.include_usage));
  }
  for (const auto& item : j.items())
    if (!is_known_field(ep, item.key())) r.ignored_fields.push_back(item.key());
  return r;
}

std::optional<ApiError> check_logit_bias(const sample::RequestParams& p, int vocab_size) {
  for (const auto& [id, b] : p.logit_bias)
    if (id >= vocab_size)
      return bad("'logit_bias' names token id " + std::to_string(id) + ", outside the vocabulary (size " +
                     std::to_string(vocab_size) + ")",
                 "logit_bias");
  return std::nullopt;
}

bool is_known_field(Endpoint ep, const std::string& field) {
  // Every field parse_request (and parse_output_constraint) reads.
  static const char* const kCommon[] = {
      "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "min_p", "presence_penalty",
      "frequency_penalty", "repetition_penalty", "top_k", "n", "seed", "ignore_eos", "return_token_ids",
      "cache_salt", "stream", "stop", "stream_options", "response_format", "guided_json", "guided_regex",
      "guided_choice", "guided_grammar", "logit_bias", "best_of", "priority", "prompt_cache_retention",
      "prompt_cache_key"};
  static const char* const kCompletions[] = {"prompt", "echo", "logprobs"};
  static const char* const kChat[] = {"messages", "logprobs", "top_logprobs", "tools", "tool_choice"};
  for (const char* k : kCommon)
    if (field == k) return true;
  if (ep == Endpoint::kChat) {
    for (const char* k : kChat)
      if (field == k) return true;
  } else {
    for (const char* k : kCompletions)
      if (field == k) return true;
  }
  return false;
}

std::variant<TokenizeRequest, ApiError> parse_tokenize(const std::string& body, const RequestLimits& limits) {
  auto parsed = parse_object(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  TokenizeRequest r;
  PAGODA_API_TRY(get_bool(j, "add_special_tokens", &r.add_special_tokens));
  PAGODA_API_TRY(get_bool(j, "add_special", &r.add_special_tokens));  // llama-server's name
  if (j.contains("messages")) {
    r.has_messages = true;
    PAGODA_API_TRY(parse_messages(j, &r.messages));
    return r;
  }
  auto it = j.find("prompt");
  if (it == j.end()) it = j.find("content");  // llama-server's shape: {"content": "..."}
  if (it == j.end() || !it->is_string())
    return bad("'prompt' (a string), 'content' (a string) or 'messages' is required", "prompt");
  r.prompt = it->get<std::string>();
  return r;
}

std::variant<std::vector<int32_t>, ApiError> parse_detokenize(const std::string& body, int vocab_size,
                                                              const RequestLimits& limits) {
  auto parsed = parse_object(body, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) return bad("'tokens' (a list of token ids) is required", "tokens");
  std::vector<int32_t> ids;
  if (auto e = parse_token_list(*it, &ids)) { e->param = "tokens"; return *e; }
  for (int32_t t : ids)
    if (t >= vocab_size) return bad("token id " + std::to_string(t) + " is not in the vocabulary (size " +
                                    std::to_string(vocab_size) + ")", "tokens");
  return ids;
}

// ---- Response formatting -------------------------------------------------------

namespace {
json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}
const char* object_name(Endpoint ep, bool chunk) {
  if (ep == Endpoint::kChat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}
json finish_json(FinishReason f) {
  return f == FinishReason::kNone ? json() : json(finish_reason_name(f));
}
}  // namespace

json logprobs_json(Endpoint ep, const tok::Tokenizer& tk, const std::vector<TokenLogprob>& lps,
                   size_t text_offset0) {
  if (ep == Endpoint::kChat) {
    json content = json::array();
    for (const auto& lp : lps) {
      const std::string& piece = tk.token_to_piece(lp.token);
      json top = json::array();
      for (const auto& [t, l] : lp.top) {
        const std::string& p = tk.token_to_piece(t);
        top.push_back({{"token", p}, {"logprob", l}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", lp.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  size_t off = text_offset0;
  for (const auto& lp : lps) {
    const std::string& piece = tk.token_to_piece(lp.token);
    tokens.push_back(piece);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [t, l] : lp.top) top[tk.token_to_piece(t)] = l;
    tops.push_back(top);
    offsets.push_back(off);
    off += piece.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json chunk_json(const ResponseMeta& m, json choices) {
  return json{{"id", m.id}, {"object", object_name(m.endpoint, true)}, {"created", m.created}, {"model", m.model},
              {"choices", std::move(choices)}};
}

json response_json(const ResponseMeta& m, json choices, json usage) {
  return json{{"id", m.id},           {"object", object_name(m.endpoint, false)},
              {"created", m.created}, {"model", m.model},
              {"choices", std::move(choices)}, {"usage", std::move(usage)}};
}

json stream_choice_json(Endpoint ep, size_t index, const std::string& text, bool first, json logprobs,
                        FinishReason finish) {
  if (ep == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    return json{{"index", index}, {"delta", delta}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_json(finish)}};
  }
  return json{{"index", index}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_json(finish)}};
}

json final_choice_json(Endpoint ep, size_t index, const std::string& text, json logprobs,
                       FinishReason finish) {
  if (ep == Endpoint::kChat)
    return json{{"index", index}, {"message", {{"role", "assistant"}, {"content", text}}},
                {"logprobs", std::move(logprobs)}, {"finish_reason", finish_json(finish)}};
  return json{{"index", index}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_json(finish)}};
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace pagoda::server
