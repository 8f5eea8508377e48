// Recurrent-state checkpoints (kv/state_checkpoint.cc, issue 38) under a
// KvManager with one full-attention group and a recurrent state group of S = 2
// blocks, blocks of 4 tokens, a checkpoint every 2 blocks (8 tokens): exact
// block ids through store (taken at a boundary, copied by flush, then
// cached-evictable), hit (the latest checkpoint inside the cached chain,
// restored by copies into fresh state blocks, held until the step ran), evict
// (LRU with the other cached blocks: cached K/V without their checkpoint give
// no hit), fork and free, with the invariants after every step.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::Ids;
using testing::Tokens;
using Copies = std::vector<BlockCopy>;

Ids group_table(const KvManager& kv, SeqId s, int32_t g) {
  auto t = kv.block_table(s, g);
  return Ids(t.begin(), t.end());
}

KvManager make_kv(int32_t num_blocks, int32_t interval = 2, double watermark = 0.0) {
  KvConfig c = testing::make_config(num_blocks, 4, watermark);
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  c.state_checkpoint_interval = interval;
  return KvManager(c);
}

// Flushes the pending checkpoint copies, returning them.
Copies flush(KvManager& kv) {
  Copies done;
  kv.flush_checkpoints([&](BlockId src, BlockId dst) { done.emplace_back(src, dst); });
  return done;
}

// Admits `t` with num_new tokens past its hit; *restore gets the checkpoint copies.
int32_t admit(KvManager& kv, SeqId id, const Tokens& t, int32_t num_new, Copies* restore) {
  auto a = kv.can_allocate(kv.match_prefix(t, ""), num_new);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.message());
  if (!a.ok()) return -1;
  auto got = kv.allocate(id, *a, restore);
  EXPECT_TRUE(got.ok()) << (got.ok() ? "" : got.message());
  return got.ok() ? *got : -1;
}

TEST(KvStateCheckpoint, ChunksEndAtCheckpointBoundaries) {
  KvManager kv = make_kv(16);
  EXPECT_TRUE(kv.config().enable_prefix_caching) << "checkpoints keep prefix caching on";
  EXPECT_EQ(kv.state_group(), 1);
  EXPECT_EQ(kv.checkpoint_tokens(), 8);
  EXPECT_EQ(kv.checkpoint_chunk(0, 10), 8);
  EXPECT_EQ(kv.checkpoint_chunk(3, 10), 5);
  EXPECT_EQ(kv.checkpoint_chunk(8, 8), 8);
  EXPECT_EQ(kv.checkpoint_chunk(8, 9), 8);
  EXPECT_EQ(kv.checkpoint_chunk(5, 2), 2);
  EXPECT_EQ(kv.checkpoint_chunk(15, 1), 1);
  // One cut per chunk, at the latest boundary inside it.
  EXPECT_EQ(kv.checkpoint_chunk(0, 20), 16);
  EXPECT_EQ(kv.checkpoint_chunk(3, 30), 29);
  EXPECT_EQ(kv.checkpoint_chunk(3, 29), 29) << "ends at a boundary: no cut";
  KvManager off = make_kv(16, 0);
  EXPECT_FALSE(off.config().enable_prefix_caching) << "no checkpoints: a recurrent state cannot be restored";
  EXPECT_EQ(off.checkpoint_tokens(), 0);
  EXPECT_EQ(off.checkpoint_chunk(0, 10), 10);
  KvConfig plain = testing::make_config(16, 4);
  plain.state_checkpoint_interval = 2;
  KvManager attention_only(plain);
  EXPECT_EQ(attention_only.checkpoint_tokens(), 0) << "no recurrent state: no checkpoints, no cut chunks";
  EXPECT_EQ(attention_only.checkpoint_chunk(0, 100), 100);
}

