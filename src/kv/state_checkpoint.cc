// Recurrent-state checkpoints (issue 38): prefix hits for hybrid models.
//
// A recurrent state (kv/recurrent_state_group.cc) is valid only at its own
// length, so cached K/V blocks alone cannot serve a prefix hit: the hit also
// needs the state as it was at the end of the prefix. As vLLM's "align" mode
// and llama.cpp's context checkpoints, the KvManager keeps copies of it:
//   - at every block boundary that is a multiple of
//     KvConfig::state_checkpoint_interval (K) blocks, mark_computed takes S
//     blocks of the ONE pool (S = the state group's blocks per sequence) and
//     commits them to the prefix cache under checkpoint_key(chain key of the
//     block ending at the boundary, i), parented on group 0's entry of the
//     block before it and verified by that block's tokens and salt, exactly
//     as a prefix block (so a checkpoint is found only after the very prefix
//     it was taken at). The copy of the state into them is the runner's:
//     flush_checkpoints hands the (state block, checkpoint block) pairs over
//     right after the step and then releases both, the checkpoint's blocks as
//     cached-evictable: they are evicted LRU like any cached block, before a
//     running sequence is ever preempted (the free queue goes first), and are
//     counted by admission and the capacity line as pool blocks.
//   - a checkpoint is taken only when S + watermark blocks are free (best
//     effort: a missing checkpoint costs recompute, never a wrong answer) and
//     only when none is cached for that prefix yet.
//   - the scheduler ends a prefill chunk at the LATEST boundary inside it
//     (checkpoint_chunk), so the state at that boundary exists at the end of
//     a step; the engine is chunk-size invariant bitwise, so outputs do not
//     change. So a prompt gets a checkpoint at the end of each prefill chunk
//     (every --max-num-batched-tokens tokens at most) and at the last
//     boundary before its end, and decoding one at every boundary it passes;
//     not one at every boundary inside a long chunk. Cutting every chunk at
//     the FIRST boundary (a checkpoint at every boundary) was measured: with
//     blocks of 16 and K = 4 it splits a prefill into 64-token steps, which made
//     a cold 4,016-token prompt of a LFM2-350M-shaped model 1.3-3x slower
//     than without checkpoints (bench/state_checkpoint_ttft.py), and a warm
//     second turn barely faster than a cold one without them.
//   - match_prefix: the hit is the longest prefix that ends at a checkpoint
//     whose S blocks are cached, every other group serving it as usual
//     (checkpoint_hit); whatever the cached K/V cover past it is recomputed.
//     allocate gives the sequence fresh state blocks and returns the copies
//     checkpoint -> state (run before its first forward), holding the
//     checkpoint's blocks until that step is marked computed (or the sequence
//     freed), so nothing can take them before the copy.
//   - KV tiers (engine/kv_tiers.h): with the commit log on, each checkpoint
//     made is logged (take_committed_checkpoints) and, once flushed, written
//     through to the tiers as ONE entry of its own kind (tier::TierKey::kind
//     kCheckpoint: its S blocks' bytes; a kind apart in the entry's name and
//     MACs, so it is never read as a K/V block nor the reverse), verified by
//     the boundary block's chain, tokens and salt like a block. A tier hit
//     imports it with the K/V (import_blocks: the hit is capped at the latest
//     boundary whose checkpoint is cached or loaded; import_checkpoint commits
//     a loaded one as make_checkpoint does), so the scheduler's match_prefix
//     then restores it as any cached checkpoint. The RAM cached_blocks view's
//     state-group row is "a checkpoint at the end of this block".
//   - pins (kv_pins.cc, docs/pins.md): a pinned prefix also pins the
//     checkpoints cached at boundaries inside it, those there when it is made
//     and those made or imported later while it lives (pin_new_checkpoint,
//     within the pin cap); the tiers store them with the pin's expiry. A
//     pinning request's prefill is also cut at the pin's last boundary
//     (checkpoint_chunk's pin_tokens) so that the pin has a checkpoint.
// The design is generic over the state group's kind: only S and the state
// group's index are used.
#include <algorithm>

#include "base/check.h"
#include "kv/kv_manager.h"

