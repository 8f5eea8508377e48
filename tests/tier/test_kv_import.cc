// KvManager's tier hooks: the commit log (write-through) and import_blocks
// (loaded blocks into the prefix cache), with every invariant after each call.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "kv/event_sink.h"
#include "kv/kv_manager.h"

namespace pagoda::kv {
namespace {

KvManager make(int32_t num_blocks, double watermark = 0.0, std::vector<KvGroupSpec> groups = {}) {
  KvConfig c;
  c.num_blocks = num_blocks;
  c.block_size = 4;
  c.watermark = watermark;
  c.model_fingerprint = 7;
  c.groups = std::move(groups);
  return KvManager(c);
}

// A tier that holds every block asked for.
bool all(int32_t, int32_t) { return true; }

std::vector<TokenId> prompt(int n, int base = 0) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

// Sequence 1 computes all of p with the commit log on; the log.
std::vector<KvManager::CommittedBlock> compute_logged(KvManager& kv, const std::vector<TokenId>& p,
                                                      const std::string& salt) {
  kv.set_commit_log(true);
  const auto n = static_cast<int32_t>(p.size());
  EXPECT_TRUE(kv.allocate(1, p, n, salt).ok());
  kv.mark_computed(1, p, n);
  return kv.take_committed();
}

TEST(KvTierHooks, CommitLogListsNewEntriesOnce) {
  KvManager kv = make(16);
  const auto p = prompt(10);  // two full blocks
  auto log = compute_logged(kv, p, "s");
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].block, kv.block_table(1)[0]);
  EXPECT_EQ(log[1].block, kv.block_table(1)[1]);
  EXPECT_EQ(log[1].tokens, (std::vector<TokenId>{4, 5, 6, 7}));
  EXPECT_EQ(log[0].salt, "s");
  EXPECT_EQ(log[0].key, kv.chain_keys(p, "s")[0]);
  EXPECT_EQ(log[1].key, kv.chain_keys(p, "s")[1]);
  EXPECT_TRUE(kv.take_committed().empty());
  // A second sequence hitting both blocks commits nothing new.
  ASSERT_TRUE(kv.allocate(2, p, 2, "s").ok());
  kv.mark_computed(2, p, 10);
  EXPECT_TRUE(kv.take_committed().empty());
  EXPECT_EQ(kv.check_invariants(), "");
}

