// KV cache groups in KvManager, with exact block ids: window release before a
// step, admission counting every group, prefix hits per group (a window group
// serves only its window), fork / free over groups, and the one arithmetic
// (kv/sizing) agreeing with what the allocator holds.
#include <gtest/gtest.h>

#include <deque>

#include "base/rng.h"
#include "kv/sizing.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::Ids;
using testing::Tokens;

KvManager make(int32_t num_blocks, int32_t block_size, std::vector<int32_t> windows) {
  KvConfig c = testing::make_config(num_blocks, block_size);
  for (int32_t w : windows) c.groups.push_back(KvGroupSpec{w});
  return KvManager(c);
}

Ids table(const KvManager& kv, SeqId s, int32_t g) {
  auto t = kv.block_table(s, g);
  return Ids(t.begin(), t.end());
}

// A prefix match: its hit length and the block ids it took in each group
// (0 where a group needs no block: before a window).
void expect_match(const PrefixMatch& m, int32_t cached_tokens, const std::vector<Ids>& blocks) {
  EXPECT_EQ(m.num_cached_tokens(), cached_tokens);
  for (size_t g = 0; g < blocks.size(); ++g) {
    const auto b = m.blocks(static_cast<int32_t>(g));
    EXPECT_EQ(Ids(b.begin(), b.end()), blocks[g]) << "group " << g;
  }
}

TEST(KvGroups, WindowGroupReleasesBlocksBeforeTheWindow) {
  // Group 0 full, group 1 window 8; blocks of 4 tokens; free queue 1..39.
  KvManager kv = make(40, 4, {0, 8});
  const Tokens t = testing::iota_tokens(100, 12);
  PrefixMatch m = kv.match_prefix(t, "");
  auto a = kv.can_allocate(std::move(m), 12);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_blocks_needed(), 6);  // 3 blocks in each group
  ASSERT_TRUE(kv.allocate(1, *a).ok());
  EXPECT_EQ(table(kv, 1, 0), (Ids{1, 2, 3}));
  EXPECT_EQ(table(kv, 1, 1), (Ids{4, 5, 6}));
  kv.mark_computed(1, t, 12);
  EXPECT_INVARIANTS(kv);
  // The step from position 12 sees keys 5..12: block 0 (tokens 0..3) of the
  // window group goes back, committed, so cached-evictable.
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(1, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table(kv, 1, 0), (Ids{1, 2, 3, 7}));
  EXPECT_EQ(table(kv, 1, 1), (Ids{0, 5, 6, 8}));
  EXPECT_EQ(kv.pool().ref_count(4), 0);
  EXPECT_TRUE(kv.cache().contains(4));
  KvStats st = kv.stats();
  EXPECT_EQ(st.num_used, 7);
  EXPECT_EQ(st.num_cached_evictable, 1);
  EXPECT_EQ(st.group_blocks_used, (std::vector<int32_t>{4, 3}));
  EXPECT_INVARIANTS(kv);
  // Decoding on: at position 16 the window starts at 9, block 1 (4..7) goes too.
  Tokens t2 = t;
  for (int i = 0; i < 5; ++i) t2.push_back(200 + i);
  kv.mark_computed(1, t2, 13);
  ASSERT_TRUE(kv.append_slots(1, 3, &copies));  // positions 13..15: window from 6, block 1 stays
  EXPECT_EQ(table(kv, 1, 1), (Ids{0, 5, 6, 8}));
  kv.mark_computed(1, t2, 16);
  ASSERT_TRUE(kv.append_slots(1, 1, &copies));  // position 16: window from 9
  EXPECT_EQ(table(kv, 1, 1), (Ids{0, 0, 6, 8, 10}));
  EXPECT_EQ(table(kv, 1, 0), (Ids{1, 2, 3, 7, 9}));
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  EXPECT_EQ(kv.num_free_blocks(), kv.num_usable_blocks());
  EXPECT_INVARIANTS(kv);
}

