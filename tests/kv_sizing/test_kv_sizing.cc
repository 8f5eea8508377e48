// Pins the KV sizing arithmetic of kv/sizing.h against published numbers.
#include <gtest/gtest.h>

#include "kv/kv_manager.h"
#include "kv/sizing.h"

namespace pagoda::kv {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

KvShape gqa(int32_t layers, int32_t kv_heads, int32_t head_dim, AttentionKind kind = AttentionKind::kGQA) {
  return KvShape{.kind = kind, .num_layers = layers, .num_kv_heads = kv_heads, .head_dim = head_dim};
}

KvShape llama2_13b() { return gqa(40, 40, 128, AttentionKind::kMHA); }
KvShape llama31_8b() { return gqa(32, 8, 128); }
KvShape llama31_70b() { return gqa(80, 8, 128); }
KvShape smollm2_135m() { return gqa(30, 3, 64); }
KvShape gemma3_27b() {
  KvShape s = gqa(62, 16, 128);
  s.sliding_window = 1024;
  s.swa_period = 6;  // 5 local layers per global layer
  return s;
}
KvShape deepseek_v3() {
  KvShape s;
  s.kind = AttentionKind::kMLA;
  s.num_layers = 61;
  s.num_kv_heads = 128;  // ignored by MLA
  s.head_dim = 192;
  s.kv_lora_rank = 512;
  s.qk_rope_head_dim = 64;
  return s;
}

TEST(KvSizing, Llama2_13B_Fp16) {
  EXPECT_EQ(kv_bytes_per_token(llama2_13b(), kv_dtype_f16()), 819200u);  // 2 x 40 x 40 x 128 x 2
  EXPECT_EQ(kv_bytes_for_sequence(llama2_13b(), kv_dtype_f16(), 4096), 3 * kGiB + kGiB / 8);  // 3.125 GiB
}

TEST(KvSizing, Llama31) {
  EXPECT_EQ(kv_bytes_per_token(llama31_8b(), kv_dtype_bf16()), 131072u);
  EXPECT_EQ(kv_bytes_per_token(llama31_70b(), kv_dtype_bf16()), 327680u);
  EXPECT_EQ(kv_bytes_per_token_per_layer(llama31_70b(), kv_dtype_bf16()), 4096u);
  // 128k context, one request, Llama-3.1-70B: 40 GiB.
  EXPECT_EQ(kv_bytes_for_sequence(llama31_70b(), kv_dtype_bf16(), 131072), 40 * kGiB);
}

TEST(KvSizing, DeepSeekV3MlaIsOneLatentNoFactorTwo) {
  EXPECT_EQ(kv_bytes_per_token_per_layer(deepseek_v3(), kv_dtype_bf16()), (512u + 64u) * 2u);
  EXPECT_EQ(kv_bytes_per_token(deepseek_v3(), kv_dtype_bf16()), 70272u);  // 61 x 576 x 2
  EXPECT_EQ(kv_bytes_per_token(deepseek_v3(), kv_dtype_fp8()), 35136u);
  // The latent is not split by head: every TP rank keeps all of it.
  EXPECT_EQ(kv_bytes_per_token(shard_for_tp(deepseek_v3(), 8), kv_dtype_bf16()), 70272u);
}

TEST(KvSizing, SmolLM2AndQuantizedDtypes) {
  const KvShape s = smollm2_135m();
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_f16()), 23040u);  // 2 x 30 x 3 x 64 x 2
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_f32()), 46080u);
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_fp8()), 11520u);
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_int8()), 11520u);
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_q8_0()), 12240u);  // 64 -> 2 blocks x 34
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_q4()), 6480u);     // 64 -> 2 blocks x 18
  EXPECT_LE(kv_bytes_per_token(s, kv_dtype_q8_0()) * 100, kv_bytes_per_token(s, kv_dtype_f16()) * 54);
  EXPECT_LE(kv_bytes_per_token(llama31_70b(), kv_dtype_q8_0()) * 100,
            kv_bytes_per_token(llama31_70b(), kv_dtype_f16()) * 54);
  // llama.cpp reports for SmolLM2-135M at 8192 context: f16 180 MiB, q8_0 95.6 MiB.
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_f16(), 8192), 180 * kMiB);
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_q8_0(), 8192) * 1000, 95625 * kMiB);
}

TEST(KvSizing, Stories260KF32) {
  EXPECT_EQ(kv_bytes_per_token(gqa(5, 4, 8), kv_dtype_f32()), 1280u);  // 2 x 5 x 4 x 8 x 4
}

