// Mamba-2 (issue 38): no attention layer at all; every layer's fixed-size
// recurrent state (conv rows + the scan's H x P rows of N floats) lives in the
// KV pool's state group (kv/recurrent_state_group.cc), and the token group
// (the prefix chain) has one K/V slot no layer uses (kv/sizing.h). Through the
// real Engine on the tiny-mamba2 synth preset (3 layers, d_inner 128 in 8 heads,
// d_state 32, 2 B/C groups; f16 pool in blocks of 4 tokens: one slot of
// 4 x (K + V) x 32 f16 holds 4 state rows of 32 floats, so the 3 x 152 = 456
// rows take S = 114 blocks per sequence):
//  - every greedy token and every logits row is bitwise the same alone,
//    batched, on 2 threads, in chunked prefill of 1, 3, 5 and 16 tokens per
//    step, after preemptions (small pools), and for each choice of an n = 3
//    fork against lone seeded requests (the forked state copied on write);
//  - the scalar (ref) kernels give the same greedy tokens, logits within rounding;
//  - each sequence holds exactly ceil(tokens / 4) token blocks + S state blocks;
//  - state checkpoints: a second turn restores the latest checkpoint inside its
//    cached prefix, bitwise a cold run; shared-prefix prompts hitting checkpoints
//    are bitwise the cold outputs alone, batched, chunked, after preemptions and
//    in n = 3 forks; a ~4,000-token conversation restores bitwise;
//  - a fixed --kv-cache-memory admits exactly the sequences kv/sizing predicts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
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

class Mamba2Hybrid : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(::testing::TempDir() + "pagoda_mamba2_" + std::to_string(::getpid()) + ".gguf");
    const gguf::SynthShape* s = gguf::find_synth_preset("tiny-mamba2");
    ASSERT_NE(s, nullptr);
    gguf::SynthOptions o;
    o.shape = *s;
    o.type = GgmlType::F32;
    o.seed = 2;
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
std::string* Mamba2Hybrid::path_ = nullptr;

constexpr int kStateBlocks = 114;  // 456 rows of 128 B; a block's 2 chunks (1 slot x K, V of 4 x 64 B) hold 2 each: 4

// Two kernel threads: the matmuls split over the pool (the scan's heads of
// 16 x 32 from 16 tokens on): no bit changes.
TEST_F(Mamba2Hybrid, AloneBatchedAndChunkedAreBitwiseTheSame) {
  check_alone_batched_chunked(*path_, kStateBlocks, {1, 3, 5, 16}, true);
}

// The scalar kernels (ref::ssm_scan, ref matmuls and norms): the same greedy
// tokens, logits within float rounding of the SIMD forward.
TEST_F(Mamba2Hybrid, RefKernelsAgree) {
  const auto p = hybrid_prompts();
  const int kOut = 8;
  const auto cpu = run(base_config(*path_, 2048), p, kOut, true);
  engine::EngineConfig rc = base_config(*path_, 2048);
  rc.ref_kernels = true;
  const auto ref = run(rc, p, kOut, true);
  ASSERT_EQ(cpu.size(), ref.size());
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(cpu[i][0].tokens, ref[i][0].tokens) << "request " << i;
    ASSERT_EQ(cpu[i][0].logits.size(), ref[i][0].logits.size());
    for (size_t s = 0; s < cpu[i][0].logits.size(); ++s) {
      float scale = 0, diff = 0;
      for (size_t v = 0; v < cpu[i][0].logits[s].size(); ++v) {
        scale = std::max(scale, std::fabs(ref[i][0].logits[s][v]));
        diff = std::max(diff, std::fabs(cpu[i][0].logits[s][v] - ref[i][0].logits[s][v]));
      }
      EXPECT_LT(diff, 1e-3f * scale) << "request " << i << " step " << s;
    }
  }
}

// Pools far smaller than the four sequences' 129 + 122 + 135 + 126 blocks (hybrid_run.h).
TEST_F(Mamba2Hybrid, PreemptedIsBitwiseTheSame) { check_preempted(*path_, {200, 260, 320}); }

TEST_F(Mamba2Hybrid, ForkedChoicesEqualLoneSeededRequests) { check_forked_choices(*path_); }

