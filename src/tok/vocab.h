// The tokenizer vocabulary as stored in GGUF metadata (tokenizer.ggml.*), with
// llama.cpp's defaults applied for keys that are absent.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::gguf {
class GgufFile;
}

namespace pagoda::tok {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // BOS/EOS/chat markers: matched in text only when parse_special
  kUserDefined = 4,  // always matched in text before the model's own splitting
  kUnused = 5,
  kByte = 6,         // SentencePiece byte fallback <0xNN>
};

enum class VocabKind {
  kSpm,  // tokenizer.ggml.model = "llama": SentencePiece-style, merge by score
  kBpe,  // tokenizer.ggml.model = "gpt2": byte-level BPE with merge ranks
};

struct Vocab {
  VocabKind kind = VocabKind::kSpm;
  std::string model;                 // tokenizer.ggml.model
  std::string pre;                   // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;   // [n_vocab] token text (SPM uses U+2581 for space)
  std::vector<float> scores;         // [n_vocab] or empty (all 0)
  std::vector<TokenType> types;      // [n_vocab]
  std::vector<std::string> merges;   // BPE only: "left right", rank = index
  TokenId bos_id = kNoToken;
  TokenId eos_id = kNoToken;
  TokenId eot_id = kNoToken;         // explicit key, else found by text (<|im_end|>, ...)
  TokenId eom_id = kNoToken;
  TokenId unk_id = kNoToken;
  TokenId pad_id = kNoToken;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;     // SPM: prepend a space to each text fragment
  std::string chat_template;         // tokenizer.chat_template ("" when absent)
};

// Reads tokenizer.ggml.* and tokenizer.chat_template. Defaults follow llama.cpp:
// "llama": bos 1, eos 2, unk 0, add_bos true, add_space_prefix true;
// "gpt2": add_bos false (true for pre llama3/llama-bpe), add_space_prefix false.
// Special-token ids outside the vocabulary (e.g. 0xFFFFFFFF) mean "none".
// Errors: missing tokens, unknown model, array lengths that disagree, duplicates.
Expected<Vocab> vocab_from_gguf(const gguf::GgufFile& file);

// Checks sizes and ids and fills eot_id by text when missing. vocab_from_gguf
// calls it; call it yourself on a Vocab built by hand.
Status finalize_vocab(Vocab& vocab);

}  // namespace pagoda::tok
