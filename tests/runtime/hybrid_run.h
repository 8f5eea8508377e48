// The engine-run staging shared by the hybrid-model tests (test_lfm2_hybrid.cc,
// test_qwen35_hybrid.cc): requests with their logits through the real Engine,
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

}  // namespace pagoda::hybrid_test
