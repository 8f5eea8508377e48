#include "tok/chat_template.h"

#include "tok/jinja.h"
#include "tok/unicode.h"

namespace pagoda::tok {

std::string py_strip(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t len = utf8_valid_len(s, begin);
    if (len == 0 || !jinja::py_isspace_cp(utf8_decode(s, begin, len))) break;
    begin += len;
  }
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) {
      --start;
    }
    const size_t len = utf8_valid_len(s, start);
    if (len != end - start || !jinja::py_isspace_cp(utf8_decode(s, start, len))) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

Expected<ChatTemplate> ChatTemplate::parse(std::string_view src, std::string bos_token,
                                           std::string eos_token) {
  if (src.empty()) {
    return make_error("chat template: the model has no tokenizer.chat_template; pass one with "
                      "--chat-template FILE");
  }
  auto t = jinja::Template::parse(src);
  if (!t.ok()) return make_error("chat template: " + t.message());
  ChatTemplate c;
  c.tmpl_ = std::make_shared<const jinja::Template>(std::move(t).value());
  c.bos_ = std::move(bos_token);
  c.eos_ = std::move(eos_token);
  return c;
}

Expected<ChatTemplate> ChatTemplate::from_tokenizer(const Tokenizer& tok) {
  return from_source(tok, tok.chat_template());
}

Expected<ChatTemplate> ChatTemplate::from_source(const Tokenizer& tok, std::string_view source) {
  auto text = [&](TokenId id) { return id == kNoToken ? std::string() : tok.token_text(id); };
  return parse(source, text(tok.bos_id()), text(tok.eos_id()));
}

Expected<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                           bool add_generation_prompt) const {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  PAGODA_ASSIGN_OR_RETURN(RenderedPrompt p, render_prompt(messages, o));
  return std::move(p.text);
}

Expected<RenderedPrompt> ChatTemplate::render_prompt(std::span<const ChatMessage> messages,
                                                     const ChatRenderOptions& opts) const {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["role"] = m.role;
    if (m.content_parts.is_array()) {
      j["content"] = m.content_parts;
    } else {
      j["content"] = m.content;
    }
    if (m.tool_calls.is_array()) j["tool_calls"] = m.tool_calls;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    arr.push_back(std::move(j));
  }
  return render_json(arr, opts);
}

Expected<RenderedPrompt> ChatTemplate::render_json(const nlohmann::ordered_json& messages,
                                                   const ChatRenderOptions& opts) const {
  if (!messages.is_array()) return make_error("chat template: messages must be a JSON array");
  if (messages.empty()) return make_error("chat template: no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return errorf("chat template: message %zu is not an object with a string 'role'", i);
    }
  }
  jinja::Context ctx;
  // Everything a client sends is tainted (plain text) except the roles, which the
  // template compares against its own literals.
  auto msgs = jinja::from_json(messages, /*tainted=*/true, {"role", "type"});
  if (!msgs.ok()) return make_error("chat template: messages: " + msgs.message());
  ctx.set("messages", std::move(msgs).value());
  if (opts.tools.is_null()) {
    ctx.set("tools", jinja::Value::none());
  } else {
    auto tools = jinja::from_json(opts.tools, true);
    if (!tools.ok()) return make_error("chat template: tools: " + tools.message());
    ctx.set("tools", std::move(tools).value());
  }
  ctx.set("documents", jinja::Value::none());
  ctx.set("add_generation_prompt", jinja::Value::boolean(opts.add_generation_prompt));
  ctx.set("bos_token", jinja::literal_str(bos_));
  ctx.set("eos_token", jinja::literal_str(eos_));
  if (opts.now != 0) ctx.now = opts.now;
  auto r = tmpl_->render(ctx);
  if (!r.ok()) return make_error("chat template: " + r.message());
  RenderedPrompt p;
  p.text = std::move(r->text);
  p.content_spans.reserve(r->tainted.size());
  for (const jinja::Span& s : r->tainted) p.content_spans.push_back({s.begin, s.end});
  return p;
}

std::vector<TokenId> encode_prompt(const Tokenizer& tok, const RenderedPrompt& prompt) {
  const std::string& bos = tok.bos_id() >= 0 ? tok.token_to_piece(tok.bos_id(), true) : std::string();
  const bool writes_bos = !bos.empty() && prompt.text.compare(0, bos.size(), bos) == 0;
  return tok.encode_with_plain_spans(prompt.text, prompt.content_spans, /*add_special=*/!writes_bos);
}

}  // namespace pagoda::tok
