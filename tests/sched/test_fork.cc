// n > 1 sampling through KvManager::fork, model-free (fake runner): the prompt
// is computed once, the request forks at the end of its prompt into children
// that share every block (the partial last one included), the first decode
// write copies the shared partial block (exact copies in the plan), and
// preemption, aborts and admission keep every invariant. Ends with a random
// soak mixing n = 1 and groups of 2..4.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <vector>

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
using Blocks = std::vector<BlockId>;
using Copies = std::vector<std::pair<BlockId, BlockId>>;

Blocks table(Harness& h, RequestId id) {
  const auto t = h.kv().block_table(id);
  return {t.begin(), t.end()};
}

std::vector<int32_t> refs(Harness& h, const Blocks& blocks) {
  std::vector<int32_t> out;
  for (BlockId b : blocks) out.push_back(h.kv().pool().ref_count(b));
  return out;
}

TEST(SchedulerFork, ForkSharesAllPromptBlocksAndCopiesThePartialOneOnFirstWrite) {
  // Blocks of 4 tokens; a 10-token prompt: 2 full blocks and a partial one (2 tokens).
  Harness h(sched_config(2048, 8), kv_config(33, 4, 0.0));
  const Tokens prompt = iota_tokens(1, 10);
  ASSERT_TRUE(h.add(1, prompt, 6, INT_MAX, "", {2, 3}).ok());
  EXPECT_EQ(h.sched().find(2), nullptr);  // a child exists only from its fork on

  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].request_id, 1u);
  EXPECT_EQ(p.seqs[0].token_ids, prompt);
  EXPECT_TRUE(p.seqs[0].wants_logits);
  EXPECT_EQ(p.seqs[0].fork_ids, (std::vector<RequestId>{2, 3}));
  EXPECT_EQ(p.seqs[0].block_ids, (Blocks{1, 2, 3}));
  EXPECT_TRUE(p.block_copies.empty());
  // After the step: three sequences on the same three blocks, each at ref count 3.
  EXPECT_EQ(h.sched().running_ids(), (std::vector<RequestId>{1, 2, 3}));
  for (RequestId id : {1, 2, 3}) {
    EXPECT_EQ(table(h, id), (Blocks{1, 2, 3})) << "request " << id;
    EXPECT_EQ(h.kv().num_computed_tokens(id), 10);
    const Request* r = h.sched().find(id);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->num_output_tokens(), 1);
    EXPECT_EQ(r->tokens.back(), h.expected(id)[0]) << "first token of choice " << id;
    EXPECT_EQ(r->forked_from, id == 1 ? 0u : 1u);
  }
  EXPECT_EQ(refs(h, {1, 2, 3}), (std::vector<int32_t>{3, 3, 3}));
  EXPECT_EQ(h.kv().stats().num_used, 3);
  EXPECT_EQ(h.sched().stats().num_forks, 2);
  EXPECT_EQ(h.sched().stats().num_admissions, 1);

  // First decode: positions 10. The parent and the first child copy the shared
  // partial block (3) to fresh blocks 4 and 5 before the forward pass; the last
  // writer holds it alone and writes in place. Full blocks stay shared.
  p = h.step();
  ASSERT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.block_copies, (Copies{{3, 4}, {3, 5}}));
  EXPECT_EQ(p.seqs[0].block_ids, (Blocks{1, 2, 4}));
  EXPECT_EQ(p.seqs[1].block_ids, (Blocks{1, 2, 5}));
  EXPECT_EQ(p.seqs[2].block_ids, (Blocks{1, 2, 3}));
  for (const ScheduledSeq& s : p.seqs) {
    EXPECT_EQ(s.start_pos, 10);
    EXPECT_EQ(s.token_ids.size(), 1u);
    EXPECT_TRUE(s.fork_ids.empty());
  }
  EXPECT_EQ(refs(h, {1, 2, 3, 4, 5}), (std::vector<int32_t>{3, 3, 1, 1, 1}));
  EXPECT_EQ(h.kv().stats().num_cow_copies, 2);

  // Position 11 fills the copies; position 12 opens one new block each: no more copies.
  p = h.step();
  EXPECT_TRUE(p.block_copies.empty());
  p = h.step();
  EXPECT_TRUE(p.block_copies.empty());
  EXPECT_EQ(p.seqs[0].block_ids, (Blocks{1, 2, 4, 6}));
  EXPECT_EQ(p.seqs[1].block_ids, (Blocks{1, 2, 5, 7}));
  EXPECT_EQ(p.seqs[2].block_ids, (Blocks{1, 2, 3, 8}));

  h.run_to_completion(20);
  h.expect_all_done_and_pool_free();
  for (RequestId id : {1, 2, 3}) {
    ASSERT_EQ(h.finished().count(id), 1u);
    EXPECT_EQ(h.finished().at(id).output_tokens.size(), 6u);
  }
  EXPECT_NE(h.expected(1), h.expected(2));  // each choice samples its own tokens
  // The prompt was computed once: 10 prompt tokens + 5 decodes for each of 3 choices.
  EXPECT_EQ(h.scheduled_tokens(), 10 + 3 * 5);
  EXPECT_EQ(h.runner().computed_tokens(1), 10 + 5);
  EXPECT_EQ(h.runner().computed_tokens(2), 5);
  EXPECT_EQ(h.runner().computed_tokens(3), 5);
}

