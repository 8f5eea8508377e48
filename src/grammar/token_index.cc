#include "grammar/token_index.h"

#include <algorithm>
#include <numeric>

#include "tok/tokenizer.h"

namespace pagoda::grammar {

Expected<std::shared_ptr<const TokenIndex>> TokenIndex::from_tokenizer(const tok::Tokenizer& tk) {
  std::vector<std::string> bytes(static_cast<size_t>(tk.vocab_size()));
  for (int32_t i = 0; i < tk.vocab_size(); ++i) bytes[static_cast<size_t>(i)] = tk.token_to_piece(i, false);
  return create(std::move(bytes), tk.eog_ids());
}

Expected<std::shared_ptr<const TokenIndex>> TokenIndex::create(std::vector<std::string> token_bytes,
                                                               std::vector<int32_t> eog_ids) {
  auto ti = std::make_shared<TokenIndex>();
  const size_t n = token_bytes.size();
  if (n == 0) return make_error("token index: empty vocabulary");
  if (n > (1u << 30)) return make_error("token index: vocabulary too large");
  ti->eog_.assign(n, 0);
  for (int32_t id : eog_ids) {
    if (id < 0 || static_cast<size_t>(id) >= n) return errorf("token index: eog id %d out of range", id);
    if (!ti->eog_[static_cast<size_t>(id)]) ti->eog_ids_.push_back(id);
    ti->eog_[static_cast<size_t>(id)] = 1;
  }
  ti->bytes_ = std::move(token_bytes);

  // Sort the maskable tokens by bytes; then a single pass with the path of open
  // nodes builds the trie in preorder.
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i)
    if (!ti->bytes_[i].empty() && !ti->eog_[i]) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return ti->bytes_[static_cast<size_t>(a)] < ti->bytes_[static_cast<size_t>(b)];
  });
  auto& nodes = ti->nodes_;
  nodes.push_back(Node{});
  std::vector<uint32_t> path{0};  // path[d] = node at depth d
  auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      nodes[path.back()].end = static_cast<uint32_t>(nodes.size());
      path.pop_back();
    }
  };
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = ti->bytes_[static_cast<size_t>(id)];
    if (s.size() > 0xFFFF) return errorf("token index: token %d longer than 65535 bytes", id);
    ti->max_len_ = std::max(ti->max_len_, s.size());
    size_t lcp = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), s.size());
      while (lcp < m && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    close_to(lcp);
    for (size_t d = lcp; d < s.size(); ++d) {
      Node nd;
      nd.depth = static_cast<uint16_t>(d + 1);
      nd.byte = static_cast<uint8_t>(s[d]);
      nd.tok_begin = static_cast<uint32_t>(ti->tokens_.size());
      path.push_back(static_cast<uint32_t>(nodes.size()));
      nodes.push_back(nd);
    }
    // Equal byte strings are adjacent in sorted order, so a node's tokens are
    // contiguous in tokens_.
    Node& leaf = nodes[path.back()];
    if (leaf.tok_count == 0) leaf.tok_begin = static_cast<uint32_t>(ti->tokens_.size());
    ti->tokens_.push_back(id);
    ++leaf.tok_count;
    prev = &s;
  }
  close_to(0);
  nodes[0].end = static_cast<uint32_t>(nodes.size());
  return std::shared_ptr<const TokenIndex>(std::move(ti));
}

}  // namespace pagoda::grammar
