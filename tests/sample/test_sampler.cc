#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sample/sampler.h"

using namespace pagoda::sample;

namespace {

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<float> log_probs(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

// Counts of each token over n draws.
std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int> h(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++h[static_cast<size_t>(s.sample(logits).token)];
  return h;
}

}  // namespace

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(greedy());
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -2.0f, 3.0f}).token, 1);
  EXPECT_EQ(s.sample(std::vector<float>{5.0f, 5.0f}).token, 0);
  EXPECT_EQ(s.sample(std::vector<float>{-1.0f, -0.5f, -0.5f}).token, 1);
  EXPECT_EQ(s.generated(), (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(argmax(std::vector<float>{-INFINITY, -INFINITY, 1.0f}), 2);
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  SamplingParams p;
  p.top_k = 2;
  p.seed = 7;
  Sampler s(p);
  const auto h = histogram(s, {1.0f, 3.0f, 0.5f, 2.9f, 2.0f}, 2000);
  EXPECT_EQ(h[0] + h[2] + h[4], 0);
  EXPECT_GT(h[1], 0);
  EXPECT_GT(h[3], 0);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  SamplingParams p;
  p.top_p = 0.75f;  // 0.5 + 0.3 >= 0.75: {0, 1}
  p.seed = 3;
  Sampler s(p);
  const auto h = histogram(s, log_probs({0.5, 0.3, 0.15, 0.05}), 4000);
  EXPECT_EQ(h[2] + h[3], 0);
  EXPECT_NEAR(h[0] / 4000.0, 0.5 / 0.8, 0.03);

  p.top_p = 0.9f;  // {0, 1, 2}
  Sampler s2(p);
  const auto h2 = histogram(s2, log_probs({0.5, 0.3, 0.15, 0.05}), 4000);
  EXPECT_EQ(h2[3], 0);
  EXPECT_GT(h2[2], 0);
}

TEST(Sampler, MinPDropsTokensBelowFractionOfMax) {
  SamplingParams p;
  p.min_p = 0.25f;  // threshold 0.125: {0, 1, 2}
  p.seed = 11;
  Sampler s(p);
  const auto h = histogram(s, log_probs({0.5, 0.3, 0.15, 0.05}), 4000);
  EXPECT_EQ(h[3], 0);
  EXPECT_NEAR(h[2] / 4000.0, 0.15 / 0.95, 0.03);
}

TEST(Sampler, TemperatureOneMatchesTheDistribution) {
  SamplingParams p;
  p.seed = 1234;
  Sampler s(p);
  const auto h = histogram(s, log_probs({0.7, 0.2, 0.1}), 10000);
  EXPECT_NEAR(h[0] / 10000.0, 0.7, 0.02);
  EXPECT_NEAR(h[1] / 10000.0, 0.2, 0.02);
  EXPECT_NEAR(h[2] / 10000.0, 0.1, 0.02);
}

TEST(Sampler, LowTemperatureSharpens) {
  SamplingParams p;
  p.temperature = 0.25f;  // p^4: 0.7^4 / (0.7^4 + 0.2^4 + 0.1^4) = 0.9935
  p.seed = 5;
  Sampler s(p);
  const auto h = histogram(s, log_probs({0.7, 0.2, 0.1}), 4000);
  EXPECT_GT(h[0], 3900);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.seed = 42;
  const std::vector<float> logits(50, 0.0f);  // uniform over 50
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 100; ++i) {
    ta.push_back(a.sample(logits).token);
    tb.push_back(b.sample(logits).token);
    tc.push_back(c.sample(logits).token);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p = greedy();
  p.repetition_penalty = 1.1f;
  const std::vector<int32_t> prompt = {0, 2};
  Sampler s(p, prompt);
  // 2.0 / 1.1 = 1.818 < 1.9
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.9f, -5.0f}).token, 1);
  // token 1 is now generated too; -1 * 1.1 = -1.1 < -1.05 for token 2 (prompt), 3 unseen
  EXPECT_EQ(s.sample(std::vector<float>{-9.0f, -9.0f, -1.0f, -1.05f}).token, 3);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountGeneratedTokensOnly) {
  SamplingParams p = greedy();
  p.frequency_penalty = 0.5f;
  const std::vector<int32_t> prompt = {1, 1, 1};  // not counted
  Sampler s(p, prompt);
  const std::vector<float> logits = {2.0f, 1.7f};
  // step 1: [2.0, 1.7] -> 0; step 2: [1.5, 1.7] -> 1; step 3: [1.5, 1.2] -> 0;
  // step 4: [1.0, 1.2] -> 1
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(s.sample(logits).token);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 0, 1}));

  SamplingParams q = greedy();
  q.presence_penalty = 0.2f;
  Sampler t(q);
  // [2.0, 1.9] -> 0; [1.8, 1.9] -> 1; [1.8, 1.7] -> 0 (presence does not grow)
  got.clear();
  for (int i = 0; i < 3; ++i) got.push_back(t.sample(std::vector<float>{2.0f, 1.9f}).token);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 0}));
}

TEST(Sampler, LogprobsAreLogSoftmaxOfProcessedLogits) {
  SamplingParams p = greedy();
  p.logprobs = true;
  p.top_logprobs = 2;
  Sampler s(p);
  const SampleResult r = s.sample(std::vector<float>{1.0f, 2.0f, 3.0f, 2.0f});
  const double z = std::log(std::exp(1.0) + 2 * std::exp(2.0) + std::exp(3.0));
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, 3.0 - z, 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].first, 2);
  EXPECT_EQ(r.top[1].first, 1);  // tie with 3: lowest id
  EXPECT_NEAR(r.top[1].second, 2.0 - z, 1e-5);

  SamplingParams q;
  q.temperature = 0.5f;
  q.logprobs = true;
  q.seed = 9;
  Sampler t(q);
  const SampleResult u = t.sample(std::vector<float>{0.0f, 1.0f});  // scaled: [0, 2]
  const double z2 = std::log(1.0 + std::exp(2.0));
  EXPECT_NEAR(u.logprob, (u.token == 1 ? 2.0 : 0.0) - z2, 1e-5);
  EXPECT_TRUE(u.top.empty());
}

