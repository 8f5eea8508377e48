// The server's own tokenizer and chat template: I/O and worker threads encode and
// decode through this object, never through the Engine (whose thread owns it).
// Immutable after create(); every method may run concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "openai/structured.h"
#include "tok/chat_template.h"

namespace pagoda::tok { class Tokenizer; }

namespace pagoda::server {

class TextCodec {
 public:
  // A private copy of `source`'s vocabulary; the chat template is parsed once here
  // (a model without a usable template still serves completions; chat then answers
  // 400 with the template's error).
  // chat_template: Jinja source that replaces the model's own ("" keeps it).
  static Expected<std::unique_ptr<TextCodec>> create(const tok::Tokenizer& source,
                                                     const std::string& chat_template = "");
  ~TextCodec();

  const tok::Tokenizer& tokenizer() const { return *tok_; }
  // Prompt text -> ids. add_special: BOS where the vocabulary adds it. parse_special:
  // control-token text in the prompt ("<|im_end|>") becomes the control token; off,
  // it is tokenized as the plain characters (user text cannot forge a turn).
  std::vector<int32_t> encode_prompt(const std::string& text, bool add_special, bool parse_special) const;
  // Messages -> ids through the chat template with the generation prompt. The
  // template's own markers are special tokens. parse_special_in_content: whether
  // control-token text inside message content is too (off: the rendered prompt's
  // content spans are tokenized as plain text, so a user cannot forge a turn).
  // tools: the request's `tools` list, passed to the template (null: none).
  // add_generation_prompt off: the conversation alone (a cache breakpoint's prefix).
  Expected<std::vector<int32_t>> encode_chat(const std::vector<tok::ChatMessage>& messages,
                                             bool parse_special_in_content,
                                             const nlohmann::ordered_json& tools = nullptr,
                                             bool add_generation_prompt = true) const;
  // How this model writes tool calls (from its chat template's text).
  ToolSyntax tool_syntax() const { return tool_syntax_; }
  std::string decode(const std::vector<int32_t>& ids) const;
  // Whether chat works, and why not ("" when it does).
  bool has_chat_template() const { return template_.has_value(); }
  const std::string& template_error() const { return template_error_; }

 private:
  TextCodec() = default;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::optional<tok::ChatTemplate> template_;
  std::string template_error_;  // why template_ is empty
  ToolSyntax tool_syntax_ = ToolSyntax::kJson;
};

}  // namespace pagoda::server