TEST(KvTierHooks, ImportedBlocksAreCachedEvictableAndHit) {
  KvManager kv = make(16);
  const auto p = prompt(13);  // three full blocks a hit may cover
  ASSERT_EQ(kv.chain_keys(p, "").size(), 3u);
  std::vector<std::pair<int32_t, BlockId>> filled;
  const int32_t n = kv.import_blocks(p, "", 3, all, [&](int32_t g, int32_t i, BlockId b) {
    EXPECT_EQ(g, 0);
    filled.emplace_back(i, b);
  });
  EXPECT_EQ(n, 3);
  ASSERT_EQ(filled.size(), 3u);
  EXPECT_EQ(kv.check_invariants(), "");
  const KvStats st = kv.stats();
  EXPECT_EQ(st.num_cached_evictable, 3);
  EXPECT_EQ(st.num_used, 0);
  // The normal RAM match now takes exactly the filled blocks, in order.
  const PrefixMatch m = kv.match_prefix(p, "");
  ASSERT_EQ(m.num_blocks(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(m.blocks()[static_cast<size_t>(i)], filled[static_cast<size_t>(i)].second);
  // The chain's head is evicted last: the free queue ends with block 0's, 1's, 2's in reverse.
  const auto q = kv.pool().free_queue();
  EXPECT_EQ(q.back(), filled[0].second);
  // Another salt sees none of it.
  EXPECT_EQ(kv.match_prefix(p, "other").num_blocks(), 0);
}

TEST(KvTierHooks, ImportContinuesTheRamChainAndStopsWhereItCannot) {
  KvManager kv = make(16);
  const auto p = prompt(21);  // five full blocks a hit may cover
  ASSERT_TRUE(kv.allocate(1, p, 8, "").ok());  // blocks 0, 1 in RAM
  kv.mark_computed(1, p, 8);
  ASSERT_TRUE(kv.free(1));
  int calls = 0;
  auto from2 = [](int32_t, int32_t i) { return i >= 2; };
  EXPECT_EQ(kv.import_blocks(p, "", 4, from2, [&](int32_t, int32_t i, BlockId) { EXPECT_GE(i, 2); ++calls; }), 2);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 4);
  EXPECT_EQ(kv.check_invariants(), "");
  // A chain whose RAM part is gone cannot be continued: nothing imported.
  const auto q = prompt(21, 100);
  auto from1 = [](int32_t, int32_t i) { return i >= 1; };
  EXPECT_EQ(kv.import_blocks(q, "", 3, from1, [&](int32_t, int32_t, BlockId) { ADD_FAILURE(); }), 0);
  EXPECT_EQ(kv.check_invariants(), "");
}

TEST(KvTierHooks, ImportNeverGoesBelowTheWatermarkOrEvictsItsOwnChain) {
  // 5 usable blocks, watermark 1: at most 4 taken by an import.
  KvManager kv = make(6, 0.2);
  ASSERT_EQ(kv.watermark_blocks(), 1);
  const auto p = prompt(4 * 8 + 1);  // eight full blocks
  int calls = 0;
  EXPECT_EQ(kv.import_blocks(p, "", 8, all, [&](int32_t, int32_t, BlockId) { ++calls; }), 4);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 4);
  EXPECT_EQ(kv.check_invariants(), "");
  // A second import of another prompt evicts the first chain's blocks, tail first.
  const auto q = prompt(4 * 2 + 1, 500);
  EXPECT_EQ(kv.import_blocks(q, "", 2, all, [&](int32_t, int32_t, BlockId) {}), 2);
  EXPECT_EQ(kv.match_prefix(q, "").num_blocks(), 2);
  EXPECT_EQ(kv.check_invariants(), "");
}


// One full group and one window-8 group, blocks of 4 tokens.
KvManager make_groups(int32_t num_blocks) { return make(num_blocks, 0.0, {KvGroupSpec{0}, KvGroupSpec{8}}); }

TEST(KvTierHooks, CommitLogListsEveryGroupsBlocks) {
  KvManager kv = make_groups(32);
  const auto p = prompt(10);  // two full blocks
  const auto log = compute_logged(kv, p, "");
  ASSERT_EQ(log.size(), 4u);  // block 0 of groups 0, 1; block 1 of groups 0, 1
  for (size_t n = 0; n < 4; ++n) {
    const auto i = static_cast<size_t>(n / 2);
    const auto g = static_cast<int32_t>(n % 2);
    EXPECT_EQ(log[n].group, g);
    EXPECT_EQ(log[n].block, kv.block_table(1, g)[i]);
    EXPECT_EQ(log[n].key, kv.chain_keys(p, "")[i]);  // the chain key; the tier entry adds the group
    EXPECT_EQ(log[n].tokens, prompt(4, static_cast<int>(4 * i)));
  }
  EXPECT_NE(log[0].block, log[1].block);
  EXPECT_EQ(kv.check_invariants(), "");
}