TEST(KvStateCheckpoint, StoreHitFreeWithExactBlockIds) {
  KvManager kv = make_kv(16);
  const Tokens t = testing::iota_tokens(100, 10);
  // Seq 1: its first chunk ends at the boundary of 8 tokens. Group 0 takes 1, 2; the state 3, 4.
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, kv.checkpoint_chunk(0, 10), &restore), 0);
  EXPECT_TRUE(restore.empty());
  EXPECT_EQ(group_table(kv, 1, 0), (Ids{1, 2}));
  EXPECT_EQ(group_table(kv, 1, 1), (Ids{3, 4}));
  kv.mark_computed(1, t, 8);
  // The checkpoint takes 5, 6, committed at once and held with the state blocks until the copy.
  EXPECT_EQ(kv.num_pending_checkpoint_copies(), 2);
  EXPECT_EQ(kv.pool().ref_count(3), 2);
  EXPECT_EQ(kv.pool().ref_count(5), 1);
  EXPECT_EQ(kv.stats().checkpoints_stored, 1);
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(flush(kv), (Copies{{3, 5}, {4, 6}}));
  EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0);
  EXPECT_EQ(kv.pool().ref_count(3), 1);
  EXPECT_EQ(kv.pool().ref_count(5), 0);
  EXPECT_TRUE(kv.cache().contains(5));
  EXPECT_TRUE(kv.cache().contains(6));
  EXPECT_EQ(kv.stats().num_checkpoints, 1);
  EXPECT_EQ(kv.stats().num_cached_evictable, 2) << "the checkpoint's blocks are cached-evictable";
  EXPECT_INVARIANTS(kv);
  EXPECT_TRUE(flush(kv).empty()) << "nothing pending twice";

  // The rest of the prompt: block 7; the state stays at 3, 4; no checkpoint at 10.
  Copies copies;
  ASSERT_TRUE(kv.append_slots(1, 2, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(group_table(kv, 1, 0), (Ids{1, 2, 7}));
  kv.mark_computed(1, t, 10);
  EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  EXPECT_INVARIANTS(kv);

  // A prompt sharing 10 tokens: its cached chain is 2 blocks and the checkpoint
  // after them is there, so the hit is 8 tokens with checkpoint blocks 5, 6.
  const Tokens t2 = testing::concat(Tokens(t.begin(), t.begin() + 10), testing::iota_tokens(500, 4));
  const PrefixMatch m = kv.match_prefix(t2, "");
  EXPECT_EQ(m.num_cached_tokens(), 8);
  EXPECT_EQ(Ids(m.checkpoint_blocks().begin(), m.checkpoint_blocks().end()), (Ids{5, 6}));
  // Another salt never sees it.
  EXPECT_EQ(testing::cached_tokens(kv, t2, "tenant"), 0);
  // A prompt sharing the first block only: block 0 is cached but no checkpoint ends there: no hit.
  EXPECT_EQ(testing::cached_tokens(kv, testing::concat(testing::iota_tokens(100, 4), testing::iota_tokens(900, 8))), 0);

  // Seq 2 from the hit: group 0 adopts 1, 2 and grows 8, 9 (the free queue:
  // 8..15, then 5, 6 by the flush, then seq 1's 4, 3, 7, 2, 1); the state gets
  // fresh 10, 11, restored from 5, 6 before its first step.
  EXPECT_EQ(kv.pool().free_queue(), (Ids{8, 9, 10, 11, 12, 13, 14, 15, 5, 6, 4, 3, 7, 2, 1}));
  auto a = kv.can_allocate(kv.match_prefix(t2, ""), 6);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_blocks_needed(), 2 + 2 + 2 + 2) << "2 fresh + 2 revived attention blocks, 2 state, 2 checkpoint";
  auto refused = kv.allocate(2, *a);
  ASSERT_FALSE(refused.ok()) << "a checkpoint hit without the restore copies";
  EXPECT_NE(refused.message().find("restore copies"), std::string::npos) << refused.message();
  EXPECT_INVARIANTS(kv);
  restore.clear();
  auto got = kv.allocate(2, *a, &restore);
  ASSERT_TRUE(got.ok()) << got.message();
  EXPECT_EQ(*got, 8);
  EXPECT_EQ(group_table(kv, 2, 0), (Ids{1, 2, 8, 9}));
  EXPECT_EQ(group_table(kv, 2, 1), (Ids{10, 11}));
  EXPECT_EQ(restore, (Copies{{5, 10}, {6, 11}}));
  EXPECT_EQ(kv.pool().ref_count(5), 1) << "held until the step that reads the restored state";
  EXPECT_EQ(kv.stats().checkpoints_hit, 1);
  EXPECT_EQ(kv.stats().prefix_hit_tokens, 8);
  EXPECT_INVARIANTS(kv);
  kv.mark_computed(2, t2, 14);
  EXPECT_EQ(kv.pool().ref_count(5), 0);
  EXPECT_EQ(kv.pool().ref_count(6), 0);
  EXPECT_TRUE(kv.cache().contains(5));
  EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0) << "14 is no boundary; the one at 8 exists";
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(kv.num_free_blocks(), 15);
  EXPECT_EQ(kv.stats().checkpoints_stored, 1);
}