namespace pagoda::kv {

Hash128 KvManager::checkpoint_key(const Hash128& chain, int32_t index) const {
  // Distinct from every block key and group key: a tag word beside the group and the index.
  const uint64_t words[4] = {chain.lo, chain.hi, static_cast<uint64_t>(state_group_),
                             0x636b7074ull << 32 | static_cast<uint32_t>(index)};  // "ckpt"
  return xxh3_128(words, sizeof(words));
}

int32_t KvManager::checkpoint_chunk(int32_t computed, int32_t n, int32_t pin_tokens) const {
  if (checkpoint_tokens_ <= 0) return n;
  // A pinned prefix's last boundary first (one more cut, for pinned prompts only).
  const int32_t pinned = pin_tokens / checkpoint_tokens_ * checkpoint_tokens_;
  if (pinned > computed && pinned < computed + n) return pinned - computed;
  // The latest boundary at or before the chunk's end: one cut per chunk at most.
  const int32_t last = (computed + n) / checkpoint_tokens_ * checkpoint_tokens_;
  return last > computed ? last - computed : n;
}

bool KvManager::find_checkpoint(const PrefixMatch& m, int32_t j, std::span<const TokenId> tokens,
                                std::vector<BlockId>* blocks, std::vector<EntryId>* entries) const {
  PAGODA_CHECK(j >= 1 && static_cast<size_t>(j) <= m.keys_.size());
  const auto bs = static_cast<size_t>(config_.block_size);
  const auto last = static_cast<size_t>(j - 1);
  const EntryId parent = last == 0 ? kRootEntry : m.entries_[last - 1];
  entries->clear();
  if (!find_checkpoint_blocks(m.keys_[last], parent, tokens.subspan(last * bs, bs), m.salt_, blocks)) return false;
  for (BlockId b : *blocks) entries->push_back(blocks_->cache.entry_of(b));
  return true;
}

bool KvManager::find_checkpoint_blocks(const Hash128& chain, EntryId parent, std::span<const TokenId> block_tokens,
                                       std::string_view salt, std::vector<BlockId>* blocks) const {
  const int32_t S = groups_[static_cast<size_t>(state_group_)]->spec().state_blocks;
  blocks->clear();
  for (int32_t i = 0; i < S; ++i) {
    const BlockId b = blocks_->cache.find(checkpoint_key(chain, i), parent, block_tokens, salt);
    if (b == kNullBlock) return false;
    blocks->push_back(b);
  }
  return true;
}

bool KvManager::import_checkpoint(const Hash128& chain, const Hash128* prev, EntryId parent,
                                  std::span<const TokenId> block_tokens, std::string_view salt,
                                  const std::function<void(int32_t, BlockId)>& fill, std::vector<BlockId>* held) {
  const int32_t S = groups_[static_cast<size_t>(state_group_)]->spec().state_blocks;
  if (num_free_blocks() < S + watermark_blocks_) return false;
  const PrefixCache::ChainRef ref{state_group_, chain, prev ? *prev : Hash128{}, prev == nullptr, false};
  std::vector<BlockId> taken;
  for (int32_t i = 0; i < S; ++i) {
    const BlockId b = blocks_->take();
    taken.push_back(b);
    fill(i, b);
    const EntryId e = blocks_->cache.insert(b, checkpoint_key(chain, i), parent, block_tokens, salt, &ref);
    if (e == kNoEntry || blocks_->cache.entry_of(b) != e) {  // refused: none of it stays
      for (BlockId t : taken) {
        blocks_->cache.erase(t);
        blocks_->pool.decref(t);
      }
      return false;
    }
  }
  blocks_->checkpoint_head[static_cast<size_t>(taken[0])] = 1;
  pin_new_checkpoint(blocks_->cache.find(chain, parent, block_tokens, salt), taken);
  held->insert(held->end(), taken.begin(), taken.end());
  return true;
}

int32_t KvManager::checkpoint_hit(PrefixMatch* m, int32_t k, std::span<const TokenId> tokens,
                                  const std::function<bool(int32_t, int32_t)>& missing) const {
  const int32_t K = config_.state_checkpoint_interval;
  m->ckpt_blocks_.clear();
  m->ckpt_entries_.clear();
  std::vector<BlockId> blocks;
  std::vector<EntryId> entries;
  // Boundaries from the latest down; each needs its checkpoint and every
  // other group's blocks for a hit there (longest_hit at that point).
  for (int32_t c = k - k % K; c > 0; c -= K) {
    if (!find_checkpoint(*m, c, tokens, &blocks, &entries)) continue;
    if (longest_hit(c, missing) != c) continue;
    m->ckpt_blocks_ = std::move(blocks);
    m->ckpt_entries_ = std::move(entries);
    return c;
  }
  return 0;
}

void KvManager::make_checkpoint(SeqId seq, const Seq& s, std::span<const TokenId> tokens) {
  const int32_t bs = config_.block_size;
  const int32_t j = s.num_computed / bs;  // the boundary, in blocks
  const auto last = static_cast<size_t>(j - 1);
  if (s.entries.size() < static_cast<size_t>(j) || s.entries[last] == kNoEntry) return;  // chain not cached
  const GroupManager& state = *groups_[static_cast<size_t>(state_group_)];
  const int32_t S = state.spec().state_blocks;
  const std::span<const BlockId> src = state.table(seq);
  PAGODA_CHECK(static_cast<int32_t>(src.size()) == S);
  const EntryId parent = last == 0 ? kRootEntry : s.entries[last - 1];
  const auto block_tokens = tokens.subspan(last * static_cast<size_t>(bs), static_cast<size_t>(bs));
  // Already cached for this prefix (a hit replayed, or the same prompt twice).
  bool cached = true;
  for (int32_t i = 0; i < S && cached; ++i)
    cached = blocks_->cache.find(checkpoint_key(s.keys[last], i), parent, block_tokens, s.salt) != kNullBlock;
  if (cached) return;
  // Best effort: never below the watermark (admission's margin).
  if (num_free_blocks() < S + watermark_blocks_) return;
  // Not a K/V block: no KV event (PrefixCache::ChainRef::announce).
  PrefixCache::ChainRef ref{state_group_, s.keys[last], last == 0 ? Hash128{} : s.keys[last - 1], last == 0, false};
  std::vector<BlockId> taken;
  bool ok = true;
  for (int32_t i = 0; i < S; ++i) {
    const BlockId b = blocks_->take();
    taken.push_back(b);
    const EntryId e = blocks_->cache.insert(b, checkpoint_key(s.keys[last], i), parent, block_tokens, s.salt, &ref);
    if (e == kNoEntry || blocks_->cache.entry_of(b) != e) {  // refused (a collision, or a partial copy under the key)
      ok = false;
      break;
    }
  }
  if (!ok) {
    for (BlockId b : taken) {
      blocks_->cache.erase(b);
      blocks_->pool.decref(b);
    }
    return;
  }
  blocks_->checkpoint_head[static_cast<size_t>(taken[0])] = 1;
  if (commit_log_on_) {  // write-through to the tiers, once flush_checkpoints copied the state
    CommittedCheckpoint cc{taken, {}, s.keys[last], {block_tokens.begin(), block_tokens.end()}, s.salt, ref.parent, ref.root};
    for (BlockId b : taken) cc.entries.push_back(blocks_->cache.entry_of(b));
    checkpoint_log_.push_back(std::move(cc));
  }
  pin_new_checkpoint(blocks_->cache.block_of_entry(s.entries[last]), taken);
  for (int32_t i = 0; i < S; ++i) {
    blocks_->pool.incref(src[static_cast<size_t>(i)]);  // held with the checkpoint's block until the copy
    ckpt_pending_.emplace_back(src[static_cast<size_t>(i)], taken[static_cast<size_t>(i)]);
  }
  ++checkpoints_stored_;
}

void KvManager::release_restore_hold(Seq* s) {
  for (BlockId b : s->restore_hold) blocks_->pool.decref(b);
  s->restore_hold.clear();
}

int32_t KvManager::flush_checkpoints(const std::function<void(BlockId, BlockId)>& copy) {
  if (ckpt_pending_.empty()) return 0;
  ++generation_;
  for (const auto& [src, dst] : ckpt_pending_) copy(src, dst);
  // The checkpoint's blocks go to the free queue's tail (most recently used);
  // a state block of a sequence freed meanwhile follows as a plain free block.
  for (const auto& [src, dst] : ckpt_pending_) {
    blocks_->pool.decref(dst);
    blocks_->pool.decref(src);
  }
  const auto n = static_cast<int32_t>(ckpt_pending_.size());
  ckpt_pending_.clear();
  return n;
}

}  // namespace pagoda::kv