// ---- token masks (structured output, issue 18) ---------------------------------

namespace {
std::vector<uint32_t> mask_of(std::initializer_list<int> allowed, size_t n) {
  std::vector<uint32_t> m((n + 31) / 32, 0);
  for (int t : allowed) m[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  return m;
}
}  // namespace

TEST(SamplerMask, GreedyPicksTheBestAllowedToken) {
  Sampler s(greedy());
  const std::vector<float> l = {0.1f, 3.0f, -2.0f, 2.0f, 1.5f};
  EXPECT_EQ(s.sample(l, mask_of({0, 2, 4}, 5)).token, 4);
  EXPECT_EQ(s.sample(l, mask_of({2}, 5)).token, 2);
  EXPECT_EQ(s.sample(l).token, 1);  // no mask: unconstrained
}

TEST(SamplerMask, DrawsOnlyAllowedTokensWithRenormalizedOdds) {
  SamplingParams p;
  p.seed = 11;
  Sampler s(p);
  // 40 tokens (two mask words); allowed 3 (p .2) and 33 (p .1): 2:1 odds.
  std::vector<double> probs(40, 0.7 / 38);
  probs[3] = 0.2;
  probs[33] = 0.1;
  const auto l = log_probs(probs);
  const auto m = mask_of({3, 33}, 40);
  std::vector<int> h(40, 0);
  for (int i = 0; i < 3000; ++i) ++h[static_cast<size_t>(s.sample(l, m).token)];
  EXPECT_EQ(h[3] + h[33], 3000);
  EXPECT_NEAR(h[3] / 3000.0, 2.0 / 3.0, 0.03);
}

TEST(SamplerMask, TruncationAndPenaltiesSeeOnlyAllowedTokens) {
  SamplingParams p;
  p.top_k = 1;  // greedy through top-k 1: the best ALLOWED token, not the best token
  p.seed = 1;
  p.repetition_penalty = 2.0f;
  Sampler s(p, std::vector<int32_t>{4});  // token 4 seen in the prompt: 4.0 -> 2.0
  EXPECT_EQ(s.sample(std::vector<float>{9.0f, 1.0f, 0.0f, 3.0f, 4.0f}, mask_of({1, 3, 4}, 5)).token, 3);
  SamplingParams q;
  q.top_p = 0.5f;
  q.min_p = 0.2f;
  q.seed = 5;
  q.logprobs = true;
  q.top_logprobs = 2;
  Sampler t(q);
  for (int i = 0; i < 200; ++i) {
    const auto r = t.sample(std::vector<float>{5.0f, 0.0f, 0.0f, 5.0f, 1.0f}, mask_of({1, 2}, 5));
    EXPECT_TRUE(r.token == 1 || r.token == 2) << r.token;
    EXPECT_NEAR(r.logprob, std::log(0.5f), 1e-5f);  // renormalized over the two allowed
  }
}

TEST(SamplerMask, UnmaskedSamplingIsUnchangedByAnAllOnesMask) {
  SamplingParams p;
  p.seed = 99;
  p.top_k = 30;
  p.top_p = 0.9f;
  Sampler a(p), b(p);
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i) * 0.7f) * 3.0f;
  const std::vector<uint32_t> all(2, ~0u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(l).token, b.sample(l, all).token);
}

TEST(SamplerMask, AllowsAny) {
  EXPECT_FALSE(mask_allows_any(mask_of({}, 40), 40));
  EXPECT_TRUE(mask_allows_any(mask_of({39}, 40), 40));
  EXPECT_FALSE(mask_allows_any(mask_of({39}, 40), 39));  // past the logits
  EXPECT_TRUE(mask_allows_any(mask_of({0}, 40), 1));
  EXPECT_FALSE(mask_allows_any({}, 10));
}

// Issue 35 item 7: logit_bias is applied before every stage (greedy, sampling,
// logprobs), and a biased-out token is never drawn.
TEST(Sampler, LogitBiasForcesAndForbidsTokens) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 3.0f};
  SamplingParams g = greedy();
  g.logit_bias = {{2, 100.0f}};
  Sampler s(g);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.sample(logits).token, 2);
  SamplingParams t;
  t.seed = 11;
  t.logit_bias = {{3, -100.0f}, {1, 100.0f}};
  Sampler st(t);
  EXPECT_EQ(histogram(st, logits, 200), (std::vector<int>{0, 200, 0, 0}));
  // The logprobs are those of the biased logits: log-softmax of {2, 1, 0.5, 3 - 1}.
  SamplingParams lp = greedy();
  lp.logprobs = true;
  lp.logit_bias = {{3, -1.0f}};
  Sampler sl(lp);
  const SampleResult r = sl.sample(logits);
  EXPECT_EQ(r.token, 0);  // 2.0 ties 3 - 1 = 2.0: the lowest id
  const double z = std::exp(2.0) + std::exp(1.0) + std::exp(0.5) + std::exp(2.0);
  EXPECT_NEAR(r.logprob, 2.0 - std::log(z), 1e-5);
  // An id past the row is skipped (the engine refuses such requests first).
  SamplingParams past = greedy();
  past.logit_bias = {{9, 100.0f}};
  Sampler sp(past);
  EXPECT_EQ(sp.sample(logits).token, 3);
}
