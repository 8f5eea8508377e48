// The runner's KV storage and the KvManager's pool come from one kv::plan_pool
// plan: for every cache dtype, with and without KV groups, the storage a
// runner built from the plan maps (RunnerOptions::use_pool -> kv_storage_spec
// -> KvStorage) is exactly the plan's num_blocks x block_bytes, with the plan's
// layer slots and groups.
#include <gtest/gtest.h>

#include <vector>

#include "kv/pool_plan.h"
#include "model/config.h"
#include "runtime/model_runner.h"

using namespace pagoda;

TEST(PoolStorage, StorageBuiltFromThePlanIsThePlansBytes) {
  struct Model {
    int32_t n_kv_heads, head_dim;
    std::vector<int32_t> windows;
  };
  const Model models[] = {
      {2, 32, {0, 0, 0}},                            // one full group
      {1, 64, {512, 512, 512, 512, 512, 0}},         // Gemma-like: 5 window layers per full one
      {4, 16, {0, 8, 0, 8, 16, 16, 16}},             // three kinds
  };
  for (const Model& m : models) {
    for (KvDtype dtype : kAllKvDtypes) {
      for (bool hybrid : {true, false}) {
        model::ModelConfig mc;
        mc.n_layers = static_cast<int32_t>(m.windows.size());
        mc.n_kv_heads = m.n_kv_heads;
        mc.head_dim = m.head_dim;
        // The engine's view of the cache: one row of n_kv_heads x head_dim per layer.
        kv::PoolRequest r;
        r.shape.kind = kv::AttentionKind::kMQA;
        r.shape.num_layers = mc.n_layers;
        r.shape.num_kv_heads = 1;
        r.shape.head_dim = m.n_kv_heads * m.head_dim;
        r.dtype = kv::kv_dtype_of(dtype);
        r.layer_windows = m.windows;
        r.hybrid = hybrid;
        r.block_size = 4;
        r.max_chunk = 8;
        r.budget_bytes = 1 << 20;
        auto plan = kv::plan_pool(r);
        ASSERT_TRUE(plan.ok()) << plan.message();
        runtime::RunnerOptions ro;
        ro.use_pool(*plan);
        ro.kv_dtype = dtype;
        const runtime::KvStorageSpec spec = runtime::kv_storage_spec(mc, ro);
        const std::string what = std::string(kv_dtype_name(dtype)) + (hybrid ? " hybrid " : " one group ") +
                                 std::to_string(m.windows.size()) + " layers";
        EXPECT_EQ(spec.num_blocks, plan->num_blocks) << what;
        EXPECT_EQ(spec.block_size, 4) << what;
        EXPECT_EQ(spec.slots(), plan->layout.group_size) << what;
        EXPECT_EQ(ro.num_kv_groups, plan->layout.num_groups()) << what;
        EXPECT_EQ(spec.bytes_total(), plan->bytes_total()) << what;
        auto kv = runtime::KvStorage::create(spec);
        ASSERT_TRUE(kv.ok()) << what << ": " << kv.message();
        EXPECT_EQ((*kv)->bytes_total(), plan->bytes_total()) << what;
        EXPECT_EQ((*kv)->block_bytes(), plan->block_bytes) << what;
        ASSERT_EQ((*kv)->layers().size(), m.windows.size());
        for (size_t l = 0; l < m.windows.size(); ++l) {
          EXPECT_EQ((*kv)->layers()[l].group, plan->layout.layer_group[l]) << what << " layer " << l;
        }
      }
    }
  }
}