TEST(KvSizing, RowRoundsUpToWholeQuantBlocks) {
  EXPECT_EQ(kv_row_bytes(kv_dtype_q8_0(), 32), 34u);
  EXPECT_EQ(kv_row_bytes(kv_dtype_q8_0(), 33), 68u);
  EXPECT_EQ(kv_row_bytes(kv_dtype_q4(), 8), 18u);
  EXPECT_EQ(kv_row_bytes(kv_dtype_f16(), 7), 14u);
  EXPECT_EQ(kv_row_bytes(kv_dtype_f16(), 0), 0u);
}

TEST(KvSizing, Gemma3SlidingWindowLayers) {
  const KvShape s = gemma3_27b();
  int local = 0;
  for (int32_t l = 0; l < s.num_layers; ++l) local += s.is_local_layer(l);
  EXPECT_EQ(local, 52);
  EXPECT_EQ(s.num_local_layers(), 52);
  EXPECT_EQ(s.num_global_layers(), 10);
  EXPECT_TRUE(s.is_local_layer(0));
  EXPECT_TRUE(s.is_local_layer(4));
  EXPECT_FALSE(s.is_local_layer(5));
  EXPECT_FALSE(s.is_local_layer(59));
  EXPECT_TRUE(s.is_local_layer(61));

  const uint64_t per_layer = 2 * 16 * 128 * 2;
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_bf16()), 62 * per_layer);  // 507,904 worst case
  EXPECT_EQ(kv_bytes_per_token(s, kv_dtype_bf16()), 507904u);
  // Up to the window every layer holds every token.
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_bf16(), 1000), 1000 * 62 * per_layer);
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_bf16(), 1024), 1024 * 62 * per_layer);
  // Beyond it local layers stop at 1024.
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_bf16(), 4096), per_layer * (10 * 4096 + 52 * 1024));
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_bf16(), 131072), per_layer * (10 * 131072 + 52 * 1024));
  EXPECT_LT(kv_bytes_for_sequence(s, kv_dtype_bf16(), 131072), 131072 * kv_bytes_per_token(s, kv_dtype_bf16()) / 5);
}

TEST(KvSizing, PeriodCountsMatchLayerPredicate) {
  for (int32_t layers : {1, 5, 6, 7, 26, 62}) {
    for (int32_t period : {0, 1, 2, 3, 6}) {
      KvShape s = gqa(layers, 2, 16);
      s.sliding_window = 64;
      s.swa_period = period;
      int local = 0;
      for (int32_t l = 0; l < layers; ++l) local += s.is_local_layer(l);
      EXPECT_EQ(local, s.num_local_layers()) << "layers " << layers << " period " << period;
    }
  }
}

TEST(KvSizing, AllLayersLocalIsFlatBeyondTheWindow) {
  KvShape s = gqa(32, 8, 128);  // Mistral-7B v0.1
  s.sliding_window = 4096;
  s.swa_period = 0;
  EXPECT_EQ(s.num_local_layers(), 32);
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_f16(), 32768), kv_bytes_for_sequence(s, kv_dtype_f16(), 4096));
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_f16(), 2048), 2048 * kv_bytes_per_token(s, kv_dtype_f16()));
}

TEST(KvSizing, NoWindowSequenceIsLinear) {
  const KvShape s = llama31_8b();
  for (int64_t L : {1, 15, 16, 17, 4096, 100000}) {
    EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_bf16(), L), static_cast<uint64_t>(L) * 131072u);
  }
  EXPECT_EQ(kv_bytes_for_sequence(s, kv_dtype_bf16(), 0), 0u);
  EXPECT_EQ(kv_bytes_per_block(s, kv_dtype_bf16(), 16), 16u * 131072u);
}

TEST(KvSizing, TensorParallelSplitsKvHeadsAtLeastOnePerRank) {
  const KvShape s = llama31_70b();
  EXPECT_EQ(shard_for_tp(s, 1).num_kv_heads, 8);
  EXPECT_EQ(shard_for_tp(s, 4).num_kv_heads, 2);
  EXPECT_EQ(shard_for_tp(s, 8).num_kv_heads, 1);
  EXPECT_EQ(shard_for_tp(s, 16).num_kv_heads, 1);  // replicated
  EXPECT_EQ(kv_bytes_per_token(shard_for_tp(s, 4), kv_dtype_bf16()), 81920u);
  EXPECT_EQ(kv_bytes_per_token(shard_for_tp(s, 16), kv_dtype_bf16()), 40960u);
  EXPECT_EQ(shard_for_tp(gqa(2, 3, 8), 2).num_kv_heads, 2);  // ceil when not divisible
}

