// KV cache groups (issue 15): outputs are bitwise identical with and without
// the hybrid KV cache manager (--disable-hybrid-kv-cache-manager), through the
// real Engine: every step's logits row and every greedy token.
//
// Synth: a 6-layer tiny-gemma3 with sliding_window_pattern 3 (layers 2 and 5
// global, 0 1 3 4 window 16) in blocks of 4 tokens: G = 2 layer slots, one
// full group and two window groups. Prompts of 100-200 tokens cross the window
// many times: alone, batched, chunked prefill at 1, 2, 16 and 64 tokens per
// step, after preemption (a tiny pool) and on prefix-cache hits.
// Real Gemma 3 270M (skipped when models/gemma-3-270m-q4_k_m.gguf is absent,
// failed when absent under CI=true, skipped under sanitizers): prompts past
// the 512-token window alone, batched, chunked at 1, 64 and 512 tokens per
// step, after a preemption, and on prefix hits longer than the window.
//
// Why bitwise: a window layer's table has the null block before its window,
// and paged_attention starts at the page of the first key in the window, a
// whole page at a time, so each token sees the same keys in the same order as
// with the full table (where the window is only a mask).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/rng.h"
#include "engine/engine.h"
#include "gguf/synth.h"
#include "gguf/writer.h"

namespace pagoda {
namespace {

struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // [tokens][n_vocab]
  int32_t num_cached = 0;
};

struct RunStats {
  int64_t preemptions = 0;
  int32_t max_blocks = 0;  // most KV blocks one sequence held in a step
};

engine::EngineConfig base_config(const std::string& path, bool hybrid, int chunk) {
  engine::EngineConfig c;
  c.model_path = path;
  c.threads = 1;
  c.kv_dtype = KvDtype::F32;
  c.block_size = 4;
  c.num_kv_blocks = 4096;
  c.max_num_batched_tokens = chunk;
  c.max_num_seqs = 16;
  c.watermark = 0;
  c.disable_hybrid_kv_cache_manager = !hybrid;
  return c;
}

// Runs the prompts greedily (max_tokens each). together: all submitted at
// once; else one after another (each alone in the engine, same engine so the
// prefix cache carries over).
std::vector<Output> run(const engine::EngineConfig& cfg, const std::vector<std::vector<int32_t>>& prompts,
                        int max_tokens, bool together, RunStats* stats = nullptr) {
  auto e = engine::Engine::create(cfg);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  if (!e.ok()) return {};
  engine::Engine& eng = **e;
  std::vector<Output> out(prompts.size());
  std::vector<engine::RequestId> ids(prompts.size());
  auto add = [&](size_t i) {
    engine::RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    p.temperature = 0;
    p.ignore_eos = true;
    p.return_logits = true;
    auto id = eng.add_request(p);
    EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.message());
    ids[i] = id.ok() ? *id : 0;
  };
  auto drain = [&] {
    while (eng.has_unfinished()) {
      for (const engine::TokenEvent& ev : eng.step()) {
        EXPECT_TRUE(ev.error.empty()) << ev.error;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] != ev.id) continue;
          for (int32_t t : ev.tokens) out[i].tokens.push_back(t);
          if (!ev.tokens.empty()) out[i].logits.push_back(ev.logits);
          out[i].num_cached = std::max(out[i].num_cached, ev.num_cached_tokens);  // reported once
          if (stats) stats->max_blocks = std::max(stats->max_blocks, ev.num_kv_blocks);
        }
      }
    }
  };
  if (together) {
    for (size_t i = 0; i < prompts.size(); ++i) add(i);
    drain();
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) {
      add(i);
      drain();
    }
  }
  if (stats) stats->preemptions = eng.stats().num_preemptions;
  return out;
}

void expect_same(const std::vector<Output>& a, const std::vector<Output>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].tokens, b[i].tokens) << what << ": prompt " << i;
    ASSERT_EQ(a[i].logits.size(), b[i].logits.size()) << what << ": prompt " << i;
    for (size_t s = 0; s < a[i].logits.size(); ++s) {
      ASSERT_FALSE(a[i].logits[s].empty());
      // Bitwise: memcmp-equal floats (EXPECT_EQ on vectors compares values).
      ASSERT_EQ(a[i].logits[s].size(), b[i].logits[s].size());
      ASSERT_EQ(0, std::memcmp(a[i].logits[s].data(), b[i].logits[s].data(), a[i].logits[s].size() * sizeof(float)))
          << what << ": prompt " << i << " step " << s;
    }
  }
}

std::vector<int32_t> random_tokens(uint64_t seed, int n, int32_t lo, int32_t hi) {
  Rng rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(lo, hi)));
  return t;
}

