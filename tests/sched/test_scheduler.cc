// Scheduler tests with a fake runner (tests/sched/fake_runner.h): exact plans
// for chunked prefill, prefix hits, in-flight dedup and preemption; an
// exhaustion test; and >= 10,000 random steps checking invariants every step.
#include <gtest/gtest.h>

#include <climits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "base/rng.h"
#include "harness.h"

namespace pagoda::sched {
namespace {

using testing::FakeRunner;
using testing::concat;
using testing::Harness;
using testing::iota_tokens;
using testing::kv_config;
using testing::kVocab;
using testing::sched_config;
using testing::SoakArrival;
using testing::SoakPrompts;
using testing::Tokens;

// add_request is the one place a request is validated: one message per
// error, naming the numbers and never an internal id, and nothing queued.
TEST(Scheduler, RejectsImpossibleRequestsAtAdd) {
  Harness h(sched_config(2048, 64, 512), kv_config(17, 16, 0.0));  // 16 usable blocks = 256 tokens
  EXPECT_TRUE(h.add(1, iota_tokens(0, 10), 5).ok());
  Status dup = h.add(1, iota_tokens(0, 10), 5);
  EXPECT_FALSE(dup.ok());
  EXPECT_NE(dup.message().find("already in use"), std::string::npos);
  auto message = [&](RequestId id, Tokens prompt, int32_t max_tokens) {
    Status st = h.add(id, std::move(prompt), max_tokens);
    EXPECT_FALSE(st.ok()) << "request " << id;
    return st.message();
  };
  EXPECT_EQ(message(2, {}, 5), "the prompt is empty");
  EXPECT_EQ(message(3, iota_tokens(0, 10), 0), "max_tokens must be >= 1, got 0");
  EXPECT_EQ(message(4, iota_tokens(0, 500), 13), "prompt (500 tokens) + max_tokens (13) = 513 exceeds the context length 512");
  // 257 tokens: 17 blocks > 16.
  EXPECT_EQ(message(5, iota_tokens(0, 250), 7),
            "prompt (250 tokens) + max_tokens (7) = 257 tokens need 17 KV blocks of 16 tokens, but the whole cache "
            "admits 16");
  EXPECT_EQ(message(7, Tokens{1, kVocab, 2}, 5), "token id 500 is not in the vocabulary (size 500)");
  EXPECT_EQ(message(8, Tokens{1, -3}, 5), "token id -3 is not in the vocabulary (size 500)");
  EXPECT_TRUE(h.add(6, iota_tokens(0, 250), 6).ok());  // exactly the whole pool
  EXPECT_EQ(h.sched().stats().num_rejected, 7);
  EXPECT_EQ(h.sched().num_waiting(), 2);
  EXPECT_EQ(h.sched().waiting_ids(), (std::vector<RequestId>{1, 6}));
  h.run_to_completion(100);
  h.expect_all_done_and_pool_free();
}

TEST(Scheduler, WithoutAVocabularySizeOnlyNegativeIdsAreRejected) {
  SchedulerConfig sc = sched_config(2048, 8);
  sc.vocab_size = 0;
  kv::KvManager kv(kv_config(17, 16));
  Scheduler s(sc, &kv);
  NewRequest r;
  r.id = 1;
  r.prompt = {7, 1 << 30};
  EXPECT_TRUE(s.add_request(r).ok());
  r.id = 2;
  r.prompt = {-1};
  Status st = s.add_request(r);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "token id -1 is negative");
  EXPECT_EQ(s.num_waiting(), 1);
}

// One walk of the prefix cache per admission (KvStats::prefix_lookups): the
// match decides the hit, the dedup check and the chunk, and allocate consumes
// it. Three requests admitted in one step: three lookups.
TEST(Scheduler, EachAdmissionLooksUpTheCacheOnce) {
  Harness h(sched_config(2048, 8), kv_config(65, 16));
  const Tokens prompt = iota_tokens(1, 100);
  ASSERT_TRUE(h.add(1, prompt, 1).ok());
  h.run_to_completion(10);
  EXPECT_EQ(h.kv().stats().prefix_lookups, 1);
  ASSERT_TRUE(h.add(2, prompt, 2).ok());
  ASSERT_TRUE(h.add(3, concat(Tokens(prompt.begin(), prompt.begin() + 40), iota_tokens(400, 30)), 2).ok());
  ASSERT_TRUE(h.add(4, iota_tokens(300, 20), 2).ok());
  const StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.seqs[0].start_pos, 96);  // 6 blocks hit
  EXPECT_EQ(p.seqs[1].start_pos, 32);  // 2 blocks hit
  EXPECT_EQ(p.seqs[2].start_pos, 0);
  EXPECT_EQ(h.kv().stats().prefix_lookups, 1 + 3);
  EXPECT_EQ(h.sched().stats().num_admissions, 1 + 3);
  // Decode steps admit nothing and look nothing up.
  h.run_to_completion(10);
  EXPECT_EQ(h.kv().stats().prefix_lookups, 4);
  h.expect_all_done_and_pool_free();
}

