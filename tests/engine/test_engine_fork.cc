// n > 1 through fork on the real stories260K model: the prompt is prefilled
// once and forked; choice i of a seeded request samples exactly what a lone
// n = 1 request with seed + i samples; greedy choices equal the n = 1 greedy
// output; peak KV blocks are below n separate requests; preemption of forked
// choices and aborts of the whole group keep the pool consistent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "engine_test_util.h"

namespace pagoda::enginetest {
namespace {

constexpr int32_t kBos = 1;

struct GroupRun {
  std::vector<std::vector<int32_t>> tokens;  // [choice]
  int64_t peak_blocks_used = 0;
  EngineStats end;  // once drained
};

// Runs requests `ps` added together; returns the tokens of every choice of
// every request in order, and the peak of blocks_used over the steps.
GroupRun run_together(const EngineConfig& c, const std::vector<RequestParams>& ps) {
  GroupRun out;
  auto e = make_engine(c);
  if (!e) return out;
  Driver d(e.get());
  std::vector<RequestId> ids;
  for (const auto& p : ps) ids.push_back(d.add(p));
  while (e->has_unfinished() && d.steps() < 100000) {
    d.step();
    out.peak_blocks_used = std::max(out.peak_blocks_used, e->stats().blocks_used);
  }
  d.expect_all_finished();
  for (size_t i = 0; i < ps.size(); ++i) {
    for (int k = 0; k < ps[i].n; ++k) {
      EXPECT_EQ(d.result(ids[i], k).finish, FinishReason::kLength) << "request " << i << " choice " << k;
      out.tokens.push_back(d.result(ids[i], k).tokens);
    }
  }
  out.end = d.expect_drained();
  return out;
}

TEST(EngineFork, SeededChoicesEqualLoneRequestsWithChildSeeds) {
  const Reference ref = load_references().at(1);
  // Block size 4: the 12-token prompt is 3 full blocks, so choice 0's first
  // decode opens a new block; add a token for a partial last block (copy-on-write).
  for (int extra : {0, 1}) {
    SCOPED_TRACE(extra);
    std::vector<int32_t> prompt = ref.prompt_tokens;
    if (extra) prompt.push_back(ref.generated_tokens[0]);
    const EngineConfig c = make_config(stories_path(), 2048, /*block_size=*/4);
    const GroupRun group = run_together(c, {seeded(prompt, 40, 1234, 3)});
    ASSERT_EQ(group.tokens.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      auto e = make_engine(c);
      ASSERT_TRUE(e);
      const ChoiceResult alone = run_alone(e.get(), seeded(prompt, 40, 1234 + static_cast<uint64_t>(i), 1));
      ASSERT_EQ(alone.tokens.size(), 40u);
      EXPECT_EQ(group.tokens[static_cast<size_t>(i)], alone.tokens)
          << "choice " << i << " differs from seed " << 1234 + i << " alone at token "
          << common_prefix(group.tokens[static_cast<size_t>(i)], alone.tokens);
    }
    EXPECT_NE(group.tokens[0], group.tokens[1]);
    EXPECT_NE(group.tokens[1], group.tokens[2]);
  }
}

TEST(EngineFork, GreedyChoicesEqualGreedyAlone) {
  const auto refs = load_references();
  for (int block_size : {4, 16}) {
    SCOPED_TRACE(block_size);
    const EngineConfig c = make_config(stories_path(), 2048, block_size);
    for (const Reference& ref : refs) {
      RequestParams p = greedy(ref.prompt_tokens, 60);
      p.n = 2;
      const GroupRun group = run_together(c, {p});
      ASSERT_EQ(group.tokens.size(), 2u);
      const std::vector<int32_t> want(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 60);
      auto e = make_engine(c);
      ASSERT_TRUE(e);
      EXPECT_EQ(run_alone(e.get(), greedy(ref.prompt_tokens, 60)).tokens, want);
      EXPECT_EQ(group.tokens[0], want) << "first difference at " << common_prefix(group.tokens[0], want);
      EXPECT_EQ(group.tokens[1], want) << "first difference at " << common_prefix(group.tokens[1], want);
    }
  }
}

TEST(EngineFork, PeakBlocksBelowSeparateRequests) {
  // A 32-token prompt (2 blocks of 16) and 20 tokens per choice (positions
  // 32..50: 2 more blocks each). Forked: 2 shared + 3 x 2 = 8 blocks at the
  // peak. Three separate requests share only the first prompt block (a prefix
  // hit never covers the last prompt token, so each recomputes the second
  // block itself): 1 + 3 x 3 = 10.
  Rng rng(5);
  const std::vector<int32_t> prompt = random_prompt(&rng, kBos, 3, 511, 32, 32);
  RequestParams p = greedy(prompt, 20);
  p.n = 3;
  const EngineConfig c = make_config(stories_path(), 2048);
  const GroupRun forked = run_together(c, {p});
  p.n = 1;
  const GroupRun separate = run_together(c, {p, p, p});
  ASSERT_EQ(forked.tokens.size(), 3u);
  ASSERT_EQ(separate.tokens.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(forked.tokens[static_cast<size_t>(i)], separate.tokens[0]) << "choice " << i;
    EXPECT_EQ(separate.tokens[static_cast<size_t>(i)], separate.tokens[0]) << "request " << i;
  }
  std::printf("[ fork ] peak blocks used: n=3 forked %lld, 3 separate requests %lld\n",
              static_cast<long long>(forked.peak_blocks_used), static_cast<long long>(separate.peak_blocks_used));
  EXPECT_EQ(forked.peak_blocks_used, 8);
  EXPECT_EQ(separate.peak_blocks_used, 10);
  EXPECT_EQ(forked.end.prefix_hits_tokens, 0);     // the prompt is computed once, no cache needed
  EXPECT_EQ(separate.end.prefix_hits_tokens, 32);  // the 2nd and 3rd request hit one block each
}

TEST(EngineFork, PreemptedChoicesGiveTheSameTokens) {
  // 3 seeded choices of 120 tokens need 3 x 8 blocks of 16 at the end; a pool
  // of 12 usable blocks preempts choices, which recompute prompt + outputs.
  const Reference ref = load_references().at(0);
  const std::vector<RequestParams> ps = {seeded(ref.prompt_tokens, 120, 77, 3)};
  EngineConfig small = make_config(stories_path());
  small.num_kv_blocks = 13;
  const GroupRun a = run_together(small, ps);
  const GroupRun b = run_together(make_config(stories_path(), 8192), ps);
  std::printf("[ fork ] small pool: %lld preemptions, peak %lld blocks\n", static_cast<long long>(a.end.num_preemptions),
              static_cast<long long>(a.peak_blocks_used));
  EXPECT_GT(a.end.num_preemptions, 0);
  EXPECT_EQ(b.end.num_preemptions, 0);
  ASSERT_EQ(a.tokens.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a.tokens[i].size(), 120u);
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "choice " << i << " at token " << common_prefix(a.tokens[i], b.tokens[i]);
  }
}

TEST(EngineFork, AbortBeforeAndAfterTheForkFreesEverything) {
  const Reference ref = load_references().at(1);
  EngineConfig c = make_config(stories_path(), 2048, 4);
  c.max_num_batched_tokens = 4;  // the 12-token prompt takes 3 steps
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  Driver d(e.get());
  RequestParams p = greedy(ref.prompt_tokens, 50);
  p.n = 3;
  const RequestId before = d.add(p);
  d.step();  // mid-prompt
  EXPECT_EQ(e->stats().num_running, 1);
  d.abort(before);
  EXPECT_FALSE(e->has_unfinished());
  EXPECT_EQ(e->stats().blocks_used, 0);

  const RequestId after = d.add(p);
  // The aborted request committed the prompt's first block: 2 prompt steps (the
  // 2nd forks with a token per choice), then one token per choice per step.
  for (int i = 0; i < 8; ++i) d.step();
  EXPECT_EQ(e->stats().num_running, 3);
  EXPECT_EQ(e->stats().prefix_hits_tokens, 4);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(d.result(after, k).tokens.size(), 7u) << "choice " << k;
  d.abort(after);
  EXPECT_FALSE(e->has_unfinished());
  EXPECT_EQ(e->stats().blocks_used, 0);
  EXPECT_TRUE(d.step().empty());
  // Still usable, and the cached prompt gives the reference tokens.
  const ChoiceResult r = run_alone(e.get(), greedy(ref.prompt_tokens, 30));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 30));
}

TEST(EngineFork, MoreChoicesThanMaxNumSeqsIsAnError) {
  EngineConfig c = make_config(stories_path(), 2048);
  c.max_num_seqs = 2;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  const EngineStats before = e->stats();
  RequestParams p = greedy(load_references().at(0).prompt_tokens, 10);
  p.n = 3;
  auto r = e->add_request(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("max_num_seqs"), std::string::npos) << r.message();
  EXPECT_TRUE(stats_equal(e->stats(), before));
  p.n = 2;
  EXPECT_TRUE(e->add_request(p).ok());
}

}  // namespace
}  // namespace pagoda::enginetest