TEST(SchedulerFork, PromptOfWholeBlocksForksWithoutCopies) {
  Harness h(sched_config(2048, 8), kv_config(33, 4, 0.0));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 8), 3, INT_MAX, "", {7}).ok());
  StepPlan p = h.step();
  EXPECT_EQ(p.seqs[0].block_ids, (Blocks{1, 2}));
  EXPECT_EQ(refs(h, {1, 2}), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(h.kv().num_committed_blocks(7), 2);  // the child inherits the committed keys
  p = h.step();  // position 8 starts a new block for each: nothing shared is written
  EXPECT_TRUE(p.block_copies.empty());
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].block_ids, (Blocks{1, 2, 3}));
  EXPECT_EQ(p.seqs[1].block_ids, (Blocks{1, 2, 4}));
  h.run_to_completion(10);
  h.expect_all_done_and_pool_free();
  EXPECT_EQ(h.kv().stats().num_cow_copies, 0);
}

TEST(SchedulerFork, ChunkedPromptForksOnlyOnItsLastChunk) {
  Harness h(sched_config(4, 8), kv_config(33, 4, 0.0));
  const Tokens prompt = iota_tokens(1, 10);
  ASSERT_TRUE(h.add(1, prompt, 2, INT_MAX, "", {2}).ok());
  for (int i = 0; i < 2; ++i) {
    StepPlan p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].token_ids.size(), 4u);
    EXPECT_FALSE(p.seqs[0].wants_logits);
    EXPECT_TRUE(p.seqs[0].fork_ids.empty());
    EXPECT_EQ(h.sched().find(2), nullptr);
  }
  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start_pos, 8);
  EXPECT_EQ(p.seqs[0].fork_ids, (std::vector<RequestId>{2}));
  ASSERT_NE(h.sched().find(2), nullptr);
  h.run_to_completion(10);
  h.expect_all_done_and_pool_free();
  EXPECT_EQ(h.scheduled_tokens(), 10 + 2);
}

TEST(SchedulerFork, OneTokenChoicesFinishAtTheFork) {
  Harness h(sched_config(2048, 8), kv_config(33, 4, 0.0));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 6), 1, INT_MAX, "", {2, 3}).ok());
  h.step();
  EXPECT_FALSE(h.sched().has_unfinished());
  EXPECT_EQ(h.finished().size(), 3u);
  for (RequestId id : {1, 2, 3}) EXPECT_EQ(h.finished().at(id).reason, FinishReason::kLength);
  h.expect_all_done_and_pool_free();
}

TEST(SchedulerFork, ChildrenStopOnTheirOwn) {
  Harness h(sched_config(2048, 8), kv_config(33, 4, 0.0));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 6), 10, INT_MAX, "", {2, 3}).ok());
  h.set_eos(2, 1);  // stops at its first token, from the fork step
  h.set_eos(3, 4);
  h.step();
  ASSERT_EQ(h.finished().count(2), 1u);
  EXPECT_EQ(h.finished().at(2).reason, FinishReason::kStop);
  EXPECT_EQ(h.sched().running_ids(), (std::vector<RequestId>{1, 3}));
  h.run_to_completion(20);
  EXPECT_EQ(h.finished().at(3).output_tokens.size(), 4u);
  EXPECT_EQ(h.finished().at(1).output_tokens.size(), 10u);
  h.expect_all_done_and_pool_free();
}

