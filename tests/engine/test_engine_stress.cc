// Engine stress: KV exhaustion with preemption, and a random soak with
// arrivals and aborts. Both deterministic (fixed seeds); counts shrink in quick
// mode (sanitizers or PAGODA_TEST_QUICK=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace pagoda::enginetest {
namespace {

constexpr int32_t kBos = 1;
constexpr int32_t kVocab = 512;

// ------------------------------------------------ 3. exhaustion + preemption

TEST(EngineStress, ExhaustionWithPreemptionMatchesAlone) {
  const int n = scaled(100, 16);
  const int min_total = scaled(200, 120), max_total = scaled(500, 250);
  Rng rng(2024);
  std::vector<RequestParams> reqs;
  for (int i = 0; i < n; ++i) {
    RequestParams p = greedy(random_prompt(&rng, kBos, 3, kVocab - 1, 8, 64), 0, /*ignore_eos=*/true);
    const int total = static_cast<int>(rng.uniform_int(min_total, max_total));
    p.max_tokens = total - static_cast<int>(p.prompt.size());
    reqs.push_back(p);
  }

  // References: all at once in a big pool (no preemption), and truly alone (one
  // request at a time, no prefix cache) for every 20th request; the batch
  // tests show batching does not change tokens, this checks it again here.
  std::vector<std::vector<int32_t>> reference;
  {
    auto e = make_engine(make_config(stories_path(), 65536));
    ASSERT_TRUE(e);
    Driver d(e.get());
    std::vector<RequestId> ids;
    for (const auto& p : reqs) ids.push_back(d.add(p));
    d.run();
    for (RequestId id : ids) reference.push_back(d.result(id).tokens);
    EXPECT_EQ(e->stats().num_preemptions, 0);
  }
  {
    EngineConfig c = make_config(stories_path(), 8192);
    c.max_num_seqs = 1;
    c.enable_prefix_caching = false;
    auto e = make_engine(c);
    ASSERT_TRUE(e);
    for (size_t i = 0; i < reqs.size(); i += 20) {
      const ChoiceResult r = run_alone(e.get(), reqs[i]);
      EXPECT_EQ(r.tokens, reference[i]) << "request " << i << ": alone differs from batched at token "
                                    << common_prefix(r.tokens, reference[i]);
    }
  }

  // All at once in 64 usable blocks of 16 tokens (quick: 16).
  EngineConfig c = make_config(stories_path());
  c.num_kv_blocks = scaled(65, 17);
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->stats().blocks_total, c.num_kv_blocks - 1);
  Driver d(e.get());
  std::vector<RequestId> ids;
  for (const auto& p : reqs) ids.push_back(d.add(p));
  int64_t max_used = 0;
  while (e->has_unfinished()) {
    d.step();
    max_used = std::max(max_used, e->stats().blocks_used);
    ASSERT_LE(e->stats().blocks_used, e->stats().blocks_total);
    ASSERT_LT(d.steps(), 200000);
  }
  d.expect_all_finished();
  for (int i = 0; i < n; ++i) {
    const ChoiceResult& r = d.result(ids[static_cast<size_t>(i)]);
    EXPECT_EQ(r.finish, FinishReason::kLength) << "request " << i;
    EXPECT_EQ(static_cast<int>(r.tokens.size()), reqs[static_cast<size_t>(i)].max_tokens) << "request " << i;
    EXPECT_EQ(r.tokens, reference[static_cast<size_t>(i)])
        << "request " << i << " differs from its big-pool run at token " << common_prefix(r.tokens, reference[i]);
  }
  const EngineStats s = e->stats();
  std::printf("[ exhaustion ] %d requests, %d steps, %lld preemptions, max %lld of %lld blocks used\n", n,
              d.steps(), static_cast<long long>(s.num_preemptions), static_cast<long long>(max_used),
              static_cast<long long>(s.blocks_total));
  EXPECT_GT(s.num_preemptions, 0);
  EXPECT_EQ(max_used, s.blocks_total);
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
  EXPECT_FALSE(e->has_unfinished());
}

// ------------------------------------------------------------- 7. random soak

struct SoakRequest {
  RequestParams params;
  int arrival = 0;    // step before which it is added
  int abort_at = -1;  // step before which it is aborted (-1: never)
};