TEST(Scheduler, ChunkedPrefillSplitsALongPrompt) {
  Harness h(sched_config(64, 8), kv_config(65, 16));
  const Tokens prompt = iota_tokens(1, 200);
  ASSERT_TRUE(h.add(1, prompt, 3).ok());
  for (int i = 0; i < 3; ++i) {
    StepPlan p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].start_pos, 64 * i);
    EXPECT_EQ(p.seqs[0].token_ids, Tokens(prompt.begin() + 64 * i, prompt.begin() + 64 * (i + 1)));
    EXPECT_FALSE(p.seqs[0].wants_logits);
    EXPECT_EQ(p.seqs[0].block_ids.size(), static_cast<size_t>(4 * (i + 1)));
  }
  StepPlan last = h.step();
  ASSERT_EQ(last.seqs.size(), 1u);
  EXPECT_EQ(last.seqs[0].start_pos, 192);
  EXPECT_EQ(last.seqs[0].token_ids.size(), 8u);
  EXPECT_TRUE(last.seqs[0].wants_logits);
  EXPECT_EQ(last.seqs[0].block_ids.size(), 13u);
  // Then decodes of one token each.
  StepPlan d = h.step();
  ASSERT_EQ(d.seqs.size(), 1u);
  EXPECT_EQ(d.seqs[0].start_pos, 200);
  EXPECT_EQ(d.seqs[0].token_ids.size(), 1u);
  EXPECT_TRUE(d.seqs[0].wants_logits);
  h.run_to_completion(10);
  ASSERT_EQ(h.finished().count(1), 1u);
  EXPECT_EQ(h.finished().at(1).reason, FinishReason::kLength);
  EXPECT_EQ(h.finished().at(1).output_tokens.size(), 3u);
  h.expect_all_done_and_pool_free();
}