TEST(KvTierHooks, GroupImportFollowsTheWindowRule) {
  const auto p = prompt(21);  // five full blocks a hit may cover
  {
    // Group 0's five blocks and the window group's blocks 3, 4 (keys 13..19,
    // the window of the token at 20): the whole hit.
    KvManager kv = make_groups(32);
    std::vector<std::pair<int32_t, int32_t>> filled;
    const int32_t n = kv.import_blocks(p, "", 5, [](int32_t g, int32_t i) { return g == 0 || i >= 3; },
                                       [&](int32_t g, int32_t i, BlockId) { filled.emplace_back(g, i); });
    EXPECT_EQ(n, 7);
    EXPECT_EQ(filled, (std::vector<std::pair<int32_t, int32_t>>{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 3}, {1, 4}}));
    const PrefixMatch m = kv.match_prefix(p, "");
    EXPECT_EQ(m.num_blocks(), 5);
    EXPECT_EQ(m.blocks(1)[0], kNullBlock);
    EXPECT_EQ(m.blocks(1)[2], kNullBlock);
    EXPECT_NE(m.blocks(1)[3], kNullBlock);
    EXPECT_EQ(kv.stats().num_cached_evictable, 7);
    EXPECT_EQ(kv.check_invariants(), "");
    // What RAM holds per group: what a tier load can skip.
    EXPECT_EQ(kv.cached_blocks(p, ""), (std::vector<std::vector<int8_t>>{{1, 1, 1, 1, 1}, {0, 0, 0, 1, 1}}));
    EXPECT_EQ(kv.cached_blocks(p, "other salt"), (std::vector<std::vector<int8_t>>{{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}}));
  }
  {
    // The window group lacks block 4: the hit falls to 4 blocks, whose window
    // (keys 9..15) needs blocks 2 and 3 of it.
    KvManager kv = make_groups(32);
    std::vector<std::pair<int32_t, int32_t>> filled;
    const int32_t n = kv.import_blocks(p, "", 5, [](int32_t g, int32_t i) { return g == 0 || i != 4; },
                                       [&](int32_t g, int32_t i, BlockId) { filled.emplace_back(g, i); });
    EXPECT_EQ(n, 7);
    EXPECT_EQ(filled, (std::vector<std::pair<int32_t, int32_t>>{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 2}, {1, 3}}));
    EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 4);
    EXPECT_EQ(kv.check_invariants(), "");
  }
  {
    // Nothing of the window group: no hit point but 0 is served.
    KvManager kv = make_groups(32);
    EXPECT_EQ(kv.import_blocks(p, "", 5, [](int32_t g, int32_t) { return g == 0; }, [](int32_t, int32_t, BlockId) {}), 5);
    EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 0);
    EXPECT_EQ(kv.check_invariants(), "");
  }
}

TEST(KvTierHooks, LongestHitSkipsBlocksOutsideTheWindow) {
  KvManager kv = make_groups(32);
  // A window block missing at 1 does not matter to a hit of 5 (window 3..4).
  EXPECT_EQ(kv.longest_hit(5, [](int32_t, int32_t i) { return i == 1; }), 5);
  // Missing at 3: hits 4 and 5 need it; 3 needs 1, 2 (keys 5..11).
  EXPECT_EQ(kv.longest_hit(5, [](int32_t, int32_t i) { return i == 3; }), 3);
  EXPECT_EQ(kv.longest_hit(5, [](int32_t, int32_t i) { return i == 3 || i == 2; }), 2);
  KvManager one = make(16);
  EXPECT_EQ(one.longest_hit(5, [](int32_t, int32_t) { return true; }), 5);
}

}  // namespace
}  // namespace pagoda::kv

