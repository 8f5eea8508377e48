// kv::plan_pool: the pool's layout, block bytes, block count and longest
// sequence, with exact values worked out by hand, and the KvManager built from
// a plan (KvConfig::from_plan) holding exactly the plan's longest sequence.
#include <gtest/gtest.h>

#include <climits>

#include "kv/kv_manager.h"
#include "kv/pool_plan.h"

namespace pagoda::kv {
namespace {

// 4 layers alternating full and window 8; one K and one V row of 32 f16 per
// token and layer: 128 bytes per token per layer.
PoolRequest request(bool hybrid) {
  PoolRequest r;
  r.shape.kind = AttentionKind::kMQA;
  r.shape.num_layers = 4;
  r.shape.num_kv_heads = 1;
  r.shape.head_dim = 32;
  r.dtype = kv_dtype_f16();
  r.layer_windows = {0, 8, 0, 8};
  r.hybrid = hybrid;
  r.block_size = 4;
  r.max_chunk = 4;
  return r;
}

// The plan of request(hybrid) for a budget of 10 KiB + 5 bytes.
PoolPlan budget_plan(bool hybrid) {
  PoolRequest r = request(hybrid);
  r.budget_bytes = 10 * 1024 + 5;
  auto p = plan_pool(r);
  EXPECT_TRUE(p.ok()) << p.message();
  return p.ok() ? *p : PoolPlan{};
}

TEST(PoolPlan, HybridLayoutFromBudget) {
  const PoolPlan p = budget_plan(true);
  // G = 2 layers of each kind: one full group, one window group.
  EXPECT_EQ(p.layout.group_size, 2);
  EXPECT_EQ(p.layout.windows, (std::vector<int32_t>{0, 8}));
  EXPECT_EQ(p.layout.layer_group, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(p.layout.layer_slot, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(p.block_size, 4);
  EXPECT_EQ(p.block_bytes, 2u * 4 * 128);
  EXPECT_EQ(p.num_blocks, 10);
  EXPECT_EQ(p.bytes_total(), 10u * 1024);
  // ceil(n/4) + min(ceil(n/4), ceil((8 + 4 - 2)/4) + 1 = 4) <= 9 blocks: n <= 20.
  EXPECT_EQ(p.max_tokens, 20);
}

TEST(PoolPlan, OneGroupWithoutHybrid) {
  const PoolPlan p = budget_plan(false);
  EXPECT_EQ(p.layout.group_size, 4);
  EXPECT_EQ(p.layout.windows, (std::vector<int32_t>{0}));
  EXPECT_EQ(p.block_bytes, 4u * 4 * 128);
  EXPECT_EQ(p.num_blocks, 5);
  EXPECT_EQ(p.max_tokens, 16);  // 4 usable blocks of 4 tokens
}

TEST(PoolPlan, SizeFromBlocksOrOneContext) {
  PoolRequest r = request(true);
  r.budget_bytes = 1 << 20;
  r.num_blocks = 7;  // wins over the budget
  auto p = plan_pool(r);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->num_blocks, 7);
  EXPECT_EQ(p->max_tokens, 12);  // ceil(n/4) + min(ceil(n/4), 4) <= 6: n <= 12
  r.one_context_tokens = 100;  // wins over both: 25 + 4 blocks + the null block
  p = plan_pool(r);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->num_blocks, 30);
  EXPECT_EQ(p->max_tokens, 100);
  // Capped at INT32_MAX / 2 blocks; one full group of 1-token blocks.
  PoolRequest big = request(false);
  big.block_size = 1;
  big.num_blocks = int64_t{1} << 40;
  p = plan_pool(big);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->num_blocks, INT32_MAX / 2);
  EXPECT_EQ(p->max_tokens, INT32_MAX / 2 - 1);
}

TEST(PoolPlan, Errors) {
  PoolRequest r = request(true);
  r.budget_bytes = 1024 + 1023;  // one block
  auto p = plan_pool(r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.message(), "the KV cache budget holds 1 blocks of 1024 bytes; at least 2 are needed");
  r.budget_bytes = 1 << 20;
  r.block_size = 0;
  EXPECT_FALSE(plan_pool(r).ok());
  r.block_size = 257;
  EXPECT_FALSE(plan_pool(r).ok());
  r.block_size = 4;
  r.max_chunk = 0;
  EXPECT_FALSE(plan_pool(r).ok());
  r.max_chunk = 4;
  r.layer_windows.clear();
  EXPECT_FALSE(plan_pool(r).ok());
}

TEST(PoolPlan, KvManagerFromPlanHoldsItsLongestSequence) {
  for (bool hybrid : {true, false}) {
    PoolRequest r = request(hybrid);
    r.budget_bytes = 23 * 1024;
    auto p = plan_pool(r);
    ASSERT_TRUE(p.ok()) << p.message();
    const KvConfig c = KvConfig::from_plan(*p);
    EXPECT_EQ(c.num_blocks, p->num_blocks);
    EXPECT_EQ(c.block_size, 4);
    ASSERT_EQ(c.groups.size(), p->layout.windows.size());
    for (size_t g = 0; g < c.groups.size(); ++g) EXPECT_EQ(c.groups[g].sliding_window, p->layout.windows[g]);
    KvManager kv(c);
    EXPECT_LE(kv.max_blocks_for_sequence(p->max_tokens, r.max_chunk), kv.num_usable_blocks()) << hybrid;
    EXPECT_GT(kv.max_blocks_for_sequence(p->max_tokens + 1, r.max_chunk), kv.num_usable_blocks()) << hybrid;
  }
}

}  // namespace
}  // namespace pagoda::kv
