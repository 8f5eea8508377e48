#include "tok/chat_template.h"

#include <vector>

#include "tok/tokenizer.h"
#include "tok/unicode.h"

namespace pagoda::tok {

namespace {

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Python's str.isspace() for one code point.
bool py_isspace(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A)) return true;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The string literals of a Jinja template, unescaped like Python literals.
std::vector<std::string> string_literals(std::string_view src) {
  std::vector<std::string> out;
  for (size_t i = 0; i < src.size(); ++i) {
    const char q = src[i];
    if (q != '\'' && q != '"') continue;
    std::string lit;
    size_t j = i + 1;
    bool closed = false;
    for (; j < src.size(); ++j) {
      const char c = src[j];
      if (c == q) {
        closed = true;
        break;
      }
      if (c == '\\' && j + 1 < src.size()) {
        const char e = src[++j];
        switch (e) {
          case 'n': lit.push_back('\n'); break;
          case 't': lit.push_back('\t'); break;
          case 'r': lit.push_back('\r'); break;
          case '\\': case '\'': case '"': lit.push_back(e); break;
          default: lit.push_back('\\'); lit.push_back(e); break;
        }
        continue;
      }
      lit.push_back(c);
    }
    if (!closed) break;
    out.push_back(std::move(lit));
    i = j;
  }
  return out;
}

Status check_role(const ChatMessage& m, size_t index) {
  if (m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool") {
    return Status::Ok();
  }
  return errorf("chat template: message %zu has unknown role '%s' (expected system, user, "
                "assistant or tool)", index, m.role.c_str());
}

}  // namespace

std::string py_strip(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t len = utf8_valid_len(s, begin);
    if (len == 0 || !py_isspace(utf8_decode(s, begin, len))) break;
    begin += len;
  }
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) {
      --start;
    }
    const size_t len = utf8_valid_len(s, start);
    if (len != end - start || !py_isspace(utf8_decode(s, start, len))) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

Expected<ChatTemplate> ChatTemplate::parse(std::string_view src, std::string bos_token,
                                           std::string eos_token) {
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  if (src.empty()) return make_error("chat template: the model has no tokenizer.chat_template");
  t.writes_bos_ = contains(src, "bos_token");
  if (contains(src, "<|im_start|>")) {
    t.kind_ = ChatTemplateKind::kChatML;
    for (std::string& lit : string_literals(src)) {
      if (lit.rfind("<|im_start|>system", 0) == 0 && contains(lit, "<|im_end|>") &&
          lit.size() > std::string_view("<|im_start|>system\n<|im_end|>").size()) {
        t.default_system_ = std::move(lit);
        break;
      }
    }
    return t;
  }
  if (contains(src, "<|start_header_id|>")) {
    if (contains(src, "Cutting Knowledge Date") || contains(src, "tools")) {
      return make_error("chat template: Llama-3.1+ style template (date/tools header) is not "
                    "supported; only the Llama-3.0 template is");
    }
    t.kind_ = ChatTemplateKind::kLlama3;
    return t;
  }
  if (contains(src, "<start_of_turn>")) {
    t.kind_ = ChatTemplateKind::kGemma;
    t.gemma_system_prefix_ = contains(src, "first_user_prefix");
    return t;
  }
  if (contains(src, "[INST]") && contains(src, "<<SYS>>") &&
      contains(src, "bos_token + '[INST] ' + content.strip() + ' [/INST]'")) {
    t.kind_ = ChatTemplateKind::kLlama2;
    return t;
  }
  return errorf("chat template: unknown template family (known: ChatML, Llama-2, Llama-3, "
                "Gemma); template starts with: %.80s",
                std::string(src.substr(0, 80)).c_str());
}

Expected<ChatTemplate> ChatTemplate::from_tokenizer(const Tokenizer& tok) {
  auto text = [&](TokenId id) { return id == kNoToken ? std::string() : tok.token_text(id); };
  return parse(tok.chat_template(), text(tok.bos_id()), text(tok.eos_id()));
}

const char* ChatTemplate::name() const {
  switch (kind_) {
    case ChatTemplateKind::kChatML: return "chatml";
    case ChatTemplateKind::kLlama2: return "llama2";
    case ChatTemplateKind::kLlama3: return "llama3";
    case ChatTemplateKind::kGemma: return "gemma";
  }
  return "?";
}