TEST(SchedulerFork, PreemptedChildRecomputesPromptAndItsOutputs) {
  // 6 usable blocks of 4 tokens. Prompt 10 (3 blocks) with n = 3: admission
  // needs 3 + 2 = 5 blocks. After the copies the group holds 5; at position 12
  // each needs a 4th block: the parent gets the last free one, the next child
  // preempts the youngest child, whose partial block it then takes.
  Harness h(sched_config(2048, 8), kv_config(7, 4, 0.0));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 6, INT_MAX, "", {2, 3}).ok());
  h.step();  // prompt + fork
  StepPlan p = h.step();  // position 10: copies
  EXPECT_EQ(p.block_copies, (Copies{{3, 4}, {3, 5}}));
  h.step();      // position 11
  p = h.step();  // position 12
  EXPECT_EQ(p.preempted, (std::vector<RequestId>{3}));
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].block_ids, (Blocks{1, 2, 4, 6}));
  EXPECT_EQ(p.seqs[1].block_ids, (Blocks{1, 2, 5, 3}));
  const Request* r3 = h.sched().find(3);
  ASSERT_NE(r3, nullptr);
  EXPECT_EQ(r3->state, RequestState::kPreempted);
  EXPECT_EQ(r3->num_output_tokens(), 3);  // the 3rd (position 12) not computed yet
  EXPECT_EQ(h.sched().waiting_ids(), (std::vector<RequestId>{3}));
  h.run_to_completion(100);
  h.expect_all_done_and_pool_free();  // child 3's outputs equal those of an unpreempted run
  EXPECT_EQ(h.finished().at(3).num_preemptions, 1);
  EXPECT_EQ(h.finished().at(1).num_preemptions, 0);
  // Child 3: 2 decodes before the preemption; after a 2-block prefix hit, tokens
  // 8..12 (the partial prompt block + its outputs but the last); then 2 decodes.
  EXPECT_EQ(h.runner().computed_tokens(3), 2 + 5 + 2);
}

TEST(SchedulerFork, ParentPreemptedBeforeItsForkForksAfterReadmission) {
  // Request 9 (older) decodes while the group 1{2} prefills 2 tokens a step;
  // the pool (8 blocks) runs out before the group's 24-token prompt is done,
  // and the group's parent, the youngest, is preempted mid-prompt.
  Harness h(sched_config(3, 8), kv_config(9, 4, 0.0));
  ASSERT_TRUE(h.add(9, iota_tokens(100, 4), 20).ok());
  ASSERT_TRUE(h.add(1, iota_tokens(1, 24), 3, INT_MAX, "", {2}).ok());
  int steps = 0;
  bool preempted = false;
  while (h.sched().has_unfinished() && steps++ < 200 && !::testing::Test::HasFailure()) {
    StepPlan p = h.step();
    for (RequestId id : p.preempted) {
      if (id != 1) continue;
      preempted = true;
      const Request* r = h.sched().find(1);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(r->fork_ids, (std::vector<RequestId>{2}));  // still to fork
      EXPECT_EQ(h.sched().find(2), nullptr);
    }
  }
  EXPECT_TRUE(preempted);
  EXPECT_EQ(h.sched().stats().num_forks, 1);
  h.expect_all_done_and_pool_free();
  EXPECT_EQ(h.finished().at(2).output_tokens, h.expected(2));
}

TEST(SchedulerFork, AbortTheWholeGroupInEveryState) {
  Harness h(sched_config(4, 8), kv_config(33, 4, 0.0));
  // Waiting: the pending children go with the parent.
  ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 5, INT_MAX, "", {2, 3}).ok());
  EXPECT_TRUE(h.abort_group({1, 2, 3}));
  EXPECT_FALSE(h.sched().has_unfinished());
  EXPECT_FALSE(h.sched().abort(2));  // gone with its parent
  EXPECT_EQ(h.sched().check_invariants(), "");
  // The ids are free again.
  ASSERT_TRUE(h.add(11, iota_tokens(1, 10), 5, INT_MAX, "", {12, 13}).ok());
  h.step();  // mid-prompt (budget 4)
  EXPECT_TRUE(h.abort_group({11, 12, 13}));
  EXPECT_EQ(h.kv().num_seqs(), 0);
  EXPECT_EQ(h.sched().check_invariants(), "");
  // Forked, mid-generation.
  ASSERT_TRUE(h.add(21, iota_tokens(1, 10), 20, INT_MAX, "", {22, 23}).ok());
  for (int i = 0; i < 6; ++i) h.step();
  ASSERT_NE(h.sched().find(23), nullptr);
  EXPECT_EQ(h.kv().num_seqs(), 3);
  EXPECT_TRUE(h.abort_group({21, 22, 23}));
  EXPECT_FALSE(h.sched().has_unfinished());
  EXPECT_EQ(h.sched().check_invariants(), "");
  // Between schedule and update of the fork step: the children are never created.
  ASSERT_TRUE(h.add(31, iota_tokens(50, 3), 20, INT_MAX, "", {32, 33}).ok());
  StepPlan p = h.step(std::vector<RequestId>{31, 32, 33});
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].fork_ids, (std::vector<RequestId>{32, 33}));
  EXPECT_EQ(h.sched().find(32), nullptr);
  EXPECT_FALSE(h.sched().has_unfinished());
  h.expect_all_done_and_pool_free();
  EXPECT_EQ(h.sched().stats().num_forks, 2);
}