class KvGroupsSynth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(::testing::TempDir() + "pagoda_kv_groups_gemma3_" + std::to_string(::getpid()) + ".gguf");
    const gguf::SynthShape* s = gguf::find_synth_preset("tiny-gemma3");
    ASSERT_NE(s, nullptr);
    gguf::SynthOptions o;
    o.shape = *s;
    o.shape.sliding_window = 16;
    o.shape.weight_std = 0.3;  // attention that depends on which keys it sees
    o.type = GgmlType::F32;
    o.seed = 15;
    gguf::GgufWriter w;
    Status st = gguf::synth_model(o, &w);
    ASSERT_TRUE(st.ok()) << st.message();
    w.set_u32("gemma3.attention.sliding_window_pattern", 3);  // layers 2 and 5 global
    st = w.write_file(*path_);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  static void TearDownTestSuite() {
    if (path_) std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
  }
  static std::vector<std::vector<int32_t>> prompts() {
    // Two share a 96-token prefix (prefix hits past the window), lengths 100..200.
    std::vector<std::vector<int32_t>> p = {random_tokens(1, 150, 3, 255), random_tokens(2, 101, 3, 255),
                                           random_tokens(3, 200, 3, 255)};
    std::vector<int32_t> shared(p[2].begin(), p[2].begin() + 96);
    const auto tail = random_tokens(4, 37, 3, 255);
    shared.insert(shared.end(), tail.begin(), tail.end());
    p.push_back(shared);
    return p;
  }
  static std::string* path_;
};
std::string* KvGroupsSynth::path_ = nullptr;

TEST_F(KvGroupsSynth, AloneBatchedChunkedPreemptedAndPrefixHitsAreBitwiseTheSame) {
  const auto p = prompts();
  const int kOut = 6;
  // Reference: every layer full-context, one prompt at a time, whole prompts per step.
  const auto ref = run(base_config(*path_, false, 2048), p, kOut, false);
  ASSERT_EQ(ref.size(), p.size());
  ASSERT_EQ(ref[0].tokens.size(), static_cast<size_t>(kOut));
  RunStats alone_stats, flag_stats;
  const auto alone = run(base_config(*path_, true, 2048), p, kOut, false, &alone_stats);
  expect_same(ref, alone, "hybrid alone");
  EXPECT_EQ(alone[3].num_cached, 96) << "the 4th prompt hits the 3rd's cached 96-token prefix, past the window";
  // The hybrid manager really holds less: at its last decode step the
  // 200-token prompt holds ceil(205 / 4) = 52 blocks of 6 layers with the
  // flag, and 52 + 2 x (16 / 4 + 1) blocks of 2 layers without it.
  run(base_config(*path_, false, 2048), p, kOut, false, &flag_stats);
  EXPECT_EQ(flag_stats.max_blocks, 52);
  expect_same(ref, run(base_config(*path_, true, 2048), p, kOut, true), "hybrid batched");
  for (int chunk : {1, 2, 16, 64}) {
    RunStats st;
    expect_same(ref, run(base_config(*path_, true, chunk), p, kOut, chunk >= 16, &st),
                "hybrid chunked " + std::to_string(chunk));
    if (chunk == 1) {
      EXPECT_LE(st.max_blocks, 52 + 2 * 5);  // one token per step: window + one block per group
    }
  }
  // A pool too small for all four at once: admission reserves each prompt's
  // prefill, but not decode growth (40 outputs = 10 more full-group blocks
  // each): in chunks of 8 a decoding request's growth during the next one's
  // long prefill preempts that one; it is recomputed later.
  const int kOutLong = 40;
  const auto ref_long = run(base_config(*path_, false, 2048), p, kOutLong, false);
  engine::EngineConfig tiny = base_config(*path_, true, 8);
  tiny.num_kv_blocks = 100;
  RunStats st;
  expect_same(ref_long, run(tiny, p, kOutLong, true, &st), "hybrid after preemption");
  EXPECT_GT(st.preemptions, 0);
  // The flag's engine agrees with itself batched too (the reference path is not special).
  expect_same(ref, run(base_config(*path_, false, 16), p, kOut, true), "flag batched chunked");
}

