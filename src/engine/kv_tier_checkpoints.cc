// KvTierLink's side of hybrid models' state checkpoints (issue 38; the design:
// kv/state_checkpoint.cc, engine/kv_tiers.h): their write-through as entries
// of kind kCheckpoint and the choice of the checkpoint a tier hit ends at.
#include <string>

#include "engine/kv_tiers.h"
#include "kv/kv_manager.h"
#include "runtime/kv_storage.h"

namespace pagoda::engine {

void KvTierLink::store_checkpoints() {
  const kv::PrefixCache& cache = kv_->cache();
  std::string block, bytes;
  for (const kv::KvManager::CommittedCheckpoint& cc : kv_->take_committed_checkpoints()) {
    // Flushed (copied) just before; still as made unless reused since (never
    // between a step's flush and this call, but a changed block is skipped).
    bool intact = true;
    for (size_t i = 0; i < cc.blocks.size() && intact; ++i)
      intact = cache.contains(cc.blocks[i]) && cache.entry_of(cc.blocks[i]) == cc.entries[i];
    if (!intact) continue;
    bytes.clear();
    for (kv::BlockId b : cc.blocks) {
      storage_->export_block(b, &block);
      bytes += block;
    }
    // Not announced (KV events): only K/V blocks are.
    const tier::TierKey key = key_for(cc.key, cc.salt, state_group_, tier::TierKey::kCheckpoint);
    tiers_->store(key, cc.tokens, bytes, cc.root ? nullptr : &cc.parent);
    stored(key);
  }
}

size_t KvTierLink::store_pinned_checkpoint(std::span<const kv::BlockId> blocks, std::span<const kv::EntryId> entries,
                                           size_t i, const Hash128* parent, uint64_t expiry) {
  const kv::PrefixCache& cache = kv_->cache();
  const kv::BlockId head = blocks[i];
  size_t end = i;
  bool intact = true;
  while (end < blocks.size() && cache.contains(blocks[end]) && cache.group_of(blocks[end]) == state_group_) {
    intact = intact && cache.entry_of(blocks[end]) == entries[end];
    ++end;
  }
  if (!intact || end == i) return end == i ? i + 1 : end;  // released and reused since
  // As store_checkpoints: keyed by the boundary block's chain, with its tokens and parent.
  const tier::TierKey key =
      key_for(cache.chain_of(head), std::string(cache.salt_of(head)), state_group_, tier::TierKey::kCheckpoint);
  const std::string name = codec_->name(key);
  auto it = pin_sent_.find(name);
  if (it == pin_sent_.end()) {
    std::string block, bytes;
    for (size_t j = i; j < end; ++j) {
      storage_->export_block(blocks[j], &block);
      bytes += block;
    }
    tiers_->store(key, cache.tokens_of(head), bytes, parent, expiry);  // not announced: only K/V blocks are
    stored(key);
    pin_sent_[name] = expiry;
  } else if (expiry >= it->second + 1000) {
    tiers_->renew(name, expiry);
    it->second = expiry;
  }
  return end;
}

int32_t KvTierLink::checkpoint_hit(Wait& w, int32_t h, const std::function<bool(int32_t, int32_t)>& missing) {
  const auto sg = static_cast<size_t>(state_group_);
  // From the latest boundary down; the RAM hit (w.first) ends at a checkpoint
  // RAM held, or is 0.
  for (int32_t c = h - h % ckpt_interval_; c > w.first; c -= ckpt_interval_) {
    const int32_t j = c - 1 - w.first;  // the checkpoint at the end of block c - 1
    int8_t& s = w.state[sg][static_cast<size_t>(j)];
    if (s == kMiss) continue;
    if (s == kUnasked) request(w, state_group_, j);
    if (s == kPending) return -1;
    if (!windows_ready(w, c)) return -1;  // kHit or kRam: the window groups' blocks c needs
    if (kv_->longest_hit(c, missing) == c) return c;
  }
  return w.first;
}

}  // namespace pagoda::engine
