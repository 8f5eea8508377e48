// The burst-aware step budget (--max-num-batched-tokens auto, sched/step_cost.h):
// the step cost model's bins, auto_prefill_budget's bounds, exact plans of a
// wave arriving while streams decode, and a random soak whose every step keeps
// prefill within the step-time target. Step times are fed by the test
// (Scheduler::record_step_time), never measured, so nothing depends on timing.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>

#include "base/rng.h"
#include "harness.h"

namespace pagoda::sched {
namespace {

using testing::Harness;
using testing::iota_tokens;
using testing::kv_config;
using testing::sched_config;
using testing::SoakArrival;
using testing::SoakPrompts;
using testing::Tokens;

TEST(StepCost, WideBinsInterpolateAndExtrapolate) {
  StepCostModel c;
  EXPECT_FALSE(c.measured());
  EXPECT_DOUBLE_EQ(c.cost(3), 2.0);  // relative units before any measurement
  c.record(16, 40.0);
  c.record(1016, 540.0);  // a wide bin (above 128 tokens)
  EXPECT_TRUE(c.measured());
  EXPECT_DOUBLE_EQ(c.cost(16), 40.0);
  EXPECT_DOUBLE_EQ(c.cost(516), 290.0);   // between the two measured sizes
  EXPECT_DOUBLE_EQ(c.cost(2016), 1040.0); // above: the slope from the smallest measured size
  EXPECT_DOUBLE_EQ(c.cost(4), 40.0);      // below every measurement: the smallest's cost
  // Up to 128 tokens only exact bins count: above 16 the slope of half a token's
  // cost (16 alone measured), not the line towards the 1016-token prefill.
  EXPECT_DOUBLE_EQ(c.cost(56), 40.0 + 40 * 1.25);
  c.record(96, 120.0);
  EXPECT_DOUBLE_EQ(c.cost(56), 80.0);     // between 16 and 96
  // A wide bin keeps the average size it saw: 1016 and 1000 share one bin.
  c.record(1000, 540.0);
  EXPECT_LT(c.cost(1012), 540.0);  // the bin's point moved to 0.8 x 1016 + 0.2 x 1000 = 1012.8
  EXPECT_GT(c.cost(1013), 540.0);
  c.record(0, 5.0);     // ignored
  c.record(20, -1.0);   // ignored
  EXPECT_DOUBLE_EQ(c.cost(16), 40.0);
  c.record(100000, 50000.0);  // past kMaxTokens: the last bin
  EXPECT_DOUBLE_EQ(c.cost(100000), 50000.0);
  StepCostModel one;
  one.record(10, 20.0);  // one size: half its cost per token above it
  EXPECT_DOUBLE_EQ(one.cost(30), 20.0 + 20 * 1.0);
}

TEST(StepCost, AutoPrefillBudgetBounds) {
  StepCostModel c;
  c.record(2, 20.0);
  c.record(102, 70.0);  // 0.5 ms a token
  const AutoBudgetConfig cfg{.target_factor = 2.0, .min_prefill_tokens = 16};
  // cost(2 + p) <= 40: p <= 40.
  EXPECT_EQ(auto_prefill_budget(c, cfg, 2, 2048), 40);
  // No decode running: nothing to protect, the whole cap.
  EXPECT_EQ(auto_prefill_budget(c, cfg, 0, 2048), 2048);
  // The cap wins over the target.
  EXPECT_EQ(auto_prefill_budget(c, cfg, 2, 30), 28);
  // A looser target allows more: cost(2 + p) <= 60 -> p <= 80.
  EXPECT_EQ(auto_prefill_budget(c, AutoBudgetConfig{.target_factor = 3.0, .min_prefill_tokens = 16}, 2, 2048), 80);
  // Prefill far dearer than decodes: the minimum chunk still advances the queue.
  StepCostModel steep;
  steep.record(2, 20.0);
  steep.record(50, 1000.0);
  EXPECT_EQ(auto_prefill_budget(steep, cfg, 2, 2048), 16);
  EXPECT_EQ(auto_prefill_budget(steep, cfg, 2, 10), 8);  // the minimum never passes the cap
  EXPECT_EQ(auto_prefill_budget(steep, cfg, 10, 10), 0);
}

// Two streams decode; a 300-token prompt arrives. With a fixed budget it is
// prefilled in one step; with auto it goes in 40-token chunks next to the two
// decodes (cost(2 + 40) = 2 x cost(2)), the streams never wait, and the outputs
// are the same.
TEST(StepBudget, AWaveIsSpreadOverStepsNextToRunningDecodes) {
  for (bool use_auto : {false, true}) {
    SCOPED_TRACE(use_auto ? "auto" : "fixed");
    SchedulerConfig sc = sched_config(2048, 8);
    sc.auto_budget = use_auto;
    sc.auto_budget_config = AutoBudgetConfig{.target_factor = 2.0, .min_prefill_tokens = 16};
    Harness h(sc, kv_config(257, 16));
    h.sched().record_step_time(2, 20.0);
    h.sched().record_step_time(102, 70.0);  // 0.5 ms a token
    ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 40).ok());
    ASSERT_TRUE(h.add(2, iota_tokens(100, 10), 40).ok());
    StepPlan first = h.step();  // nothing decodes yet: both prompts whole
    ASSERT_EQ(first.seqs.size(), 2u);
    EXPECT_EQ(first.num_tokens(), 20);
    const Tokens wave = iota_tokens(200, 300);
    ASSERT_TRUE(h.add(3, wave, 5).ok());
    std::vector<int32_t> chunks;
    while (h.sched().find(3) != nullptr && h.sched().num_computed_tokens(3) < 300) {
      StepPlan p = h.step();
      ASSERT_EQ(p.seqs.size(), 3u);
      EXPECT_EQ(p.seqs[0].token_ids.size(), 1u);  // the decodes first, every step
      EXPECT_EQ(p.seqs[1].token_ids.size(), 1u);
      EXPECT_EQ(p.seqs[2].request_id, 3u);
      EXPECT_EQ(p.seqs[2].start_pos, std::accumulate(chunks.begin(), chunks.end(), 0));
      chunks.push_back(static_cast<int32_t>(p.seqs[2].token_ids.size()));
    }
    if (use_auto) {
      EXPECT_EQ(chunks, (std::vector<int32_t>{40, 40, 40, 40, 40, 40, 40, 20}));
      EXPECT_EQ(h.sched().stats().num_budget_capped_steps, 7);  // the last chunk (20) was not held back
    } else {
      EXPECT_EQ(chunks, (std::vector<int32_t>{300}));
      EXPECT_EQ(h.sched().stats().num_budget_capped_steps, 0);
    }
    h.run_to_completion(100);
    h.expect_all_done_and_pool_free();  // outputs checked against the fake runner's by the harness
  }
}

