// KvManager's census (stats) and its invariant check (check_invariants).
#include "kv/kv_manager.h"

namespace pagoda::kv {

KvStats KvManager::stats() const {
  const BlockPool& pool = blocks_->pool;
  const PrefixCache& cache = blocks_->cache;
  KvStats st;
  st.num_blocks_total = pool.num_usable_blocks();
  st.num_cached = cache.size();
  for (BlockId b = 1; b < pool.num_blocks(); ++b) {
    if (pool.ref_count(b) > 0) {
      ++st.num_used;
    } else if (cache.contains(b)) {
      ++st.num_cached_evictable;
    } else {
      ++st.num_free;
    }
  }
  st.prefix_lookups = prefix_lookups_;
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.num_evictions = blocks_->num_evictions;
  st.num_cow_copies = blocks_->num_cow_copies;
  st.collisions_refused = cache.collisions_refused();
  st.num_pins = static_cast<int32_t>(pins_.size());
  st.num_pinned = num_pinned_blocks_;
  for (BlockId b = 1; b < pool.num_blocks(); ++b)
    st.num_checkpoints += blocks_->checkpoint_head[static_cast<size_t>(b)] && cache.contains(b) ? 1 : 0;
  st.checkpoints_stored = checkpoints_stored_;
  st.checkpoints_hit = checkpoints_hit_;
  st.checkpoints_evicted = blocks_->num_checkpoint_evictions;
  st.group_blocks_used.assign(groups_.size(), 0);
  // A block sits in one group's tables only (shared by fork within that group).
  std::vector<uint8_t> seen(static_cast<size_t>(pool.num_blocks()), 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g]->for_each([&](SeqId, std::span<const BlockId> table, int32_t) {
      for (BlockId b : table) {
        if (b == kNullBlock || seen[static_cast<size_t>(b)]) continue;
        seen[static_cast<size_t>(b)] = 1;
        ++st.group_blocks_used[g];
      }
    });
  }
  return st;
}

std::string KvManager::check_seq(SeqId id, const Seq& s, std::vector<int32_t>* refs,
                                 std::vector<int32_t>* group_of) const {
  const auto uid = static_cast<unsigned long long>(id);
  const int32_t n = blocks_->pool.num_blocks();
  const int32_t bs = config_.block_size;
  const int32_t entries = groups_[0]->num_entries(id);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupManager& gm = *groups_[g];
    if (!gm.has(id)) return errorf("seq %llu: no table in group %zu", uid, g).message;
    const std::span<const BlockId> table = gm.table(id);
    if (static_cast<int32_t>(table.size()) != gm.table_entries(entries)) {
      return errorf("seq %llu: group %zu table of %zu blocks, group 0 of %d", uid, g, table.size(), entries).message;
    }
    // No block is released while a step still reads it: every entry from
    // first_needed_block(num_computed) on is a real block (full groups: all).
    const int32_t need_lo = gm.first_needed_block(s.num_computed);
    for (size_t i = 0; i < table.size(); ++i) {
      const BlockId b = table[i];
      if (b == kNullBlock) {
        if (static_cast<int32_t>(i) >= need_lo) {
          return errorf("seq %llu: group %zu block %zu is released but inside the window (%d computed)", uid, g, i,
                        s.num_computed)
              .message;
        }
        continue;
      }
      if (static_cast<int32_t>(i) < gm.first_live(id)) {
        return errorf("seq %llu: group %zu holds block %d before its first live entry %d", uid, g, b,
                      gm.first_live(id))
            .message;
      }
      if (b < kNullBlock || b >= n) return errorf("seq %llu holds invalid block %d", uid, b).message;
      ++(*refs)[static_cast<size_t>(b)];
      int32_t& owner = (*group_of)[static_cast<size_t>(b)];
      if (owner >= 0 && owner != static_cast<int32_t>(g)) {
        return errorf("block %d is in the tables of groups %d and %zu", b, owner, g).message;
      }
      owner = static_cast<int32_t>(g);
    }
  }
  if (s.num_computed < 0 || s.num_computed > entries * bs) {
    return errorf("seq %llu: %d computed tokens in %d blocks", uid, s.num_computed, entries).message;
  }
  if (static_cast<int32_t>(s.entries.size()) > s.num_computed / bs) {
    return errorf("seq %llu: %zu committed blocks with %d computed tokens", uid, s.entries.size(), s.num_computed)
        .message;
  }
  if (s.keys.size() < s.entries.size()) {
    return errorf("seq %llu: %zu block keys for %zu committed blocks", uid, s.keys.size(), s.entries.size()).message;
  }
  const PrefixCache& cache = blocks_->cache;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::span<const BlockId> table = groups_[g]->table(id);
    for (size_t i = 0; i < s.entries.size() && i < table.size(); ++i) {
      const BlockId b = table[i];
      if (b != kNullBlock && cache.contains(b) && !(cache.key_of(b) == group_key(s.keys[i], static_cast<int32_t>(g)))) {
        return errorf("seq %llu: group %zu block %d cached under another key", uid, g, b).message;
      }
    }
  }
  return "";
}

