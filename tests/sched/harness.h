// The scheduler test harness: a Scheduler over a KvManager driven by the fake
// runner (fake_runner.h), checking each plan (budget, seats, fork ids, FIFO
// fairness, one prefix lookup per admission), every finished request's outputs
// against expected_outputs(), and every invariant after every step.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/rng.h"
#include "fake_runner.h"
#include "kv/test_util.h"
#include "sched/scheduler.h"

namespace pagoda::sched::testing {

using kv::testing::concat;
using kv::testing::iota_tokens;
using kv::testing::Tokens;
constexpr int32_t kVocab = 500;

inline kv::KvConfig kv_config(int32_t num_blocks, int32_t block_size, double watermark = 0.01) {
  return kv::testing::make_config(num_blocks, block_size, watermark, /*model_fingerprint=*/99);
}

// The random soaks' prompts: four base strings of 200 tokens; a prompt is (60%)
// a random prefix of one of them, then a random tail of 0..120 tokens (at
// least one), so that prefix hits and in-flight dedup happen.
// One soak arrival: a prompt (see SoakPrompts::prompt), its output budget and
// the output length at which the fake runner emits eos.
struct SoakArrival {
  Tokens prompt;
  int32_t max_tokens = 0;
  int32_t eos = 0;
};

class SoakPrompts {
 public:
  explicit SoakPrompts(Rng& rng) : rng_(rng), bases_(4) {
    for (auto& b : bases_) {
      for (int i = 0; i < 200; ++i) b.push_back(static_cast<TokenId>(rng_.uniform_int(0, kVocab - 1)));
    }
  }
  // Prompts sharing one of 4 bases (60%) plus a random tail.
  Tokens next() {
    Tokens prompt;
    if (rng_.uniform() < 0.6) {
      const auto& b = bases_[static_cast<size_t>(rng_.uniform_int(0, 3))];
      prompt.assign(b.begin(), b.begin() + rng_.uniform_int(1, 200));
    }
    const int64_t tail = rng_.uniform_int(prompt.empty() ? 1 : 0, 120);
    for (int64_t i = 0; i < tail; ++i) prompt.push_back(static_cast<TokenId>(rng_.uniform_int(0, kVocab - 1)));
    return prompt;
  }
  // Arrivals this step: ~0.2 per step on average, in bursts of 1 to 4.
  int arrivals() { return rng_.uniform() < 0.08 ? static_cast<int>(rng_.uniform_int(1, 4)) : 0; }
  // A request of next()'s prompt, max_tokens in [1, max_tokens_hi], eos in [1, 80].
  SoakArrival arrival(int32_t max_tokens_hi) {
    SoakArrival a;
    a.prompt = next();
    a.max_tokens = static_cast<int32_t>(rng_.uniform_int(1, max_tokens_hi));
    a.eos = static_cast<int32_t>(rng_.uniform_int(1, 80));
    return a;
  }

 private:
  Rng& rng_;
  std::vector<Tokens> bases_;
};

// Drives scheduler + fake runner and checks every step.
class Harness {
 public:
  Harness(const SchedulerConfig& sc, const kv::KvConfig& kc)
      : kv_(kc), sched_(sc, &kv_), runner_(kc.num_blocks, kc.block_size, kVocab) {}

  // fork_ids: n > 1 sampling, the ids of choices 1..n-1 (all with eos_len).
  Status add(RequestId id, Tokens prompt, int32_t max_tokens, int32_t eos_len = INT_MAX, std::string salt = "",
             std::vector<RequestId> fork_ids = {}) {
    NewRequest r;
    r.id = id;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.cache_salt = std::move(salt);
    r.fork_ids = fork_ids;
    Status st = sched_.add_request(std::move(r));
    if (st.ok()) {
      fork_ids.insert(fork_ids.begin(), id);
      for (RequestId c : fork_ids) {
        specs_[c] = Spec{prompt, max_tokens};
        runner_.set_prompt_len(c, static_cast<int32_t>(prompt.size()));
        runner_.set_max_tokens(c, max_tokens);
        set_eos(c, eos_len);
      }
    }
    return st;
  }