TEST(KvStateCheckpoint, EvictedLikeCachedBlocks) {
  // 11 usable blocks. Seq 1 computes 8 tokens (1, 2; state 3, 4) and checkpoints into 5, 6.
  KvManager kv = make_kv(12);
  const Tokens t = testing::iota_tokens(100, 10);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, 8, &restore), 0);
  kv.mark_computed(1, t, 8);
  EXPECT_EQ(flush(kv), (Copies{{3, 5}, {4, 6}}));
  ASSERT_TRUE(kv.free(1));
  EXPECT_EQ(kv.pool().free_queue(), (Ids{7, 8, 9, 10, 11, 5, 6, 4, 3, 2, 1}));
  EXPECT_EQ(testing::cached_tokens(kv, t), 8);
  // A revalidated match loses a checkpoint evicted since: the whole hit goes.
  PrefixMatch stale = kv.match_prefix(t, "");
  ASSERT_EQ(stale.num_cached_tokens(), 8);

  // An unrelated 20-token sequence takes 7 blocks: 7..11 and the checkpoint's 5, 6 (LRU order).
  ASSERT_EQ(admit(kv, 2, testing::iota_tokens(700, 20), 20, &restore), 0);
  EXPECT_EQ(group_table(kv, 2, 0), (Ids{7, 8, 9, 10, 11}));
  EXPECT_EQ(group_table(kv, 2, 1), (Ids{5, 6}));
  EXPECT_EQ(kv.stats().checkpoints_evicted, 1);
  EXPECT_EQ(kv.stats().num_checkpoints, 0);
  EXPECT_INVARIANTS(kv);
  // Blocks 1, 2 still hold t's K/V, but without the state there is no hit.
  EXPECT_TRUE(kv.cache().contains(1));
  EXPECT_TRUE(kv.cache().contains(2));
  EXPECT_EQ(testing::cached_tokens(kv, t), 0);
  kv.revalidate(&stale);
  EXPECT_EQ(stale.num_cached_tokens(), 0);
  EXPECT_TRUE(stale.checkpoint_blocks().empty());
  ASSERT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);
}

