// Structured outputs and tool calling on the OpenAI API (issue 18): the request
// fields that constrain the output (response_format, vLLM's guided_json /
// guided_regex / guided_choice, tools + tool_choice) and the parsing of tool
// calls out of model text. Pure functions over JSON and text; the grammar is
// compiled (and cached) by the server, the constraint applied by the engine.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/cache.h"

namespace pagoda::server {

struct ApiError;

// How a model writes a tool call (detected from its chat template).
enum class ToolSyntax {
  kJson,     // no known syntax: a bare {"name": .., "arguments": {..}}
  kHermes,   // Hermes / Qwen: <tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>
  kLlama3,   // Llama 3.x: {"name": .., "parameters": {..}}
  kMistral,  // Mistral: [TOOL_CALLS][{"name": .., "arguments": {..}}]
};
ToolSyntax detect_tool_syntax(std::string_view chat_template_source);
const char* tool_syntax_name(ToolSyntax s);

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolSetup {
  nlohmann::ordered_json tools;            // the request's `tools` (null: none), for the template
  std::vector<std::string> names;          // declared function names
  std::vector<nlohmann::ordered_json> parameters;  // [names] each function's parameters schema
  ToolChoice choice = ToolChoice::kNone;
  std::string named;                       // kNamed: the function
  bool active() const { return !names.empty() && choice != ToolChoice::kNone; }
};

// What a request asks of its output, parsed from the body.
struct OutputConstraint {
  grammar::ConstraintSpec spec;  // empty: unconstrained (or auto tools: parsed after)
  ToolSetup tools;
};

// Parses response_format, guided_json, guided_regex, guided_choice, tools and
// tool_choice (at most one of the output constraints; tools only on chat).
// Shape errors only: the schema itself is checked when compiled. raw: the body
// text, parsed again (only when one of these fields is present) keeping key order.
std::optional<ApiError> parse_output_constraint(const nlohmann::json& body, bool chat, const std::string& raw,
                                                OutputConstraint* out);
// The grammar of a forced call (tool_choice required or named) in `syntax`.
grammar::ConstraintSpec tool_call_spec(const ToolSetup& tools, ToolSyntax syntax);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};
struct ToolParse {
  std::string content;           // text outside the calls (trimmed)
  std::vector<ToolCall> calls;   // empty: no call found (content is the whole text)
};
// Finds tool calls in model text in any of the supported syntaxes. Only calls
// naming a declared function count (known_names empty: any name).
ToolParse parse_tool_calls(std::string_view text, const std::vector<std::string>& known_names);
// Could `text` (the output so far) still turn out to be a tool call? Streaming
// holds such text back instead of sending it as content.
bool may_be_tool_call(std::string_view text);

}  // namespace pagoda::server
