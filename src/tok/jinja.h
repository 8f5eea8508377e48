// An in-project Jinja interpreter for chat templates (the text in a GGUF's
// tokenizer.chat_template), matching Python jinja2 as Hugging Face configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF's
// tojson / raise_exception / strftime_now).
//
// Templates are untrusted input: there is no file or environment access; the
// parser bounds nesting depth; rendering bounds steps, wall time, macro recursion,
// output size and live memory (strings and lists), and every violation is an
// error. Attributes starting with '_' are refused; lists and dicts cannot be
// modified in place (as in jinja2's immutable sandbox).
//
// Rendering returns the text and the byte spans that came from tainted input
// strings (message content), see jinja_value.h.
//
// Thread-safety: a Template is immutable after parse(); render() may run
// concurrently on one Template.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "tok/jinja_value.h"

namespace pagoda::tok::jinja {

struct Node;

struct Limits {
  int max_parse_depth = 100;               // nested blocks and expression levels
  int max_call_depth = 64;                 // macro recursion
  int64_t max_steps = 5'000'000;           // evaluated nodes and loop iterations
  double max_seconds = 0.5;                // wall clock per render
  size_t max_output_bytes = 8u << 20;      // the rendered text (a 128K-token prompt is ~0.5 MiB)
  size_t max_memory_bytes = 16u << 20;     // live strings, lists and dicts
};

struct Rendered {
  std::string text;
  std::vector<Span> tainted;  // byte spans of text that came from tainted strings
};

// Globals of one render: a dict of name -> value (messages, bos_token...).
class Context {
 public:
  Context();
  void set(const std::string& name, Value v);
  const Value& vars() const { return vars_; }
  // Seconds since the epoch that strftime_now formats (UTC); default: now.
  std::time_t now = 0;

 private:
  Value vars_;
};

class Template {
 public:
  static Expected<Template> parse(std::string_view source, const Limits& limits = {});
  Expected<Rendered> render(const Context& ctx) const;

 private:
  std::shared_ptr<const Node> root_;
  Limits limits_;
};

// JSON -> Value, keeping object key order (use ordered_json: jinja2 sees dicts in
// the order the client wrote them). tainted: strings are marked as message content,
// except the values of keys listed in untainted_keys (e.g. "role").
// Errors: nesting deeper than 128 levels.
Expected<Value> from_json(const nlohmann::ordered_json& j, bool tainted,
                          const std::vector<std::string>& untainted_keys = {});

}  // namespace pagoda::tok::jinja