TEST(SchedulerFork, AbortOneChoice) {
  Harness h(sched_config(2048, 8), kv_config(33, 4, 0.0));
  // A pending child aborted before the fork: the fork creates the others only.
  ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 5, INT_MAX, "", {2, 3}).ok());
  EXPECT_TRUE(h.abort(3));
  StepPlan p = h.step();
  EXPECT_EQ(p.seqs[0].fork_ids, (std::vector<RequestId>{2}));
  EXPECT_EQ(refs(h, {1, 2, 3}), (std::vector<int32_t>{2, 2, 2}));
  // A pending child aborted between schedule and update of the fork step.
  ASSERT_TRUE(h.add(11, iota_tokens(200, 5), 5, INT_MAX, "", {12, 13}).ok());
  p = h.step(13);
  EXPECT_EQ(p.seqs.back().fork_ids, (std::vector<RequestId>{12, 13}));
  EXPECT_NE(h.sched().find(12), nullptr);
  EXPECT_EQ(h.sched().find(13), nullptr);
  // A forked child aborted: the others go on.
  EXPECT_TRUE(h.abort(2));
  h.run_to_completion(20);
  h.expect_all_done_and_pool_free();
  EXPECT_EQ(h.finished().count(1), 1u);
  EXPECT_EQ(h.finished().count(12), 1u);
}

TEST(SchedulerFork, AdmissionCountsTheGroup) {
  // Seats: a group of 3 needs 3 of max_num_seqs 3 and waits for request 9.
  {
    Harness h(sched_config(2048, 3), kv_config(33, 4, 0.0));
    Status too_many = h.add(5, iota_tokens(1, 4), 2, INT_MAX, "", {6, 7, 8});
    EXPECT_FALSE(too_many.ok());
    EXPECT_NE(too_many.message().find("max_num_seqs 3"), std::string::npos) << too_many.message();
    ASSERT_TRUE(h.add(9, iota_tokens(1, 3), 2).ok());
    ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 2, INT_MAX, "", {2, 3}).ok());
    StepPlan p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);  // 9 only: 1 + 3 seats > 3
    EXPECT_EQ(h.sched().waiting_ids(), (std::vector<RequestId>{1}));
    h.step();  // 9 finishes
    p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].request_id, 1u);
    h.run_to_completion(10);
    h.expect_all_done_and_pool_free();
  }
  // Blocks: 6 usable; the group (3 prompt blocks + 2 children) needs 5 free,
  // so it waits while request 9 holds 2.
  {
    Harness h(sched_config(2048, 8), kv_config(7, 4, 0.0));
    Status too_big = h.add(5, iota_tokens(1, 17), 2, INT_MAX, "", {6, 7});  // 5 blocks + 2 children > 6
    EXPECT_FALSE(too_big.ok());
    EXPECT_NE(too_big.message().find("at its fork"), std::string::npos) << too_big.message();
    ASSERT_TRUE(h.add(9, iota_tokens(100, 5), 3).ok());  // no prefix shared with the group
    ASSERT_TRUE(h.add(1, iota_tokens(1, 10), 2, INT_MAX, "", {2, 3}).ok());
    StepPlan p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(h.kv().num_free_blocks(), 4);
    h.step();
    p = h.step();  // 9 finishes here
    ASSERT_EQ(p.seqs.size(), 1u);
    p = h.step();
    ASSERT_EQ(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].request_id, 1u);
    h.run_to_completion(10);
    h.expect_all_done_and_pool_free();
  }
}

