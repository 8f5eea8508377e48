// The engine-run staging shared by the hybrid-model tests (test_lfm2_hybrid.cc,
// test_qwen35_hybrid.cc, test_mamba2_hybrid.cc): requests with their logits through the real Engine,
// the KV invariants checked after every step, and bitwise comparison.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/rng.h"
#include "engine/engine.h"

namespace pagoda::hybrid_test {

struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // [tokens][n_vocab]
  int32_t num_cached = -1;
  int32_t last_blocks = 0;  // KV blocks (all groups) of the last event
  int32_t last_computed = 0;  // prompt + outputs - 1 at the last event
};

struct RunStats {
  int64_t preemptions = 0;
  int max_running = 0;
  int64_t checkpoints_stored = 0;
  int64_t checkpoints_hit = 0;
};

inline engine::EngineConfig base_config(const std::string& path, int chunk) {
  engine::EngineConfig c;
  c.model_path = path;
  c.threads = 1;
  c.kv_dtype = KvDtype::F16;
  c.block_size = 4;
  c.num_kv_blocks = 2048;
  c.max_num_batched_tokens = chunk;
  c.max_num_seqs = 64;
  c.watermark = 0;
  return c;
}

struct Req {
  std::vector<int32_t> prompt;
  int n = 1;
  uint64_t seed = 0;  // 0: greedy
};

// Runs the requests (max_tokens each); together: all added at once, else one
// after another. out[i][choice].
inline std::vector<std::vector<Output>> run(const engine::EngineConfig& cfg, const std::vector<Req>& reqs, int max_tokens,
                                     bool together, RunStats* stats = nullptr) {
  auto e = engine::Engine::create(cfg);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  if (!e.ok()) return {};
  engine::Engine& eng = **e;
  std::vector<std::vector<Output>> out(reqs.size());
  std::vector<engine::RequestId> ids(reqs.size());
  auto add = [&](size_t i) {
    engine::RequestParams p;
    p.prompt = reqs[i].prompt;
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.return_logits = true;
    p.n = reqs[i].n;
    p.temperature = reqs[i].seed ? 1.0f : 0.0f;
    p.seed = reqs[i].seed;
    p.has_seed = reqs[i].seed != 0;
    out[i].resize(static_cast<size_t>(reqs[i].n));
    auto id = eng.add_request(p);
    EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.message());
    ids[i] = id.ok() ? *id : 0;
  };
  auto drain = [&] {
    while (eng.has_unfinished()) {
      const auto events = eng.step();
      const std::string broken = eng.check_invariants();
      EXPECT_EQ(broken, "");
      if (!broken.empty()) return;
      if (stats) stats->max_running = std::max(stats->max_running, eng.stats().num_running);
      for (const engine::TokenEvent& ev : events) {
        EXPECT_TRUE(ev.error.empty()) << ev.error;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] != ev.id) continue;
          Output& o = out[i][static_cast<size_t>(ev.index)];
          for (int32_t t : ev.tokens) o.tokens.push_back(t);
          if (!ev.tokens.empty()) o.logits.push_back(ev.logits);
          if (ev.num_cached_tokens >= 0 && o.num_cached < 0) o.num_cached = ev.num_cached_tokens;
          o.last_blocks = ev.num_kv_blocks;
          o.last_computed = static_cast<int32_t>(reqs[i].prompt.size()) + ev.num_output_tokens - 1;
        }
      }
    }
  };
  if (together) {
    for (size_t i = 0; i < reqs.size(); ++i) add(i);
    drain();
  } else {
    for (size_t i = 0; i < reqs.size(); ++i) {
      add(i);
      drain();
    }
  }
  if (stats) {
    const engine::EngineStats es = eng.stats();
    stats->preemptions = es.num_preemptions;
    stats->checkpoints_stored = es.checkpoints_stored;
    stats->checkpoints_hit = es.checkpoints_hit;
  }
  return out;
}

