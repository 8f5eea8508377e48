#include "server/text.h"

#include "tok/tokenizer.h"

namespace pagoda::server {

Expected<std::unique_ptr<TextCodec>> TextCodec::create(const tok::Tokenizer& source) {
  std::unique_ptr<TextCodec> c(new TextCodec());
  PAGODA_ASSIGN_OR_RETURN(c->tok_, tok::Tokenizer::create(source.vocab()));
  auto tmpl = tok::ChatTemplate::from_tokenizer(*c->tok_);
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
                                                      bool parse_special_in_content) const {
  if (!template_) return make_error("this model has no usable chat template: " + template_error_);
  PAGODA_ASSIGN_OR_RETURN(std::string text, template_->render(messages, /*add_generation_prompt=*/true));
  // The template writes BOS itself where the family wants it, hence add_special off.
  // parse_special is on for the whole text: its markers must become control tokens.
  // Content spans are not known here yet (see the header), so the flag cannot narrow it.
  (void)parse_special_in_content;
  return tok_->encode(text, /*add_special=*/false, /*parse_special=*/true);
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const { return tok_->decode(ids); }

}  // namespace pagoda::server