TEST_F(Mamba2Hybrid, PrefixCacheIsOffWithoutCheckpoints) {
  const std::vector<int32_t> prompt = random_tokens(5, 40);
  const auto out = run(cold_config(*path_, 2048), {{prompt}, {prompt}}, 4, false);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1][0].num_cached, 0) << "a recurrent state cannot be restored without a checkpoint";
  expect_same(out[0][0], out[1][0], "repeated prompt");
}

// A second turn restores the latest checkpoint inside its cached prefix, bitwise a cold run (hybrid_run.h).
TEST_F(Mamba2Hybrid, SecondTurnRestoresACheckpointBitwiseAsCold) { check_second_turn_restores_checkpoint(*path_); }

// A ~4,000-token conversation restores the checkpoint at 3,008 bitwise (hybrid_run.h);
// 800 blocks of 16: the 29 state blocks of each checkpoint beside the 251 token blocks.
TEST_F(Mamba2Hybrid, FourThousandTokenConversationRestoresBitwise) { check_long_conversation_restores(*path_, 800); }

// Shared-prefix prompts hitting checkpoints: bitwise the cold outputs alone,
// batched, chunked, in small pools and n = 3 forks (hybrid_run.h). A sequence
// holds ~135 blocks, 114 of them state: 260 blocks preempts a decoding
// sequence; at 370 the later admissions hit checkpoints.
TEST_F(Mamba2Hybrid, CheckpointHitsAreBatchInvariant) { check_checkpoint_hits_batch_invariant(*path_, {260, 370, 400}); }

// A pool of a fixed byte budget admits exactly floor(usable / per-sequence)
// sequences, the per-sequence blocks being kv/sizing's token blocks plus the
// state's (the same plan_pool the engine sizes itself with).
TEST_F(Mamba2Hybrid, KvCacheMemoryAdmitsWhatSizingPredicts) {
  // 13-token prompts and 3 outputs: 15 computed tokens, 4 token blocks of 4 + S per sequence.
  const int kPrompt = 13, kOut = 3;
  kv::PoolRequest pr;
  pr.shape.kind = kv::AttentionKind::kMQA;
  pr.shape.num_layers = 0;  // no attention layer
  pr.shape.num_kv_heads = 1;
  pr.shape.head_dim = 32;  // the slot's row: one state row of d_state
  pr.dtype = kv::kv_dtype_of(KvDtype::F16);
  pr.layer_windows = {kv::kStateWindow, kv::kStateWindow, kv::kStateWindow};
  pr.block_size = 4;
  pr.max_chunk = 2048;
  pr.state_rows = 456;
  pr.state_row_bytes = 32 * 4;
  const uint64_t block_bytes = 1 * 4 * 2 * 32 * 2;  // G = 1 slot x 4 tokens x (K + V) x 32 x f16
  pr.budget_bytes = 710 * block_bytes + block_bytes / 2;  // 710 blocks
  auto plan = kv::plan_pool(pr);
  ASSERT_TRUE(plan.ok()) << plan.message();
  ASSERT_EQ(plan->block_bytes, block_bytes);
  ASSERT_EQ(plan->num_blocks, 710);
  ASSERT_EQ(plan->layout.state_blocks, kStateBlocks);
  const int64_t per_seq = kv::kv_blocks_for_sequence(plan->layout, kPrompt + kOut - 1, 4);
  ASSERT_EQ(per_seq, 4 + kStateBlocks);
  const int64_t predicted = kv::max_concurrency(plan->num_blocks, per_seq, 0.0);
  ASSERT_EQ(predicted, 6);  // 709 usable / 118

  engine::EngineConfig c = base_config(*path_, 2048);
  c.num_kv_blocks = 0;
  c.kv_cache_memory = static_cast<int64_t>(pr.budget_bytes);
  std::vector<Req> reqs;
  for (int k = 0; k < 10; ++k) reqs.push_back({random_tokens(100 + static_cast<uint64_t>(k), kPrompt)});
  RunStats st;
  const auto out = run(c, reqs, kOut, true, &st);
  EXPECT_EQ(st.max_running, predicted);
  EXPECT_EQ(st.preemptions, 0);
  for (const auto& o : out) EXPECT_EQ(o[0].tokens.size(), static_cast<size_t>(kOut));
  auto e = engine::Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.message();
  EXPECT_EQ((*e)->model_info().num_kv_blocks, 710);
}

}  // namespace
}  // namespace pagoda