namespace pagoda::kv {
namespace {

// Issue 38, a recurrent state group (S = 2) with a checkpoint every 2 blocks:
// the commit log lists each checkpoint made (its blocks, chain, tokens), and
// an import's hit ends at the latest boundary whose checkpoint is cached or
// loaded, the loaded one committed whole (all S blocks) or not at all.
KvManager make_hybrid(int32_t num_blocks, double watermark = 0.0) {
  KvConfig c;
  c.num_blocks = num_blocks;
  c.block_size = 4;
  c.watermark = watermark;
  c.model_fingerprint = 7;
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  c.state_checkpoint_interval = 2;
  return KvManager(c);
}

TEST(KvTierHooks, CheckpointsAreLoggedAndImportedWholeAtTheLatestBoundary) {
  const auto p = prompt(21);  // 5 full blocks a hit may cover: boundaries at 2 and 4 blocks
  {
    KvManager kv = make_hybrid(32);
    kv.set_commit_log(true);
    ASSERT_TRUE(kv.allocate(1, p, 16, "s").ok());
    kv.mark_computed(1, p, 16);  // 4 blocks: a checkpoint at 16 tokens
    const auto logged = kv.take_committed_checkpoints();
    ASSERT_EQ(logged.size(), 1u);
    EXPECT_EQ(logged[0].blocks.size(), 2u);
    EXPECT_EQ(logged[0].key, kv.chain_keys(p, "s")[3]);
    EXPECT_EQ(logged[0].parent, kv.chain_keys(p, "s")[2]);
    EXPECT_FALSE(logged[0].root);
    EXPECT_EQ(logged[0].tokens, std::vector<TokenId>(p.begin() + 12, p.begin() + 16));
    EXPECT_EQ(logged[0].salt, "s");
    EXPECT_EQ(kv.flush_checkpoints([](BlockId, BlockId) {}), 2);
    EXPECT_TRUE(kv.take_committed_checkpoints().empty());
    ASSERT_TRUE(kv.free(1));
    ASSERT_EQ(kv.match_prefix(p, "s").num_blocks(), 4);
    // RAM loses the checkpoint (not its K/V): no hit, until a tier brings the checkpoint back.
    for (const BlockId b : logged[0].blocks) kv.mutable_cache_for_testing().erase(b);
    ASSERT_EQ(kv.match_prefix(p, "s").num_blocks(), 0);
    int32_t parts = 0;
    EXPECT_EQ(kv.import_blocks(
                  p, "s", 4, [](int32_t g, int32_t i) { return g == 1 && i == 3; }, [](int32_t, int32_t, BlockId) {},
                  [&](int32_t i, int32_t part, BlockId) { EXPECT_EQ(i * 10 + part, 30 + parts++); }),
              2);
    EXPECT_EQ(kv.match_prefix(p, "s").num_blocks(), 4);
    EXPECT_EQ(kv.check_invariants(), "");
  }
  // Loaded: K/V of 5 blocks; checkpoints as `ckpts` says ([block index] at its end).
  auto import = [&](KvManager& kv, std::vector<int32_t> ckpts, int32_t* filled) {
    *filled = 0;
    return kv.import_blocks(
        p, "", 5,
        [&](int32_t g, int32_t i) {
          return g == 0 || std::find(ckpts.begin(), ckpts.end(), i) != ckpts.end();
        },
        [](int32_t, int32_t, BlockId) {}, [&](int32_t, int32_t, BlockId) { ++*filled; });
  };
  int32_t filled = 0;
  {
    KvManager kv = make_hybrid(32);
    EXPECT_EQ(import(kv, {1, 3}, &filled), 5 + 2);  // the one at 4 blocks, not at 2
    EXPECT_EQ(filled, 2);
    EXPECT_EQ(kv.cached_blocks(p, "")[1], (std::vector<int8_t>{0, 0, 0, 1, 0}));
    const PrefixMatch m = kv.match_prefix(p, "");
    EXPECT_EQ(m.num_blocks(), 4);
    EXPECT_EQ(m.checkpoint_blocks().size(), 2u);
    EXPECT_EQ(kv.check_invariants(), "");
  }
  {
    KvManager kv = make_hybrid(32);
    EXPECT_EQ(import(kv, {1}, &filled), 5 + 2);  // only the one at 2 blocks
    EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 2);
    EXPECT_EQ(kv.check_invariants(), "");
  }
  {
    KvManager kv = make_hybrid(32);
    EXPECT_EQ(import(kv, {}, &filled), 5);  // K/V without a checkpoint: no hit
    EXPECT_EQ(filled, 0);
    EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 0);
    EXPECT_EQ(kv.check_invariants(), "");
  }
  {
    // 7 usable blocks: the 5 K/V blocks leave 2 free, the watermark (1 block) takes one: no room for S = 2.
    KvManager kv = make_hybrid(8, 0.15);
    ASSERT_EQ(kv.watermark_blocks(), 1);
    EXPECT_EQ(import(kv, {3}, &filled), 5);
    EXPECT_EQ(kv.cached_blocks(p, "")[1], (std::vector<int8_t>{0, 0, 0, 0, 0})) << "all or none";
    EXPECT_EQ(kv.match_prefix(p, "").num_blocks(), 0);
    EXPECT_EQ(kv.check_invariants(), "");
  }
}