  // A request with every NewRequest field (priority, pins), n == 1.
  Status add_request(NewRequest r, int32_t eos_len = INT_MAX) {
    const Tokens prompt = r.prompt;
    const RequestId id = r.id;
    const int32_t max_tokens = r.max_tokens;
    Status st = sched_.add_request(std::move(r));
    if (st.ok()) {
      specs_[id] = Spec{prompt, max_tokens};
      runner_.set_prompt_len(id, static_cast<int32_t>(prompt.size()));
      runner_.set_max_tokens(id, max_tokens);
      set_eos(id, eos_len);
    }
    return st;
  }

  // EOS after eos_len outputs of request (or choice) `id`; INT_MAX: never.
  void set_eos(RequestId id, int32_t eos_len) {
    const Spec& s = specs_.at(id);
    expected_[id] = expected_outputs(id, s.prompt, s.max_tokens, eos_len, kVocab);
    if (eos_len != INT_MAX) runner_.set_eos_len(id, eos_len);
  }
  const Tokens& expected(RequestId id) const { return expected_.at(id); }

  // One engine step; abort_mid (if set) is aborted between the run and update().
  StepPlan step(RequestId abort_mid = 0) {
    if (abort_mid == 0) return step(std::vector<RequestId>{});
    return step(std::vector<RequestId>{abort_mid});
  }
  // One engine step; the group abort_mid (if non-empty) is aborted between the run and update().
  StepPlan step(const std::vector<RequestId>& abort_mid) {
    const std::vector<RequestId> waiting_before = sched_.waiting_ids();
    const int64_t lookups_before = kv_.stats().prefix_lookups;
    StepPlan plan = sched_.schedule();
    check_plan(plan, waiting_before);
    check_lookups(plan, waiting_before, kv_.stats().prefix_lookups - lookups_before);
    std::vector<SeqOutput> outs = runner_.execute(plan);
    for (const ScheduledSeq& s : plan.seqs) scheduled_tokens_ += static_cast<int64_t>(s.token_ids.size());
    if (abort_mid.size() == 1) abort(abort_mid[0]);
    if (abort_mid.size() > 1) abort_group(abort_mid);
    for (FinishedRequest& f : sched_.update(plan, outs)) {
      EXPECT_EQ(f.output_tokens, expected_[f.id]) << "request " << f.id << " output differs";
      EXPECT_TRUE(finished_.emplace(f.id, f).second) << "request " << f.id << " finished twice";
    }
    EXPECT_EQ(sched_.check_invariants(), "") << "step " << sched_.stats().num_steps;
    ++steps_;
    return plan;
  }

  // Aborts one request or choice; a parent not forked yet takes its pending children along.
  bool abort(RequestId id) {
    const Request* r = sched_.find(id);
    const std::vector<RequestId> pending = r ? r->fork_ids : std::vector<RequestId>{};
    const bool ok = sched_.abort(id);
    if (ok) aborted_.insert(id);
    if (ok) aborted_.insert(pending.begin(), pending.end());
    return ok;
  }
  // Aborts every id of an n > 1 group (as the engine does): the ids not finished
  // yet count as aborted; the first call aborts the parent or a child, so it
  // must succeed unless the whole group is gone. Returns whether any id was known.
  bool abort_group(const std::vector<RequestId>& ids) {
    bool any = false;
    for (RequestId id : ids) {
      any = sched_.abort(id) || any;
      if (!finished_.count(id)) aborted_.insert(id);
    }
    return any;
  }
  int64_t scheduled_tokens() const { return scheduled_tokens_; }

