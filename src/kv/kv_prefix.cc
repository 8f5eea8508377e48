// KvManager's prefix-cache walks: match_prefix (the one walk at admission),
// revalidate, the per-group hit rule (longest_hit) and the read-only views of
// what the cache holds for a token list (chain_keys, cached_blocks).
#include <algorithm>

#include "base/check.h"
#include "kv/kv_manager.h"

namespace pagoda::kv {

int32_t KvManager::longest_hit(int32_t k, const std::function<bool(int32_t, int32_t)>& missing) const {
  // A block missing at i rules out every j that needs it (j > i, and
  // first_needed(j) <= i since it only grows with j), so the search continues
  // at j = i.
  int32_t j = k;
  while (j > 0) {
    int32_t miss = -1;
    for (int32_t g = 1; g < num_groups() && miss < 0; ++g) {
      if (g == state_group_) continue;  // served by a checkpoint at the hit point (checkpoint_hit)
      const int32_t lo = first_needed_block(g, static_cast<int64_t>(j) * config_.block_size);
      for (int32_t i = j - 1; i >= lo; --i) {
        if (missing(g, i)) {
          miss = i;
          break;
        }
      }
    }
    if (miss < 0) break;
    j = miss;
  }
  return j;
}

PrefixMatch KvManager::match_prefix(std::span<const TokenId> tokens, std::string_view cache_salt) const {
  ++prefix_lookups_;
  PrefixMatch m;
  m.salt_.assign(cache_salt);
  m.num_query_tokens_ = static_cast<int64_t>(tokens.size());
  m.block_size_ = config_.block_size;
  m.owner_ = this;
  m.generation_ = generation_;
  m.tables_.assign(groups_.size(), {});
  m.table_entries_.assign(groups_.size(), {});
  if (!config_.enable_prefix_caching || tokens.empty()) return m;
  const size_t bs = static_cast<size_t>(config_.block_size);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // never the last token
  Hash128 parent{};
  EntryId parent_entry = kRootEntry;
  std::vector<BlockId> walked;  // group 0's blocks of the confirmed chain
  for (size_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    const Hash128 key = blocks_->cache.key(parent, block_tokens, cache_salt);
    const BlockId b = blocks_->cache.find(key, parent_entry, block_tokens, cache_salt);
    if (b == kNullBlock) {
      m.next_key_ = key;
      m.has_next_key_ = true;
      break;
    }
    walked.push_back(b);
    m.keys_.push_back(key);
    parent_entry = blocks_->cache.entry_of(b);
    m.entries_.push_back(parent_entry);
    parent = key;
  }
  // Group 0's chain is confirmed through k blocks; the other groups look up
  // their own block under each chain key, with group 0's entry as parent.
  const auto k = static_cast<int32_t>(m.keys_.size());
  const auto ng = groups_.size();
  m.tables_.assign(ng, std::vector<BlockId>(static_cast<size_t>(k), kNullBlock));
  m.table_entries_.assign(ng, std::vector<EntryId>(static_cast<size_t>(k), kNoEntry));
  m.tables_[0] = std::move(walked);
  m.table_entries_[0] = m.entries_;
  // Each (group, block) is looked up at most once.
  std::vector<std::vector<int8_t>> looked(ng, std::vector<int8_t>(static_cast<size_t>(k), 0));
  const std::function<bool(int32_t, int32_t)> missing = [&](int32_t g, int32_t i) {
    const auto ui = static_cast<size_t>(i);
    const auto ug = static_cast<size_t>(g);
    if (!looked[ug][ui]) {
      looked[ug][ui] = 1;
      const EntryId parent_e = i == 0 ? kRootEntry : m.entries_[ui - 1];
      const BlockId b = blocks_->cache.find(group_key(m.keys_[ui], g), parent_e, tokens.subspan(ui * bs, bs), cache_salt);
      m.tables_[ug][ui] = b;
      m.table_entries_[ug][ui] = b == kNullBlock ? kNoEntry : blocks_->cache.entry_of(b);
    }
    return m.tables_[ug][ui] == kNullBlock;
  };
  int32_t j = longest_hit(k, missing);
  if (state_group_ >= 0) j = checkpoint_hit(&m, j, tokens, missing);
  if (j < k) {
    m.next_key_ = m.keys_[static_cast<size_t>(j)];
    m.has_next_key_ = true;
  }
  truncate_match(&m, j);
  return m;
}

void KvManager::truncate_match(PrefixMatch* m, int32_t j) const {
  m->num_blocks_ = j;
  m->keys_.resize(static_cast<size_t>(j));
  m->entries_.resize(static_cast<size_t>(j));
  if (j == 0) {
    m->ckpt_blocks_.clear();
    m->ckpt_entries_.clear();
  }
  for (size_t g = 0; g < m->tables_.size(); ++g) {
    if (static_cast<int32_t>(g) == state_group_) {  // restored from the checkpoint, not adopted
      m->tables_[g].clear();
      m->table_entries_[g].clear();
      continue;
    }
    m->tables_[g].resize(static_cast<size_t>(j));
    m->table_entries_[g].resize(static_cast<size_t>(j));
    const int32_t lo = std::min(j, first_needed_block(static_cast<int32_t>(g), static_cast<int64_t>(j) * config_.block_size));
    for (int32_t i = 0; i < lo; ++i) {
      m->tables_[g][static_cast<size_t>(i)] = kNullBlock;
      m->table_entries_[g][static_cast<size_t>(i)] = kNoEntry;
    }
  }
}

bool KvManager::hit_valid(const PrefixMatch& m, int32_t j) const {
  for (size_t g = 0; g < m.tables_.size(); ++g) {
    if (static_cast<int32_t>(g) == state_group_) continue;  // the checkpoint (revalidate)
    const int32_t lo = first_needed_block(static_cast<int32_t>(g), static_cast<int64_t>(j) * config_.block_size);
    for (int32_t i = lo; i < j; ++i) {
      const BlockId b = m.tables_[g][static_cast<size_t>(i)];
      if (b == kNullBlock || blocks_->cache.entry_of(b) != m.table_entries_[g][static_cast<size_t>(i)]) return false;
    }
  }
  return true;
}

void KvManager::revalidate(PrefixMatch* match) const {
  PAGODA_CHECK_MSG(match->owner_ == this, "revalidate of a prefix match made by another KvManager");
  if (match->generation_ == generation_) return;
  // A block gone at i ends the hit at i or before; a window group may then
  // need blocks the match never looked up, which ends it earlier still.
  int32_t j = match->num_blocks_;
  for (size_t g = 0; g < match->tables_.size(); ++g) {
    for (int32_t i = 0; i < j; ++i) {
      const BlockId b = match->tables_[g][static_cast<size_t>(i)];
      if (b != kNullBlock && blocks_->cache.entry_of(b) != match->table_entries_[g][static_cast<size_t>(i)]) j = i;
    }
  }
  while (j > 0 && !hit_valid(*match, j)) --j;
  if (state_group_ >= 0 && j > 0) {
    // The hit must end at its checkpoint, all of whose blocks are still as matched;
    // an earlier checkpoint was never looked up, so any loss ends the hit at 0.
    bool whole = j == match->num_blocks_ && !match->ckpt_blocks_.empty();
    for (size_t i = 0; whole && i < match->ckpt_blocks_.size(); ++i)
      whole = blocks_->cache.entry_of(match->ckpt_blocks_[i]) == match->ckpt_entries_[i];
    if (!whole) j = 0;
  }
  if (j < match->num_blocks_) {
    // The hit ends before block j: its key is the next one to compute.
    match->next_key_ = match->keys_[static_cast<size_t>(j)];
    match->has_next_key_ = true;
    truncate_match(match, j);
  }
  match->generation_ = generation_;
}

std::vector<Hash128> KvManager::chain_keys(std::span<const TokenId> tokens, std::string_view cache_salt) const {
  std::vector<Hash128> keys;
  if (tokens.empty()) return keys;
  const size_t bs = static_cast<size_t>(config_.block_size);
  Hash128 parent{};
  for (size_t i = 0; i < (tokens.size() - 1) / bs; ++i) {
    parent = blocks_->cache.key(parent, tokens.subspan(i * bs, bs), cache_salt);
    keys.push_back(parent);
  }
  return keys;
}

std::vector<std::vector<int8_t>> KvManager::cached_blocks(std::span<const TokenId> tokens,
                                                          std::string_view cache_salt) const {
  const size_t bs = static_cast<size_t>(config_.block_size);
  const size_t n = tokens.empty() ? 0 : (tokens.size() - 1) / bs;
  std::vector<std::vector<int8_t>> held(groups_.size(), std::vector<int8_t>(n, 0));
  if (!config_.enable_prefix_caching) return held;
  Hash128 key{};
  EntryId parent = kRootEntry;
  for (size_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    key = blocks_->cache.key(key, block_tokens, cache_salt);
    const BlockId b = blocks_->cache.find(key, parent, block_tokens, cache_salt);
    if (b == kNullBlock) break;
    held[0][i] = 1;
    for (size_t g = 1; g < groups_.size(); ++g) {
      if (static_cast<int32_t>(g) == state_group_) {  // a checkpoint at the end of block i
        std::vector<BlockId> ckpt;
        held[g][i] = checkpoint_tokens_ > 0 && find_checkpoint_blocks(key, parent, block_tokens, cache_salt, &ckpt);
        continue;
      }
      held[g][i] = blocks_->cache.find(group_key(key, static_cast<int32_t>(g)), parent, block_tokens, cache_salt) != kNullBlock;
    }
    parent = blocks_->cache.entry_of(b);
  }
  return held;
}

}  // namespace pagoda::kv