std::string KvManager::check_invariants() const {
  const BlockPool& pool = blocks_->pool;
  const PrefixCache& cache = blocks_->cache;
  if (std::string e = pool.check(); !e.empty()) return "pool: " + e;
  if (std::string e = cache.check(); !e.empty()) return "prefix cache: " + e;
  const int32_t n = pool.num_blocks();
  std::vector<int32_t> refs(static_cast<size_t>(n), 0);
  std::vector<int32_t> group_of(static_cast<size_t>(n), -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g]->num_seqs() != num_seqs()) {
      return errorf("group %zu has tables of %d sequences, the manager %d", g, groups_[g]->num_seqs(), num_seqs())
          .message;
    }
  }
  for (const auto& [id, s] : seqs_) {
    if (std::string e = check_seq(id, s, &refs, &group_of); !e.empty()) return e;
  }
  // A pinned block holds one more reference (kv_pins.cc) and stays cached.
  std::vector<int32_t> pin_refs(static_cast<size_t>(n), 0);
  if (std::string e = check_pins(&pin_refs); !e.empty()) return "pins: " + e;
  for (size_t i = 0; i < refs.size(); ++i) refs[i] += pin_refs[i];
  // Checkpoints (state_checkpoint.cc): blocks held for a restore or for a copy
  // not flushed yet hold one reference each; a checkpoint's block is in no table.
  for (const auto& [id, s] : seqs_) {
    for (BlockId b : s.restore_hold) {
      if (b <= kNullBlock || b >= n) return errorf("seq %llu holds invalid checkpoint block %d", static_cast<unsigned long long>(id), b).message;
      if (!cache.contains(b) || cache.group_of(b) != state_group_)
        return errorf("seq %llu holds block %d for a restore, which is not a cached checkpoint", static_cast<unsigned long long>(id), b).message;
      ++refs[static_cast<size_t>(b)];
    }
  }
  for (const auto& [src, dst] : ckpt_pending_) {
    ++refs[static_cast<size_t>(src)];
    ++refs[static_cast<size_t>(dst)];
  }
  for (BlockId b = 1; b < n; ++b) {
    if (cache.contains(b) && state_group_ >= 0 && cache.group_of(b) == state_group_ && group_of[static_cast<size_t>(b)] >= 0)
      return errorf("checkpoint block %d is in group %d's tables", b, group_of[static_cast<size_t>(b)]).message;
    if (blocks_->checkpoint_head[static_cast<size_t>(b)] && cache.contains(b) && cache.group_of(b) != state_group_)
      return errorf("block %d is marked a checkpoint but cached in group %d", b, cache.group_of(b)).message;
  }
  int32_t used = 0, free_plain = 0, evictable = 0;
  for (BlockId b = 1; b < n; ++b) {
    const auto i = static_cast<size_t>(b);
    if (refs[i] != pool.ref_count(b)) {
      return errorf("block %d: ref count %d but %d table references", b, pool.ref_count(b), refs[i]).message;
    }
    if (refs[i] > 0 && pool.in_free_queue(b)) return errorf("block %d both free and referenced", b).message;
    if (refs[i] > 0) {
      ++used;
    } else if (cache.contains(b)) {
      ++evictable;
    } else {
      ++free_plain;
    }
  }
  if (cache.contains(kNullBlock)) return "null block is cached";
  if (free_plain + used + evictable != pool.num_usable_blocks()) {
    return errorf("free %d + used %d + cached-evictable %d != total %d", free_plain, used, evictable,
                  pool.num_usable_blocks())
        .message;
  }
  if (free_plain + evictable != pool.num_free()) {
    return errorf("free %d + evictable %d != free queue %d", free_plain, evictable, pool.num_free()).message;
  }
  return "";
}

}  // namespace pagoda::kv