inline void expect_same(const Output& a, const Output& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t s = 0; s < a.logits.size(); ++s) {
    ASSERT_FALSE(a.logits[s].empty()) << what;
    ASSERT_EQ(a.logits[s].size(), b.logits[s].size()) << what;
    ASSERT_EQ(0, std::memcmp(a.logits[s].data(), b.logits[s].data(), a.logits[s].size() * sizeof(float)))
        << what << ": step " << s;
  }
}

inline void expect_same(const std::vector<std::vector<Output>>& a, const std::vector<std::vector<Output>>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what;
    for (size_t k = 0; k < a[i].size(); ++k) expect_same(a[i][k], b[i][k], what + ": request " + std::to_string(i));
  }
}

inline std::vector<int32_t> random_tokens(uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(3, 300)));
  return t;
}

// The checks of the tests below every hybrid model's test runs on its tiny
// synth preset (blocks of 4 tokens, f16): the same four prompts each time.
inline std::vector<Req> hybrid_prompts() {
  return {{random_tokens(1, 37)}, {random_tokens(2, 9)}, {random_tokens(3, 61)}, {random_tokens(4, 22)}};
}

// Every greedy token and logits row is bitwise the same alone, batched, in
// chunked prefill of the given sizes (and on 2 kernel threads when asked); each
// sequence holds exactly ceil(computed / 4) token blocks + its S state blocks.
inline void check_alone_batched_chunked(const std::string& path, int state_blocks, const std::vector<int>& chunks,
                                        bool two_threads) {
  const auto p = hybrid_prompts();
  const int kOut = 8;
  const auto ref = run(base_config(path, 2048), p, kOut, false);
  ASSERT_EQ(ref.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(ref[i][0].tokens.size(), static_cast<size_t>(kOut));
    const int32_t computed = ref[i][0].last_computed;
    EXPECT_EQ(ref[i][0].last_blocks, (computed + 3) / 4 + state_blocks) << "request " << i;
  }
  // The four continuations differ (the state and the prompts matter).
  EXPECT_NE(ref[0][0].tokens, ref[1][0].tokens);
  EXPECT_NE(ref[2][0].tokens, ref[3][0].tokens);
  expect_same(ref, run(base_config(path, 2048), p, kOut, true), "batched");
  for (int chunk : chunks) expect_same(ref, run(base_config(path, chunk), p, kOut, true), "chunked " + std::to_string(chunk));
  if (two_threads) {
    engine::EngineConfig two = base_config(path, 2048);
    two.threads = 2;
    expect_same(ref, run(two, p, kOut, true), "2 threads");
  }
}

// Pools far smaller than the four sequences' blocks at the end of 24 outputs
// each (chunks of 8): growth preempts, and the preempted sequences recompute
// from the zero state, bitwise as alone.
inline void check_preempted(const std::string& path, const std::vector<int>& pools) {
  const auto p = hybrid_prompts();
  const int kOut = 24;
  const auto ref = run(base_config(path, 2048), p, kOut, false);
  int64_t preemptions = 0;
  for (int blocks : pools) {
    engine::EngineConfig small = base_config(path, 8);
    small.num_kv_blocks = blocks;
    RunStats st;
    expect_same(ref, run(small, p, kOut, true, &st), "preempted, " + std::to_string(blocks) + " blocks");
    preemptions += st.preemptions;
  }
  EXPECT_GT(preemptions, 0);
}

// Each choice of an n = 3 fork equals a lone seeded request (the forked state
// is copied on write, not shared).
inline void check_forked_choices(const std::string& path) {
  const std::vector<int32_t> prompt = random_tokens(9, 30);
  const int kOut = 12;
  const auto forked = run(base_config(path, 2048), {{prompt, 3, 1234}}, kOut, true);
  ASSERT_EQ(forked.size(), 1u);
  ASSERT_EQ(forked[0].size(), 3u);
  for (int k = 0; k < 3; ++k) {
    const auto lone = run(base_config(path, 2048), {{prompt, 1, 1234u + static_cast<uint64_t>(k)}}, kOut, true);
    expect_same(lone[0][0], forked[0][static_cast<size_t>(k)], "choice " + std::to_string(k));
  }
  // Seeded sampling at temperature 1 gives the choices different tokens: a
  // shared (not copied) state would have mixed them.
  EXPECT_NE(forked[0][0].tokens, forked[0][1].tokens);
}