TEST(KvGroups, ChunkedPrefillFreesAsItGoes) {
  // Window 4, blocks of 2: a 20-token prompt in chunks of 4 never holds more
  // than the window plus the chunk in the window group.
  KvManager kv = make(64, 2, {0, 4});
  const Tokens t = testing::iota_tokens(1, 20);
  auto a = kv.can_allocate(kv.match_prefix(t, ""), 4);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(kv.allocate(7, *a).ok());
  kv.mark_computed(7, t, 4);
  for (int32_t start = 4; start < 20; start += 4) {
    std::vector<BlockCopy> copies;
    ASSERT_TRUE(kv.append_slots(7, 4, &copies));
    int32_t live = 0;
    for (BlockId b : kv.block_table(7, 1)) live += b != kNullBlock ? 1 : 0;
    // Keys start - 3 .. start + 3: blocks (start - 3) / 2 .. (start + 3) / 2.
    EXPECT_EQ(live, (start + 3) / 2 - (start - 3) / 2 + 1) << "start " << start;
    EXPECT_LE(static_cast<int64_t>(live), kv_group_blocks_for_sequence(start + 4, 2, 4, /*max_chunk=*/4))
        << "start " << start;  // the sizing bound holds at every chunk
    kv.mark_computed(7, t, start + 4);
    EXPECT_INVARIANTS(kv);
  }
  EXPECT_EQ(static_cast<int32_t>(kv.block_table(7, 0).size()), 10);
}

TEST(KvGroups, AdmissionCountsEveryGroupAgainstOnePool) {
  // 3 groups, blocks of 4: a 10-token prompt needs 3 blocks per group = 9.
  KvManager kv = make(10, 4, {0, 16, 16});  // 9 usable
  const Tokens t = testing::iota_tokens(1, 10);
  auto a = kv.can_allocate(kv.match_prefix(t, ""), 10);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->num_blocks_needed(), 9);
  auto b = kv.can_allocate(kv.match_prefix(t, ""), 10, /*reserve_blocks=*/1);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("need 9 free blocks"), std::string::npos) << b.message();
  EXPECT_EQ(kv.max_blocks_for_sequence(10, 512), 9);
  EXPECT_EQ(kv.max_blocks_for_sequence(100, 1), 25 + 2 * (4 + 1));
}

