// sample::argmax (vectorized) against the plain first-maximum loop: every
// length around the vector width, ties, infinities, negative zeros and NaNs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/rng.h"
#include "sample/sampler.h"

using namespace pagoda::sample;

namespace {

int32_t first_max(const std::vector<float>& l) {
  int32_t best = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i] > l[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

TEST(Argmax, MatchesFirstMaximumLoop) {
  pagoda::Rng rng(42);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {1, 7, 8, 15, 16, 17, 23, 24, 31, 64, 100, 1000, 49152}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> l(n);
      // Few distinct values, so that ties (in one lane and across lanes) are common.
      const int levels = trial % 4 == 0 ? 2 : 50;
      for (float& x : l) x = static_cast<float>(rng.uniform_int(0, levels - 1)) - 10.0f;
      const size_t at = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(n) - 1));
      switch (trial % 8) {
        case 1: l[at] = inf; break;
        case 2: std::fill(l.begin(), l.end(), -inf); break;
        case 3: l[at] = nan; break;
        case 4: l[0] = nan; break;
        case 5: std::fill(l.begin(), l.end(), 0.0f); l[at] = -0.0f; break;
        case 6: l[n - 1] = 1e30f; break;  // in the scalar tail for most n
        default: break;
      }
      ASSERT_EQ(argmax(l), first_max(l)) << "n=" << n << " trial=" << trial;
    }
  }
}

TEST(Argmax, GreedySampleIsTheArgmaxAndCountsTheToken) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, {});
  std::vector<float> l(100, 0.0f);
  l[37] = 3.0f;
  l[90] = 3.0f;  // tie: the lowest id wins
  EXPECT_EQ(s.sample(l).token, 37);
  // With a penalty (the general path) the same first answer, then 37 counts as seen.
  p.repetition_penalty = 2.0f;
  Sampler with_penalty(p, {});
  EXPECT_EQ(with_penalty.sample(l).token, 37);
  EXPECT_EQ(with_penalty.sample(l).token, 90);  // 37's logit 3 -> 1.5 after the penalty
}

}  // namespace
