// The recurrent state group kind (kv/recurrent_state_group.cc, issue 38) under a
// KvManager beside one full-attention group, blocks of 4 tokens, S = 2 state
// blocks per sequence: exact block ids through allocate, append, fork +
// copy-on-write, refused truncation and free, the invariants after every step,
// no prefix hit ever, and the sizing the allocator counts by.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/pool_plan.h"
#include "kv/sizing.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::Ids;
using testing::Tokens;

Ids group_table(const KvManager& kv, SeqId s, int32_t g) {
  auto t = kv.block_table(s, g);
  return Ids(t.begin(), t.end());
}

KvManager make_kv(int32_t num_blocks) {
  KvConfig c = testing::make_config(num_blocks, 4);
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  return KvManager(c);
}

TEST(KvRecurrentState, BlockIdsForkCopyOnWriteAndFree) {
  KvManager kv = make_kv(16);
  ASSERT_EQ(std::string(kv.group(1).kind()), "recurrent_state");
  EXPECT_FALSE(kv.config().enable_prefix_caching) << "a recurrent state cannot be restored by a prefix hit";
  EXPECT_EQ(kv.max_blocks_for_sequence(6, 512), 2 + 2);
  EXPECT_EQ(kv.max_blocks_for_sequence(100, 1), 25 + 2);

  // Allocate 6 tokens: group 0 takes 1, 2; the state its fixed 2 blocks 3, 4.
  const Tokens t = testing::iota_tokens(100, 6);
  auto a = kv.can_allocate(kv.match_prefix(t, ""), 6);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_blocks_needed(), 4);
  ASSERT_TRUE(kv.allocate(1, *a).ok());
  EXPECT_EQ(group_table(kv, 1, 0), (Ids{1, 2}));
  EXPECT_EQ(group_table(kv, 1, 1), (Ids{3, 4}));
  EXPECT_EQ(kv.check_invariants(), "");
  kv.mark_computed(1, t, 6);
  EXPECT_EQ(kv.check_invariants(), "");

  // Decode to 9 tokens: group 0 grows by block 5; the state stays at 3, 4 (no copy: not shared).
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(1, 3, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(group_table(kv, 1, 0), (Ids{1, 2, 5}));
  EXPECT_EQ(group_table(kv, 1, 1), (Ids{3, 4}));
  const Tokens t9 = testing::concat(t, testing::iota_tokens(200, 3));
  kv.mark_computed(1, t9, 9);
  EXPECT_EQ(kv.check_invariants(), "");

  // The full blocks were not committed: a new sequence with the same tokens gets no hit.
  EXPECT_EQ(testing::cached_tokens(kv, t9), 0);

  // Fork: the child shares all five blocks; its first step copies the shared
  // partial block 5 (it holds computed token 8) and both state blocks.
  ASSERT_TRUE(kv.fork(1, 2).ok());
  EXPECT_EQ(group_table(kv, 2, 1), (Ids{3, 4}));
  EXPECT_EQ(kv.check_invariants(), "");
  ASSERT_TRUE(kv.append_slots(2, 1, &copies));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{5, 6}, {3, 7}, {4, 8}}));
  EXPECT_EQ(group_table(kv, 2, 0), (Ids{1, 2, 6}));
  EXPECT_EQ(group_table(kv, 2, 1), (Ids{7, 8}));
  EXPECT_EQ(kv.check_invariants(), "");
  // The parent now holds its blocks alone: its step copies nothing.
  copies.clear();
  ASSERT_TRUE(kv.append_slots(1, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(group_table(kv, 1, 1), (Ids{3, 4}));
  EXPECT_EQ(kv.check_invariants(), "");

  // The state cannot roll back: truncating below the computed tokens is refused, unchanged.
  EXPECT_FALSE(kv.truncate(1, 8));
  EXPECT_EQ(kv.num_computed_tokens(1), 9);
  EXPECT_EQ(group_table(kv, 1, 1), (Ids{3, 4}));
  // Dropping slots past the computed tokens is fine, and keeps the state.
  EXPECT_TRUE(kv.truncate(1, 9));
  EXPECT_EQ(group_table(kv, 1, 1), (Ids{3, 4}));
  EXPECT_EQ(kv.check_invariants(), "");

  ASSERT_TRUE(kv.free(1));
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(kv.check_invariants(), "");
  EXPECT_EQ(kv.num_free_blocks(), 15);
}

TEST(KvRecurrentState, AdmissionCountsTheStateBlocks) {
  // 9 usable blocks: two 6-token sequences take 2 + 2 each; a third needs 4 more, only 1 is left.
  KvManager kv = make_kv(10);
  ASSERT_EQ(testing::prefill(kv, 1, testing::iota_tokens(0, 6)), 0);
  ASSERT_EQ(testing::prefill(kv, 2, testing::iota_tokens(50, 6)), 0);
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_FALSE(testing::can_allocate(kv, testing::iota_tokens(90, 1), 1));
  ASSERT_TRUE(kv.free(1));
  EXPECT_TRUE(testing::can_allocate(kv, testing::iota_tokens(90, 1), 1));
  EXPECT_EQ(kv.check_invariants(), "");
}

// plan_pool packs the state rows into whole blocks and counts them per sequence.
TEST(KvRecurrentState, PlanPoolCountsStateBlocks) {
  PoolRequest r;
  r.shape = {.kind = AttentionKind::kMQA, .num_layers = 16, .num_kv_heads = 1, .head_dim = 512};
  r.dtype = kv_dtype_f16();
  // LFM2-350M: attention at 2, 5, 8, 10, 12, 14; 10 conv layers x 2 rows of 1024 f32.
  for (int l = 0; l < 16; ++l)
    r.layer_windows.push_back(l == 2 || l == 5 || l == 8 || l == 10 || l == 12 || l == 14 ? 0 : kStateWindow);
  r.block_size = 16;
  r.state_rows = 20;
  r.state_row_bytes = 4096;
  r.num_blocks = 101;
  auto p = plan_pool(r);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->layout.group_size, 6);
  EXPECT_EQ(p->layout.windows, (std::vector<int32_t>{0, kStateWindow}));
  EXPECT_EQ(p->layout.layer_group[0], 1);
  EXPECT_EQ(p->layout.layer_slot[0], -1);
  EXPECT_EQ(p->layout.layer_slot[14], 5);
  EXPECT_EQ(p->block_bytes, 6u * 16 * 2 * 1024);  // 192 KiB: the attention layers only
  // A block's 12 chunks of 16 KiB hold 4 rows of 4 KiB each: 48 rows, so 20 rows take 1 block.
  EXPECT_EQ(kv_state_rows_per_block(r.shape, r.dtype, 16, 6, 4096), 48);
  EXPECT_EQ(p->layout.state_blocks, 1);
  EXPECT_EQ(kv_blocks_for_sequence(p->layout, 1000, 16), 63 + 1);
  EXPECT_EQ(p->max_tokens, 99 * 16);  // 100 usable blocks, one for the state
  // A state row wider than a chunk is refused with the reason.
  r.block_size = 1;
  auto bad = plan_pool(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("larger block size"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace pagoda::kv