// Prefill much dearer than the target allows: still min_prefill_tokens a step,
// shared by a running prompt's chunk and the admissions after it.
TEST(StepBudget, MinimumChunkAdvancesTheQueue) {
  SchedulerConfig sc = sched_config(2048, 8);
  sc.auto_budget = true;
  sc.auto_budget_config = AutoBudgetConfig{.target_factor = 1.5, .min_prefill_tokens = 24};
  Harness h(sc, kv_config(257, 16));
  h.sched().record_step_time(1, 10.0);
  h.sched().record_step_time(20, 1000.0);
  ASSERT_TRUE(h.add(1, iota_tokens(1, 5), 30).ok());
  EXPECT_EQ(h.step().num_tokens(), 5);
  ASSERT_TRUE(h.add(2, iota_tokens(50, 30), 3).ok());
  ASSERT_TRUE(h.add(3, iota_tokens(90, 30), 3).ok());
  StepPlan a = h.step();  // 1 decode + 24 of request 2
  ASSERT_EQ(a.seqs.size(), 2u);
  EXPECT_EQ(a.seqs[1].token_ids.size(), 24u);
  StepPlan b = h.step();  // 1 decode + 6 of request 2 + 18 of request 3
  ASSERT_EQ(b.seqs.size(), 3u);
  EXPECT_EQ(b.seqs[1].token_ids.size(), 6u);
  EXPECT_EQ(b.seqs[2].request_id, 3u);
  EXPECT_EQ(b.seqs[2].token_ids.size(), 18u);
  h.run_to_completion(100);
  h.expect_all_done_and_pool_free();
}

// Random arrivals, aborts and preemptions with auto on and a linear step cost
// (4 + 0.5 n ms) fed after every step: every step with D > 0 decodes carries at
// most max(min chunk, 8 + D) prefill tokens (cost(D + P) <= 2 cost(D)), and
// every request still gets exactly its outputs.
TEST(StepBudget, RandomSoakKeepsEveryStepWithinTheTarget) {
  SchedulerConfig sc = sched_config(256, 16, 512);
  sc.max_dedup_defer_steps = 6;
  sc.auto_budget = true;
  sc.auto_budget_config = AutoBudgetConfig{.target_factor = 2.0, .min_prefill_tokens = 16};
  Harness h(sc, kv_config(129, 16));
  Rng rng(77);
  SoakPrompts prompts(rng);
  h.sched().record_step_time(1, 4.5);  // two sizes on the line: the model is exact from the start
  h.sched().record_step_time(256, 132.0);
  RequestId next = 1;
  int64_t capped_prefill = 0;
  for (int step = 0; step < 3000; ++step) {
    for (int a = 0, arrivals = prompts.arrivals(); a < arrivals; ++a) {
      const SoakArrival r = prompts.arrival(120);
      (void)h.add(next++, r.prompt, r.max_tokens, r.eos);  // too long for 512: rejected, fine
    }
    int32_t decodes = 0;
    for (RequestId id : h.sched().running_ids()) {
      const Request* r = h.sched().find(id);
      decodes += h.sched().num_computed_tokens(id) == r->num_tokens() - 1 ? 1 : 0;
    }
    const StepPlan p = h.step(rng.uniform() < 0.01 && !h.sched().running_ids().empty()
                                  ? h.sched().running_ids().front()
                                  : 0);
    if (h.soak_failed(step)) return;
    h.sched().record_step_time(p.num_tokens(), 4.0 + 0.5 * p.num_tokens());
    if (decodes > 0 && p.preempted.empty()) {
      const int32_t prefill = p.num_tokens() - decodes;
      EXPECT_LE(prefill, std::max(16, 8 + decodes)) << "step " << step << " with " << decodes << " decodes";
      capped_prefill += prefill == std::max(16, 8 + decodes) ? 1 : 0;
    }
  }
  const auto [st, ks] = h.drain_soak("auto budget");
  std::printf("auto budget: %lld capped steps, %lld steps at the bound\n",
              static_cast<long long>(st.num_budget_capped_steps), static_cast<long long>(capped_prefill));
  EXPECT_GT(st.num_budget_capped_steps, 50);  // the budget did bite
  EXPECT_GT(h.finished().size(), 200u);
}

}  // namespace
}  // namespace pagoda::sched