TEST(KvStateCheckpoint, ForkSharesStateAndHoldsStayWithTheParent) {
  KvManager kv = make_kv(24);
  const Tokens t = testing::iota_tokens(100, 8);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, 8, &restore), 0);
  kv.mark_computed(1, t, 8);  // checkpoint 5, 6 of state 3, 4, pending
  // n > 1 at the end of the prompt: the child shares everything, the pending copy too.
  ASSERT_TRUE(kv.fork(1, 2).ok());
  EXPECT_EQ(kv.pool().ref_count(3), 3);
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(flush(kv), (Copies{{3, 5}, {4, 6}}));
  EXPECT_EQ(kv.pool().ref_count(3), 2);
  EXPECT_INVARIANTS(kv);
  // The child's first decode copies the shared state into 7, 8 (copy-on-write
  // comes before growth), then gets block 9 for token 8.
  Copies copies;
  ASSERT_TRUE(kv.append_slots(2, 1, &copies));
  EXPECT_EQ(copies, (Copies{{3, 7}, {4, 8}}));
  EXPECT_EQ(group_table(kv, 2, 0), (Ids{1, 2, 9}));
  EXPECT_EQ(group_table(kv, 2, 1), (Ids{7, 8}));
  EXPECT_INVARIANTS(kv);

  // Seq 3 hits the checkpoint and forks before its first step: the hold stays the parent's.
  const Tokens t3 = testing::concat(t, testing::iota_tokens(300, 3));
  restore.clear();
  ASSERT_EQ(admit(kv, 3, t3, 3, &restore), 8);
  EXPECT_EQ(group_table(kv, 3, 0), (Ids{1, 2, 10}));
  EXPECT_EQ(group_table(kv, 3, 1), (Ids{11, 12}));
  EXPECT_EQ(restore, (Copies{{5, 11}, {6, 12}}));
  EXPECT_EQ(kv.pool().ref_count(5), 1);
  ASSERT_TRUE(kv.fork(3, 4).ok());
  EXPECT_EQ(kv.pool().ref_count(5), 1);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(4));
  EXPECT_EQ(kv.pool().ref_count(5), 1);
  ASSERT_TRUE(kv.free(3));  // freed before its step: the hold goes with it
  EXPECT_EQ(kv.pool().ref_count(5), 0);
  EXPECT_TRUE(kv.cache().contains(5));
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  ASSERT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(kv.num_free_blocks(), 23);
  EXPECT_EQ(kv.stats().num_checkpoints, 1);
}

TEST(KvStateCheckpoint, OnlyAtBoundariesAboveTheWatermarkAndOnce) {
  // Past a boundary in one step (no cut chunk): no state at the boundary, no checkpoint.
  {
    KvManager kv = make_kv(16);
    ASSERT_EQ(testing::prefill(kv, 1, testing::iota_tokens(0, 10)), 0);
    EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0);
    EXPECT_EQ(kv.stats().checkpoints_stored, 0);
    EXPECT_INVARIANTS(kv);
  }
  // 5 usable blocks: 8 tokens take 2 + 2, one is left, a checkpoint needs 2: none (best effort).
  {
    KvManager kv = make_kv(6);
    ASSERT_EQ(testing::prefill(kv, 1, testing::iota_tokens(0, 8)), 0);
    EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0);
    EXPECT_EQ(kv.stats().checkpoints_stored, 0);
    EXPECT_INVARIANTS(kv);
  }
  // The same prefix twice: one checkpoint; every boundary of a longer prompt gets its own.
  {
    KvManager kv = make_kv(40);
    const Tokens t = testing::iota_tokens(0, 17);
    Copies restore;
    ASSERT_EQ(admit(kv, 1, t, 8, &restore), 0);
    kv.mark_computed(1, t, 8);
    flush(kv);
    ASSERT_TRUE(kv.append_slots(1, 8, &restore));
    kv.mark_computed(1, t, 16);
    EXPECT_EQ(flush(kv).size(), 2u);
    EXPECT_EQ(kv.stats().checkpoints_stored, 2);
    EXPECT_EQ(testing::cached_tokens(kv, t), 16);
    ASSERT_TRUE(kv.free(1));
    // The same prompt again hits 16 and stores nothing new.
    restore.clear();
    ASSERT_EQ(admit(kv, 2, t, 1, &restore), 16);
    EXPECT_EQ(restore.size(), 2u);
    kv.mark_computed(2, t, 17);
    EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0);
    EXPECT_EQ(kv.stats().checkpoints_stored, 2);
    EXPECT_EQ(kv.stats().num_checkpoints, 2);
    EXPECT_INVARIANTS(kv);
    // A prompt diverging in block 3 hits the checkpoint at 8 only.
    Tokens d = t;
    d[13] = 999;
    EXPECT_EQ(testing::cached_tokens(kv, d), 8);
    ASSERT_TRUE(kv.free(2));
    EXPECT_INVARIANTS(kv);
  }
}

}  // namespace
}  // namespace pagoda::kv