std::vector<SoakRequest> make_soak(int n, int horizon, uint64_t seed) {
  Rng rng(seed);
  // A few stems so that some prompts share full blocks (prefix cache + preemption).
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 4; ++i) stems.push_back(random_prompt(&rng, kBos, 3, kVocab - 1, 48, 48));
  std::vector<SoakRequest> out;
  for (int i = 0; i < n; ++i) {
    SoakRequest r;
    RequestParams& p = r.params;
    if (rng.uniform() < 0.4) {
      const auto& stem = stems[rng.uniform_int(0, 3)];
      p.prompt.assign(stem.begin(), stem.begin() + rng.uniform_int(1, 48));
      const auto tail = random_prompt(&rng, -1, 3, kVocab - 1, 0, 30);
      p.prompt.insert(p.prompt.end(), tail.begin(), tail.end());
    } else {
      p.prompt = random_prompt(&rng, kBos, 3, kVocab - 1, 1, 80);
    }
    p.max_tokens = static_cast<int>(rng.uniform_int(1, 120));
    p.ignore_eos = true;
    if (rng.uniform() < 0.5) {
      p.temperature = 0.0f;
    } else {
      p.temperature = 0.9f;
      p.top_k = rng.uniform() < 0.5 ? 40 : 0;
      p.seed = 1000 + static_cast<uint64_t>(i);
      p.has_seed = true;
    }
    p.n = rng.uniform() < 0.15 ? 2 : 1;
    r.arrival = static_cast<int>(rng.uniform_int(0, horizon));
    if (rng.uniform() < 0.1) r.abort_at = r.arrival + static_cast<int>(rng.uniform_int(0, 60));
    out.push_back(std::move(r));
  }
  return out;
}

struct SoakOutcome {
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // [request][choice]
  EngineStats end;  // once drained
  int steps = 0;
};

SoakOutcome run_soak(const EngineConfig& c, const std::vector<SoakRequest>& reqs) {
  SoakOutcome out;
  auto e = make_engine(c);
  if (!e) return out;
  Driver d(e.get());
  std::vector<RequestId> ids(reqs.size(), 0);
  size_t added = 0;
  for (int step = 0;; ++step) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i].arrival == step) {
        ids[i] = d.add(reqs[i].params);
        ++added;
      }
      if (reqs[i].abort_at == step) d.abort(ids[i]);  // the driver fails on any later event
    }
    if (added == reqs.size() && !e->has_unfinished()) break;
    d.step();
    if (d.steps() > 100000) {
      ADD_FAILURE() << "soak did not finish";
      return out;
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<std::vector<int32_t>> choices;
    for (int k = 0; k < reqs[i].params.n; ++k) {
      const ChoiceResult& r = d.result(ids[i], k);
      if (reqs[i].abort_at < 0) {
        EXPECT_EQ(r.finish, FinishReason::kLength) << "request " << i << " choice " << k;
        EXPECT_EQ(static_cast<int>(r.tokens.size()), reqs[i].params.max_tokens) << "request " << i << " choice " << k;
      } else {
        EXPECT_LE(static_cast<int>(r.tokens.size()), reqs[i].params.max_tokens);
      }
      choices.push_back(r.tokens);
    }
    out.tokens.push_back(std::move(choices));
  }
  out.end = d.expect_drained();
  out.steps = d.steps();
  return out;
}

TEST(EngineStress, RandomSoakWithAborts) {
  const int n = scaled(200, 40);
  const auto reqs = make_soak(n, scaled(400, 80), 77);
  int num_aborted = 0;
  for (const auto& r : reqs) num_aborted += r.abort_at >= 0;

  EngineConfig small = make_config(stories_path());
  small.num_kv_blocks = 40;
  const SoakOutcome a = run_soak(small, reqs);
  ASSERT_EQ(a.tokens.size(), reqs.size());
  std::printf("[ soak ] %d requests (%d aborted), %d steps, %lld preemptions in 39 blocks\n", n, num_aborted, a.steps,
              static_cast<long long>(a.end.num_preemptions));
  EXPECT_GT(a.end.num_preemptions, 0);
  EXPECT_GT(num_aborted, 0);

  // The same workload in a big pool: every request that was not aborted
  // produced the same tokens, greedy or seeded sampling (preemption and
  // batching change no float op). Not compared across block sizes: attention's
  // page-wise online softmax rounds differently per block size, which moved 4 of
  // ~90 seeded samples when this was tried with block size 7 (greedy held).
  const SoakOutcome b = run_soak(make_config(stories_path(), 32768), reqs);
  ASSERT_EQ(b.tokens.size(), reqs.size());
  EXPECT_EQ(b.end.num_preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].abort_at >= 0) continue;
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "request " << i << " (temperature " << reqs[i].params.temperature
                                        << ", n " << reqs[i].params.n << ")";
  }
}

}  // namespace
}  // namespace pagoda::enginetest
