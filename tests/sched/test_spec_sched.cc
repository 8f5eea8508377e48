// Speculative decoding in the scheduler and the KvManager: a decode with a
// draft carries [last token, drafts...] within the token budget and its slots;
// update() keeps the verified prefix and rolls the rest back
// (KvManager::truncate), so rejected tokens are never computed or committed
// to the prefix cache; drafts are capped by max_tokens and never preempt.
#include <gtest/gtest.h>

#include "harness.h"
#include "kv/test_util.h"

namespace pagoda::sched {
namespace {

using testing::iota_tokens;
using testing::kv_config;
using testing::sched_config;
using testing::Tokens;

// Prompt [0..n): one prefill step, then the request decodes.
struct Fixture {
  kv::KvManager kv;
  Scheduler s;
  Fixture(int32_t budget, int32_t blocks, int32_t bs = 4) : kv(kv_config(blocks, bs, 0.0)), s(sched_config(budget, 8), &kv) {}
  void prefill(RequestId id, int n, int32_t first_token, int32_t max_tokens = 20) {
    NewRequest r;
    r.id = id;
    r.prompt = iota_tokens(0, n);
    r.max_tokens = max_tokens;
    ASSERT_TRUE(s.add_request(r).ok());
    StepPlan p = s.schedule();
    ASSERT_EQ(p.seqs.size(), 1u);
    SeqOutput o{id, first_token};
    s.update(p, std::span<const SeqOutput>(&o, 1));
  }
};

TEST(SpecSched, DraftTokensFollowTheDecodeAndRejectedSlotsRollBack) {
  Fixture f(64, 17);            // 16 usable blocks of 4 tokens
  f.prefill(1, 6, 100);         // tokens [0..6) + 100; 6 computed (2 blocks)
  ASSERT_TRUE(f.s.set_draft(1, Tokens{101, 102, 103, 104, 105}));
  StepPlan p = f.s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  const ScheduledSeq& q = p.seqs[0];
  EXPECT_EQ(q.start_pos, 6);
  EXPECT_EQ(q.token_ids, (Tokens{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(q.num_draft_tokens, 5);
  EXPECT_TRUE(q.wants_logits);
  EXPECT_EQ(q.block_ids.size(), 3u);  // positions 0..11
  EXPECT_EQ(f.kv.num_slots(1), 12);
  // Two drafts verified, then a correction token 7.
  SeqOutput o{1, 7};
  o.accepted = {101, 102};
  EXPECT_TRUE(f.s.update(p, std::span<const SeqOutput>(&o, 1)).empty());
  EXPECT_EQ(f.s.find(1)->tokens, (Tokens{0, 1, 2, 3, 4, 5, 100, 101, 102, 7}));
  EXPECT_EQ(f.kv.num_computed_tokens(1), 9);
  EXPECT_EQ(f.kv.block_table(1).size(), 3u);  // 9 tokens: 3 blocks (the third partial)
  EXPECT_EQ(f.kv.num_committed_blocks(1), 2);
  EXPECT_EQ(f.s.check_invariants(), "");
  // Nothing accepted: the draft's block past the computed ones goes back.
  ASSERT_TRUE(f.s.set_draft(1, Tokens{50, 51, 52, 53}));
  p = f.s.schedule();
  ASSERT_EQ(p.seqs[0].token_ids, (Tokens{7, 50, 51, 52, 53}));
  EXPECT_EQ(f.kv.block_table(1).size(), 4u);  // positions 9..13
  const int32_t free_before = f.kv.num_free_blocks();
  o = SeqOutput{1, 8};
  f.s.update(p, std::span<const SeqOutput>(&o, 1));
  EXPECT_EQ(f.kv.num_computed_tokens(1), 10);
  EXPECT_EQ(f.kv.block_table(1).size(), 3u);
  EXPECT_EQ(f.kv.num_free_blocks(), free_before + 1);
  EXPECT_EQ(f.s.check_invariants(), "");
}

TEST(SpecSched, OnlyVerifiedTokensReachThePrefixCache) {
  Fixture f(64, 33);
  f.prefill(1, 3, 3);  // tokens 0,1,2,3 (3 computed)
  // Drafts fill blocks 1 and 2; only one is accepted.
  ASSERT_TRUE(f.s.set_draft(1, Tokens{4, 5, 6, 7, 8, 9}));
  StepPlan p = f.s.schedule();
  ASSERT_EQ(p.seqs[0].num_draft_tokens, 6);
  SeqOutput o{1, 99};
  o.accepted = {4};
  f.s.update(p, std::span<const SeqOutput>(&o, 1));
  // 5 computed: block 0 committed; block 1 holds token 4 and stale K/V of rejected drafts, uncommitted.
  EXPECT_EQ(f.kv.num_committed_blocks(1), 1);
  EXPECT_EQ(f.kv.stats().num_cached, 1);
  // A request whose prompt is the rejected continuation gets no hit past block 0.
  EXPECT_EQ(kv::testing::cached_tokens(f.kv, Tokens{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), 4);
  EXPECT_EQ(f.s.check_invariants(), "");
}

TEST(SpecSched, DraftsAreCappedByMaxTokensAndBudgetAndNeverPreempt) {
  {
    Fixture f(64, 17);
    f.prefill(1, 4, 10, /*max_tokens=*/3);  // 1 output; 2 more allowed: at most 1 draft + the bonus
    ASSERT_TRUE(f.s.set_draft(1, Tokens{11, 12, 13}));
    StepPlan p = f.s.schedule();
    EXPECT_EQ(p.seqs[0].token_ids, (Tokens{10, 11}));
  }
  {
    Fixture f(3, 17);  // budget 3: 1 real + 2 drafts
    f.prefill(1, 2, 10);
    ASSERT_TRUE(f.s.set_draft(1, Tokens{11, 12, 13, 14}));
    StepPlan p = f.s.schedule();
    EXPECT_EQ(p.seqs[0].num_draft_tokens, 2);
    EXPECT_EQ(p.num_tokens(), 3);
  }
  {
    // Two requests fill the pool; a draft needing a new block is dropped, nobody is preempted.
    Fixture f(64, 5);  // 4 usable blocks of 4 tokens
    for (RequestId id : {1, 2}) {
      NewRequest r;
      r.id = id;
      r.prompt = iota_tokens(static_cast<TokenId>(id) * 50, 7);  // distinct: no in-flight dedup
      r.max_tokens = 5;
      ASSERT_TRUE(f.s.add_request(r).ok());
    }
    StepPlan p = f.s.schedule();
    ASSERT_EQ(p.seqs.size(), 2u);
    const SeqOutput first[] = {{1, 10}, {2, 20}};
    f.s.update(p, first);  // each holds 2 blocks: 8 slots, 7 computed
    ASSERT_EQ(f.kv.num_free_blocks(), 0);
    ASSERT_TRUE(f.s.set_draft(2, Tokens{21, 22}));
    p = f.s.schedule();
    ASSERT_EQ(p.seqs.size(), 2u);
    EXPECT_TRUE(p.preempted.empty());
    for (const ScheduledSeq& q : p.seqs) EXPECT_EQ(q.num_draft_tokens, 0);
    EXPECT_EQ(p.num_tokens(), 2);
  }
  {
    // A draft is for one step: the next schedule() has none.
    Fixture f(64, 17);
    f.prefill(1, 4, 10);
    ASSERT_TRUE(f.s.set_draft(1, Tokens{11}));
    StepPlan p = f.s.schedule();
    SeqOutput o{1, 12};
    o.accepted = {11};
    f.s.update(p, std::span<const SeqOutput>(&o, 1));
    p = f.s.schedule();
    EXPECT_EQ(p.seqs[0].token_ids, (Tokens{12}));
    EXPECT_FALSE(f.s.set_draft(77, Tokens{1}));  // unknown request
  }
}

TEST(SpecKv, TruncateRollsBackComputedTokensAndBlocks) {
  kv::KvManager kv(kv_config(17, 4, 0.0));
  const Tokens t = iota_tokens(0, 13);
  ASSERT_TRUE(kv.allocate(1, t, 13, "").ok());
  kv.mark_computed(1, t, 13);  // 4 blocks, 3 committed
  ASSERT_EQ(kv.num_committed_blocks(1), 3);
  const int32_t free0 = kv.num_free_blocks();
  EXPECT_FALSE(kv.truncate(1, 17));  // past its slots: refused, nothing changed
  EXPECT_FALSE(kv.truncate(2, 1));   // unknown
  EXPECT_EQ(kv.num_slots(1), 16);
  ASSERT_TRUE(kv.truncate(1, 13));   // no-op in blocks
  EXPECT_EQ(kv.num_free_blocks(), free0);
  EXPECT_FALSE(kv.truncate(1, 6));   // inside committed block 1: the cache's, refused
  EXPECT_EQ(kv.num_computed_tokens(1), 13);
  ASSERT_TRUE(kv.truncate(1, 8));    // back to 8 tokens: 2 blocks, both committed
  EXPECT_EQ(kv.num_computed_tokens(1), 8);
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  EXPECT_EQ(kv.num_committed_blocks(1), 2);
  EXPECT_EQ(kv.num_free_blocks(), free0 + 2);
  EXPECT_EQ(kv.stats().num_cached, 3);  // block 2 of the chain stays cached-evictable
  EXPECT_EQ(kv.check_invariants(), "");
  // The sequence grows again from 8 over other tokens.
  Tokens u = t;
  u.resize(8);
  for (int i = 0; i < 6; ++i) u.push_back(1000 + i);
  std::vector<kv::BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(1, 6, &copies));
  kv.mark_computed(1, u, 14);
  EXPECT_EQ(kv.num_committed_blocks(1), 3);
  EXPECT_EQ(kv::testing::cached_tokens(kv, u), 12);
  EXPECT_EQ(kv.check_invariants(), "");
  EXPECT_TRUE(kv.free(1));
  EXPECT_EQ(kv.check_invariants(), "");
}

TEST(SpecKv, TruncateRefusesToReachBackIntoAReleasedWindow) {
  kv::KvConfig c = kv_config(33, 4, 0.0);
  c.groups = {kv::KvGroupSpec{0}, kv::KvGroupSpec{4}};
  kv::KvManager kv(c);
  const Tokens t = iota_tokens(0, 16);
  ASSERT_TRUE(kv.allocate(1, t, 12, "").ok());
  kv.mark_computed(1, t, 12);
  std::vector<kv::BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(1, 4, &copies));  // from 12: the window group drops blocks 0 and 1
  kv.mark_computed(1, t, 16);
  EXPECT_EQ(kv.block_table(1, 1)[0], kv::kNullBlock);
  const auto before = std::vector<kv::BlockId>(kv.block_table(1).begin(), kv.block_table(1).end());
  EXPECT_FALSE(kv.truncate(1, 4));  // would need the window group's block 0 again
  EXPECT_EQ(std::vector<kv::BlockId>(kv.block_table(1).begin(), kv.block_table(1).end()), before);
  EXPECT_EQ(kv.num_computed_tokens(1), 16);
  EXPECT_FALSE(kv.truncate(1, 14));  // inside committed block 3
  EXPECT_TRUE(kv.truncate(1, 12));   // its window (keys from 9 on) is in blocks 2.., still there
  EXPECT_EQ(kv.num_computed_tokens(1), 12);
  EXPECT_EQ(kv.check_invariants(), "");
}

}  // namespace
}  // namespace pagoda::sched