// Admission with a prefill target: a request reserves what the rest of its
// prefill can take (full group: its whole prompt; window group: W + one chunk,
// not its prompt), and running prefills keep their reserve until they end.
TEST(KvGroups, AdmissionReservesTheRestOfEachPrefill) {
  // Group 0 full, group 1 window 8; blocks of 4; 29 usable (free queue 1..29).
  // A 40-token prompt in chunks of 8 peaks at 10 full + min(10, ceil(14 / 4) + 1) = 5 window blocks.
  KvManager kv = make(30, 4, {0, 8});
  const Tokens ta = testing::iota_tokens(100, 40), tb = testing::iota_tokens(1000, 40);
  auto a = kv.can_allocate(kv.match_prefix(ta, ""), 8, 0, /*target_tokens=*/40, /*max_chunk=*/8);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_blocks_needed(), 4);     // the first chunk: 2 blocks per group
  EXPECT_EQ(a->num_blocks_reserved(), 11);  // 10 - 2 full + 5 - 2 window
  EXPECT_EQ(a->num_blocks_needed() + a->num_blocks_reserved(), kv.max_blocks_for_sequence(40, 8));
  ASSERT_TRUE(kv.allocate(1, *a).ok());
  EXPECT_EQ(table(kv, 1, 0), (Ids{1, 2}));
  EXPECT_EQ(table(kv, 1, 1), (Ids{3, 4}));
  EXPECT_EQ(kv.num_reserved_blocks(), 11);
  // B: 4 + 11 of its own + A's 11 > 25 free. The first-chunk rule would admit it.
  auto b = kv.can_allocate(kv.match_prefix(tb, ""), 8, 0, 40, 8);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("need 4 free blocks + 11 reserved for the rest of its prefill + 11 for running "
                             "prefills + watermark 0 + reserve 0, only 25 free"),
            std::string::npos)
      << b.message();
  EXPECT_TRUE(kv.can_allocate(kv.match_prefix(tb, ""), 8).ok());
  // A's prefill, 8 tokens a step: the window group releases 2 blocks a step
  // from start 16 on (cached-evictable, to the back of the free queue).
  const std::vector<Ids> g0 = {{1, 2, 5, 6}, {1, 2, 5, 6, 9, 10}, {1, 2, 5, 6, 9, 10, 13, 14},
                               {1, 2, 5, 6, 9, 10, 13, 14, 17, 18}};
  const std::vector<Ids> g1 = {{3, 4, 7, 8}, {0, 0, 7, 8, 11, 12}, {0, 0, 0, 0, 11, 12, 15, 16},
                               {0, 0, 0, 0, 0, 0, 15, 16, 19, 20}};
  const std::vector<int64_t> reserved = {7, 5, 3, 1};
  for (int32_t step = 0; step < 4; ++step) {
    const int32_t start = 8 * (step + 1);
    kv.mark_computed(1, ta, start);
    std::vector<BlockCopy> copies;
    ASSERT_TRUE(kv.append_slots(1, 8, &copies));
    EXPECT_EQ(table(kv, 1, 0), g0[static_cast<size_t>(step)]) << "start " << start;
    EXPECT_EQ(table(kv, 1, 1), g1[static_cast<size_t>(step)]) << "start " << start;
    EXPECT_EQ(kv.num_reserved_blocks(), reserved[static_cast<size_t>(step)]) << "start " << start;
    EXPECT_FALSE(kv.can_allocate(kv.match_prefix(tb, ""), 8, 0, 40, 8).ok()) << "start " << start;
    EXPECT_INVARIANTS(kv);
  }
  EXPECT_EQ(kv.num_free_blocks(), 15);  // 16 blocks short of B's 4 + 11 + A's last 1
  // A's prompt is computed: it reserves nothing more (decode growth is not
  // reserved), and B's 4 + 11 fit the 15 free exactly.
  kv.mark_computed(1, ta, 40);
  EXPECT_EQ(kv.num_reserved_blocks(), 0);
  auto b2 = kv.can_allocate(kv.match_prefix(tb, ""), 8, 0, 40, 8);
  ASSERT_TRUE(b2.ok()) << b2.message();
  ASSERT_TRUE(kv.allocate(2, *b2).ok());
  EXPECT_EQ(table(kv, 2, 0), (Ids{21, 22}));
  EXPECT_EQ(table(kv, 2, 1), (Ids{23, 24}));
  EXPECT_EQ(kv.num_reserved_blocks(), 11);
  EXPECT_INVARIANTS(kv);
}

