// Chat templates: the GGUF's tokenizer.chat_template (Jinja) rendered by the
// in-project interpreter (tok/jinja.h) exactly as Hugging Face's
// apply_chat_template renders it with jinja2. The context is HF's: messages,
// tools (None when absent), documents (None), add_generation_prompt, bos_token,
// eos_token, plus raise_exception and strftime_now.
//
// Message content is untrusted text: rendering records the byte spans of the
// prompt that came from message fields (content, content parts, tool calls, tool
// definitions), and encode_prompt() tokenizes with control tokens recognised only
// outside them, so "<|im_end|>" typed by a user stays plain text.
//
// The rendered text includes BOS text when the template writes bos_token: encode
// it with add_special = false in that case.
//
// Thread-safety: immutable after parse(); render() may run concurrently.
#pragma once
#include <ctime>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tok/tokenizer.h"

namespace pagoda::tok {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"... (the template decides)
  std::string content;
  // Optional OpenAI-style fields (ordered_json: key order reaches the prompt); null/empty ones are not passed to the template.
  nlohmann::ordered_json content_parts = nullptr;  // array of {"type": "text", "text": ...}: replaces content
  nlohmann::ordered_json tool_calls = nullptr;     // array of {"type": "function", "function": {"name", "arguments"}}
  std::string tool_call_id = {};
  std::string name = {};
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;  // null: no tools (the template sees None)
  std::time_t now = 0;   // strftime_now's clock (UTC seconds); 0: the current time
};

struct RenderedPrompt {
  std::string text;
  std::vector<ByteSpan> content_spans;  // sorted byte spans of text taken from messages/tools
};

class ChatTemplate {
 public:
  // source: the Jinja text; bos/eos: the text of the BOS/EOS tokens ("<s>", "</s>").
  // Errors: empty source (with the advice to pass --chat-template), syntax errors
  // and unsupported constructs (named).
  static Expected<ChatTemplate> parse(std::string_view source, std::string bos_token,
                                      std::string eos_token);
  // The tokenizer's tokenizer.chat_template with its BOS/EOS token texts.
  static Expected<ChatTemplate> from_tokenizer(const Tokenizer& tok);
  // `source` (e.g. the file of --chat-template) instead of the model's own, with the
  // tokenizer's BOS/EOS token texts.
  static Expected<ChatTemplate> from_source(const Tokenizer& tok, std::string_view source);

  // The prompt text. Errors: no messages, anything the template raises
  // (raise_exception), template limits (see jinja::Limits).
  Expected<std::string> render(std::span<const ChatMessage> messages,
                               bool add_generation_prompt) const;
  Expected<RenderedPrompt> render_prompt(std::span<const ChatMessage> messages,
                                         const ChatRenderOptions& opts) const;
  // messages: a JSON array of message objects as the OpenAI API / HF take them.
  Expected<RenderedPrompt> render_json(const nlohmann::ordered_json& messages, const ChatRenderOptions& opts) const;

  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  ChatTemplate() = default;
  std::shared_ptr<const jinja::Template> tmpl_;
  std::string bos_;
  std::string eos_;
};

// Token ids of a rendered prompt: control tokens only outside content spans; BOS
// added (when the vocabulary adds one) unless the text already starts with it.
std::vector<TokenId> encode_prompt(const Tokenizer& tok, const RenderedPrompt& prompt);

// Python's str.strip() (Jinja's trim filter): removes leading and trailing
// Unicode whitespace.
std::string py_strip(std::string_view s);

}  // namespace pagoda::tok
