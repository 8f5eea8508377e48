#include "openai/structured.h"

#include "grammar/json_text.h"
#include "openai/errors.h"

namespace pagoda::server {

namespace {

using ojson = nlohmann::ordered_json;

ApiError bad(std::string msg, std::string param) {
  return ApiError{400, std::move(msg), "invalid_request_error", std::move(param), "invalid_value"};
}

std::string_view trim(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

bool valid_function_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

bool known(const std::vector<std::string>& names, const std::string& n) {
  return names.empty() || std::find(names.begin(), names.end(), n) != names.end();
}

// {"name": .., "arguments"|"parameters": {..} or "<json>"} -> a call.
std::optional<ToolCall> call_of(const ojson& j, const std::vector<std::string>& names) {
  if (!j.is_object()) return std::nullopt;
  auto n = j.find("name");
  if (n == j.end() || !n->is_string() || !known(names, n->get<std::string>())) return std::nullopt;
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  ToolCall c{n->get<std::string>(), "{}"};
  if (a == j.end()) return c;
  if (a->is_object()) {
    c.arguments = a->dump();
  } else if (a->is_string()) {
    auto parsed = ojson::parse(a->get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
    c.arguments = parsed.dump();
  } else {
    return std::nullopt;
  }
  return c;
}

// A JSON value at the start of s holding one call or an array of calls;
// consumed: its length. Empty when it is not that.
std::vector<ToolCall> calls_at(std::string_view s, const std::vector<std::string>& names, size_t* consumed) {
  *consumed = 0;
  const size_t len = grammar::json_value_extent(s);
  if (len == 0) return {};
  auto j = ojson::parse(s.substr(0, len), nullptr, false);
  if (j.is_discarded()) return {};
  std::vector<ToolCall> out;
  if (j.is_array()) {
    for (const auto& e : j) {
      auto c = call_of(e, names);
      if (!c) return {};
      out.push_back(std::move(*c));
    }
  } else if (auto c = call_of(j, names)) {
    out.push_back(std::move(*c));
  }
  if (!out.empty()) *consumed = len;
  return out;
}

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]", kPythonTag = "<|python_tag|>";

}  // namespace

ToolSyntax detect_tool_syntax(std::string_view src) {
  if (src.find("[TOOL_CALLS]") != std::string_view::npos) return ToolSyntax::kMistral;
  if (src.find("<tool_call>") != std::string_view::npos) return ToolSyntax::kHermes;
  if (src.find("<|python_tag|>") != std::string_view::npos || src.find("\"parameters\"") != std::string_view::npos)
    return ToolSyntax::kLlama3;
  return ToolSyntax::kJson;
}

const char* tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::kHermes: return "hermes";
    case ToolSyntax::kLlama3: return "llama3";
    case ToolSyntax::kMistral: return "mistral";
    case ToolSyntax::kJson: break;
  }
  return "json";
}