Expected<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                           bool add_generation_prompt) const {
  if (messages.empty()) return make_error("chat template: no messages");
  for (size_t i = 0; i < messages.size(); ++i) PAGODA_TRY(check_role(messages[i], i));
  switch (kind_) {
    case ChatTemplateKind::kChatML: return render_chatml(messages, add_generation_prompt);
    case ChatTemplateKind::kLlama2: return render_llama2(messages);
    case ChatTemplateKind::kLlama3: return render_llama3(messages, add_generation_prompt);
    case ChatTemplateKind::kGemma: return render_gemma(messages, add_generation_prompt);
  }
  return make_error("chat template: bad kind");
}

Expected<std::string> ChatTemplate::render_chatml(std::span<const ChatMessage> m, bool gen) const {
  std::string out;
  if (!default_system_.empty() && m[0].role != "system") out += default_system_;
  for (const ChatMessage& msg : m) {
    out.append("<|im_start|>").append(msg.role).append("\n").append(msg.content).append("<|im_end|>\n");
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

Expected<std::string> ChatTemplate::render_llama2(std::span<const ChatMessage> m) const {
  // {% if messages[0]['role'] == 'system' %} loop over messages[1:] {% endif %};
  // user turns: bos + '[INST] ' + content.strip() + ' [/INST]';
  // assistant turns: ' ' + content.strip() + ' ' + eos. No generation prompt.
  const bool has_system = m[0].role == "system";
  const std::span<const ChatMessage> loop = has_system ? m.subspan(1) : m;
  std::string out;
  for (size_t i = 0; i < loop.size(); ++i) {
    const ChatMessage& msg = loop[i];
    if (msg.role != "user" && msg.role != "assistant") {
      return errorf("chat template (llama2): role '%s' at message %zu is not supported; only a "
                    "first system message, then user/assistant", msg.role.c_str(),
                    i + (has_system ? 1 : 0));
    }
    if ((msg.role == "user") != (i % 2 == 0)) {
      return make_error("chat template (llama2): Conversation roles must alternate "
                    "user/assistant/user/assistant/...");
    }
    std::string content = msg.content;
    if (i == 0 && has_system) {
      content.clear();
      content.append("<<SYS>>\n").append(m[0].content).append("\n<</SYS>>\n\n").append(msg.content);
    }
    if (msg.role == "user") {
      out.append(bos_).append("[INST] ").append(py_strip(content)).append(" [/INST]");
    } else {
      out.append(" ").append(py_strip(content)).append(" ").append(eos_);
    }
  }
  return out;
}

Expected<std::string> ChatTemplate::render_llama3(std::span<const ChatMessage> m, bool gen) const {
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (i == 0 && writes_bos_) out += bos_;
    out.append("<|start_header_id|>").append(m[i].role).append("<|end_header_id|>\n\n");
    out.append(py_strip(m[i].content)).append("<|eot_id|>");
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

Expected<std::string> ChatTemplate::render_gemma(std::span<const ChatMessage> m, bool gen) const {
  std::string out = writes_bos_ ? bos_ : std::string();
  std::string first_user_prefix;
  std::span<const ChatMessage> loop = m;
  if (m[0].role == "system") {
    if (!gemma_system_prefix_) return make_error("chat template (gemma): System role not supported");
    first_user_prefix.append(m[0].content).append("\n\n");
    loop = m.subspan(1);
  }
  for (size_t i = 0; i < loop.size(); ++i) {
    const ChatMessage& msg = loop[i];
    if (msg.role != "user" && msg.role != "assistant") {
      return errorf("chat template (gemma): role '%s' is not supported (user/assistant only, "
                    "after an optional first system message)", msg.role.c_str());
    }
    if ((msg.role == "user") != (i % 2 == 0)) {
      return make_error("chat template (gemma): Conversation roles must alternate "
                    "user/assistant/user/assistant/...");
    }
    const char* role = msg.role == "assistant" ? "model" : "user";
    out.append("<start_of_turn>").append(role).append("\n");
    if (i == 0) out += first_user_prefix;
    out.append(py_strip(msg.content)).append("<end_of_turn>\n");
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace pagoda::tok