// No checkpoints, no prefix caching: the reference of the checkpoint checks below.
inline engine::EngineConfig cold_config(const std::string& path, int chunk) {
  engine::EngineConfig c = base_config(path, chunk);
  c.state_checkpoint_interval = 0;
  return c;
}

inline std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The state-checkpoint checks every hybrid model's test runs (test_lfm2_hybrid.cc,
// test_mamba2_hybrid.cc), in blocks of 4 unless said otherwise.
//
// Turn 1 (37 prompt tokens, 8 outputs) then turn 2 (turn 1 + its answer + 11
// new tokens) in one engine. Turn 1 computed 44 tokens (its last output is not
// computed): 11 full blocks of 4. With a checkpoint every 4 blocks (16 tokens)
// the latest inside them is at 32; every block: at 44. Turn 2's tokens and
// logits are bitwise a cold run of its whole prompt.
inline void check_second_turn_restores_checkpoint(const std::string& path) {
  const int kOut = 8;
  const std::vector<int32_t> p1 = random_tokens(11, 37);
  const auto turn1 = run(cold_config(path, 2048), {{p1}}, kOut, true);
  ASSERT_EQ(turn1[0][0].tokens.size(), static_cast<size_t>(kOut));
  const std::vector<int32_t> p2 = cat(cat(p1, turn1[0][0].tokens), random_tokens(12, 11));
  const auto cold = run(cold_config(path, 2048), {{p2}}, kOut, true);
  ASSERT_EQ(cold[0][0].num_cached, 0);
  for (int interval : {4, 1}) {
    engine::EngineConfig c = base_config(path, 2048);
    c.state_checkpoint_interval = interval;
    RunStats st;
    const auto warm = run(c, {{p1}, {p2}}, kOut, false, &st);
    const std::string what = "interval " + std::to_string(interval);
    ASSERT_EQ(warm.size(), 2u);
    expect_same(turn1[0][0], warm[0][0], what + ": turn 1");
    EXPECT_EQ(warm[0][0].num_cached, 0);
    EXPECT_EQ(warm[1][0].num_cached, interval == 4 ? 32 : 44) << what;
    expect_same(cold[0][0], warm[1][0], what + ": turn 2");
    EXPECT_EQ(st.checkpoints_hit, 1) << what;
    // A prefill chunk ends at the latest boundary inside it. Interval 4: turn 1
    // [0, 32) + [32, 37) stores 32, its decode to 44 none; turn 2 [32, 48) +
    // [48, 56) stores 48, its decode to 63 none. Interval 1: turn 1 stores 36
    // (its prefill's last boundary), 40, 44 (decode); turn 2 56 and 60.
    EXPECT_EQ(st.checkpoints_stored, interval == 4 ? 2 : 5) << what;
  }
}

// A ~4,000-token conversation (issue 38's Done-when) in blocks of 16 with the
// default interval (a checkpoint every 64 tokens) in a pool of num_kv_blocks:
// turn 1 is 3,000 prompt tokens + 16 outputs (3,015 computed; the decode
// reaching 3,008 = 47 x 64 stores one), turn 2 adds 1,000 tokens: it restores
// the checkpoint at 3,008 and recomputes 1,008 tokens, bitwise a cold run of all 4,016.
inline void check_long_conversation_restores(const std::string& path, int num_kv_blocks) {
  const int kOut = 16;
  auto cfg = [&](int interval) {
    engine::EngineConfig c = base_config(path, 2048);
    c.block_size = 16;
    c.num_kv_blocks = num_kv_blocks;
    c.context_length = 4200;
    c.state_checkpoint_interval = interval;
    return c;
  };
  const std::vector<int32_t> p1 = random_tokens(21, 3000);
  const auto turn1 = run(cfg(0), {{p1}}, kOut, true);
  ASSERT_EQ(turn1[0][0].tokens.size(), static_cast<size_t>(kOut));
  const std::vector<int32_t> p2 = cat(cat(p1, turn1[0][0].tokens), random_tokens(22, 1000));
  ASSERT_EQ(p2.size(), 4016u);
  const auto cold = run(cfg(0), {{p2}}, kOut, true);
  RunStats st;
  const auto warm = run(cfg(4), {{p1}, {p2}}, kOut, false, &st);
  ASSERT_EQ(warm.size(), 2u);
  expect_same(turn1[0][0], warm[0][0], "turn 1");
  EXPECT_EQ(warm[1][0].num_cached, 3008);
  expect_same(cold[0][0], warm[1][0], "turn 2");
  EXPECT_EQ(st.checkpoints_hit, 1);
}