// KV cache groups: a full group and a window-32 group, blocks of 16. Chunked
// prefill of a 200-token prompt frees the window group's blocks as it goes, so
// a pool of 20 usable blocks holds it (13 full + at most ceil((32 + 62) / 16) + 1
// = 7 window blocks); with two full groups the same pool refuses it at add (26).
TEST(Scheduler, WindowGroupFreesBlocksDuringChunkedPrefill) {
  kv::KvConfig kc = kv_config(21, 16, 0.0);
  kc.groups = {kv::KvGroupSpec{0}, kv::KvGroupSpec{32}};
  Harness h(sched_config(64, 8), kc);
  const Tokens prompt = iota_tokens(1, 200);
  ASSERT_TRUE(h.add(1, prompt, 3).ok());
  for (int i = 0; i < 6; ++i) {  // chunks of 64, 64, 64, 8, then 2 decodes
    StepPlan p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);
    const ScheduledSeq& q = p.seqs[0];
    ASSERT_EQ(q.group_block_ids.size(), 1u);
    const std::vector<BlockId>& w = q.group_block_ids[0];
    ASSERT_EQ(w.size(), q.block_ids.size());
    // Null exactly before the block of the step's first key, start - 31.
    const int32_t lo = std::max(0, q.start_pos - 31) / 16;
    int32_t live = 0;
    for (size_t j = 0; j < w.size(); ++j) {
      EXPECT_EQ(w[j] == kv::kNullBlock, static_cast<int32_t>(j) < lo) << "step " << i << " entry " << j;
      live += w[j] != kv::kNullBlock ? 1 : 0;
    }
    EXPECT_LE(live, 7) << "step " << i;
  }
  h.run_to_completion(10);
  ASSERT_EQ(h.finished().count(1), 1u);
  EXPECT_EQ(h.finished().at(1).output_tokens.size(), 3u);
  h.expect_all_done_and_pool_free();

  kv::KvConfig two_full = kv_config(21, 16, 0.0);
  two_full.groups = {kv::KvGroupSpec{0}, kv::KvGroupSpec{0}};
  Harness full(sched_config(64, 8), two_full);
  const Status st = full.add(1, prompt, 3);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("need 26 KV blocks"), std::string::npos) << st.message();
}

TEST(Scheduler, DecodesGoFirstThenPrefillChunks) {
  Harness h(sched_config(40, 8), kv_config(65, 16));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 20).ok());
  h.step();  // 1 prefills 10 tokens
  ASSERT_TRUE(h.add(2, iota_tokens(100, 100), 5).ok());
  StepPlan p = h.step();  // 1 decodes, 2 gets the remaining 39 tokens
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].request_id, 1u);
  EXPECT_EQ(p.seqs[0].token_ids.size(), 1u);
  EXPECT_EQ(p.seqs[1].request_id, 2u);
  EXPECT_EQ(p.seqs[1].token_ids.size(), 39u);
  p = h.step();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].request_id, 1u);
  EXPECT_EQ(p.seqs[1].start_pos, 39);
  EXPECT_EQ(p.seqs[1].token_ids.size(), 39u);
  h.run_to_completion(100);
  h.expect_all_done_and_pool_free();
}

TEST(Scheduler, PrefixHitComputesOnlyTheTail) {
  Harness h(sched_config(2048, 8), kv_config(65, 16));
  const Tokens prompt = iota_tokens(1, 100);
  ASSERT_TRUE(h.add(1, prompt, 2).ok());
  StepPlan a = h.step();
  ASSERT_EQ(a.seqs.size(), 1u);
  const std::vector<BlockId> a_blocks = a.seqs[0].block_ids;
  ASSERT_TRUE(h.add(2, prompt, 2).ok());
  StepPlan b = h.step();
  ASSERT_EQ(b.seqs.size(), 2u);
  const ScheduledSeq& s = b.seqs[1];
  EXPECT_EQ(s.request_id, 2u);
  EXPECT_EQ(s.start_pos, 96);  // 6 full blocks hit
  EXPECT_EQ(s.token_ids, Tokens(prompt.begin() + 96, prompt.end()));
  EXPECT_TRUE(s.wants_logits);
  EXPECT_EQ(std::vector<BlockId>(s.block_ids.begin(), s.block_ids.begin() + 6),
            std::vector<BlockId>(a_blocks.begin(), a_blocks.begin() + 6));
  h.run_to_completion(10);
  EXPECT_EQ(h.finished().at(2).num_cached_tokens, 96);
  EXPECT_EQ(h.runner().computed_tokens(2), 4 + 1);  // tail + one decode
  // A prompt of exactly 6 blocks still computes its last block (for logits).
  ASSERT_TRUE(h.add(3, Tokens(prompt.begin(), prompt.begin() + 96), 1).ok());
  StepPlan c = h.step();
  ASSERT_EQ(c.seqs.size(), 1u);
  EXPECT_EQ(c.seqs[0].start_pos, 80);
  EXPECT_EQ(c.seqs[0].token_ids.size(), 16u);
  h.run_to_completion(10);
  h.expect_all_done_and_pool_free();
  EXPECT_GT(h.kv().stats().prefix_hit_tokens, 0);
}