TEST(SchedulerFork, RejectsBadChoiceIds) {
  Harness h(sched_config(2048, 8), kv_config(33, 4, 0.0));
  ASSERT_TRUE(h.add(1, iota_tokens(1, 5), 2, INT_MAX, "", {2}).ok());
  EXPECT_FALSE(h.add(2, iota_tokens(1, 5), 2).ok());                      // a pending child's id
  EXPECT_FALSE(h.add(3, iota_tokens(1, 5), 2, INT_MAX, "", {2}).ok());    // taken as a child
  EXPECT_FALSE(h.add(4, iota_tokens(1, 5), 2, INT_MAX, "", {4}).ok());    // itself
  EXPECT_FALSE(h.add(5, iota_tokens(1, 5), 2, INT_MAX, "", {6, 6}).ok()); // twice
  EXPECT_FALSE(h.add(7, iota_tokens(1, 5), 2, INT_MAX, "", {1}).ok());    // a request
  EXPECT_EQ(h.sched().stats().num_rejected, 5);
  EXPECT_EQ(h.sched().check_invariants(), "");
  h.run_to_completion(10);
  h.expect_all_done_and_pool_free();
}

TEST(SchedulerFork, RandomSoakWithGroups) {
  // A budget of 64: prefills span steps, so decode growth (which admission
  // does not reserve) can preempt a parent before its fork.
  SchedulerConfig sc = sched_config(64, 16, 512);
  sc.max_dedup_defer_steps = 6;
  Harness h(sc, kv_config(97, 16));  // 96 usable blocks = 1536 tokens
  Rng rng(4242);
  SoakPrompts prompts(rng);
  RequestId next = 1;
  std::vector<std::vector<RequestId>> live;  // groups: parent first
  int groups = 0, parents_preempted = 0, children_preempted = 0;
  constexpr int kSteps = 10000;
  auto alive = [&](const std::vector<RequestId>& g) {
    return std::any_of(g.begin(), g.end(), [&](RequestId id) { return h.sched().find(id) != nullptr; });
  };
  for (int step = 0; step < kSteps; ++step) {
    for (int a = 0, arrivals = prompts.arrivals(); a < arrivals; ++a) {
      const SoakArrival r = prompts.arrival(160);
      const int n = rng.uniform() < 0.3 ? static_cast<int>(rng.uniform_int(2, 4)) : 1;
      std::vector<RequestId> group;
      for (int i = 0; i < n; ++i) group.push_back(next++);
      const std::vector<RequestId> children(group.begin() + 1, group.end());
      if (h.add(group[0], r.prompt, r.max_tokens, r.eos, rng.uniform() < 0.1 ? "tenant-x" : "", children).ok()) {
        for (RequestId c : children) h.set_eos(c, static_cast<int32_t>(rng.uniform_int(1, 80)));
        live.push_back(group);
        groups += n > 1;
      }
    }
    std::erase_if(live, [&](const std::vector<RequestId>& g) { return !alive(g); });
    std::vector<RequestId> abort_mid;
    if (!live.empty() && rng.uniform() < 0.03) {
      const auto& g = live[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(live.size()) - 1))];
      const double u = rng.uniform();
      if (u < 0.3) {
        EXPECT_TRUE(h.abort_group(g));
      } else if (u < 0.6) {
        abort_mid = g;  // possibly scheduled in this very step
      } else {
        h.abort(g[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(g.size()) - 1))]);  // one choice
      }
    }
    StepPlan p = h.step(abort_mid);
    for (RequestId id : p.preempted) {
      const Request* r = h.sched().find(id);
      if (r == nullptr) continue;
      parents_preempted += !r->fork_ids.empty();
      children_preempted += r->forked_from != 0;
    }
    if (h.soak_failed(step)) return;
  }
  const auto [st, ks] = h.drain_soak("fork soak");
  std::printf("fork soak: %llu ids, %d groups, %lld forks, %d parents preempted before their fork, %d children, "
              "%lld cow copies\n",
              static_cast<unsigned long long>(next - 1), groups, static_cast<long long>(st.num_forks), parents_preempted,
              children_preempted, static_cast<long long>(ks.num_cow_copies));
  EXPECT_GE(st.num_steps, kSteps);
  EXPECT_GT(groups, 100);
  EXPECT_GT(st.num_forks, 200);
  EXPECT_GT(ks.num_cow_copies, 100);
  EXPECT_GT(parents_preempted, 0);
  EXPECT_GT(children_preempted, 0);
  EXPECT_GT(st.num_aborted, 50);
  EXPECT_GT(h.finished().size(), 500u);
}

}  // namespace
}  // namespace pagoda::sched