TEST(KvSizing, PoolArithmetic) {
  EXPECT_EQ(num_blocks_for_budget(1000, 300), 3);
  EXPECT_EQ(num_blocks_for_budget(899, 300), 2);
  EXPECT_EQ(num_blocks_for_budget(1000, 0), 0);
  EXPECT_EQ(blocks_for_tokens(8192, 16), 512);
  EXPECT_EQ(blocks_for_tokens(8193, 16), 513);
  // The watermark is a fraction of the usable blocks (null block excluded), as KvManager has it.
  EXPECT_EQ(watermark_blocks(1001, 0.01), 10);
  EXPECT_EQ(watermark_blocks(1000, 0.01), 9);   // floor(0.01 x 999)
  EXPECT_EQ(watermark_blocks(101, 0.01), 1);    // 0.01 x 100 is 1 despite rounding
  EXPECT_EQ(watermark_blocks(100, 0.01), 0);
  EXPECT_EQ(watermark_blocks(1000, 0.0), 0);
  EXPECT_EQ(usable_blocks(1001, 0.01), 990);  // 1001 - 1 null - 10 watermark
  EXPECT_EQ(usable_blocks(1, 0.01), 0);
  EXPECT_EQ(usable_blocks(0, 0.01), 0);
  EXPECT_EQ(max_concurrency(1001, 10, 0.01), 99);
  EXPECT_EQ(max_concurrency(1001, 10, 0.0), 100);
  EXPECT_EQ(max_concurrency(1000, 10, 0.01), 99);  // (999 - 9) / 10
  EXPECT_EQ(max_concurrency(1000, 0, 0.01), 0);
  // SmolLM2-135M f16 in a 1 GiB pool, 16-token blocks, 8192-token requests.
  const uint64_t per_block = kv_bytes_per_block(smollm2_135m(), kv_dtype_f16(), 16);
  EXPECT_EQ(per_block, 368640u);
  const int64_t n = num_blocks_for_budget(kGiB, per_block);
  EXPECT_EQ(n, 2912);
  EXPECT_EQ(max_concurrency(n, blocks_for_tokens(8192, 16), 0.01), 5);  // (2912 - 1 - 29) / 512
}

// max_concurrency() is what the real KvManager admits: full-context requests
// until allocate() (match_prefix + can_allocate + allocate) refuses.
int64_t admitted_by_kv_manager(int32_t num_blocks, int32_t block_size, int32_t tokens_per_request, double wm) {
  KvConfig cfg;
  cfg.num_blocks = num_blocks;
  cfg.block_size = block_size;
  cfg.watermark = wm;
  cfg.enable_prefix_caching = false;
  KvManager m(cfg);
  int64_t n = 0;
  for (;; ++n) {
    std::vector<TokenId> tokens(static_cast<size_t>(tokens_per_request), static_cast<TokenId>(n % 1000));
    auto got = m.allocate(static_cast<SeqId>(n + 1), tokens, tokens_per_request, "");
    if (!got.ok()) break;
  }
  return n;
}

TEST(KvSizing, MaxConcurrencyMatchesKvManagerAdmission) {
  struct Case { int32_t blocks, bs, tokens; double wm; };
  for (const Case& c : {Case{1001, 16, 160, 0.01}, Case{1000, 16, 160, 0.01}, Case{2912, 16, 8192, 0.01},
                        Case{101, 16, 17, 0.01}, Case{64, 8, 100, 0.0}, Case{500, 16, 1000, 0.05}}) {
    EXPECT_EQ(admitted_by_kv_manager(c.blocks, c.bs, c.tokens, c.wm),
              max_concurrency(c.blocks, blocks_for_tokens(c.tokens, c.bs), c.wm))
        << c.blocks << " blocks of " << c.bs << ", " << c.tokens << " tokens, watermark " << c.wm;
  }
}

TEST(KvSizing, ParseAndValidate) {
  EXPECT_EQ(parse_kv_dtype("Q8_0").value().block_bytes, 34);
  EXPECT_EQ(parse_kv_dtype("fp16").value().block_bytes, 2);
  EXPECT_EQ(parse_kv_dtype("q4").value().block_elems, 32);
  EXPECT_FALSE(parse_kv_dtype("fp4").ok());
  EXPECT_EQ(parse_attention_kind("MLA").value(), AttentionKind::kMLA);
  EXPECT_FALSE(parse_attention_kind("linear").ok());

  EXPECT_TRUE(validate_kv_shape(llama31_8b()).ok());
  EXPECT_TRUE(validate_kv_shape(deepseek_v3()).ok());
  KvShape bad = llama31_8b();
  bad.num_kv_heads = 0;
  EXPECT_FALSE(validate_kv_shape(bad).ok());
  KvShape mqa = gqa(4, 2, 64, AttentionKind::kMQA);
  EXPECT_FALSE(validate_kv_shape(mqa).ok());
  KvShape mla = deepseek_v3();
  mla.kv_lora_rank = 0;
  EXPECT_FALSE(validate_kv_shape(mla).ok());
}

}  // namespace
}  // namespace pagoda::kv