std::optional<ApiError> parse_output_constraint(const nlohmann::json& body, bool chat, const std::string& raw,
                                                OutputConstraint* out) {
  static const char* kKeys[] = {"response_format", "guided_json", "guided_regex", "guided_choice", "tools",
                                "tool_choice",     "guided_grammar"};
  bool any = false;
  for (const char* k : kKeys) {
    auto it = body.find(k);
    any |= it != body.end() && !it->is_null();
  }
  if (!any) return std::nullopt;
  // Parsed again keeping key order: a schema's property order is the order the
  // output writes them in.
  const ojson j = ojson::parse(raw, nullptr, false);
  grammar::ConstraintSpec& spec = out->spec;
  int given = 0;
  const char* which = "";
  auto take = [&](const char* k) {
    ++given;
    which = k;
  };
  if (auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      return bad("'response_format' must be an object with a string 'type'", "response_format");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      take("response_format");
      spec.kind = grammar::ConstraintKind::kJsonObject;
    } else if (type == "json_schema") {
      take("response_format");
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        return bad("'response_format.json_schema' must be an object", "response_format");
      if (auto n = js->find("name"); n != js->end() && !n->is_string())
        return bad("'response_format.json_schema.name' must be a string", "response_format");
      if (auto s = js->find("strict"); s != js->end() && !s->is_null() && !s->is_boolean())
        return bad("'response_format.json_schema.strict' must be a boolean", "response_format");
      auto sc = js->find("schema");
      if (sc == js->end() || !(sc->is_object() || sc->is_boolean()))
        return bad("'response_format.json_schema.schema' must be a JSON schema object", "response_format");
      spec.kind = grammar::ConstraintKind::kJsonSchema;
      spec.text = sc->dump();
    } else if (type != "text") {
      return bad("'response_format.type' must be text, json_object or json_schema, got '" + type + "'",
                 "response_format");
    }
  }
  if (auto it = j.find("guided_json"); it != j.end() && !it->is_null()) {
    take("guided_json");
    spec.kind = grammar::ConstraintKind::kJsonSchema;
    if (it->is_string()) spec.text = it->get<std::string>();
    else if (it->is_object() || it->is_boolean()) spec.text = it->dump();
    else return bad("'guided_json' must be a JSON schema (object or string)", "guided_json");
  }
  if (auto it = j.find("guided_regex"); it != j.end() && !it->is_null()) {
    take("guided_regex");
    if (!it->is_string()) return bad("'guided_regex' must be a string", "guided_regex");
    spec.kind = grammar::ConstraintKind::kRegex;
    spec.text = it->get<std::string>();
  }
  if (auto it = j.find("guided_choice"); it != j.end() && !it->is_null()) {
    take("guided_choice");
    if (!it->is_array() || it->empty()) return bad("'guided_choice' must be a non-empty list of strings", "guided_choice");
    for (const auto& c : *it) {
      if (!c.is_string()) return bad("'guided_choice' must be a non-empty list of strings", "guided_choice");
      spec.choices.push_back(c.get<std::string>());
    }
    spec.kind = grammar::ConstraintKind::kChoice;
  }
  if (auto it = j.find("guided_grammar"); it != j.end() && !it->is_null()) {
    take("guided_grammar");
    if (!it->is_string()) return bad("'guided_grammar' must be a GBNF grammar (a string)", "guided_grammar");
    spec.kind = grammar::ConstraintKind::kGbnf;
    spec.text = it->get<std::string>();
  }
  if (given > 1)
    return bad("at most one of response_format (json), guided_json, guided_regex, guided_choice and guided_grammar "
               "may be given",
               which);

  ToolSetup& t = out->tools;
  if (auto it = j.find("tools"); it != j.end() && !it->is_null()) {
    if (!chat) return bad("'tools' is only supported on /v1/chat/completions", "tools");
    if (!it->is_array()) return bad("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", "tools");
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& tool = (*it)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
          !tool["function"].is_object())
        return bad(at + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
      const ojson& f = tool["function"];
      if (!f.contains("name") || !f["name"].is_string() || !valid_function_name(f["name"].get<std::string>()))
        return bad(at + ".function.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -", "tools");
      const std::string name = f["name"].get<std::string>();
      if (std::find(t.names.begin(), t.names.end(), name) != t.names.end())
        return bad(at + ": function '" + name + "' is declared twice", "tools");
      ojson params = ojson{{"type", "object"}};
      if (auto p = f.find("parameters"); p != f.end() && !p->is_null()) {
        if (!p->is_object()) return bad(at + ".function.parameters must be a JSON schema object", "tools");
        params = *p;
      }
      t.names.push_back(name);
      t.parameters.push_back(std::move(params));
    }
    if (!t.names.empty()) {
      t.tools = *it;
      t.choice = ToolChoice::kAuto;
    }
  }
  if (auto it = j.find("tool_choice"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c == "none") t.choice = ToolChoice::kNone;
      else if (c == "auto") t.choice = t.names.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
      else if (c == "required") t.choice = ToolChoice::kRequired;
      else return bad("'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
    } else if (it->is_object() && it->value("type", "") == "function" && it->contains("function") &&
               (*it)["function"].is_object() && (*it)["function"].contains("name") &&
               (*it)["function"]["name"].is_string()) {
      t.choice = ToolChoice::kNamed;
      t.named = (*it)["function"]["name"].get<std::string>();
      if (std::find(t.names.begin(), t.names.end(), t.named) == t.names.end())
        return bad("'tool_choice' names function '" + t.named + "', which is not in 'tools'", "tool_choice");
    } else {
      return bad("'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
    }
    if (t.choice == ToolChoice::kRequired && t.names.empty())
      return bad("'tool_choice' is required but no 'tools' are given", "tool_choice");
  }
  const bool forced = t.choice == ToolChoice::kRequired || t.choice == ToolChoice::kNamed;
  if (forced && !spec.empty())
    return bad(std::string("'tool_choice' ") + (t.choice == ToolChoice::kNamed ? "naming a function" : "required") +
                   " cannot be combined with " + which,
               "tool_choice");
  return std::nullopt;
}