  // Runs until nothing is left; returns the number of steps.
  int run_to_completion(int max_steps) {
    int n = 0;
    while (sched_.has_unfinished() && n < max_steps && !::testing::Test::HasFailure()) {
      step();
      ++n;
    }
    if (sched_.has_unfinished()) {
      std::ostringstream dump;
      dump << "running:";
      for (RequestId id : sched_.running_ids()) {
        const Request* r = sched_.find(id);
        dump << " " << id << "(" << sched_.num_computed_tokens(id) << "/" << r->num_tokens() << ")";
      }
      dump << " waiting:";
      for (RequestId id : sched_.waiting_ids()) {
        const Request* r = sched_.find(id);
        dump << " " << id << "(" << request_state_name(r->state) << " " << r->num_tokens() << " def "
             << r->deferred_steps << ")";
      }
      dump << " free blocks " << kv_.num_free_blocks();
      ADD_FAILURE() << dump.str().substr(0, 2000);
    }
    EXPECT_FALSE(sched_.has_unfinished()) << "requests left after " << max_steps << " steps";
    return n;
  }

  // A soak's step loop stops at its first failure (one report is enough).
  bool soak_failed(int step) {
    if (!::testing::Test::HasFailure()) return false;
    ADD_FAILURE() << "stopped at step " << step;
    return true;
  }
  // The end of a soak: runs what is left, then every request must have
  // finished or been aborted, and the pool must be free again.
  // Ends a soak: runs what is left, checks nothing was lost and the pool is free,
  // prints the counters every soak reports after `name` and returns them.
  struct SoakCounters {
    SchedulerStats sched;
    kv::KvStats kv;
  };
  SoakCounters drain_soak(const char* name) {
    run_to_completion(5000);
    expect_all_done_and_pool_free();
    SoakCounters c{sched_.stats(), kv_.stats()};
    std::printf("%s: %lld steps, %zu finished, %lld aborted, %lld preemptions, prefix hits %lld / %lld tokens\n", name,
                static_cast<long long>(c.sched.num_steps), finished_.size(), static_cast<long long>(c.sched.num_aborted),
                static_cast<long long>(c.sched.num_preemptions), static_cast<long long>(c.kv.prefix_hit_tokens),
                static_cast<long long>(c.kv.prefix_query_tokens));
    return c;
  }

  void expect_all_done_and_pool_free() {
    for (const auto& [id, out] : expected_) {
      EXPECT_TRUE(finished_.count(id) + aborted_.count(id) == 1) << "request " << id << " lost";
    }
    const kv::KvStats st = kv_.stats();
    EXPECT_EQ(st.num_used, 0);
    EXPECT_EQ(kv_.num_free_blocks(), kv_.num_usable_blocks());
    EXPECT_EQ(kv_.num_seqs(), 0);
  }

  kv::KvManager& kv() { return kv_; }
  Scheduler& sched() { return sched_; }
  FakeRunner& runner() { return runner_; }
  const std::map<RequestId, FinishedRequest>& finished() const { return finished_; }
  int64_t max_deferred_steps = 0;
  int64_t max_overtaken_steps = 0;  // kLpm

 private:
  // Admission walks the prefix cache once per request it considers: kLpm for
  // the whole queue when ordering it (and never again), kFcfs for each request
  // it admits or defers, plus at most one that did not fit. None in a step
  // that preempted (no admission).
  void check_lookups(const StepPlan& plan, const std::vector<RequestId>& waiting_before, int64_t lookups) {
    if (sched_.config().policy == SchedulePolicy::kPriority) {
      // Admission may preempt worse requests and look up again (scheduler_priority.cc).
      int64_t admitted = static_cast<int64_t>(plan.deferred.size());
      for (const ScheduledSeq& s : plan.seqs) admitted += std::count(waiting_before.begin(), waiting_before.end(), s.request_id);
      EXPECT_GE(lookups, admitted) << "an admission without a lookup";
      return;
    }
    if (!plan.preempted.empty()) {
      EXPECT_EQ(lookups, 0) << "lookups in a step without admission";
      return;
    }
    if (sched_.config().policy == SchedulePolicy::kLpm) {
      EXPECT_EQ(lookups, static_cast<int64_t>(waiting_before.size())) << "kLpm: one lookup per waiting request";
      return;
    }
    const std::set<RequestId> waiting(waiting_before.begin(), waiting_before.end());
    int64_t considered = static_cast<int64_t>(plan.deferred.size());
    for (const ScheduledSeq& s : plan.seqs) considered += waiting.count(s.request_id);
    EXPECT_GE(lookups, considered) << "an admission without a lookup";
    EXPECT_LE(lookups, considered + 1) << "more than one lookup per admission";
  }

