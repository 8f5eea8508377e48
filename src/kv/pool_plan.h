// kv::plan_pool: the one sizing of the paged KV pool. From the attention's
// shape, the layers' windows (the KV group layout), the cache dtype and the
// memory (a byte budget, a block count or one context) to a plan: the group
// layout, the block's bytes, the number of blocks and the longest sequence they
// hold. Pure arithmetic over kv/sizing's functions. The engine builds both the
// allocator (KvConfig::from_plan -> KvManager / BlockPool) and the runner's
// storage (runtime::RunnerOptions::use_pool -> KvStorage) from one plan, so the
// two cannot disagree on blocks, block size or layer slots.
#pragma once
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kv/sizing.h"

namespace pagoda::kv {

struct PoolRequest {
  KvShape shape;                       // the attention as the cache stores it (bytes per token per layer)
  KvDtype dtype;                       // the cache's storage dtype
  std::vector<int32_t> layer_windows;  // [n_layers] 0 = full context, else the layer's window; kStateWindow: recurrent
  // Hybrid models: each sequence's recurrent state, state_rows rows of
  // state_row_bytes (packed into the state group's blocks: kv_state_rows_per_block).
  int64_t state_rows = 0;
  uint64_t state_row_bytes = 0;
  bool hybrid = true;                  // group layers by kind (false: one group of every layer)
  int32_t block_size = 16;             // tokens per block, 1..256
  int32_t max_chunk = 1;               // the step's token budget (a window group's peak holds W + chunk)
  // The pool's size, the first that applies: a pool holding one sequence of
  // one_context_tokens (+ the null block); num_blocks (including the null
  // block); floor(budget_bytes / block bytes).
  int64_t one_context_tokens = 0;
  int64_t num_blocks = 0;
  uint64_t budget_bytes = 0;
};

struct PoolPlan {
  KvGroupLayout layout;      // the groups, layer slots per block, each layer's group and slot
  int32_t block_size = 0;    // tokens per block
  int32_t num_blocks = 0;    // including the null block 0
  uint64_t block_bytes = 0;  // one block: G layer slots x block_size tokens x (K, V) (kv_group_bytes_per_block)
  int64_t max_tokens = 0;    // the longest sequence the pool holds (kv_blocks_for_sequence <= num_blocks - 1)
  uint64_t bytes_total() const { return static_cast<uint64_t>(num_blocks) * block_bytes; }
};

// Errors: block_size outside 1..256, max_chunk < 1, no layers (or no attention
// layer), a state row larger than a block's K or V chunk, or a pool of fewer than 2 blocks. The pool is capped at INT32_MAX / 2 blocks.
Expected<PoolPlan> plan_pool(const PoolRequest& request);
// The first half of plan_pool: the layout (state_blocks included), block_size
// and block_bytes, whatever the pool's size (num_blocks and max_tokens left 0).
// `pagoda size` and sim's planner size a budget that may hold no pool with it.
// Errors: those of plan_pool but the pool's size.
Expected<PoolPlan> plan_pool_layout(const PoolRequest& request);

}  // namespace pagoda::kv