TEST(Scheduler, InFlightPrefixDedupWaitsInsteadOfComputingTwice) {
  const Tokens prompt = iota_tokens(1, 100);
  const Tokens other = iota_tokens(300, 20);
  for (bool dedup : {true, false}) {
    SchedulerConfig sc = sched_config(2048, 8);
    sc.max_dedup_defer_steps = dedup ? 16 : 0;
    Harness h(sc, kv_config(65, 16));
    ASSERT_TRUE(h.add(1, prompt, 3).ok());
    ASSERT_TRUE(h.add(2, prompt, 3).ok());
    ASSERT_TRUE(h.add(3, other, 3).ok());
    StepPlan p = h.step();
    if (dedup) {
      ASSERT_EQ(p.seqs.size(), 2u);  // 2 waits for 1's blocks, 3 passes it
      EXPECT_EQ(p.seqs[0].request_id, 1u);
      EXPECT_EQ(p.seqs[1].request_id, 3u);
      EXPECT_EQ(p.deferred, (std::vector<RequestId>{2}));
      p = h.step();
      ASSERT_EQ(p.seqs.size(), 3u);
      EXPECT_EQ(p.seqs[2].request_id, 2u);
      EXPECT_EQ(p.seqs[2].start_pos, 96);
      h.run_to_completion(20);
      EXPECT_EQ(h.runner().computed_tokens(2), 4 + 2);
      EXPECT_EQ(h.finished().at(2).num_cached_tokens, 96);
      EXPECT_EQ(h.sched().stats().num_deferrals, 1);
    } else {
      ASSERT_EQ(p.seqs.size(), 3u);
      EXPECT_TRUE(p.deferred.empty());
      h.run_to_completion(20);
      EXPECT_EQ(h.runner().computed_tokens(2), 100 + 2);
    }
    h.expect_all_done_and_pool_free();
  }
}

TEST(Scheduler, PreemptsTheMostRecentlyAdmittedToTheFront) {
  // 5 usable blocks of 4 tokens. A and B hold 2 blocks each after prefill; at
  // their 9th token both need a third block; A (older) gets the last one, B
  // is preempted to the front of the queue, ahead of C.
  Harness h(sched_config(2048, 8), kv_config(6, 4, 0.0));
  ASSERT_TRUE(h.add(1, iota_tokens(10, 7), 10).ok());
  ASSERT_TRUE(h.add(2, iota_tokens(20, 7), 10).ok());
  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 2u);
  ASSERT_TRUE(h.add(3, iota_tokens(30, 3), 2).ok());
  p = h.step();  // both decode position 7 (still in their 2nd block); C takes the 5th block
  ASSERT_EQ(p.seqs.size(), 3u);
  p = h.step();
  // C (admitted last step) goes first, then B preempts itself: no older victim.
  EXPECT_EQ(p.preempted, (std::vector<RequestId>{3, 2}));
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].request_id, 1u);
  EXPECT_EQ(h.sched().find(2)->state, RequestState::kPreempted);
  EXPECT_EQ(h.sched().waiting_ids(), (std::vector<RequestId>{2, 3}));  // older admission in front
  EXPECT_EQ(h.sched().find(2)->num_preemptions, 1);
  h.run_to_completion(200);
  EXPECT_EQ(h.finished().at(2).num_preemptions, 1);
  h.expect_all_done_and_pool_free();
}