// Prompts sharing a 40-token prefix: with a checkpoint every 4 blocks of 4 the
// later ones restore the one at 32. Everything is bitwise the outputs without
// any prefix caching: alone, batched, chunked, in the small pools given (which
// must preempt somewhere, and whose readmissions must hit checkpoints
// somewhere) and n = 3 forked choices.
inline void check_checkpoint_hits_batch_invariant(const std::string& path, const std::vector<int>& small_pools) {
  const std::vector<int32_t> shared = random_tokens(31, 40);
  std::vector<Req> p;
  int i = 0;
  for (int len : {5, 23, 9, 30}) p.push_back({cat(shared, random_tokens(32 + static_cast<uint64_t>(i++), len))});
  const int kOut = 12;
  const auto ref = run(cold_config(path, 2048), p, kOut, false);
  RunStats st;
  const auto alone = run(base_config(path, 2048), p, kOut, false, &st);
  expect_same(ref, alone, "alone");
  EXPECT_EQ(alone[0][0].num_cached, 0);
  for (size_t k = 1; k < p.size(); ++k) EXPECT_EQ(alone[k][0].num_cached, 32) << "request " << k;
  EXPECT_EQ(st.checkpoints_hit, 3);
  expect_same(ref, run(base_config(path, 2048), p, kOut, true), "batched");
  for (int chunk : {1, 3, 16}) {
    expect_same(ref, run(base_config(path, chunk), p, kOut, true), "chunked " + std::to_string(chunk));
    expect_same(ref, run(base_config(path, chunk), p, kOut, false), "chunked alone " + std::to_string(chunk));
  }
  int64_t preemptions = 0, hits = 0;
  for (int blocks : small_pools) {
    engine::EngineConfig small = base_config(path, 8);
    small.num_kv_blocks = blocks;
    RunStats ps;
    expect_same(ref, run(small, p, kOut, true, &ps), "small pool, " + std::to_string(blocks) + " blocks");
    preemptions += ps.preemptions;
    hits += ps.checkpoints_hit;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(hits, 0) << "readmissions restore checkpoints";
  // n = 3 after a checkpoint hit: each choice as a lone seeded request without caching.
  const std::vector<int32_t> forked_prompt = cat(shared, random_tokens(40, 7));
  RunStats fs;
  const auto forked = run(base_config(path, 2048), {{p[0].prompt}, {forked_prompt, 3, 777}}, kOut, false, &fs);
  ASSERT_EQ(forked.size(), 2u);
  ASSERT_EQ(forked[1].size(), 3u);
  EXPECT_EQ(forked[1][0].num_cached, 32);
  EXPECT_EQ(fs.checkpoints_hit, 1);
  for (int k = 0; k < 3; ++k) {
    const auto lone = run(cold_config(path, 2048), {{forked_prompt, 1, 777u + static_cast<uint64_t>(k)}}, kOut, true);
    expect_same(lone[0][0], forked[1][static_cast<size_t>(k)], "choice " + std::to_string(k));
  }
  EXPECT_NE(forked[1][0].tokens, forked[1][1].tokens);
}

}  // namespace pagoda::hybrid_test
