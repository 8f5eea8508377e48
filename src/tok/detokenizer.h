// Streaming detokenizer: fed one token id at a time, returns only complete UTF-8
// text. Bytes that may still become a character (a multi-byte sequence split over
// byte tokens) are held back until the rest arrives; bytes that can never be valid
// UTF-8 come out as U+FFFD, so every returned string is valid UTF-8 (safe for JSON).
//
// Thread-safety: one instance per sequence; the Tokenizer must outlive it.
#pragma once
#include <string>

#include "tok/tokenizer.h"

namespace pagoda::tok {

struct DetokenizerOptions {
  bool render_special = false;  // include control-token text such as "<|im_end|>"
  // True when the first token fed starts the sequence (e.g. BOS, then the prompt):
  // for SPM vocabularies with add_space_prefix the leading space of the first text
  // token is dropped, as in Tokenizer::decode. False for a continuation (the
  // generated tokens after a prompt), whose first space is real.
  bool at_sequence_start = false;
};

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, DetokenizerOptions opts = {});

  // Returns the text completed by this token (possibly empty).
  std::string push(TokenId id);
  // End of stream: returns held-back bytes, each replaced by U+FFFD.
  std::string flush();
  // Bytes held back, waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  DetokenizerOptions opts_;
  bool strip_ = false;
  std::string pending_;
};

}  // namespace pagoda::tok