// KV events (issue 37): a checkpoint (S = 2 blocks under one chain) is no K/V
// block: neither made, imported nor evicted, it is never announced; the K/V
// blocks around it are, as without it. The view a subscriber keeps is the
// cache's entries less its checkpoints, each stored once, removed once.
class Recorder final : public KvEventSink {
 public:
  void block_stored(const Hash128& chain, const Hash128*, std::span<const TokenId>, int32_t group) override {
    ++stored;
    EXPECT_EQ(group, 0);
    EXPECT_TRUE(view.insert({group, chain.lo}).second) << "stored twice";
  }
  void block_removed(const Hash128& chain, int32_t group) override {
    ++removed;
    EXPECT_EQ(view.erase({group, chain.lo}), 1u) << "removed without being stored";
  }
  void all_cleared() override { view.clear(); }
  int stored = 0, removed = 0;
  std::set<std::pair<int32_t, uint64_t>> view;
};

TEST(KvTierHooks, CheckpointsAreNeverAnnouncedAsKvEvents) {
  KvManager kv = make_hybrid(17);  // 16 usable
  Recorder rec;
  kv.set_event_sink(&rec);
  auto blocks_view = [&] {
    std::set<std::pair<int32_t, uint64_t>> v;
    for (BlockId b = 1; b < kv.pool().num_blocks(); ++b) {
      if (kv.cache().contains(b) && kv.cache().group_of(b) != kv.state_group())
        v.insert({kv.cache().group_of(b), kv.cache().chain_of(b).lo});
    }
    return v;
  };
  const auto a = prompt(9, 100);
  ASSERT_TRUE(kv.allocate(1, a, 9, "").ok());
  kv.mark_computed(1, a, 8);  // 2 blocks and the checkpoint at their end
  EXPECT_EQ(kv.flush_checkpoints([](BlockId, BlockId) {}), 2);
  EXPECT_EQ(kv.stats().num_checkpoints, 1);
  EXPECT_EQ(rec.stored, 2);
  EXPECT_EQ(rec.view, blocks_view());
  ASSERT_TRUE(kv.free(1));
  const auto b = prompt(21, 500);  // 5 blocks; imported with the checkpoint at 4
  EXPECT_EQ(kv.import_blocks(b, "", 5, all, [](int32_t, int32_t, BlockId) {}, [](int32_t, int32_t, BlockId) {}), 5 + 2);
  EXPECT_EQ(kv.stats().num_checkpoints, 2);
  EXPECT_EQ(rec.stored, 2 + 5);
  EXPECT_EQ(rec.view, blocks_view());
  // A prompt taking 14 of the 16 blocks evicts blocks and checkpoints: only the blocks are removed.
  const auto big = prompt(48, 2000);
  ASSERT_TRUE(kv.allocate(2, big, 48, "").ok());
  EXPECT_GT(rec.removed, 0);
  EXPECT_LT(kv.stats().num_checkpoints, 2);
  EXPECT_EQ(rec.view, blocks_view());
  EXPECT_EQ(kv.check_invariants(), "");
}

}  // namespace
}  // namespace pagoda::kv
