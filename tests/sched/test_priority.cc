// The priority policy (kPriority, scheduler_priority.cc) and pins at the
// scheduler (issue 36): admission order, preemption victims and preemption on
// behalf of a better request with exact request ids; pins that would block an
// accepted request are released; every output checked by the harness (the
// fake runner's tokens) and every invariant after every step.
#include <gtest/gtest.h>

#include <climits>
#include <vector>

#include "base/rng.h"
#include "harness.h"

namespace pagoda::sched {
namespace {

using testing::Harness;
using testing::iota_tokens;
using testing::kv_config;
using testing::sched_config;
using testing::Tokens;
using Ids = std::vector<RequestId>;

SchedulerConfig priority_config(int32_t budget, int32_t max_seqs) {
  SchedulerConfig c = sched_config(budget, max_seqs);
  c.policy = SchedulePolicy::kPriority;
  return c;
}

NewRequest req(RequestId id, Tokens prompt, int32_t max_tokens, int32_t priority, int32_t pin_tokens = 0,
               double ttl = 0) {
  NewRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.priority = priority;
  r.pin_tokens = pin_tokens;
  r.pin_ttl_s = ttl;
  return r;
}

Ids admitted_in(const StepPlan& plan, const Ids& waiting_before) {
  Ids out;
  for (const ScheduledSeq& s : plan.seqs)
    if (std::find(waiting_before.begin(), waiting_before.end(), s.request_id) != waiting_before.end())
      out.push_back(s.request_id);
  return out;
}

TEST(SchedPriority, AdmitsLowestPriorityFirstTiesByArrival) {
  Harness h(priority_config(256, 2), kv_config(65, 4, 0.0));
  ASSERT_TRUE(h.add_request(req(1, iota_tokens(10, 6), 3, 5)).ok());
  ASSERT_TRUE(h.add_request(req(2, iota_tokens(20, 6), 3, 1)).ok());
  ASSERT_TRUE(h.add_request(req(3, iota_tokens(30, 6), 3, 3)).ok());
  ASSERT_TRUE(h.add_request(req(4, iota_tokens(40, 6), 3, 1)).ok());
  Ids order;
  while (h.sched().has_unfinished()) {
    const Ids before = h.sched().waiting_ids();
    for (RequestId id : admitted_in(h.step(), before)) order.push_back(id);
    ASSERT_LT(h.sched().stats().num_steps, 50);
  }
  EXPECT_EQ(order, (Ids{2, 4, 3, 1}));
  h.expect_all_done_and_pool_free();
}

TEST(SchedPriority, FcfsKeepsArrivalOrder) {  // the same queue under fcfs: priorities are ignored
  Harness h(sched_config(256, 2), kv_config(65, 4, 0.0));
  for (RequestId id = 1; id <= 4; ++id)
    ASSERT_TRUE(h.add_request(req(id, iota_tokens(static_cast<int>(id) * 10, 6), 3, 5 - static_cast<int>(id))).ok());
  Ids order;
  while (h.sched().has_unfinished()) {
    const Ids before = h.sched().waiting_ids();
    for (RequestId id : admitted_in(h.step(), before)) order.push_back(id);
    ASSERT_LT(h.sched().stats().num_steps, 50);
  }
  EXPECT_EQ(order, (Ids{1, 2, 3, 4}));
  h.expect_all_done_and_pool_free();
}

TEST(SchedPriority, BetterRequestPreemptsTheWorstForASeat) {
  Harness h(priority_config(256, 2), kv_config(65, 4, 0.0));
  ASSERT_TRUE(h.add_request(req(1, iota_tokens(10, 6), 8, 10)).ok());
  ASSERT_TRUE(h.add_request(req(2, iota_tokens(20, 6), 8, 10)).ok());
  h.step();
  h.step();
  EXPECT_EQ(h.sched().running_ids(), (Ids{1, 2}));
  ASSERT_TRUE(h.add_request(req(3, iota_tokens(30, 6), 4, 0)).ok());
  const StepPlan p = h.step();
  EXPECT_EQ(p.preempted, (Ids{2}));  // same priority: the later arrival
  EXPECT_EQ(h.sched().running_ids(), (Ids{1, 3}));
  EXPECT_EQ(h.sched().waiting_ids(), (Ids{2}));
  h.run_to_completion(100);
  h.expect_all_done_and_pool_free();  // every request complete, outputs exact
  EXPECT_EQ(h.finished().at(2).num_preemptions, 1);
}

// Memory preemption takes the worst priority, not the last admitted: request 1
// (priority 10) runs before request 2 (priority 0) arrives; both decode into a
// full pool.
TEST(SchedPriority, MemoryPreemptionTakesTheWorstPriority) {
  for (SchedulePolicy policy : {SchedulePolicy::kPriority, SchedulePolicy::kFcfs}) {
    SchedulerConfig sc = sched_config(256, 4);
    sc.policy = policy;
    Harness h(sc, kv_config(6, 4, 0.0));  // 5 usable blocks
    ASSERT_TRUE(h.add_request(req(1, iota_tokens(10, 7), 6, 10)).ok());
    h.step();
    ASSERT_TRUE(h.add_request(req(2, iota_tokens(20, 7), 6, 0)).ok());
    Ids preempted;
    while (h.sched().has_unfinished() && preempted.empty()) {
      const StepPlan p = h.step();
      preempted = p.preempted;
      ASSERT_LT(h.sched().stats().num_steps, 20);
    }
    EXPECT_EQ(preempted, (Ids{policy == SchedulePolicy::kPriority ? RequestId{1} : RequestId{2}}))
        << schedule_policy_name(policy);
    h.run_to_completion(100);
    h.expect_all_done_and_pool_free();
  }
}

// Pins never deadlock: with nothing running, a request that only fits
// without the pins gets them released, oldest first.
TEST(SchedPriority, PinsAreReleasedWhenTheyBlockAnIdlePool) {
  kv::KvConfig kc = kv_config(21, 4, 0.0);
  kc.pinned_fraction = 0.5;  // 10 blocks
  Harness h(sched_config(256, 4), kc);
  double t = 0;
  h.kv().set_clock([&] { return t; });
  ASSERT_TRUE(h.add_request(req(1, iota_tokens(100, 21), 1, 0, 20, 100)).ok());
  h.run_to_completion(10);
  t = 1;
  ASSERT_TRUE(h.add_request(req(2, iota_tokens(200, 21), 1, 0, 20, 100)).ok());
  h.run_to_completion(10);
  EXPECT_EQ(h.kv().num_pinned_blocks(), 10);
  EXPECT_EQ(h.kv().pin_stats().num_pins, 2);
  // 14 blocks: fits only with one pin gone; the older (request 1's) goes.
  ASSERT_TRUE(h.add_request(req(3, iota_tokens(300, 52), 4, 0)).ok());
  h.run_to_completion(20);
  EXPECT_EQ(h.kv().pin_stats().demoted, 1);
  EXPECT_EQ(h.kv().num_pinned_blocks(), 5);
  EXPECT_EQ(h.kv().match_prefix(iota_tokens(200, 21), "").num_cached_tokens(), 20);
  t = 200;  // past every TTL: the pool is free again
  h.kv().expire_pins();
  h.expect_all_done_and_pool_free();
}

// Random arrivals with priorities, pins and TTLs: every request completes with
// its exact output (the harness), invariants after every step.
TEST(SchedPriority, RandomSoakWithPrioritiesAndPins) {
  kv::KvConfig kc = kv_config(49, 4, 0.0);
  Harness h(priority_config(32, 6), kc);
  double t = 0;
  h.kv().set_clock([&] { return t; });
  Rng rng(7);
  std::vector<Tokens> bases(3);
  for (auto& b : bases)
    for (int i = 0; i < 40; ++i) b.push_back(static_cast<int32_t>(rng.uniform_int(0, 99)));
  RequestId next = 1;
  for (int step = 0; step < 1500 && !::testing::Test::HasFailure(); ++step) {
    if (rng.uniform() < 0.25) {
      Tokens p;
      const Tokens& b = bases[static_cast<size_t>(rng.uniform_int(0, 2))];
      p.assign(b.begin(), b.begin() + rng.uniform_int(1, 40));
      for (int64_t i = rng.uniform_int(1, 20); i > 0; --i) p.push_back(static_cast<int32_t>(rng.uniform_int(0, 99)));
      const bool pin = rng.uniform() < 0.4;
      ASSERT_TRUE(h.add_request(req(next, p, static_cast<int32_t>(rng.uniform_int(1, 20)),
                                    static_cast<int32_t>(rng.uniform_int(0, 3)) * 5,
                                    pin ? static_cast<int32_t>(rng.uniform_int(4, 40)) : 0, 1 + 20 * rng.uniform()))
                      .ok());
      ++next;
    }
    t += 0.5 * rng.uniform();
    if (h.sched().has_unfinished()) h.step();
    ASSERT_LE(h.kv().num_pinned_blocks(), h.kv().pin_cap_blocks());
  }
  h.run_to_completion(5000);
  EXPECT_GT(h.kv().pin_stats().created, 20);
  EXPECT_GT(h.sched().stats().num_preemptions, 0);
  t += 1000;
  h.kv().expire_pins();
  h.expect_all_done_and_pool_free();
}

}  // namespace
}  // namespace pagoda::sched
