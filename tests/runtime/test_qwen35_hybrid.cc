// Qwen3.5 (issue 38): a hybrid of Gated DeltaNet layers, whose fixed-size
// recurrent state (convolution rows + one S x S matrix per v head) lives in the
// KV pool's state group (kv/recurrent_state_group.cc), and gated attention
// layers. Through the real Engine on the tiny-qwen35 synth preset (delta-net,
// delta-net, attention, x 2; f16 K/V in blocks of 4 tokens; 4 delta-net layers x
// (24 conv + 64 matrix) rows of 16 floats = 352 rows, 32 per block: S = 11):
//  - every greedy token and every logits row is bitwise the same alone,
//    batched, on 2 threads, in chunked prefill of 1, 3, 5 and 16 tokens per step, after
//    preemptions (a tiny pool), and for each choice of an n = 3 fork against
//    lone seeded requests (the forked state is copied on write, not shared);
//  - each sequence holds exactly ceil(tokens / 4) attention blocks + S state blocks;
//  - a repeated prompt is bitwise the same (no prefix hit here; a checkpoint hit
//    once state checkpoints exist);
//  - a fixed --kv-cache-memory admits exactly the sequences kv/sizing predicts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/rng.h"
#include "engine/engine.h"
#include "gguf/synth.h"
#include "kv/pool_plan.h"
#include "kv/sizing.h"
#include "runtime/hybrid_run.h"

namespace pagoda {
namespace {

using namespace hybrid_test;


class Qwen35Hybrid : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(::testing::TempDir() + "pagoda_qwen35_" + std::to_string(::getpid()) + ".gguf");
    const gguf::SynthShape* s = gguf::find_synth_preset("tiny-qwen35");
    ASSERT_NE(s, nullptr);
    gguf::SynthOptions o;
    o.shape = *s;
    o.type = GgmlType::F32;
    o.seed = 35;
    const Status st = gguf::synth_model_file(o, *path_);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  static void TearDownTestSuite() {
    if (path_) std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
  }
  static std::string* path_;
};
std::string* Qwen35Hybrid::path_ = nullptr;

constexpr int kStateBlocks = 11;  // 352 rows of 64 B; a block's 4 chunks (2 slots x K, V of 4 x 128 B) hold 8 each: 32

// Two kernel threads: the delta rule's heads split over the pool (prompts of 37
// and 61 tokens reach its split), the matmuls too: no bit changes.
TEST_F(Qwen35Hybrid, AloneBatchedAndChunkedAreBitwiseTheSame) {
  check_alone_batched_chunked(*path_, kStateBlocks, {1, 3, 5, 16}, true);
}

// Pools far smaller than the four sequences' 26 + 19 + 32 + 23 blocks (hybrid_run.h).
TEST_F(Qwen35Hybrid, PreemptedIsBitwiseTheSame) { check_preempted(*path_, {40, 50, 60}); }

TEST_F(Qwen35Hybrid, ForkedChoicesEqualLoneSeededRequests) { check_forked_choices(*path_); }

// A repeated prompt gives bitwise the same tokens and logits. On this branch the
// prefix cache is off for hybrids (no hit: the state is recomputed); with state
// checkpoints (kv/state_checkpoint.cc, another branch) a hit must restore the
// delta-net state exactly, which this also checks.
TEST_F(Qwen35Hybrid, RepeatedPromptIsBitwiseTheSame) {
  const std::vector<int32_t> prompt = random_tokens(5, 40);
  const auto out = run(base_config(*path_, 2048), {{prompt}, {prompt}}, 4, false);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0][0].tokens.size(), 4u);
  expect_same(out[0][0], out[1][0], "repeated prompt");
}

// A pool of a fixed byte budget admits exactly floor(usable / per-sequence)
// sequences, the per-sequence blocks being kv/sizing's attention blocks plus
// the state's (the same plan_pool the engine sizes itself with).
TEST_F(Qwen35Hybrid, KvCacheMemoryAdmitsWhatSizingPredicts) {
  // 13-token prompts and 3 outputs: 15 computed tokens at the end, 4 blocks of
  // 4 from admission on (the prompt's 13 already take 4), + S = 15 per sequence.
  const int kPrompt = 13, kOut = 3;
  kv::PoolRequest pr;
  pr.shape.kind = kv::AttentionKind::kMQA;
  pr.shape.num_layers = 6;
  pr.shape.num_kv_heads = 1;
  pr.shape.head_dim = 64;  // 2 KV heads x 32
  pr.dtype = kv::kv_dtype_of(KvDtype::F16);
  pr.layer_windows = {kv::kStateWindow, kv::kStateWindow, 0, kv::kStateWindow, kv::kStateWindow, 0};
  pr.block_size = 4;
  pr.max_chunk = 2048;
  pr.state_rows = 352;
  pr.state_row_bytes = 16 * 4;
  const uint64_t block_bytes = 2 * 4 * 2 * 64 * 2;  // G = 2 slots x 4 tokens x (K + V) x 64 x f16
  pr.budget_bytes = 91 * block_bytes + block_bytes / 2;  // 91 blocks
  auto plan = kv::plan_pool(pr);
  ASSERT_TRUE(plan.ok()) << plan.message();
  ASSERT_EQ(plan->block_bytes, block_bytes);
  ASSERT_EQ(plan->num_blocks, 91);
  ASSERT_EQ(plan->layout.state_blocks, kStateBlocks);
  const int64_t per_seq = kv::kv_blocks_for_sequence(plan->layout, kPrompt + kOut - 1, 4);
  ASSERT_EQ(per_seq, 4 + kStateBlocks);
  const int64_t predicted = kv::max_concurrency(plan->num_blocks, per_seq, 0.0);
  ASSERT_EQ(predicted, 6);  // 90 usable / 15

  engine::EngineConfig c = base_config(*path_, 2048);
  c.num_kv_blocks = 0;
  c.kv_cache_memory = static_cast<int64_t>(pr.budget_bytes);
  std::vector<Req> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back({random_tokens(100 + static_cast<uint64_t>(i), kPrompt)});
  RunStats st;
  const auto out = run(c, reqs, kOut, true, &st);
  EXPECT_EQ(st.max_running, predicted);
  EXPECT_EQ(st.preemptions, 0);
  for (const auto& o : out) EXPECT_EQ(o[0].tokens.size(), static_cast<size_t>(kOut));
  auto e = engine::Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.message();
  EXPECT_EQ((*e)->model_info().num_kv_blocks, 91);
}

}  // namespace
}  // namespace pagoda
