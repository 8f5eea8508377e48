// A Qwen3.5-0.8B-shaped recurrent state through prefix caching (issue 38): the
// synth qwen3.5-0.8b preset keeps its real per-layer shapes (1,024 wide; Gated
// DeltaNet of 16 k and 16 v heads of 128 with a convolution of 4; gated
// attention of 8 heads, 2 KV heads of 256) but only its first 4 layers (3
// delta-net, then attention), a 2,048-token vocabulary and a 1,024-wide FFN,
// so that it takes about a second of CPU: the real state (one 128 x 128 f32 matrix
// per v head: 1 MiB per delta-net layer, plus the convolution rows) is 103
// blocks of 16 tokens per sequence, and a checkpoint as large. Turn 1 is 37
// tokens + 4 outputs (a checkpoint at 32); turn 2 shares turn 1's prompt and
// adds 13 tokens: it hits 32 tokens, restores that checkpoint, and its tokens
// and every logits row are bitwise a cold run's (no checkpoints, no caching).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gguf/synth.h"
#include "runtime/hybrid_run.h"

namespace pagoda {
namespace {

using namespace hybrid_test;

TEST(Qwen35RealShape, CheckpointOfARealSizeStateRestoresBitwise) {
  const std::clock_t c0 = std::clock();
  const gguf::SynthShape* s = gguf::find_synth_preset("qwen3.5-0.8b");
  ASSERT_NE(s, nullptr);
  gguf::SynthOptions o;
  o.shape = *s;
  // The state's shape is untouched: only what no state depends on shrinks.
  ASSERT_EQ(o.shape.ssm_state, 128);
  ASSERT_EQ(o.shape.ssm_v_heads, 16);
  ASSERT_EQ(o.shape.ssm_conv_kernel, 4);
  o.shape.n_vocab = 2048;
  o.shape.n_ff = 1024;
  o.shape.n_ctx = 4096;
  o.n_layers_override = 4;  // delta-net x 3, attention (full_attention_interval 4)
  o.type = GgmlType::Q8_0;
  o.seed = 8;
  const std::string path = ::testing::TempDir() + "pagoda_qwen35_real_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(gguf::synth_model_file(o, path).ok());

  const std::vector<int32_t> turn1 = random_tokens(1, 37);
  std::vector<int32_t> turn2 = turn1;
  const std::vector<int32_t> more = random_tokens(2, 13);
  turn2.insert(turn2.end(), more.begin(), more.end());

  engine::EngineConfig c = base_config(path, 2048);
  c.block_size = 16;
  c.num_kv_blocks = 512;
  c.state_checkpoint_interval = 2;  // every 32 tokens
  RunStats st;
  const auto warm = run(c, {{turn1}, {turn2}}, 4, false, &st);
  c.state_checkpoint_interval = 0;  // the cold reference: no checkpoints, no prefix caching
  const auto cold = run(c, {{turn2}}, 4, false);
  std::remove(path.c_str());
  ASSERT_EQ(warm.size(), 2u);
  ASSERT_EQ(cold.size(), 1u);
  EXPECT_EQ(warm[0][0].num_cached, 0);
  EXPECT_EQ(warm[1][0].num_cached, 32);
  expect_same(cold[0][0], warm[1][0], "turn 2 from the checkpoint at 32");
  EXPECT_EQ(st.checkpoints_hit, 1);
  EXPECT_EQ(st.checkpoints_stored, 1) << "turn 1's at 32; turn 2 (53 tokens) reaches no other boundary";
  // The state's blocks: turn 2's last event holds 4 attention blocks (53 tokens) + S = 103: 3 delta-net
  // layers x (16 x 128 x 128 x 4 B + 3 x 6,144 x 4 B of convolution) = 3,366,912 B over blocks of
  // 32,768 B (one attention layer's K and V, 2 heads of 256, 16 tokens, f16).
  EXPECT_EQ(warm[1][0].last_blocks, 4 + 103);
  // The guard: about 1 s of CPU here (the wall time follows the machine's load).
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  EXPECT_LT(cpu, 10.0) << "meant to stay within a few seconds";
}

}  // namespace
}  // namespace pagoda