// The reservation's promise, randomized: a sequence whose prompt is computed
// holds its blocks a random number of steps without growing (a decode that
// never crosses a block), then is freed; so nothing grows past its target and
// a step's append_slots never fails for an admitted sequence. Prompts share
// prefixes (hits, window blocks shared with running sequences) and chunks are
// the scheduler's: min(remaining, what the step's budget leaves), running
// sequences first. (With target_tokens = 0, the first-chunk rule, it fails.)
TEST(KvGroups, AdmittedPrefillsNeverRunOutOfBlocks) {
  struct Running {
    SeqId id;
    Tokens tokens;
    int linger;  // steps to hold its blocks once computed
  };
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rng rng(seed);
    const auto w = static_cast<int32_t>(rng.uniform_int(1, 4) * 4);
    const auto budget = static_cast<int32_t>(rng.uniform_int(1, 24));
    KvManager kv = make(static_cast<int32_t>(rng.uniform_int(48, 80)), 4, {0, w, w + 3});
    const Tokens base = testing::iota_tokens(5000, 80);
    std::deque<Running> waiting;
    for (SeqId id = 1; id <= 60; ++id) {
      Tokens t(base.begin(), base.begin() + rng.uniform_int(0, 60));
      for (int64_t i = rng.uniform_int(1, 30); i > 0; --i) t.push_back(static_cast<TokenId>(rng.uniform_int(0, 99)));
      waiting.push_back({id, std::move(t), static_cast<int>(rng.uniform_int(0, 20))});
    }
    std::vector<Running> running;
    int64_t admitted = 0;
    for (int step = 0; step < 20000 && (!waiting.empty() || !running.empty()); ++step) {
      int32_t left = budget;
      std::vector<std::pair<size_t, int32_t>> slices;  // (index in running, tokens)
      for (size_t i = 0; i < running.size() && left > 0; ++i) {
        const int32_t n = std::min(static_cast<int32_t>(running[i].tokens.size()) - kv.num_computed_tokens(running[i].id), left);
        if (n == 0) continue;
        std::vector<BlockCopy> copies;
        ASSERT_TRUE(kv.append_slots(running[i].id, n, &copies)) << "seed " << seed << " step " << step;
        slices.emplace_back(i, n);
        left -= n;
      }
      while (!waiting.empty() && left > 0) {
        const Running& r = waiting.front();
        PrefixMatch m = kv.match_prefix(r.tokens, "");
        const int32_t n = std::min(static_cast<int32_t>(r.tokens.size()) - m.num_cached_tokens(), left);
        auto a = kv.can_allocate(std::move(m), n, 0, static_cast<int32_t>(r.tokens.size()), budget);
        if (!a.ok()) break;
        ASSERT_TRUE(kv.allocate(r.id, *a).ok());
        running.push_back(waiting.front());
        waiting.pop_front();
        slices.emplace_back(running.size() - 1, n);
        left -= n;
        ++admitted;
      }
      for (const auto& [i, n] : slices) {
        kv.mark_computed(running[i].id, running[i].tokens, kv.num_computed_tokens(running[i].id) + n);
      }
      std::erase_if(running, [&](Running& r) {
        if (kv.num_computed_tokens(r.id) < static_cast<int32_t>(r.tokens.size()) || r.linger-- > 0) return false;
        return kv.free(r.id);
      });
      ASSERT_EQ(kv.check_invariants(), "") << "seed " << seed << " step " << step;
    }
    EXPECT_EQ(admitted, 60) << "seed " << seed;
    EXPECT_EQ(kv.num_free_blocks(), kv.num_usable_blocks()) << "seed " << seed;
  }
}

// Gemma 3 270M's groups, a fresh 8,192-token prompt in chunks of 512: the
// first chunk takes 32 blocks per group, the reserve the rest of the full
// group and 65 - 32 per window group; together the sizing formula's peak.
TEST(KvGroups, AdmissionOfAGemma3PromptCountsTheWindowNotThePrompt) {
  KvManager kv = make(4000, 16, {0, 512, 512, 512, 512, 512});
  const Tokens t = testing::iota_tokens(1, 8192);
  auto a = kv.can_allocate(kv.match_prefix(t, ""), 512, 0, 8192, 512);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_blocks_needed(), 6 * 32);
  EXPECT_EQ(a->num_blocks_reserved(), (512 - 32) + 5 * (65 - 32));
  EXPECT_EQ(kv.max_blocks_for_sequence(8192, 512), 512 + 5 * 65);
  // One full context group (the flag's layout in blocks of 6x the bytes): the whole prompt.
  KvManager flat = make(4000, 16, {0});
  auto f = flat.can_allocate(flat.match_prefix(t, ""), 512, 0, 8192, 512);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->num_blocks_needed() + f->num_blocks_reserved(), 512);
}

TEST(KvGroups, PrefixHitTakesOnlyTheWindowBlocks) {
  KvManager kv = make(40, 4, {0, 8});
  const Tokens t = testing::iota_tokens(100, 12);
  testing::cache_prefix(kv, t);  // g0 {1,2,3}, g1 {4,5,6}, all committed
  // A hit at 12 computes position 12 first, which sees keys 5..11: the window
  // group needs its blocks 1 and 2 only.
  const Tokens q = testing::concat(t, {7});
  PrefixMatch m = kv.match_prefix(q, "");
  expect_match(m, 12, {{1, 2, 3}, {0, 5, 6}});
  auto a = kv.can_allocate(std::move(m), 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->num_blocks_needed(), 5 + 2);  // 5 revived + 1 fresh per group
  ASSERT_TRUE(kv.allocate(2, *a).ok());
  EXPECT_EQ(table(kv, 2, 1)[0], kNullBlock);
  EXPECT_EQ(kv.pool().ref_count(4), 0);  // block 0 of the window group stays evictable
  EXPECT_INVARIANTS(kv);
}

