// Admission order under SchedulePolicy::kLpm (longest cached prefix first) vs
// kFcfs, with exact request ids per step, and the overtaking bound.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "harness.h"

namespace pagoda::sched {
namespace {

using testing::concat;
using testing::Harness;
using testing::iota_tokens;
using testing::kv_config;
using testing::sched_config;
using testing::Tokens;

std::vector<RequestId> ids_of(const StepPlan& p) {
  std::vector<RequestId> out;
  for (const ScheduledSeq& s : p.seqs) out.push_back(s.request_id);
  return out;
}

// Request 1 caches a 12-token prompt (3 blocks of 4). Then a cold 12-token
// request 2 and a 16-token request 3 extending the cached prompt arrive, in
// that order, with an 8-token budget per step.
std::unique_ptr<Harness> second_wave(SchedulePolicy policy, StepPlan* first) {
  SchedulerConfig sc = sched_config(8, 8);
  sc.policy = policy;
  auto h = std::make_unique<Harness>(sc, kv_config(33, 4));
  const Tokens p = iota_tokens(1, 12);
  EXPECT_TRUE(h->add(1, p, 1).ok());
  h->run_to_completion(10);
  EXPECT_TRUE(h->add(2, iota_tokens(100, 12), 1).ok());
  EXPECT_TRUE(h->add(3, concat(p, {50, 51, 52, 53}), 1).ok());
  *first = h->step();
  return h;
}

TEST(SchedulerLpm, FcfsAdmitsInArrivalOrder) {
  StepPlan s;
  auto h = second_wave(SchedulePolicy::kFcfs, &s);
  ASSERT_EQ(ids_of(s), (std::vector<RequestId>{2}));
  EXPECT_EQ(s.seqs[0].token_ids.size(), 8u);  // a chunk of the cold prompt takes the budget
  h->run_to_completion(10);
  h->expect_all_done_and_pool_free();
}

TEST(SchedulerLpm, LpmAdmitsTheLongestCachedPrefixFirst) {
  StepPlan s;
  auto h = second_wave(SchedulePolicy::kLpm, &s);
  ASSERT_EQ(ids_of(s), (std::vector<RequestId>{3, 2}));
  EXPECT_EQ(s.seqs[0].start_pos, 12);  // 3 blocks hit
  EXPECT_EQ(s.seqs[0].token_ids, (Tokens{50, 51, 52, 53}));
  EXPECT_TRUE(s.seqs[0].wants_logits);
  EXPECT_EQ(s.seqs[1].start_pos, 0);
  EXPECT_EQ(s.seqs[1].token_ids.size(), 4u);  // what is left of the budget
  EXPECT_EQ(h->sched().find(2)->overtaken_steps, 0);  // admitted in the same step
  // One lookup for each (the ordering's), reused by the admissions: 1 for request 1 before.
  EXPECT_EQ(h->kv().stats().prefix_lookups, 1 + 2);
  h->run_to_completion(10);
  h->expect_all_done_and_pool_free();
  EXPECT_EQ(h->finished().at(3).num_cached_tokens, 12);
}

// One seat: each step admits one request, which finishes in that step. A cold
// request is overtaken by requests hitting the cache exactly
// max_lpm_overtake_steps times, then goes first.
TEST(SchedulerLpm, OvertakingIsBounded) {
  SchedulerConfig sc = sched_config(64, 1);
  sc.policy = SchedulePolicy::kLpm;
  sc.max_lpm_overtake_steps = 2;
  Harness h(sc, kv_config(33, 4));
  const Tokens p = iota_tokens(1, 12);
  ASSERT_TRUE(h.add(1, p, 1).ok());
  h.run_to_completion(10);
  ASSERT_TRUE(h.add(10, iota_tokens(200, 8), 1).ok());  // cold, first in the queue
  for (RequestId id = 11; id <= 14; ++id) {
    ASSERT_TRUE(h.add(id, concat(p, {static_cast<TokenId>(id)}), 1).ok());
  }
  std::vector<RequestId> order;
  while (h.sched().has_unfinished()) {
    const StepPlan s = h.step();
    ASSERT_EQ(s.seqs.size(), 1u);
    order.push_back(s.seqs[0].request_id);
  }
  EXPECT_EQ(order, (std::vector<RequestId>{11, 12, 10, 13, 14}));
  h.expect_all_done_and_pool_free();
}

}  // namespace
}  // namespace pagoda::sched