  void check_plan(const StepPlan& plan, const std::vector<RequestId>& waiting_before) {
    const SchedulerConfig& c = sched_.config();
    EXPECT_LE(plan.num_tokens(), c.max_num_batched_tokens);
    EXPECT_LE(sched_.num_running(), c.max_num_seqs);
    std::set<RequestId> ids;
    for (const ScheduledSeq& s : plan.seqs) {
      for (RequestId c : s.fork_ids) {
        EXPECT_TRUE(ids.insert(c).second) << "fork id " << c << " twice in a step";
        EXPECT_EQ(sched_.find(c), nullptr) << "fork id " << c << " already a request";
        EXPECT_TRUE(s.wants_logits);
      }
      EXPECT_TRUE(ids.insert(s.request_id).second) << "request scheduled twice in a step";
      EXPECT_FALSE(s.token_ids.empty());
      EXPECT_GE(static_cast<int64_t>(s.block_ids.size()) * kv_.block_size(),
                s.start_pos + static_cast<int64_t>(s.token_ids.size()));
    }
    // FIFO fairness: a request admitted this step passed only requests that
    // were admitted too or deferred for in-flight dedup. Under kLpm requests
    // may be overtaken, but each at most max_lpm_overtake_steps steps, plus the
    // steps it was deferred for in-flight dedup (which lets others pass anyway).
    if (c.policy == SchedulePolicy::kLpm) {
      for (RequestId w : sched_.waiting_ids()) {
        const Request* r = sched_.find(w);
        ASSERT_NE(r, nullptr);
        EXPECT_LE(r->overtaken_steps, c.max_lpm_overtake_steps + r->deferred_steps) << "request " << w;
        max_overtaken_steps = std::max<int64_t>(max_overtaken_steps, r->overtaken_steps);
      }
    }
    std::set<RequestId> deferred(plan.deferred.begin(), plan.deferred.end());
    std::set<RequestId> skipped;
    for (RequestId w : waiting_before) {
      if (c.policy != SchedulePolicy::kFcfs) break;  // kLpm, kPriority reorder
      if (ids.count(w)) {
        for (RequestId s : skipped) {
          EXPECT_TRUE(deferred.count(s)) << "request " << w << " admitted past " << s << " which was not deferred";
        }
      } else {
        skipped.insert(w);
      }
    }
    for (RequestId d : plan.deferred) {
      const Request* r = sched_.find(d);
      ASSERT_NE(r, nullptr);
      EXPECT_LE(r->deferred_steps, c.max_dedup_defer_steps);
      max_deferred_steps = std::max<int64_t>(max_deferred_steps, r->deferred_steps);
    }
  }

  kv::KvManager kv_;
  Scheduler sched_;
  FakeRunner runner_;
  struct Spec {
    Tokens prompt;
    int32_t max_tokens = 0;
  };
  std::map<RequestId, Spec> specs_;
  std::map<RequestId, Tokens> expected_;
  std::map<RequestId, FinishedRequest> finished_;
  std::set<RequestId> aborted_;
  int steps_ = 0;
  int64_t scheduled_tokens_ = 0;
};

inline SchedulerConfig sched_config(int32_t budget, int32_t max_seqs, int32_t max_len = 2048) {
  return SchedulerConfig{
      .max_num_batched_tokens = budget, .max_num_seqs = max_seqs, .max_model_len = max_len, .vocab_size = kVocab};
}

}  // namespace pagoda::sched::testing
