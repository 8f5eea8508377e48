// Tier import (issue 16): blocks loaded from a tier below RAM enter the prefix
// cache as cached-evictable blocks, group 0's chain first, then the window
// groups' blocks of the hit every group serves.
#include <algorithm>

#include "kv/kv_manager.h"

namespace pagoda::kv {

BlockId KvManager::import_one(const Hash128& key, EntryId parent, std::span<const TokenId> tokens,
                              std::string_view salt, const std::function<void(BlockId)>& fill,
                              const PrefixCache::ChainRef& ref) {
  if (blocks_->pool.num_free() <= watermark_blocks_) return kNullBlock;
  const BlockId b = blocks_->take();
  fill(b);
  const EntryId e = blocks_->cache.insert(b, key, parent, tokens, salt, &ref);
  if (e == kNoEntry || blocks_->cache.entry_of(b) != e) {  // refused (a collision): back to the pool, keyless
    blocks_->pool.decref(b);
    return kNullBlock;
  }
  return b;
}

int32_t KvManager::import_blocks(std::span<const TokenId> tokens, std::string_view cache_salt, int32_t num_blocks,
                                 const std::function<bool(int32_t, int32_t)>& loaded,
                                 const std::function<void(int32_t, int32_t, BlockId)>& fill,
                                 const std::function<void(int32_t, int32_t, BlockId)>& fill_checkpoint) {
  if (!config_.enable_prefix_caching || num_blocks <= 0 || tokens.empty()) return 0;
  ++generation_;
  const size_t bs = static_cast<size_t>(config_.block_size);
  const auto end = std::min(static_cast<size_t>(num_blocks), (tokens.size() - 1) / bs);
  const auto ng = groups_.size();
  std::vector<std::vector<BlockId>> pinned(ng);  // [group] held so that taking a block cannot evict them
  std::vector<Hash128> keys;
  std::vector<EntryId> entries;  // group 0's entry standing for the prefix through each block
  int32_t imported = 0;
  // Group 0: the chain, from the cache or imported.
  for (size_t i = 0; i < end; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    const Hash128 key = blocks_->cache.key(keys.empty() ? Hash128{} : keys.back(), block_tokens, cache_salt);
    const EntryId parent = entries.empty() ? kRootEntry : entries.back();
    const auto ii = static_cast<int32_t>(i);
    BlockId b = blocks_->cache.find(key, parent, block_tokens, cache_salt);
    if (b != kNullBlock) {
      blocks_->pool.incref(b);
    } else if (loaded(0, ii)) {
      const PrefixCache::ChainRef ref{0, key, keys.empty() ? Hash128{} : keys.back(), keys.empty()};
      b = import_one(key, parent, block_tokens, cache_salt, [&](BlockId blk) { fill(0, ii, blk); }, ref);
      if (b == kNullBlock) break;
      ++imported;
    } else {
      break;
    }
    pinned[0].push_back(b);
    keys.push_back(key);
    entries.push_back(blocks_->cache.entry_of(b));
  }
  // Window groups: the hit every group serves, then their blocks of it.
  auto find_g = [&](int32_t g, int32_t i) {
    const auto ui = static_cast<size_t>(i);
    return blocks_->cache.find(group_key(keys[ui], g), i == 0 ? kRootEntry : entries[ui - 1], tokens.subspan(ui * bs, bs),
                       cache_salt);
  };
  const auto window_missing = [&](int32_t g, int32_t i) { return find_g(g, i) == kNullBlock && !loaded(g, i); };
  int32_t h = longest_hit(static_cast<int32_t>(keys.size()), window_missing);
  // A recurrent state group: the hit ends at a checkpoint, cached (held from
  // here on: imports cannot evict it) or loaded (imported below).
  std::vector<BlockId> ckpt;  // the checkpoint's blocks held during the call
  bool ckpt_loaded = false;
  if (state_group_ >= 0) {
    const int32_t K = config_.state_checkpoint_interval;
    int32_t c = h - h % K;
    for (; c > 0; c -= K) {
      const auto last = static_cast<size_t>(c - 1);
      const EntryId parent = last == 0 ? kRootEntry : entries[last - 1];
      const bool cached = find_checkpoint_blocks(keys[last], parent, tokens.subspan(last * bs, bs), cache_salt, &ckpt);
      ckpt_loaded = !cached && fill_checkpoint && loaded(state_group_, c - 1);
      if ((cached || ckpt_loaded) && longest_hit(c, window_missing) == c) {
        if (cached) {
          for (BlockId b : ckpt) blocks_->pool.incref(b);
        }
        break;
      }
      ckpt.clear();
      ckpt_loaded = false;
    }
    h = c;
  }
  for (int32_t g = 1; g < num_groups(); ++g) {  // pin what the cache has first: imports cannot evict it then
    if (g == state_group_) continue;  // no blocks of its own: the checkpoint (above)
    auto& table = pinned[static_cast<size_t>(g)];
    table.assign(static_cast<size_t>(h), kNullBlock);
    for (int32_t i = first_needed_block(g, static_cast<int64_t>(h) * config_.block_size); i < h; ++i) {
      const BlockId b = find_g(g, i);
      if (b != kNullBlock) blocks_->pool.incref(b);
      table[static_cast<size_t>(i)] = b;
    }
  }
  for (int32_t g = 1; g < num_groups(); ++g) {
    if (g == state_group_) continue;
    auto& table = pinned[static_cast<size_t>(g)];
    for (int32_t i = first_needed_block(g, static_cast<int64_t>(h) * config_.block_size); i < h; ++i) {
      const auto ui = static_cast<size_t>(i);
      if (table[ui] != kNullBlock) continue;
      const BlockId b = import_one(group_key(keys[ui], g), i == 0 ? kRootEntry : entries[ui - 1],
                                   tokens.subspan(ui * bs, bs), cache_salt, [&](BlockId blk) { fill(g, i, blk); },
                                   PrefixCache::ChainRef{g, keys[ui], i == 0 ? Hash128{} : keys[ui - 1], i == 0});
      if (b == kNullBlock) break;
      table[ui] = b;
      ++imported;
    }
  }
  if (ckpt_loaded) {
    const auto last = static_cast<size_t>(h - 1);
    ckpt.clear();
    if (import_checkpoint(keys[last], last == 0 ? nullptr : &keys[last - 1], last == 0 ? kRootEntry : entries[last - 1],
                          tokens.subspan(last * bs, bs), cache_salt,
                          [&](int32_t part, BlockId b) { fill_checkpoint(h - 1, part, b); }, &ckpt)) {
      imported += static_cast<int32_t>(ckpt.size());
    }
  }
  // The checkpoint first (evicted before the blocks it needs), then as free()
  // does: group 0 last, each group's last block first.
  for (BlockId b : ckpt) blocks_->pool.decref(b);
  for (size_t g = 1; g <= ng; ++g) {
    const auto& blocks = pinned[g % ng];
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (*it != kNullBlock) blocks_->pool.decref(*it);
    }
  }
  return imported;
}

}  // namespace pagoda::kv
