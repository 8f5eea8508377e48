#include "server/text.h"

#include "tok/chat_template.h"
#include "tok/tokenizer.h"

namespace pagoda::server {

std::vector<int32_t> encode_prompt(const tok::Tokenizer& t, const std::string& text, bool add_special) {
  return t.encode(text, add_special, /*parse_special=*/true);
}

Expected<std::vector<int32_t>> encode_chat(const tok::Tokenizer& t, const std::vector<ChatMessage>& messages) {
  PAGODA_ASSIGN_OR_RETURN(tok::ChatTemplate tmpl, tok::ChatTemplate::from_tokenizer(t));
  std::vector<tok::ChatMessage> msgs;
  msgs.reserve(messages.size());
  for (const auto& m : messages) msgs.push_back({m.role, m.content});
  PAGODA_ASSIGN_OR_RETURN(std::string text, tmpl.render(msgs, /*add_generation_prompt=*/true));
  // The template writes BOS itself where the family wants it.
  return t.encode(text, /*add_special=*/false, /*parse_special=*/true);
}

std::string token_piece(const tok::Tokenizer& t, int32_t id) { return t.token_to_piece(id); }

std::string decode_tokens(const tok::Tokenizer& t, const std::vector<int32_t>& ids) { return t.decode(ids); }

}  // namespace pagoda::server
