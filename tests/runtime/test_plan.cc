#include <gtest/gtest.h>

#include <vector>

#include "plan/batch.h"

using namespace pagoda;
using V32 = std::vector<int32_t>;
using V64 = std::vector<int64_t>;

namespace {

sched::ScheduledSeq seq(sched::RequestId id, int32_t start, V32 tokens, V32 blocks, bool logits) {
  sched::ScheduledSeq s;
  s.request_id = id;
  s.start_pos = start;
  s.token_ids = std::move(tokens);
  s.block_ids = std::move(blocks);
  s.wants_logits = logits;
  return s;
}

}  // namespace

TEST(Plan, BuildsRaggedBatchWithPageTable) {
  sched::StepPlan p;
  // A: decode-ish slice at positions 5..7 of blocks [3, 7] (block size 4).
  p.seqs.push_back(seq(10, 5, {50, 51, 52}, {3, 7}, true));
  // B: a prefill chunk 0..5 that does not want logits; block 9 is allocated ahead.
  p.seqs.push_back(seq(11, 0, {60, 61, 62, 63, 64, 65}, {1, 2, 9}, false));
  // C: one decode token at position 8 (third page, first slot).
  p.seqs.push_back(seq(12, 8, {70}, {4, 5, 6}, true));
  plan::StepBatch b;
  ASSERT_TRUE(plan::build_batch(p, 4, 16, &b).ok());
  EXPECT_EQ(b.token_ids, (V32{50, 51, 52, 60, 61, 62, 63, 64, 65, 70}));
  EXPECT_EQ(b.positions, (V32{5, 6, 7, 0, 1, 2, 3, 4, 5, 8}));
  EXPECT_EQ(b.slot_mapping, (V64{29, 30, 31, 4, 5, 6, 7, 8, 9, 24}));
  EXPECT_EQ(b.q_indptr, (V32{0, 3, 9, 10}));
  EXPECT_EQ(b.kv_indptr, (V32{0, 2, 4, 7}));
  EXPECT_EQ(b.kv_indices, (V32{3, 7, 1, 2, 4, 5, 6}));
  EXPECT_EQ(b.kv_last_page_len, (V32{4, 2, 1}));
  EXPECT_EQ(b.logit_rows, (V32{2, 9}));
  EXPECT_EQ(b.logit_seqs, (V32{0, 2}));

  const kernels::BatchView v = b.view();
  EXPECT_EQ(v.n_tokens, 10);
  EXPECT_EQ(v.n_seqs, 3);
  EXPECT_EQ(v.n_logits, 2);
  EXPECT_EQ(kernels::kv_len(v, 0, 4), 8);
  EXPECT_EQ(kernels::kv_len(v, 1, 4), 6);
  EXPECT_EQ(kernels::kv_len(v, 2, 4), 9);

  // Rebuilding reuses the object and forgets the previous step.
  sched::StepPlan q;
  q.seqs.push_back(seq(10, 8, {53}, {3, 7, 8}, true));
  ASSERT_TRUE(plan::build_batch(q, 4, 16, &b).ok());
  EXPECT_EQ(b.slot_mapping, (V64{32}));
  EXPECT_EQ(b.kv_indices, (V32{3, 7, 8}));
  EXPECT_EQ(b.logit_rows, (V32{0}));
}

TEST(Plan, BlockSizeOneAndLarge) {
  sched::StepPlan p;
  p.seqs.push_back(seq(1, 0, {5, 6, 7}, {4, 2, 8}, true));
  plan::StepBatch b;
  ASSERT_TRUE(plan::build_batch(p, 1, 10, &b).ok());
  EXPECT_EQ(b.slot_mapping, (V64{4, 2, 8}));
  EXPECT_EQ(b.kv_last_page_len, (V32{1}));
  p.seqs[0].block_ids = {3};
  ASSERT_TRUE(plan::build_batch(p, 256, 10, &b).ok());
  EXPECT_EQ(b.slot_mapping, (V64{768, 769, 770}));
  EXPECT_EQ(b.kv_last_page_len, (V32{3}));
}

TEST(Plan, RejectsBadPlans) {
  plan::StepBatch b;
  sched::StepPlan p;
  p.seqs.push_back(seq(1, 6, {1, 2, 3}, {1, 2}, true));  // needs 3 blocks of 4 for 9 tokens
  Status s = plan::build_batch(p, 4, 16, &b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("needs 3 blocks for 9 tokens, block table has 2"), std::string::npos) << s.message();
  EXPECT_EQ(b.n_tokens(), 0);

  p.seqs[0] = seq(1, 0, {1}, {16}, true);
  s = plan::build_batch(p, 4, 16, &b);
  EXPECT_NE(s.message().find("block 16 outside the KV storage of 16 blocks"), std::string::npos) << s.message();
  p.seqs[0] = seq(1, 0, {}, {1}, true);
  EXPECT_FALSE(plan::build_batch(p, 4, 16, &b).ok());
  p.seqs[0] = seq(1, -1, {1}, {1}, true);
  EXPECT_FALSE(plan::build_batch(p, 4, 16, &b).ok());
  p.seqs[0] = seq(1, 0, {1}, {1}, true);
  EXPECT_FALSE(plan::build_batch(p, 0, 16, &b).ok());
  EXPECT_TRUE(plan::build_batch(p, 4, 16, &b).ok());
}

// KV cache groups: group 1's table (a window group, the null block 0 before
// its window) gets its own slot mapping and pages under the shared indptr;
// group_view hands a layer of group 1 exactly those.
TEST(Plan, BuildsPerGroupSlotsAndPages) {
  sched::StepPlan p;
  p.seqs.push_back(seq(10, 9, {50, 51}, {3, 7, 8}, true));  // positions 9, 10 (page 2)
  p.seqs.back().group_block_ids = {{0, 0, 11}};            // window group: pages 0, 1 released
  p.seqs.push_back(seq(11, 0, {60, 61, 62}, {1}, true));
  p.seqs.back().group_block_ids = {{12}};
  plan::StepBatch b;
  ASSERT_TRUE(plan::build_batch(p, 4, 16, &b, /*num_groups=*/2).ok());
  EXPECT_EQ(b.slot_mapping, (V64{33, 34, 4, 5, 6}));
  ASSERT_EQ(b.groups.size(), 1u);
  EXPECT_EQ(b.groups[0].slot_mapping, (V64{45, 46, 48, 49, 50}));
  EXPECT_EQ(b.groups[0].kv_indices, (V32{0, 0, 11, 12}));
  const kernels::BatchView v = b.view();
  EXPECT_EQ(v.n_groups, 2);
  const kernels::BatchView g1 = kernels::group_view(v, 1);
  EXPECT_EQ(g1.slot_mapping[0], 45);
  EXPECT_EQ(g1.kv_indices[2], 11);
  EXPECT_EQ(g1.kv_indptr, v.kv_indptr);  // same logical pages in every group
  EXPECT_EQ(kernels::group_view(v, 0).kv_indices, v.kv_indices);

  // Refused, leaving the batch empty: a missing group table, a new token into
  // the null block of a group.
  sched::StepPlan missing = p;
  missing.seqs[1].group_block_ids.clear();
  EXPECT_FALSE(plan::build_batch(missing, 4, 16, &b, 2).ok());
  EXPECT_EQ(b.n_tokens(), 0);
  sched::StepPlan into_null = p;
  into_null.seqs[0].group_block_ids[0][2] = 0;
  const Status st = plan::build_batch(into_null, 4, 16, &b, 2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("null block"), std::string::npos) << st.message();
  EXPECT_EQ(b.n_tokens(), 0);
}
