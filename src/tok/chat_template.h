// Chat templates: the GGUF's tokenizer.chat_template (Jinja) is classified into a
// known family and rendered by hand-written code that produces exactly what the
// Jinja template produces for plain {role, content} messages (no tools, no
// images). A template of no known family is an error, never a guess.
//
// Families:
//   kChatML  "<|im_start|>role\ncontent<|im_end|>\n" (SmolLM2, Qwen, Hermes). A
//            complete default system block written in the template (SmolLM2: "You
//            are a helpful AI assistant named SmolLM, ...") is injected when the
//            first message is not a system message.
//   kLlama2  "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>"; roles
//            must alternate user/assistant after an optional first system message.
//   kLlama3  "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>", BOS first,
//            content trimmed (the Llama-3.0 template; 3.1+ date/tools headers are
//            rejected as unknown).
//   kGemma   "<start_of_turn>user\n...<end_of_turn>\n", assistant -> "model", content
//            trimmed; a system message is an error (Gemma 1/2) or is prepended to
//            the first user turn (Gemma 3 templates with first_user_prefix).
// The rendered text includes BOS text when the template writes bos_token: encode
// it with parse_special = true and add_special = false in that case.
//
// Thread-safety: immutable after parse(); render() may run concurrently.
#pragma once
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace pagoda::tok {

class Tokenizer;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;
};

enum class ChatTemplateKind { kChatML, kLlama2, kLlama3, kGemma };

class ChatTemplate {
 public:
  // source: the Jinja text; bos/eos: the text of the BOS/EOS tokens ("<s>", "</s>").
  static Expected<ChatTemplate> parse(std::string_view source, std::string bos_token,
                                      std::string eos_token);
  // The tokenizer's tokenizer.chat_template with its BOS/EOS token texts.
  static Expected<ChatTemplate> from_tokenizer(const Tokenizer& tok);

  ChatTemplateKind kind() const { return kind_; }
  const char* name() const;
  // Errors: no messages, unknown role, a role the family cannot express, roles
  // not alternating where the template raises an exception.
  Expected<std::string> render(std::span<const ChatMessage> messages,
                               bool add_generation_prompt) const;
  // The ChatML system block injected when no system message is given ("" if none).
  const std::string& default_system_block() const { return default_system_; }

 private:
  ChatTemplate() = default;
  Expected<std::string> render_chatml(std::span<const ChatMessage> m, bool gen) const;
  Expected<std::string> render_llama2(std::span<const ChatMessage> m) const;
  Expected<std::string> render_llama3(std::span<const ChatMessage> m, bool gen) const;
  Expected<std::string> render_gemma(std::span<const ChatMessage> m, bool gen) const;

  ChatTemplateKind kind_ = ChatTemplateKind::kChatML;
  std::string bos_;
  std::string eos_;
  std::string default_system_;   // ChatML
  bool gemma_system_prefix_ = false;
  bool writes_bos_ = false;      // the template writes bos_token
};

// Python's str.strip() (Jinja's trim filter): removes leading and trailing
// Unicode whitespace.
std::string py_strip(std::string_view s);

}  // namespace pagoda::tok