grammar::ConstraintSpec tool_call_spec(const ToolSetup& tools, ToolSyntax syntax) {
  const char* arg_key = syntax == ToolSyntax::kLlama3 ? "parameters" : "arguments";
  ojson alts = ojson::array();
  for (size_t i = 0; i < tools.names.size(); ++i) {
    if (tools.choice == ToolChoice::kNamed && tools.names[i] != tools.named) continue;
    ojson props = ojson::object();
    props["name"] = ojson{{"const", tools.names[i]}};
    props[arg_key] = tools.parameters[i];
    alts.push_back(ojson{{"type", "object"}, {"properties", props}, {"required", ojson::array({"name", arg_key})}});
  }
  grammar::ConstraintSpec s;
  s.kind = grammar::ConstraintKind::kJsonSchema;
  s.text = alts.size() == 1 ? alts[0].dump() : ojson{{"anyOf", alts}}.dump();
  if (syntax == ToolSyntax::kHermes) {
    s.prefix = std::string(kHermesOpen) + "\n";
    s.suffix = "\n" + std::string(kHermesClose);
  } else if (syntax == ToolSyntax::kMistral) {
    s.prefix = std::string(kMistralOpen) + "[";
    s.suffix = "]";
  }
  return s;
}

ToolParse parse_tool_calls(std::string_view text, const std::vector<std::string>& names) {
  ToolParse r;
  // Hermes / Qwen: any number of <tool_call>{..}</tool_call> blocks among text
  // (the closing tag may be cut by the end of generation).
  if (text.find(kHermesOpen) != std::string_view::npos) {
    std::string content;
    std::vector<ToolCall> calls;
    size_t pos = 0;
    bool ok = true;
    while (pos < text.size()) {
      const size_t open = text.find(kHermesOpen, pos);
      if (open == std::string_view::npos) {
        content.append(text.substr(pos));
        break;
      }
      content.append(text.substr(pos, open - pos));
      const size_t body = open + kHermesOpen.size();
      size_t close = text.find(kHermesClose, body);
      const size_t end = close == std::string_view::npos ? text.size() : close;
      std::string_view inner = trim(text.substr(body, end - body));
      size_t used = 0;
      auto cs = calls_at(inner, names, &used);
      if (cs.empty() || used != inner.size()) {
        ok = false;
        break;
      }
      calls.insert(calls.end(), cs.begin(), cs.end());
      pos = close == std::string_view::npos ? text.size() : close + kHermesClose.size();
    }
    if (ok && !calls.empty()) {
      r.content = std::string(trim(content));
      r.calls = std::move(calls);
      return r;
    }
  }
  // Mistral: text, then [TOOL_CALLS] and a JSON array (or object) of calls.
  if (size_t m = text.find(kMistralOpen); m != std::string_view::npos) {
    std::string_view rest = trim(text.substr(m + kMistralOpen.size()));
    size_t used = 0;
    auto cs = calls_at(rest, names, &used);
    if (!cs.empty() && trim(rest.substr(used)).empty()) {
      r.content = std::string(trim(text.substr(0, m)));
      r.calls = std::move(cs);
      return r;
    }
  }
  // Llama 3.x / bare JSON: the whole output is one or more call objects
  // (optionally after <|python_tag|>, separated by ';' or ','), nothing else.
  std::string_view t = trim(text);
  if (t.substr(0, kPythonTag.size()) == kPythonTag) t = trim(t.substr(kPythonTag.size()));
  std::vector<ToolCall> calls;
  while (!t.empty()) {
    size_t used = 0;
    auto cs = calls_at(t, names, &used);
    if (cs.empty()) {
      calls.clear();
      break;
    }
    calls.insert(calls.end(), cs.begin(), cs.end());
    t = trim(t.substr(used));
    if (!t.empty() && (t[0] == ';' || t[0] == ',')) t = trim(t.substr(1));
  }
  if (!calls.empty()) {
    r.calls = std::move(calls);
    return r;
  }
  r.content = std::string(text);
  return r;
}

bool may_be_tool_call(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty()) return true;
  for (std::string_view open : {kHermesOpen, kMistralOpen, kPythonTag, std::string_view("{"), std::string_view("[{")}) {
    const size_t n = std::min(open.size(), t.size());
    if (t.substr(0, n) == open.substr(0, n)) return true;
  }
  return false;
}

}  // namespace pagoda::server