TEST(KvGroups, WindowGroupLimitsTheHit) {
  // Group 1 has window 4. A's 16 tokens: g0 {1,2,3,4}, g1 {5,6,7,8}.
  KvManager kv = make(14, 4, {0, 4});
  const Tokens t = testing::iota_tokens(100, 16);
  testing::cache_prefix(kv, t);  // queue: 9..13, then g1 8,7,6,5, then g0 4,3,2,1
  // B pops 9..13 and 8: the window group's last block of A is evicted.
  ASSERT_EQ(testing::prefill(kv, 2, testing::iota_tokens(500, 12)), 0);
  EXPECT_EQ(table(kv, 2, 0), (Ids{9, 10, 11}));
  EXPECT_EQ(table(kv, 2, 1), (Ids{12, 13, 8}));
  ASSERT_TRUE(kv.free(2));
  // Group 0 still has A's 4 blocks, but a hit at 16 needs g1's block 3 (gone);
  // at 12 it needs g1's block 2 only (keys 9..11): the hit is 12.
  const Tokens q = testing::concat(t, {1});
  PrefixMatch m = kv.match_prefix(q, "");
  expect_match(m, 12, {{1, 2, 3}, {0, 0, 7}});
  ASSERT_NE(m.next_block_key(), nullptr);
  auto a = kv.can_allocate(std::move(m), 5);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_blocks_needed(), 4 + 4);  // 4 revived, 2 fresh per group
  ASSERT_TRUE(kv.allocate(3, *a).ok());
  EXPECT_EQ(table(kv, 3, 0), (Ids{1, 2, 3, 6, 5}));
  EXPECT_EQ(table(kv, 3, 1), (Ids{0, 0, 7, 4, 8}));
  EXPECT_INVARIANTS(kv);
}

TEST(KvGroups, RevalidateDropsAHitWhoseWindowBlockWasEvicted) {
  KvManager kv = make(14, 4, {0, 4});
  const Tokens t = testing::iota_tokens(100, 16);
  testing::cache_prefix(kv, t);
  Tokens q = t;
  q.push_back(1);
  PrefixMatch m = kv.match_prefix(q, "");
  ASSERT_EQ(m.num_cached_tokens(), 16);
  EXPECT_TRUE(std::ranges::equal(m.blocks(1), Ids{0, 0, 0, 8}));
  ASSERT_EQ(testing::prefill(kv, 2, testing::iota_tokens(500, 12)), 0);  // evicts block 8
  kv.revalidate(&m);
  // Hit points below 16 need window blocks the match never took: no hit.
  EXPECT_EQ(m.num_cached_tokens(), 0);
  EXPECT_EQ(kv.match_prefix(q, "").num_cached_tokens(), 12);
}

TEST(KvGroups, ForkAndCopyOnWriteInEveryGroup) {
  KvManager kv = make(40, 4, {0, 8});
  const Tokens t = testing::iota_tokens(1, 10);
  testing::prefill_and_fork(kv, t);  // g0 {1,2,3}, g1 {4,5,6}
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(2, 1, &copies));
  // Position 10 sees keys 3..10: nothing released; the shared partial block of
  // each group is copied.
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{3, 7}, {6, 8}}));
  EXPECT_EQ(table(kv, 2, 0), (Ids{1, 2, 7}));
  EXPECT_EQ(table(kv, 2, 1), (Ids{4, 5, 8}));
  EXPECT_INVARIANTS(kv);
  // Shared window blocks released by one holder stay with the other.
  Tokens t2 = t;
  for (int i = 0; i < 6; ++i) t2.push_back(50 + i);
  kv.mark_computed(2, t2, 11);
  ASSERT_TRUE(kv.append_slots(2, 5, &copies));  // start 11: keys from 4, block 0 goes
  EXPECT_EQ(table(kv, 2, 1)[0], kNullBlock);
  EXPECT_EQ(kv.pool().ref_count(4), 1);  // still seq 1's
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(kv.num_free_blocks(), kv.num_usable_blocks());
  EXPECT_INVARIANTS(kv);
}

