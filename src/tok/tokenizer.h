// Tokenizers built only from GGUF metadata: SentencePiece-style ("llama": merge the
// highest-scoring adjacent pair, byte fallback <0xNN>) and byte-level BPE ("gpt2":
// PCRE2 pre-split chosen by tokenizer.ggml.pre, then merges by rank). Output ids
// match llama.cpp's tokenizer on the same file.
//
// Special tokens: control and unknown tokens written in the text are recognised
// only when parse_special is true; user-defined tokens always are. Longer special
// tokens are matched first. Ordinary text never turns into a control token, even
// when merges would spell one (so user text cannot inject <|im_start|>).
//
// Thread-safety: a Tokenizer is immutable after create(); every method is const and
// may run concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tok/pretokenize.h"
#include "tok/vocab.h"

namespace pagoda::gguf {
class GgufFile;
}

namespace pagoda::tok {

// [begin, end) byte range of a text.
struct ByteSpan {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const ByteSpan&) const = default;
};

struct DecodeOptions {
  // Include the text of control/unknown tokens (e.g. "<|im_start|>", "<s>").
  bool render_special = false;
  // SPM vocabularies with add_space_prefix: the encoder put a space before the
  // first text fragment; drop one leading space of the first non-control token so
  // decode(encode(s)) == s. Turn off when decoding a continuation, not a whole
  // sequence.
  bool strip_leading_space = true;
};

class Tokenizer {
 public:
  static Expected<std::unique_ptr<Tokenizer>> create(Vocab vocab);
  static Expected<std::unique_ptr<Tokenizer>> from_gguf(const gguf::GgufFile& file);

  // add_special: prepend BOS / append EOS as the vocabulary's add_bos/add_eos say.
  // parse_special: recognise control tokens written in the text.
  std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special) const;
  // encode(text, add_special, /*parse_special=*/true), except that control and
  // unknown tokens are not recognised where their text overlaps one of the byte
  // spans in plain (sorted, disjoint): a rendered chat prompt's message content is
  // plain text, only the template's own markers become special tokens. Fragments
  // are not split at span boundaries, so text without control-token spellings
  // tokenizes exactly as with encode().
  std::vector<TokenId> encode_with_plain_spans(std::string_view text, std::span<const ByteSpan> plain,
                                               bool add_special) const;

  // The bytes one token stands for (may be part of a UTF-8 character). Control and
  // unknown tokens give "" unless render_special. Out-of-range ids give "".
  const std::string& token_to_piece(TokenId id, bool render_special = false) const;
  // Concatenated pieces; may contain bytes that are not valid UTF-8.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& opts = {}) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  VocabKind kind() const { return vocab_.kind; }
  TokenId bos_id() const { return vocab_.bos_id; }
  TokenId eos_id() const { return vocab_.eos_id; }
  TokenId eot_id() const { return vocab_.eot_id; }
  TokenId unk_id() const { return vocab_.unk_id; }
  TokenId pad_id() const { return vocab_.pad_id; }
  bool add_bos() const { return vocab_.add_bos; }
  bool add_eos() const { return vocab_.add_eos; }
  // End of generation: EOS, EOT, EOM and tokens such as <|im_end|>, <|endoftext|>,
  // <|eot_id|>, <end_of_turn>.
  bool is_eog(TokenId id) const;
  const std::vector<TokenId>& eog_ids() const { return eog_ids_; }
  // Control or unknown: hidden from decoded text by default.
  bool is_control(TokenId id) const;
  TokenType token_type(TokenId id) const;
  // Raw vocabulary text (SPM: U+2581 for space; BPE: GPT-2 byte-mapped). Precondition: valid id.
  const std::string& token_text(TokenId id) const { return vocab_.tokens[static_cast<size_t>(id)]; }
  // Id whose vocabulary text is exactly text, or kNoToken.
  TokenId find_token(std::string_view text) const;
  const Vocab& vocab() const { return vocab_; }
  const std::string& chat_template() const { return vocab_.chat_template; }
  // True when decode strips the space the SPM encoder prepends.
  bool adds_space_prefix() const { return vocab_.kind == VocabKind::kSpm && vocab_.add_space_prefix; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using TextMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  Tokenizer() = default;
  Status init();
  // Vocabulary lookup for ordinary text: never returns control/unknown/byte tokens.
  TokenId text_token(std::string_view text) const;
  std::vector<TokenId> encode_impl(std::string_view text, bool add_special, bool parse_special,
                                   std::span<const ByteSpan> plain) const;
  void encode_spm(std::string_view fragment, bool prefix_space, std::vector<TokenId>* out) const;
  void encode_bpe(std::string_view fragment, std::vector<TokenId>* out) const;
  void encode_bpe_word(std::string_view word, std::vector<TokenId>* out) const;

  Vocab vocab_;
  TextMap token_ids_;                  // text -> id, all tokens
  TextMap bpe_ranks_;                  // "left right" -> merge rank
  std::vector<TokenId> special_;       // matched before splitting, longest first
  std::vector<std::string> pieces_;          // [n_vocab] bytes, control -> ""
  std::vector<std::string> pieces_special_;  // [n_vocab] bytes, control -> its text
  std::vector<uint8_t> eog_;           // [n_vocab] 1 if end of generation
  std::vector<TokenId> eog_ids_;
  TokenId byte_tokens_[256] = {};      // SPM byte fallback ids (kNoToken if absent)
  PreTokenizer pretok_;                // BPE only
  bool ignore_merges_ = false;         // llama3: a word that is a token stays whole
};

}  // namespace pagoda::tok
