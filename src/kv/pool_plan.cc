#include "kv/pool_plan.h"

#include <algorithm>
#include <climits>

namespace pagoda::kv {

Expected<PoolPlan> plan_pool_layout(const PoolRequest& r) {
  if (r.block_size < 1 || r.block_size > 256) return errorf("block size must be in 1..256, got %d", r.block_size);
  if (r.max_chunk < 1) return errorf("kv pool: the step budget must be >= 1 token, got %d", r.max_chunk);
  if (r.layer_windows.empty()) return errorf("kv pool: no layers");
  PoolPlan p;
  p.layout = kv_group_layout(r.layer_windows, r.hybrid);
  p.block_size = r.block_size;
  if (p.layout.group_size <= 0) return errorf("kv pool: no layer slot");
  p.block_bytes = kv_group_bytes_per_block(r.shape, r.dtype, r.block_size, p.layout);
  const bool has_state = !p.layout.windows.empty() && p.layout.windows.back() == kStateWindow;
  if (has_state != (r.state_rows > 0)) return errorf("kv pool: recurrent layers and state rows (%lld) disagree", static_cast<long long>(r.state_rows));
  if (has_state) {
    const int64_t per_block = kv_state_rows_per_block(r.shape, r.dtype, r.block_size, p.layout.group_size, r.state_row_bytes);
    if (per_block <= 0)
      return errorf("kv pool: a recurrent state row of %llu bytes does not fit a block's K or V chunk of %d tokens; use a larger block size",
                    static_cast<unsigned long long>(r.state_row_bytes), r.block_size);
    p.layout.state_blocks = kv_state_blocks(r.state_rows, per_block);
  }
  return p;
}

Expected<PoolPlan> plan_pool(const PoolRequest& r) {
  PAGODA_ASSIGN_OR_RETURN(PoolPlan p, plan_pool_layout(r));
  auto seq_blocks = [&](int64_t n) { return kv_blocks_for_sequence(p.layout, n, r.block_size, r.max_chunk); };
  int64_t num_blocks = r.num_blocks;
  if (r.one_context_tokens > 0) {
    num_blocks = seq_blocks(r.one_context_tokens) + 1;  // + the null block
  } else if (num_blocks <= 0) {
    num_blocks = num_blocks_for_budget(r.budget_bytes, p.block_bytes);
  }
  if (num_blocks < 2)
    return errorf("the KV cache budget holds %lld blocks of %llu bytes; at least 2 are needed",
                  static_cast<long long>(num_blocks), static_cast<unsigned long long>(p.block_bytes));
  num_blocks = std::min<int64_t>(num_blocks, INT32_MAX / 2);
  p.num_blocks = static_cast<int32_t>(num_blocks);
  // The longest sequence the pool holds (one full group: (num_blocks - 1) x
  // block_size); seq_blocks grows with n, so bisect.
  for (int64_t lo = 0, hi = int64_t{INT32_MAX} / 2; lo <= hi;) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (seq_blocks(mid) <= num_blocks - 1) {
      p.max_tokens = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return p;
}

}  // namespace pagoda::kv
