#include "openai/text.h"

#include "tok/tokenizer.h"

namespace pagoda::server {

Expected<std::unique_ptr<TextCodec>> TextCodec::create(const tok::Tokenizer& source, const std::string& chat_template) {
  std::unique_ptr<TextCodec> c(new TextCodec());
  PAGODA_ASSIGN_OR_RETURN(c->tok_, tok::Tokenizer::create(source.vocab()));
  auto tmpl = chat_template.empty() ? tok::ChatTemplate::from_tokenizer(*c->tok_)
                                    : tok::ChatTemplate::from_source(*c->tok_, chat_template);
  c->tool_syntax_ = detect_tool_syntax(chat_template.empty() ? c->tok_->chat_template() : chat_template);
  if (tmpl.ok()) {
    c->template_.emplace(std::move(tmpl).value());
  } else {
    c->template_error_ = tmpl.message();
  }
  return c;
}

TextCodec::~TextCodec() = default;

std::vector<int32_t> TextCodec::encode_prompt(const std::string& text, bool add_special, bool parse_special) const {
  return tok_->encode(text, add_special, parse_special);
}

Expected<std::vector<int32_t>> TextCodec::encode_chat(const std::vector<tok::ChatMessage>& messages,
                                                      bool parse_special_in_content,
                                                      const nlohmann::ordered_json& tools,
                                                      bool add_generation_prompt) const {
  if (!template_) return make_error("this model has no usable chat template: " + template_error_);
  tok::ChatRenderOptions opts;
  opts.tools = tools;
  opts.add_generation_prompt = add_generation_prompt;
  PAGODA_ASSIGN_OR_RETURN(tok::RenderedPrompt p, template_->render_prompt(messages, opts));
  // The template's markers are control tokens; content spans are plain text unless asked.
  if (parse_special_in_content) p.content_spans.clear();
  return tok::encode_prompt(*tok_, p);
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const { return tok_->decode(ids); }

}  // namespace pagoda::server