// The allocator and kv/sizing's formula agree: decoding one token per step,
// a window group never holds more than kv_group_blocks_for_sequence says, and
// at some length holds exactly that (the bound is tight).
TEST(KvGroups, AllocatorHoldsWhatTheSizingFormulaSays) {
  for (int32_t window : {5, 8, 16}) {
    KvManager kv = make(200, 4, {0, window});
    const Tokens t = testing::iota_tokens(1, 300);
    auto a = kv.can_allocate(kv.match_prefix(std::span<const TokenId>(t).first(1), ""), 1);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(kv.allocate(1, *a).ok());
    int64_t max_held = 0;
    for (int32_t n = 1; n < 300; ++n) {
      kv.mark_computed(1, t, n);
      std::vector<BlockCopy> copies;
      ASSERT_TRUE(kv.append_slots(1, 1, &copies));
      int64_t held = 0;
      for (BlockId b : kv.block_table(1, 1)) held += b != kNullBlock ? 1 : 0;
      const int64_t formula = kv_group_blocks_for_sequence(n + 1, 4, window);
      ASSERT_LE(held, formula) << "window " << window << " tokens " << n + 1;
      max_held = std::max(max_held, held);
      EXPECT_EQ(static_cast<int64_t>(kv.block_table(1, 0).size()), kv_group_blocks_for_sequence(n + 1, 4, 0));
      ASSERT_EQ(kv.stats().num_used, static_cast<int32_t>(kv.block_table(1, 0).size() + held));
    }
    EXPECT_EQ(max_held, blocks_for_tokens(window - 1, 4) + 1) << "window " << window;
  }
}

TEST(KvGroups, LayoutOfGemma3AndTheFlag) {
  // Gemma 3 270M: 18 layers, every 6th global, the rest window 512.
  std::vector<int32_t> w(18, 512);
  for (int l = 5; l < 18; l += 6) w[static_cast<size_t>(l)] = 0;
  const KvGroupLayout g = kv_group_layout(w, /*hybrid=*/true);
  EXPECT_EQ(g.group_size, 3);
  EXPECT_EQ(g.windows, (std::vector<int32_t>{0, 512, 512, 512, 512, 512}));
  EXPECT_EQ(g.layer_group[5], 0);
  EXPECT_EQ(g.layer_slot[11], 1);
  EXPECT_EQ(g.layer_group[0], 1);
  EXPECT_EQ(g.layer_slot[2], 2);
  EXPECT_EQ(g.layer_group[3], 2);  // the 4th window layer opens the second window group
  const KvGroupLayout off = kv_group_layout(w, /*hybrid=*/false);
  EXPECT_EQ(off.group_size, 18);
  EXPECT_EQ(off.windows, (std::vector<int32_t>{0}));
  EXPECT_EQ(off.layer_slot[17], 17);
  // 32,000 tokens, blocks of 16: 2000 full + 5 x 33 window blocks of 3 layers,
  // i.e. 3 x 32000 + 15 x 528 layer-tokens (the exact figure's 512 + one block).
  EXPECT_EQ(kv_blocks_for_sequence(g, 32000, 16), 2000 + 5 * 33);
  EXPECT_EQ(kv_blocks_for_sequence(off, 32000, 16), 2000);
  // Padding: 4 full + 6 window layers -> G = 4, window groups of 4 and 2(+2 padding).
  std::vector<int32_t> w2 = {0, 0, 0, 0, 64, 64, 64, 64, 64, 64};
  const KvGroupLayout p = kv_group_layout(w2, true);
  EXPECT_EQ(p.group_size, 4);
  EXPECT_EQ(p.windows, (std::vector<int32_t>{0, 64, 64}));
  EXPECT_EQ(p.layer_group[9], 2);
  EXPECT_EQ(p.layer_slot[9], 1);
}

}  // namespace
}  // namespace pagoda::kv