std::string gemma_path() {
  if (const char* e = std::getenv("PAGODA_GEMMA3")) return e;
  return std::string(PAGODA_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
}

// The real Gemma 3 270M file: absent, the test skips, or fails under CI=true
// (scripts/setup fetches it there). Too slow under sanitizers (a minute or
// more in Release): skipped there; the synth test above runs the same paths.
#if defined(__SANITIZE_ADDRESS__)
#define PAGODA_GEMMA3_OR_SKIP() GTEST_SKIP() << "real Gemma 3 prompts are too slow under sanitizers"
#else
#define PAGODA_GEMMA3_OR_SKIP()                                                                          \
  do {                                                                                                   \
    if (!std::filesystem::exists(gemma_path())) {                                                        \
      const char* ci = std::getenv("CI");                                                                \
      if (ci != nullptr && std::string(ci) == "true") FAIL() << gemma_path() << " absent under CI=true"; \
      GTEST_SKIP() << gemma_path() << " absent (scripts/setup fetches it)";                              \
    }                                                                                                    \
  } while (0)
#endif

engine::EngineConfig gemma_config(bool hybrid, int chunk) {
  engine::EngineConfig c = base_config(gemma_path(), hybrid, chunk);
  c.threads = 2;
  c.kv_dtype = KvDtype::F16;
  c.block_size = 16;
  c.num_kv_blocks = 0;
  c.kv_cache_memory = 64ll << 20;
  return c;
}

// Gemma 3 270M: window 512 on 15 of 18 layers, blocks of 16 tokens.
// 700 and 560 tokens: past the window; 3 decode steps each. Alone, batched,
// chunked prefill at 64 and 512 tokens per step.
TEST(KvGroupsGemma3, PromptsPastTheWindowAreBitwiseTheSame) {
  PAGODA_GEMMA3_OR_SKIP();
  const std::vector<std::vector<int32_t>> p = {random_tokens(7, 700, 1000, 200000), random_tokens(8, 560, 1000, 200000)};
  const auto ref = run(gemma_config(false, 2048), p, 3, false);
  expect_same(ref, run(gemma_config(true, 2048), p, 3, false), "gemma3 alone");
  expect_same(ref, run(gemma_config(true, 64), p, 3, true), "gemma3 batched, chunks of 64");
  expect_same(ref, run(gemma_config(true, 512), p, 3, true), "gemma3 batched, chunks of 512");
}

// One token per step over 545 tokens (past 512 + one block): every window
// release happens between two steps of one token.
TEST(KvGroupsGemma3, ChunksOfOneTokenAreBitwiseTheSame) {
  PAGODA_GEMMA3_OR_SKIP();
  const std::vector<std::vector<int32_t>> p = {random_tokens(9, 545, 1000, 200000)};
  RunStats st;
  const auto ref = run(gemma_config(false, 2048), p, 2, false);
  expect_same(ref, run(gemma_config(true, 1), p, 2, false, &st), "gemma3 chunks of 1");
  // 35 full blocks (546 tokens) + 5 window groups x 33 (512 + one block) at the last step.
  EXPECT_EQ(st.max_blocks, 35 + 5 * 33);
}

// A pool where the second request is admitted with one block to spare, in
// chunks of 16: admission reserved its prefill (35 full + 5 x 34 window
// blocks), but the first one's decode growth is not reserved (positions 704
// and 720 open blocks 44 and 45 of its full group) and comes during the
// second one's 38-step prefill, which is preempted and recomputed later
// (prefix hits on its committed blocks).
TEST(KvGroupsGemma3, AfterPreemptionOutputsAreBitwiseTheSame) {
  PAGODA_GEMMA3_OR_SKIP();
  const std::vector<std::vector<int32_t>> p = {random_tokens(7, 700, 1000, 200000), random_tokens(8, 560, 1000, 200000)};
  const auto ref = run(gemma_config(false, 2048), p, 40, false);
  engine::EngineConfig c = gemma_config(true, 16);
  c.kv_cache_memory = 0;
  c.num_kv_blocks = 416;
  RunStats st;
  expect_same(ref, run(c, p, 40, true, &st), "gemma3 after preemption");
  EXPECT_GT(st.preemptions, 0) << "the pool was meant to force a preemption";
}

// The second prompt shares 560 tokens (35 blocks, more than the 512 window)
// with the first: it hits the cache (the full group's 35 blocks, each window
// group's last 33), and its outputs are those of the same prompt computed
// from scratch in a fresh engine without the hybrid manager.
TEST(KvGroupsGemma3, PrefixHitsPastTheWindowAreBitwiseTheSame) {
  PAGODA_GEMMA3_OR_SKIP();
  const auto a = random_tokens(10, 600, 1000, 200000);
  std::vector<int32_t> b(a.begin(), a.begin() + 560);
  const auto tail = random_tokens(11, 40, 1000, 200000);
  b.insert(b.end(), tail.begin(), tail.end());
  const auto ref_b = run(gemma_config(false, 2048), {b}, 3, false);
  ASSERT_EQ(ref_b[0].num_cached, 0);
  for (int chunk : {2048, 64}) {
    const auto out = run(gemma_config(true, chunk), {a, b}, 3, false);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[1].num_cached, 560) << "chunk " << chunk;
    expect_same(ref_b, {out[1]}, "gemma3 prefix hit, chunk " + std::to_string(chunk));
  }
}

}  // namespace
}  // namespace pagoda
