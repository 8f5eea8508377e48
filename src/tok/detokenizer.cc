#include "tok/detokenizer.h"

#include "tok/unicode.h"

namespace pagoda::tok {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, DetokenizerOptions opts)
    : tok_(&tok), opts_(opts), strip_(opts.at_sequence_start && tok.adds_space_prefix()) {}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string_view piece = tok_->token_to_piece(id, opts_.render_special);
  if (strip_ && !tok_->is_control(id) && !piece.empty()) {
    strip_ = false;
    if (piece[0] == ' ') piece.remove_prefix(1);
  }
  pending_.append(piece);
  const size_t hold = utf8_incomplete_tail(pending_);
  const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - hold);
  std::string out = utf8_sanitize(ready);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace pagoda::tok