TEST(Scheduler, AbortFreesEverythingInAnyState) {
  Harness h(sched_config(32, 8), kv_config(65, 16));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 100), 50).ok());
  ASSERT_TRUE(h.add(2, iota_tokens(200, 10), 50).ok());
  h.step();  // 1 prefilling, 2 waiting (budget)
  EXPECT_EQ(h.sched().find(1)->state, RequestState::kRunning);
  EXPECT_EQ(h.sched().find(2)->state, RequestState::kWaiting);
  EXPECT_TRUE(h.abort(2));
  EXPECT_TRUE(h.abort(1));
  EXPECT_FALSE(h.abort(1));
  EXPECT_FALSE(h.sched().has_unfinished());
  EXPECT_EQ(h.sched().check_invariants(), "");
  // Abort between schedule and update: update skips it.
  ASSERT_TRUE(h.add(3, iota_tokens(1, 20), 5).ok());
  StepPlan p = h.sched().schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  auto outs = h.runner().execute(p);
  EXPECT_TRUE(h.abort(3));
  EXPECT_TRUE(h.sched().update(p, outs).empty());
  EXPECT_EQ(h.sched().check_invariants(), "");
  h.expect_all_done_and_pool_free();
  EXPECT_EQ(h.kv().stats().num_cached, 2);  // request 1's 32 computed tokens; 3 never got its update
}

TEST(Scheduler, EngineStopFlagFinishesWithStop) {
  Harness h(sched_config(2048, 8), kv_config(65, 16));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 5), 100, /*eos_len=*/4).ok());
  h.run_to_completion(10);
  EXPECT_EQ(h.finished().at(1).reason, FinishReason::kStop);
  EXPECT_EQ(h.finished().at(1).output_tokens.size(), 4u);
  h.expect_all_done_and_pool_free();
}

// The scheduler decides no finish (issue 34): it ends a request exactly when
// the output says so, with the output's reason (also before max_tokens), never
// appends a token of -1, and stops the process when an output leaves a request
// at max_tokens without a finish (the caller broke the contract).
TEST(Scheduler, EndsARequestOnlyWithTheReasonItIsGiven) {
  kv::KvManager kv(kv_config(17, 4, 0.0));
  Scheduler s(sched_config(64, 8), &kv);
  NewRequest r;
  r.max_tokens = 3;
  for (RequestId id : {1, 2}) {  // different prompts: no in-flight dedup
    r.id = id;
    r.prompt = iota_tokens(static_cast<TokenId>(100 * id), 6);
    ASSERT_TRUE(s.add_request(r).ok());
  }
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 2u);
  const SeqOutput first[] = {{1, 100}, {2, 200, FinishReason::kLength}};  // 2: length after 1 of 3 outputs
  std::vector<FinishedRequest> done = s.update(p, first);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 2u);
  EXPECT_EQ(done[0].reason, FinishReason::kLength);
  EXPECT_EQ(done[0].output_tokens, Tokens{200});
  EXPECT_EQ(s.check_invariants(), "");
  p = s.schedule();
  SeqOutput o{1, 101};
  EXPECT_TRUE(s.update(p, std::span<const SeqOutput>(&o, 1)).empty());
  EXPECT_EQ(s.find(1)->tokens, concat(iota_tokens(100, 6), Tokens{100, 101}));
  p = s.schedule();
  o = SeqOutput{1, -1, FinishReason::kError};  // no token: the engine failed it
  done = s.update(p, std::span<const SeqOutput>(&o, 1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].reason, FinishReason::kError);
  EXPECT_EQ(done[0].output_tokens, (Tokens{100, 101}));
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_EQ(s.check_invariants(), "");
  // max_tokens = 1 and an output that says go on: a broken caller, stopped.
  r.id = 3;
  r.max_tokens = 1;
  ASSERT_TRUE(s.add_request(r).ok());
  p = s.schedule();
  o = SeqOutput{3, 300};
  EXPECT_DEATH(s.update(p, std::span<const SeqOutput>(&o, 1)), "1 outputs of max_tokens 1");
}

