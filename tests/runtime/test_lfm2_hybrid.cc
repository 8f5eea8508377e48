// LFM2 (issue 38): a hybrid of short-convolution layers, whose fixed-size
// recurrent state lives in a KV group of its own (kv/recurrent_state_group.cc),
// and attention layers. Through the real Engine on the tiny-lfm2 synth preset
// (conv, attn, conv, conv, attn, conv; f16 K/V in blocks of 4 tokens, so the
// 8 state rows of 64 floats take S = 2 blocks per sequence):
//  - every greedy token and every logits row is bitwise the same alone,
//    batched, in chunked prefill of 1, 3 and 16 tokens per step, after
//    preemptions (a tiny pool), and for each choice of an n = 3 fork against
//    lone seeded requests (the forked state is copied on write, not shared);
//  - each sequence holds exactly ceil(tokens / 4) attention blocks + S state blocks;
//  - with --state-checkpoint-interval 0 the prefix cache is off for the model;
//  - with state checkpoints (kv/state_checkpoint.cc) the second turn of a
//    conversation (also one of ~4,000 tokens) restores the latest checkpoint
//    inside its cached prefix, exactly where the arithmetic says, and its
//    tokens and logits are bitwise a cold run's; shared-prefix prompts hitting
//    checkpoints are bitwise the cold outputs alone, batched, chunked, after
//    preemptions and in n = 3 forks; the KV invariants hold after every step;
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


class Lfm2Hybrid : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(::testing::TempDir() + "pagoda_lfm2_" + std::to_string(::getpid()) + ".gguf");
    const gguf::SynthShape* s = gguf::find_synth_preset("tiny-lfm2");
    ASSERT_NE(s, nullptr);
    gguf::SynthOptions o;
    o.shape = *s;
    o.type = GgmlType::F32;
    o.seed = 38;
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
std::string* Lfm2Hybrid::path_ = nullptr;

constexpr int kStateBlocks = 2;  // 8 rows of 256 B; a block's chunks (2 slots x K, V of 4 x 64 B) hold 1 each: 4

TEST_F(Lfm2Hybrid, AloneBatchedAndChunkedAreBitwiseTheSame) {
  check_alone_batched_chunked(*path_, kStateBlocks, {1, 3, 16}, false);
}

// Pools far smaller than the four sequences' 18 + 11 + 24 + 14 blocks (hybrid_run.h).
TEST_F(Lfm2Hybrid, PreemptedIsBitwiseTheSame) { check_preempted(*path_, {26, 30, 34}); }

TEST_F(Lfm2Hybrid, ForkedChoicesEqualLoneSeededRequests) { check_forked_choices(*path_); }

TEST_F(Lfm2Hybrid, PrefixCacheIsOffWithoutCheckpoints) {
  const std::vector<int32_t> prompt = random_tokens(5, 40);
  const auto out = run(cold_config(*path_, 2048), {{prompt}, {prompt}}, 4, false);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1][0].num_cached, 0) << "a recurrent state cannot be restored from cached K/V blocks";
  // A negative interval is refused with the flag's name, and no engine is made.
  engine::EngineConfig bad = base_config(*path_, 2048);
  bad.state_checkpoint_interval = -1;
  auto e = engine::Engine::create(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("--state-checkpoint-interval must be"), std::string::npos) << e.message();
  expect_same(out[0][0], out[1][0], "repeated prompt");
}

// A pool of a fixed byte budget admits exactly floor(usable / per-sequence)
// sequences, the per-sequence blocks being kv/sizing's attention blocks plus
// the state's (the same plan_pool the engine sizes itself with).
TEST_F(Lfm2Hybrid, KvCacheMemoryAdmitsWhatSizingPredicts) {
  // 13-token prompts and 3 outputs: 15 computed tokens at the end, 4 blocks of
  // 4 from admission on (the prompt's 13 already take 4), + S = 6 per sequence.
  const int kPrompt = 13, kOut = 3;
  kv::PoolRequest pr;
  pr.shape.kind = kv::AttentionKind::kMQA;
  pr.shape.num_layers = 6;
  pr.shape.num_kv_heads = 1;
  pr.shape.head_dim = 32;  // 2 KV heads x 16
  pr.dtype = kv::kv_dtype_of(KvDtype::F16);
  pr.layer_windows = {kv::kStateWindow, 0, kv::kStateWindow, kv::kStateWindow, 0, kv::kStateWindow};
  pr.block_size = 4;
  pr.max_chunk = 2048;
  pr.state_rows = 8;
  pr.state_row_bytes = 64 * 4;
  const uint64_t block_bytes = 2 * 4 * 2 * 32 * 2;  // G = 2 slots x 4 tokens x (K + V) x 32 x f16
  pr.budget_bytes = 37 * block_bytes + block_bytes / 2;  // 37 blocks
  auto plan = kv::plan_pool(pr);
  ASSERT_TRUE(plan.ok()) << plan.message();
  ASSERT_EQ(plan->block_bytes, block_bytes);
  ASSERT_EQ(plan->num_blocks, 37);
  ASSERT_EQ(plan->layout.state_blocks, kStateBlocks);
  const int64_t per_seq = kv::kv_blocks_for_sequence(plan->layout, kPrompt + kOut - 1, 4);
  ASSERT_EQ(per_seq, 4 + kStateBlocks);
  const int64_t predicted = kv::max_concurrency(plan->num_blocks, per_seq, 0.0);
  ASSERT_EQ(predicted, 6);  // 36 usable / 6

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
  EXPECT_EQ((*e)->model_info().num_kv_blocks, 37);
}

// A second turn restores the latest checkpoint inside its cached prefix, bitwise a cold run (hybrid_run.h).
TEST_F(Lfm2Hybrid, SecondTurnRestoresACheckpointBitwiseAsCold) { check_second_turn_restores_checkpoint(*path_); }

// A ~4,000-token conversation restores the checkpoint at 3,008 bitwise (hybrid_run.h).
TEST_F(Lfm2Hybrid, FourThousandTokenConversationRestoresBitwise) { check_long_conversation_restores(*path_, 600); }

// Shared-prefix prompts hitting checkpoints: bitwise the cold outputs alone,
// batched, chunked, in pools of 24 to 32 blocks (preemptions; readmissions hit
// checkpoints) and n = 3 forks (hybrid_run.h).
TEST_F(Lfm2Hybrid, CheckpointHitsAreBatchInvariant) { check_checkpoint_hits_batch_invariant(*path_, {24, 28, 32}); }

}  // namespace
}  // namespace pagoda
