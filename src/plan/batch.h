// plan/: turns the scheduler's StepPlan (per-sequence token slices + block
// tables) into the kernels' BatchView, once per step. StepBatch owns the arrays;
// view() hands the kernels a non-owning POD over them.
#pragma once
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kernels/api.h"
#include "sched/step_plan.h"

namespace pagoda::plan {

struct StepBatch {
  // N = tokens this step, S = sequences, P = pages over all sequences, L = logit rows.
  std::vector<int32_t> token_ids;         // [N]
  std::vector<int32_t> positions;         // [N] start_pos + i
  std::vector<int64_t> slot_mapping;      // [N] block_ids[pos / bs] * bs + pos % bs
  std::vector<int32_t> q_indptr;          // [S + 1]
  std::vector<int32_t> kv_indptr;         // [S + 1]
  std::vector<int32_t> kv_indices;        // [P] the first ceil(kv_len / bs) blocks of each table
  std::vector<int32_t> kv_last_page_len;  // [S] in 1..bs
  // [L] last token row of each seq with wants_logits; a seq with k draft
  // tokens has its last k + 1 rows here, in order.
  std::vector<int32_t> logit_rows;
  std::vector<int32_t> logit_seqs;        // [L] index into StepPlan::seqs of each logits row
  // KV groups 1.. (group_block_ids of each sequence): their slot mapping [N]
  // and pages [P], addressed by the same q/kv indptr.
  struct GroupArrays {
    std::vector<int64_t> slot_mapping;  // [N]
    std::vector<int32_t> kv_indices;    // [P]
  };
  std::vector<GroupArrays> groups;             // [n_groups - 1]
  std::vector<kernels::KvGroupBatch> group_views;  // [n_groups - 1] over `groups`
  int32_t block_size = 0;

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t n_seqs() const { return static_cast<int32_t>(kv_last_page_len.size()); }
  int32_t n_logits() const { return static_cast<int32_t>(logit_rows.size()); }
  // Valid until the next build into this StepBatch.
  kernels::BatchView view() const;
};

// Rebuilds `out` from `plan` (reusing its capacity). Checks before writing any
// output that every sequence has >= 1 new token, start_pos >= 0, and its block
// table covers positions 0 .. start_pos + n - 1 with ids in [0, num_blocks).
// With num_groups > 1 every sequence carries num_groups - 1 group_block_ids
// tables, each covering the same positions; a token's slot in a group must be
// a real block (not the null block 0). Group state_group (>= 1; -1: none) is
// a recurrent state group: its tables hold the sequence's state blocks, not
// token positions; they must be real blocks and add no slots or pages. On
// error `out` is left empty.
Status build_batch(const sched::StepPlan& plan, int32_t block_size, int32_t num_blocks, StepBatch* out,
                   int32_t num_groups = 1, int32_t state_group = -1);

}  // namespace pagoda::plan
