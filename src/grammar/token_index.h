// The vocabulary as a byte trie, built once per tokenizer and shared by every
// grammar and request (immutable after create).
//
// Nodes are stored in preorder, so a walk that rejects a node skips its whole
// subtree by jumping to node.end, and all tokens sharing a prefix are advanced
// over that prefix once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::tok {
class Tokenizer;
}

namespace pagoda::grammar {

class TokenIndex {
 public:
  struct Node {
    uint32_t end = 0;        // one past the last node of this subtree (preorder)
    uint32_t tok_begin = 0;  // tokens whose bytes end here: tokens()[tok_begin, tok_begin + tok_count)
    uint32_t tok_count = 0;
    uint16_t depth = 0;      // bytes from the root (root = 0)
    uint8_t byte = 0;        // the byte on the edge into this node
  };

  // Token bytes from tok::Tokenizer::token_to_piece (byte-level BPE bytes,
  // SentencePiece "▁" as space, <0xNN> byte-fallback tokens as their byte).
  // Control tokens (empty pieces) are never allowed by a mask, except the
  // end-of-generation tokens, which are allowed exactly when the grammar can end.
  static Expected<std::shared_ptr<const TokenIndex>> from_tokenizer(const tok::Tokenizer& tk);
  // From raw token byte strings (tests, tools). eog ids must be in range.
  static Expected<std::shared_ptr<const TokenIndex>> create(std::vector<std::string> token_bytes,
                                                            std::vector<int32_t> eog_ids);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  // uint32 words of a mask: bit (id % 32) of word id / 32 is token id.
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& token_bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_eog(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < eog_.size() && eog_[static_cast<size_t>(id)];
  }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  const std::vector<Node>& nodes() const { return nodes_; }      // [0] is the root
  const std::vector<int32_t>& tokens() const { return tokens_; }  // ids grouped by node
  size_t max_token_bytes() const { return max_len_; }

 private:
  std::vector<std::string> bytes_;  // [vocab]
  std::vector<uint8_t> eog_;        // [vocab]
  std::vector<int32_t> eog_ids_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  size_t max_len_ = 0;
};

}  // namespace pagoda::grammar