TEST(Scheduler, ExhaustionPreemptsAndOutputsAreUnaffected) {
  // 64 usable blocks x 16 tokens; 100 requests of 200-500 total tokens.
  Harness h(sched_config(2048, 64, 512), kv_config(65, 16, 0.0));
  Rng rng(7);
  for (RequestId id = 1; id <= 100; ++id) {
    const auto total = static_cast<int32_t>(rng.uniform_int(200, 500));
    const auto prompt_len = static_cast<int32_t>(rng.uniform_int(100, 300));
    Tokens prompt(static_cast<size_t>(prompt_len));
    for (auto& t : prompt) t = static_cast<TokenId>(rng.uniform_int(0, kVocab - 1));
    ASSERT_TRUE(h.add(id, prompt, std::max(1, total - prompt_len)).ok());
  }
  h.run_to_completion(20000);
  EXPECT_EQ(h.finished().size(), 100u);
  EXPECT_GT(h.sched().stats().num_preemptions, 0);
  std::printf("exhaustion: %lld steps, %lld preemptions, %lld admissions\n",
              static_cast<long long>(h.sched().stats().num_steps),
              static_cast<long long>(h.sched().stats().num_preemptions),
              static_cast<long long>(h.sched().stats().num_admissions));
  h.expect_all_done_and_pool_free();
}

void random_soak(SchedulePolicy policy) {
  SchedulerConfig sc = sched_config(256, 16, 512);
  sc.max_dedup_defer_steps = 6;
  sc.policy = policy;
  sc.max_lpm_overtake_steps = 8;
  Harness h(sc, kv_config(129, 16));  // 128 usable blocks = 2048 tokens
  Rng rng(2024);
  SoakPrompts prompts(rng);
  RequestId next = 1;
  std::vector<RequestId> live;
  int rejected = 0;
  constexpr int kSteps = 10000;
  for (int step = 0; step < kSteps; ++step) {
    // Near but under capacity.
    for (int a = 0, arrivals = prompts.arrivals(); a < arrivals; ++a) {
      const SoakArrival r = prompts.arrival(200);
      const std::string salt = rng.uniform() < 0.1 ? "tenant-x" : "";
      const RequestId id = next++;
      if (h.add(id, r.prompt, r.max_tokens, r.eos, salt).ok()) {
        live.push_back(id);
      } else {
        ++rejected;  // prompt + max_tokens > 512
      }
    }
    std::erase_if(live, [&](RequestId id) { return h.sched().find(id) == nullptr; });
    RequestId abort_mid = 0;
    if (!live.empty() && rng.uniform() < 0.03) {
      const auto i = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(live.size()) - 1));
      if (rng.uniform() < 0.5) {
        EXPECT_TRUE(h.abort(live[i]));
      } else {
        abort_mid = live[i];  // possibly scheduled in this very step
      }
    }
    h.step(abort_mid);
    if (h.soak_failed(step)) return;
  }
  const auto [st, ks] = h.drain_soak("random");
  std::printf("random: %llu requests (%d rejected), %lld deferrals (max %lld steps)\n",
              static_cast<unsigned long long>(next - 1), rejected, static_cast<long long>(st.num_deferrals),
              static_cast<long long>(h.max_deferred_steps));
  EXPECT_GE(st.num_steps, kSteps);
  EXPECT_GT(st.num_preemptions, 0);
  EXPECT_GT(st.num_deferrals, 0);
  EXPECT_GT(ks.prefix_hit_tokens, 0);
  EXPECT_GT(st.num_aborted, 100);
  EXPECT_GT(h.finished().size(), 1000u);
  if (policy == SchedulePolicy::kLpm) {
    std::printf("lpm: max overtaken steps %lld\n", static_cast<long long>(h.max_overtaken_steps));
    EXPECT_GT(h.max_overtaken_steps, 0);  // the policy did reorder
  }
}

TEST(Scheduler, RandomTenThousandSteps) { random_soak(SchedulePolicy::kFcfs); }

TEST(Scheduler, RandomTenThousandStepsLongestPrefixFirst) { random_soak(SchedulePolicy::kLpm); }

}  // namespace
}  // namespace pagoda::sched
