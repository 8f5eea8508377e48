// The KvManager's configuration and its counters (kv_manager.h).
#pragma once
#include <cstdint>
#include <vector>

#include "kv/group_manager.h"

namespace pagoda::kv {

struct PoolPlan;

struct KvConfig {
  int32_t num_blocks = 0;          // including the null block 0; usable = num_blocks - 1
  int32_t block_size = 16;         // tokens per block, 1..256
  double watermark = 0.01;         // fraction of usable blocks admission leaves free
  uint64_t model_fingerprint = 0;  // part of every block key: caches of different models never mix
  bool enable_prefix_caching = true;
  // Pins (kv_pins.cc, issue 36): pinned blocks may hold at most this fraction
  // of the usable blocks; past it the least recently touched pin is demoted.
  double pinned_fraction = 0.2;
  // Eviction classes (BlockPool): 1 = one LRU free queue (default). More: a
  // sequence's blocks are released into its set_eviction_class() class, and
  // higher classes are evicted first (the scheduler's priority policy).
  int32_t eviction_classes = 1;
  // [n_groups]; empty = one full-context group. Group 0 anchors the prefix
  // chain (put full-context groups first).
  std::vector<KvGroupSpec> groups;
  // Recurrent-state checkpoints (kv/state_checkpoint.cc, issue 38), in blocks:
  // with a recurrent state group, K > 0 keeps a copy of a sequence's state at
  // every block boundary that is a multiple of K blocks, and a prefix hit ends
  // at the latest such checkpoint; 0 = none, and prefix caching is off for a
  // model with a recurrent state group. Without such a group it changes nothing.
  int32_t state_checkpoint_interval = 0;
  // num_blocks, block_size and groups from a pool plan (kv/pool_plan.h); the
  // rest as defaulted here.
  static KvConfig from_plan(const PoolPlan& plan);
};

struct KvStats {
  int32_t num_blocks_total = 0;      // usable blocks (null block excluded)
  int32_t num_free = 0;              // ref 0 and no key
  int32_t num_used = 0;              // ref > 0
  int32_t num_cached_evictable = 0;  // ref 0 with a key: free, but a prefix hit can revive it
  int32_t num_cached = 0;            // blocks with a key, used or not
  int64_t prefix_lookups = 0;        // walks of the prefix cache (match_prefix calls)
  int64_t prefix_query_tokens = 0;   // tokens offered to lookups by allocate()
  int64_t prefix_hit_tokens = 0;     // of those, served from the cache
  int64_t num_evictions = 0;         // cached blocks whose key was dropped for reuse
  int64_t num_cow_copies = 0;        // copy-on-write block copies requested
  int64_t collisions_refused = 0;    // key matches refused by the token / salt / parent check
  int32_t num_pins = 0;              // live pins (kv_pins.cc)
  int32_t num_pinned = 0;            // distinct blocks held by pins (counted in num_used: a pin holds a reference)
  std::vector<int32_t> group_blocks_used;  // [n_groups] blocks referenced by each group's tables
  // Recurrent-state checkpoints (kv/state_checkpoint.cc): live ones in the
  // cache, and since start: made, restored by a prefix hit, evicted for reuse.
  int32_t num_checkpoints = 0;
  int64_t checkpoints_stored = 0;
  int64_t checkpoints_hit = 0;
  int64_t checkpoints_evicted = 0;
};

}  // namespace pagoda::kv
