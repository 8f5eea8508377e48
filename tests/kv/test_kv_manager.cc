// Model-free tests of the paged KV bookkeeping: exact block ids, ref counts and
// eviction order (in the spirit of vLLM's tests/v1/core/test_prefix_caching.py).
#include <gtest/gtest.h>

#include <vector>

#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::can_allocate;
using testing::cache_prefix;
using testing::cached_tokens;
using testing::concat;
using testing::Ids;
using testing::iota_tokens;
using testing::make_config;
using testing::prefill;
using testing::prefill_and_fork;
using testing::table;
using testing::Tokens;
using testing::with_cached;

TEST(BlockPool, InitialOrderPopAndReverseFree) {
  BlockPool pool(6);
  EXPECT_EQ(pool.num_usable_blocks(), 5);
  EXPECT_EQ(pool.free_queue(), (Ids{1, 2, 3, 4, 5}));
  EXPECT_EQ(pool.pop_free(), 1);
  EXPECT_EQ(pool.pop_free(), 2);
  EXPECT_EQ(pool.ref_count(1), 1);
  pool.incref(4);  // touch from the middle of the queue
  EXPECT_EQ(pool.free_queue(), (Ids{3, 5}));
  EXPECT_FALSE(pool.in_free_queue(4));
  EXPECT_TRUE(pool.decref(4));
  EXPECT_EQ(pool.free_queue(), (Ids{3, 5, 4}));
  pool.incref(1);
  EXPECT_FALSE(pool.decref(1));
  EXPECT_TRUE(pool.decref(1));
  EXPECT_EQ(pool.free_queue(), (Ids{3, 5, 4, 1}));
  EXPECT_EQ(pool.check(), "");
}

TEST(KvManager, AllocateAndFreeExactIds) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(100, 10);
  ASSERT_EQ(*kv.allocate(1, t, 10, ""), 0);
  EXPECT_EQ(table(kv, 1), (Ids{1, 2, 3}));
  for (BlockId b : {1, 2, 3}) EXPECT_EQ(kv.pool().ref_count(b), 1);
  EXPECT_EQ(kv.pool().free_queue(), (Ids{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(kv.num_computed_tokens(1), 0);
  EXPECT_EQ(kv.num_committed_blocks(1), 0);

  kv.mark_computed(1, t, 10);
  EXPECT_EQ(kv.num_committed_blocks(1), 2);  // block 3 holds 2 of 4 tokens: not committed
  KvStats st = kv.stats();
  EXPECT_EQ(st.num_blocks_total, 9);
  EXPECT_EQ(st.num_used, 3);
  EXPECT_EQ(st.num_free, 6);
  EXPECT_EQ(st.num_cached, 2);
  EXPECT_INVARIANTS(kv);

  EXPECT_TRUE(kv.free(1));
  EXPECT_FALSE(kv.free(1));
  // Released last block first: the sequence's tail is evicted before its head.
  EXPECT_EQ(kv.pool().free_queue(), (Ids{4, 5, 6, 7, 8, 9, 3, 2, 1}));
  st = kv.stats();
  EXPECT_EQ(st.num_used, 0);
  EXPECT_EQ(st.num_cached_evictable, 2);
  EXPECT_EQ(st.num_free, 7);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, NullBlockNeverHandedOut) {
  KvManager kv(make_config(5, 2));
  ASSERT_TRUE(kv.allocate(1, iota_tokens(0, 8), 8, "").ok());
  EXPECT_EQ(table(kv, 1), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_FALSE(can_allocate(kv, iota_tokens(50, 1), 1));
  EXPECT_FALSE(kv.allocate(2, iota_tokens(50, 1), 1, "").ok());
  EXPECT_FALSE(kv.has_seq(2));
  EXPECT_INVARIANTS(kv);
}

// A 12-token prompt computed and freed leaves blocks 1, 2, 3 cached; prompts
// sharing 0..3 full blocks hit exactly those.
TEST(KvManager, PrefixHitsOnOneToKFullBlocks) {
  KvManager kv(make_config(16, 4));
  const Tokens base = iota_tokens(100, 12);
  ASSERT_EQ(*kv.allocate(1, base, 12, ""), 0);
  kv.mark_computed(1, base, 12);
  EXPECT_EQ(kv.num_committed_blocks(1), 3);
  kv.free(1);
  EXPECT_EQ(kv.pool().free_queue(), (Ids{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 2, 1}));

  for (int k = 0; k <= 3; ++k) {
    // k shared blocks, then a different token and 3 more.
    Tokens t(base.begin(), base.begin() + 4 * k);
    t = concat(t, Tokens{7, 7, 7, 7});
    EXPECT_EQ(cached_tokens(kv, t), 4 * k) << "k=" << k;
  }
  // Hit on 2 blocks: they leave the free queue; one fresh block from the head.
  const Tokens two = concat(Tokens(base.begin(), base.begin() + 8), Tokens{9, 9});
  ASSERT_EQ(*kv.allocate(2, two, 2, ""), 8);
  EXPECT_EQ(table(kv, 2), (Ids{1, 2, 4}));
  EXPECT_EQ(kv.num_computed_tokens(2), 8);
  EXPECT_EQ(kv.num_committed_blocks(2), 2);
  EXPECT_EQ(kv.pool().free_queue(), (Ids{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3}));
  // A second sharer of block 1 only: ref counts 2 and 1.
  const Tokens one = concat(Tokens(base.begin(), base.begin() + 4), Tokens{8, 8, 8, 8, 8});
  ASSERT_EQ(*kv.allocate(3, one, 5, ""), 4);
  EXPECT_EQ(table(kv, 3), (Ids{1, 5, 6}));
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  EXPECT_EQ(kv.pool().ref_count(2), 1);
  KvStats st = kv.stats();
  EXPECT_EQ(st.prefix_hit_tokens, 12);
  EXPECT_EQ(st.prefix_query_tokens, 12 + 10 + 9);
  EXPECT_INVARIANTS(kv);

  // A prompt of exactly 3 full blocks hits only 2: the last token is computed.
  EXPECT_EQ(cached_tokens(kv, base), 8);
  kv.free(2);
  kv.free(3);
  EXPECT_EQ(kv.stats().num_used, 0);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, PartialLastBlockIsNeverShared) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 6);  // block 1 full, block 2 holds 2 tokens
  ASSERT_EQ(*kv.allocate(1, t, 6, ""), 0);
  kv.mark_computed(1, t, 6);
  EXPECT_EQ(kv.num_committed_blocks(1), 1);
  EXPECT_EQ(kv.stats().num_cached, 1);
  kv.free(1);
  EXPECT_EQ(kv.pool().free_queue(), (Ids{3, 4, 5, 6, 7, 8, 9, 2, 1}));

  const Tokens longer = concat(t, Tokens{6, 7, 8});
  ASSERT_EQ(*kv.allocate(2, longer, 5, ""), 4);
  EXPECT_EQ(table(kv, 2), (Ids{1, 3, 4}));  // block 2 (the old partial block) is not reused as a hit
  EXPECT_TRUE(kv.pool().in_free_queue(2));
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, LruEvictsLeastRecentlyFreedFirst) {
  KvManager kv(make_config(5, 4));  // usable blocks 1..4
  const Tokens a = iota_tokens(10, 4), b = iota_tokens(20, 4), c = iota_tokens(30, 4);
  ASSERT_EQ(prefill(kv, 1, a), 0);
  ASSERT_EQ(prefill(kv, 2, b), 0);
  ASSERT_EQ(prefill(kv, 3, c), 0);
  EXPECT_EQ(table(kv, 1), (Ids{1}));
  EXPECT_EQ(table(kv, 2), (Ids{2}));
  EXPECT_EQ(table(kv, 3), (Ids{3}));
  kv.free(2);
  kv.free(1);
  kv.free(3);
  EXPECT_EQ(kv.pool().free_queue(), (Ids{4, 2, 1, 3}));
  EXPECT_EQ(kv.stats().num_cached_evictable, 3);

  auto probe = [&](const Tokens& t) { return cached_tokens(kv, concat(t, Tokens{0})); };
  ASSERT_TRUE(kv.allocate(4, iota_tokens(40, 4), 4, "").ok());
  EXPECT_EQ(table(kv, 4), (Ids{4}));  // plain free block first, no eviction
  EXPECT_EQ(kv.stats().num_evictions, 0);
  ASSERT_TRUE(kv.allocate(5, iota_tokens(50, 4), 4, "").ok());
  EXPECT_EQ(table(kv, 5), (Ids{2}));  // b was freed first: evicted first
  EXPECT_EQ(kv.stats().num_evictions, 1);
  EXPECT_EQ(probe(b), 0);
  EXPECT_EQ(probe(a), 4);
  EXPECT_EQ(probe(c), 4);
  ASSERT_TRUE(kv.allocate(6, iota_tokens(60, 4), 4, "").ok());
  EXPECT_EQ(table(kv, 6), (Ids{1}));
  EXPECT_EQ(probe(a), 0);
  EXPECT_EQ(probe(c), 4);
  EXPECT_EQ(kv.stats().num_evictions, 2);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, HitOnFreeBlockRemovesItFromTheQueue) {
  const Tokens t = iota_tokens(0, 8);
  KvManager kv = with_cached(make_config(8, 4), t);
  EXPECT_EQ(kv.pool().free_queue(), (Ids{3, 4, 5, 6, 7, 2, 1}));
  EXPECT_EQ(kv.stats().num_cached_evictable, 2);

  const Tokens u = concat(t, Tokens{99});
  ASSERT_EQ(*kv.allocate(2, u, 1, ""), 8);
  EXPECT_EQ(table(kv, 2), (Ids{1, 2, 3}));
  EXPECT_EQ(kv.pool().free_queue(), (Ids{4, 5, 6, 7}));
  EXPECT_EQ(kv.pool().ref_count(1), 1);
  EXPECT_EQ(kv.pool().ref_count(2), 1);
  KvStats st = kv.stats();
  EXPECT_EQ(st.num_cached_evictable, 0);
  EXPECT_EQ(st.num_used, 3);
  // A second hit on blocks in use only raises their ref counts.
  ASSERT_EQ(*kv.allocate(3, u, 1, ""), 8);
  EXPECT_EQ(table(kv, 3), (Ids{1, 2, 4}));
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, RevivedHitsCountAgainstFreeBlocks) {
  // 3 usable blocks, 2 cached and free. Reviving both and taking one fresh
  // block uses the whole pool; asking for 2 fresh ones is refused untouched.
  const Tokens t = iota_tokens(0, 4);
  KvManager kv = with_cached(make_config(4, 2), t);
  const Tokens u = concat(t, Tokens{5, 6, 7});
  EXPECT_EQ(cached_tokens(kv, u), 4);
  EXPECT_FALSE(can_allocate(kv, u, 3));  // 2 revived + 2 fresh > 3
  const auto before = kv.pool().free_queue();
  EXPECT_FALSE(kv.allocate(2, u, 3, "").ok());
  EXPECT_EQ(kv.pool().free_queue(), before);
  EXPECT_EQ(kv.stats().prefix_query_tokens, 4);
  EXPECT_TRUE(can_allocate(kv, u, 2));
  ASSERT_EQ(*kv.allocate(2, u, 2, ""), 4);
  EXPECT_EQ(table(kv, 2), (Ids{1, 2, 3}));
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, WatermarkKeepsBlocksFreeAtAdmissionOnly) {
  KvManager kv(make_config(101, 1, 0.05));  // 100 usable, 5 kept free at admission
  EXPECT_EQ(kv.watermark_blocks(), 5);
  EXPECT_FALSE(can_allocate(kv, iota_tokens(0, 96), 96));
  EXPECT_FALSE(kv.allocate(1, iota_tokens(0, 96), 96, "").ok());
  EXPECT_EQ(kv.num_free_blocks(), 100);
  EXPECT_TRUE(can_allocate(kv, iota_tokens(0, 95), 95));
  ASSERT_TRUE(kv.allocate(1, iota_tokens(0, 95), 95, "").ok());
  kv.mark_computed(1, iota_tokens(0, 95), 95);
  // A running sequence may grow into the watermark.
  std::vector<BlockCopy> copies;
  EXPECT_TRUE(kv.append_slots(1, 5, &copies));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_TRUE(copies.empty());
  EXPECT_INVARIANTS(kv);
  KvConfig def;
  def.num_blocks = 101;
  EXPECT_EQ(KvManager(def).watermark_blocks(), 1);  // default 1%
}

TEST(KvManager, AppendSlotsRefusalLeavesNoPartialState) {
  KvManager kv(make_config(5, 4));  // 4 usable
  const Tokens t = iota_tokens(0, 6);
  prefill_and_fork(kv, t);  // blocks 1, 2
  // Child writes position 6 (shared partial block 2 -> CoW) and needs 2 more
  // blocks for 12 tokens: 3 > 2 free, refused.
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(kv.can_append_slots(2, 12));
  EXPECT_FALSE(kv.append_slots(2, 12, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table(kv, 2), (Ids{1, 2}));
  EXPECT_EQ(kv.pool().ref_count(2), 2);
  EXPECT_EQ(kv.num_free_blocks(), 2);
  EXPECT_TRUE(kv.append_slots(2, 6, &copies));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{2, 3}}));
  EXPECT_EQ(table(kv, 2), (Ids{1, 3, 4}));
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, ForkSharesBlocksAndCopiesOnWrite) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 6);
  prefill_and_fork(kv, t);
  EXPECT_FALSE(kv.fork(1, 2).ok());
  EXPECT_FALSE(kv.fork(7, 8).ok());
  EXPECT_EQ(table(kv, 2), (Ids{1, 2}));
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  EXPECT_EQ(kv.pool().ref_count(2), 2);
  EXPECT_EQ(kv.num_computed_tokens(2), 6);
  EXPECT_EQ(kv.num_committed_blocks(2), 1);
  EXPECT_INVARIANTS(kv);

  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(2, 1, &copies));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{2, 3}}));
  EXPECT_EQ(table(kv, 2), (Ids{1, 3}));
  EXPECT_EQ(kv.pool().ref_count(1), 2);  // full block stays shared
  EXPECT_EQ(kv.pool().ref_count(2), 1);
  EXPECT_EQ(kv.pool().ref_count(3), 1);
  EXPECT_EQ(kv.stats().num_cow_copies, 1);
  // The parent is now the only owner of block 2: no copy.
  ASSERT_TRUE(kv.append_slots(1, 3, &copies));
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(table(kv, 1), (Ids{1, 2, 4}));

  // Divergent continuations commit their own full blocks.
  const Tokens p = concat(t, Tokens{100, 101, 102});
  const Tokens c = concat(t, Tokens{200});
  kv.mark_computed(1, p, 9);
  kv.mark_computed(2, c, 7);
  EXPECT_EQ(kv.num_committed_blocks(1), 2);
  EXPECT_EQ(kv.num_committed_blocks(2), 1);
  EXPECT_INVARIANTS(kv);
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.stats().num_used, 0);
  EXPECT_EQ(kv.num_free_blocks(), 9);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, ForkOnBlockBoundaryNeedsNoCopy) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 8);
  prefill_and_fork(kv, t);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(2, 1, &copies));
  ASSERT_TRUE(kv.append_slots(1, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table(kv, 1), (Ids{1, 2, 4}));
  EXPECT_EQ(table(kv, 2), (Ids{1, 2, 3}));
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, ForkedSharedBlockCommittedByBothOwners) {
  // Parent allocated slots ahead; child forks before the block fills. Both
  // later commit the same (CoW-separated) content without corrupting the cache.
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 4);
  ASSERT_TRUE(kv.allocate(1, t, 3, "").ok());
  kv.mark_computed(1, t, 3);
  ASSERT_TRUE(kv.fork(1, 2).ok());
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(1, 1, &copies));  // block 1 shared -> parent gets a copy
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{1, 2}}));
  ASSERT_TRUE(kv.append_slots(2, 1, &copies));  // child is sole owner of block 1 now
  kv.mark_computed(1, t, 4);
  kv.mark_computed(2, t, 4);
  EXPECT_EQ(kv.stats().num_cached, 1);
  EXPECT_EQ(cached_tokens(kv, concat(t, Tokens{9})), 4);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, DuplicateComputeMapsToTheFirstCachedBlock) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 9);
  ASSERT_EQ(*kv.allocate(1, t, 9, ""), 0);
  ASSERT_EQ(*kv.allocate(2, t, 9, ""), 0);  // nothing committed yet: computed twice
  kv.mark_computed(1, t, 9);
  kv.mark_computed(2, t, 9);
  EXPECT_EQ(kv.stats().num_cached, 2);  // blocks 1, 2 of seq 1 only
  ASSERT_EQ(*kv.allocate(3, t, 1, ""), 8);
  EXPECT_EQ(table(kv, 3), (Ids{1, 2, 7}));
  // Seq 2's duplicate full blocks are plain blocks: freed to the plain pool.
  kv.free(2);
  KvStats st = kv.stats();
  EXPECT_EQ(st.num_cached_evictable, 0);
  EXPECT_EQ(st.num_used, 4);  // 1, 2, 3 and 7
  EXPECT_EQ(st.num_free, 5);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, CacheSaltIsolatesTenants) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 9);
  ASSERT_EQ(prefill(kv, 1, t, "tenant-a"), 0);
  EXPECT_EQ(cached_tokens(kv, t, "tenant-a"), 8);
  EXPECT_EQ(cached_tokens(kv, t, "tenant-b"), 0);
  EXPECT_EQ(cached_tokens(kv, t), 0);
  ASSERT_EQ(*kv.allocate(2, t, 9, "tenant-b"), 0);
  ASSERT_EQ(*kv.allocate(3, t, 1, "tenant-a"), 8);
  EXPECT_EQ(table(kv, 3)[0], 1);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, ModelFingerprintIsPartOfTheKey) {
  const Tokens t = iota_tokens(0, 16);
  const Hash128 a = PrefixCache::default_hash(Hash128{}, t, 1, "");
  EXPECT_FALSE(a == PrefixCache::default_hash(Hash128{}, t, 2, ""));
  EXPECT_FALSE(a == PrefixCache::default_hash(Hash128{}, t, 1, "s"));
  EXPECT_FALSE(a == PrefixCache::default_hash(Hash128{1, 0}, t, 1, ""));
  EXPECT_TRUE(a == PrefixCache::default_hash(Hash128{}, t, 1, ""));
}

TEST(KvManager, ForcedHashCollisionIsRefusedByTheTokenCheck) {
  KvManager kv(make_config(10, 4));
  // Every block hashes to the same key.
  kv.mutable_cache_for_testing().set_hash_fn_for_testing(
      [](const Hash128&, std::span<const TokenId>, uint64_t, std::string_view) { return Hash128{42, 42}; });
  const Tokens x = {1, 1, 1, 1, 5};
  const Tokens y = {2, 2, 2, 2, 5};
  cache_prefix(kv, x);
  EXPECT_EQ(kv.stats().num_cached, 1);
  EXPECT_EQ(cached_tokens(kv, x), 4);
  EXPECT_EQ(cached_tokens(kv, y), 0);  // same key, other tokens
  ASSERT_EQ(*kv.allocate(2, y, 5, ""), 0);
  EXPECT_EQ(table(kv, 2), (Ids{3, 4}));
  kv.mark_computed(2, y, 5);
  EXPECT_EQ(kv.stats().num_cached, 1);  // y's block may not take the key
  EXPECT_GE(kv.stats().collisions_refused, 2);
  EXPECT_EQ(cached_tokens(kv, x), 4);
  EXPECT_INVARIANTS(kv);
}

TEST(PrefixCache, ParentEntryIsConfirmedNotJustItsKey) {
  // Block keys collide for all first blocks; the second block's key depends
  // only on the (colliding) parent key and its tokens.
  PrefixCache cache(8, 0);
  cache.set_hash_fn_for_testing([](const Hash128& parent, std::span<const TokenId> t, uint64_t fp,
                                   std::string_view salt) {
    return parent == Hash128{} ? Hash128{7, 7} : PrefixCache::default_hash(parent, t, fp, salt);
  });
  const Tokens a = {1, 1}, b = {2, 2}, c = {3, 3};
  const Hash128 k0 = cache.key(Hash128{}, a, "");
  const Hash128 k1 = cache.key(k0, c, "");
  const EntryId ea = cache.insert(1, k0, kRootEntry, a, "");
  const EntryId ec = cache.insert(2, k1, ea, c, "");
  ASSERT_NE(ea, kNoEntry);
  ASSERT_NE(ec, kNoEntry);
  EXPECT_EQ(cache.find(k1, ea, c, ""), 2);
  // While a's entry is live, b may not take the colliding key.
  EXPECT_EQ(cache.find(k0, kRootEntry, b, ""), kNullBlock);
  EXPECT_EQ(cache.insert(5, k0, kRootEntry, b, ""), kNoEntry);
  EXPECT_EQ(cache.collisions_refused(), 2);
  cache.erase(1);  // the parent is evicted; its child stays cached
  const EntryId eb = cache.insert(3, cache.key(Hash128{}, b, ""), kRootEntry, b, "");  // same key k0, prefix b
  ASSERT_NE(eb, kNoEntry);
  EXPECT_EQ(cache.find(k0, kRootEntry, b, ""), 3);
  // b + c has the same keys as a + c, and c's tokens match: refused because
  // block 2 extends entry ea, not eb.
  EXPECT_EQ(cache.find(k1, eb, c, ""), kNullBlock);
  // Block 4, really computed after b, may take the key over from unreachable block 2.
  EXPECT_NE(cache.insert(4, k1, eb, c, ""), kNoEntry);
  EXPECT_FALSE(cache.contains(2));
  EXPECT_EQ(cache.find(k1, eb, c, ""), 4);
  EXPECT_EQ(cache.check(), "");
}

TEST(PrefixCache, RecommitUnderALiveParentTakesOverAStaleChild) {
  PrefixCache cache(8, 0);
  const Tokens a = {1, 1}, c = {3, 3};
  const Hash128 k0 = cache.key(Hash128{}, a, "");
  const Hash128 k1 = cache.key(k0, c, "");
  const EntryId ea = cache.insert(1, k0, kRootEntry, a, "");
  ASSERT_NE(cache.insert(2, k1, ea, c, ""), kNoEntry);
  cache.erase(1);
  const EntryId ea2 = cache.insert(3, k0, kRootEntry, a, "");  // same prefix recomputed in block 3
  EXPECT_EQ(cache.find(k1, ea2, c, ""), kNullBlock);           // block 2 cannot be confirmed
  const EntryId ec2 = cache.insert(4, k1, ea2, c, "");
  ASSERT_NE(ec2, kNoEntry);
  EXPECT_FALSE(cache.contains(2));
  EXPECT_EQ(cache.find(k1, ea2, c, ""), 4);
  EXPECT_EQ(cache.collisions_refused(), 0);
  EXPECT_EQ(cache.check(), "");
}

TEST(KvManager, ForcedKeyCollisionBetweenSaltsIsRefusedBySaltCheck) {
  KvManager kv(make_config(10, 4));
  // Keys ignore the salt: the same prompt of two tenants has the same keys.
  kv.mutable_cache_for_testing().set_hash_fn_for_testing(
      [](const Hash128& parent, std::span<const TokenId> t, uint64_t fp, std::string_view) {
        return PrefixCache::default_hash(parent, t, fp, "");
      });
  const Tokens t = iota_tokens(0, 9);  // two full blocks + 1
  ASSERT_EQ(prefill(kv, 1, t, "tenant-a"), 0);
  EXPECT_EQ(table(kv, 1), (Ids{1, 2, 3}));
  kv.free(1);
  EXPECT_EQ(kv.stats().num_cached, 2);
  EXPECT_EQ(kv.cache().salt_of(1), "tenant-a");
  EXPECT_EQ(kv.cache().num_salts(), 1);
  EXPECT_EQ(kv.stats().collisions_refused, 0);
  // Tenant b: block 1's key matches, its tokens and parent match, its salt does not.
  EXPECT_EQ(cached_tokens(kv, t, "tenant-b"), 0);
  EXPECT_EQ(kv.stats().collisions_refused, 1);
  EXPECT_EQ(cached_tokens(kv, t), 0);  // the empty salt is a salt too
  EXPECT_EQ(kv.stats().collisions_refused, 2);
  ASSERT_EQ(*kv.allocate(2, t, 9, "tenant-b"), 0);  // refusal 3
  // Fresh blocks from the free queue (3, 2, 1 were freed in reverse): the
  // cached blocks 1 and 2 are not revived for b.
  EXPECT_EQ(table(kv, 2), (Ids{4, 5, 6}));
  kv.mark_computed(2, t, 9);  // b's first block may not take a's key: refusal 4, chain broken after it
  EXPECT_EQ(kv.stats().collisions_refused, 4);
  EXPECT_EQ(kv.stats().num_cached, 2);
  EXPECT_FALSE(kv.cache().contains(4));
  EXPECT_FALSE(kv.cache().contains(5));
  // Tenant a still hits its own blocks.
  ASSERT_EQ(*kv.allocate(3, t, 1, "tenant-a"), 8);
  EXPECT_EQ(table(kv, 3), (Ids{1, 2, 7}));
  EXPECT_INVARIANTS(kv);
}

TEST(PrefixCache, SaltIsStoredInternedAndVerified) {
  PrefixCache cache(8, 0);
  cache.set_hash_fn_for_testing([](const Hash128& parent, std::span<const TokenId> t, uint64_t fp,
                                   std::string_view) { return PrefixCache::default_hash(parent, t, fp, ""); });
  const Tokens a = {1, 1}, c = {3, 3};
  const Hash128 ka = cache.key(Hash128{}, a, "x");
  const Hash128 kc = cache.key(Hash128{}, c, "x");
  ASSERT_TRUE(ka == cache.key(Hash128{}, a, "y"));  // forced: salts do not change keys
  const EntryId ea = cache.insert(1, ka, kRootEntry, a, "x");
  ASSERT_NE(ea, kNoEntry);
  ASSERT_NE(cache.insert(2, kc, kRootEntry, c, "x"), kNoEntry);
  EXPECT_EQ(cache.num_salts(), 1);  // one interned copy for both blocks
  EXPECT_EQ(cache.salt_of(1).data(), cache.salt_of(2).data());
  EXPECT_EQ(cache.find(ka, kRootEntry, a, "x"), 1);
  EXPECT_EQ(cache.find(ka, kRootEntry, a, "y"), kNullBlock);
  EXPECT_EQ(cache.find(ka, kRootEntry, a, ""), kNullBlock);
  EXPECT_EQ(cache.find(ka, kRootEntry, a, "xx"), kNullBlock);
  EXPECT_EQ(cache.collisions_refused(), 3);
  // Same key, tokens and parent under another salt: refused, block 3 stays uncached.
  EXPECT_EQ(cache.insert(3, ka, kRootEntry, a, "y"), kNoEntry);
  EXPECT_EQ(cache.collisions_refused(), 4);
  EXPECT_FALSE(cache.contains(3));
  EXPECT_EQ(cache.num_salts(), 1);
  // Identical content under the same salt maps to the existing entry.
  EXPECT_EQ(cache.insert(4, ka, kRootEntry, a, "x"), ea);
  EXPECT_FALSE(cache.contains(4));
  EXPECT_EQ(cache.check(), "");
  // The interned salt lives while a block holds it.
  cache.erase(1);
  EXPECT_EQ(cache.num_salts(), 1);
  EXPECT_EQ(cache.salt_of(2), "x");
  cache.erase(2);
  EXPECT_EQ(cache.num_salts(), 0);
  EXPECT_EQ(cache.check(), "");
  // Once a's block is gone, tenant y may cache the same prompt under the key.
  EXPECT_NE(cache.insert(3, ka, kRootEntry, a, "y"), kNoEntry);
  EXPECT_EQ(cache.find(ka, kRootEntry, a, "y"), 3);
  EXPECT_EQ(cache.find(ka, kRootEntry, a, "x"), kNullBlock);
  EXPECT_EQ(cache.salt_of(3), "y");
  EXPECT_EQ(cache.check(), "");
}

TEST(KvManager, PrefixCachingCanBeDisabled) {
  KvConfig cfg = make_config(10, 4);
  cfg.enable_prefix_caching = false;
  KvManager kv(cfg);
  const Tokens t = iota_tokens(0, 9);
  ASSERT_EQ(prefill(kv, 1, t), 0);
  EXPECT_EQ(kv.stats().num_cached, 0);
  EXPECT_EQ(cached_tokens(kv, t), 0);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, BlockSizeOneAndTwoHundredFiftySix) {
  for (int32_t bs : {1, 256}) {
    KvManager kv(make_config(6, bs));
    const Tokens t = iota_tokens(0, 3 * bs);
    ASSERT_EQ(prefill(kv, 1, t), 0);
    EXPECT_EQ(kv.num_committed_blocks(1), 3);
    ASSERT_EQ(*kv.allocate(2, t, 1, ""), 2 * bs) << bs;
    EXPECT_EQ(table(kv, 2), (Ids{1, 2, 4}));
    EXPECT_INVARIANTS(kv);
  }
}

// Admission walks the prefix cache once: match_prefix looks up, can_allocate
// and allocate only consume the match.
TEST(KvManager, AdmissionLooksUpOnce) {
  const Tokens base = iota_tokens(100, 12);
  KvManager kv = with_cached(make_config(16, 4), base);
  const int64_t before = kv.stats().prefix_lookups;
  const Tokens two = concat(Tokens(base.begin(), base.begin() + 8), Tokens{9, 9});
  PrefixMatch m = kv.match_prefix(two, "");
  EXPECT_EQ(kv.stats().prefix_lookups, before + 1);
  EXPECT_EQ(m.num_cached_tokens(), 8);
  EXPECT_EQ(m.blocks()[0], 1);
  EXPECT_EQ(m.blocks()[1], 2);
  auto a = kv.can_allocate(m, 2);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->num_cached_tokens(), 8);
  EXPECT_EQ(a->num_new_tokens(), 2);
  EXPECT_EQ(a->num_blocks_needed(), 3);  // blocks 1 and 2 revived, one fresh
  ASSERT_EQ(*kv.allocate(2, *a), 8);
  EXPECT_EQ(table(kv, 2), (Ids{1, 2, 4}));
  EXPECT_EQ(kv.num_computed_tokens(2), 8);
  EXPECT_EQ(kv.stats().prefix_lookups, before + 1);
  // The same admission again: the seq exists; and it is stale anyway.
  EXPECT_FALSE(kv.allocate(2, *a).ok());
  auto again = kv.allocate(3, *a);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.message().find("stale"), std::string::npos) << again.message();
  // The one-call form: one lookup too.
  ASSERT_EQ(*kv.allocate(3, concat(Tokens(base.begin(), base.begin() + 4), Tokens{5}), 1, ""), 4);
  EXPECT_EQ(kv.stats().prefix_lookups, before + 2);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, StaleMatchIsRefusedThenRevalidatedWithoutHashing) {
  const Tokens a = iota_tokens(0, 8);
  KvManager kv = with_cached(make_config(5, 4), a);  // usable blocks 1..4; a committed 1, 2
  EXPECT_EQ(kv.pool().free_queue(), (Ids{3, 4, 2, 1}));
  const Tokens u = concat(a, Tokens{9});
  PrefixMatch m = kv.match_prefix(u, "");
  ASSERT_EQ(m.num_cached_tokens(), 8);
  EXPECT_EQ(m.next_block_key(), nullptr);  // both hittable blocks hit
  // Another sequence takes 3 blocks: 3, 4 and 2, evicting a's second block.
  ASSERT_EQ(*kv.allocate(2, iota_tokens(50, 12), 12, ""), 0);
  EXPECT_EQ(table(kv, 2), (Ids{3, 4, 2}));
  auto stale = kv.can_allocate(m, 1);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.message().find("stale"), std::string::npos) << stale.message();
  const int64_t lookups = kv.stats().prefix_lookups;
  kv.revalidate(&m);
  EXPECT_EQ(kv.stats().prefix_lookups, lookups);
  EXPECT_EQ(m.num_cached_tokens(), 4);
  EXPECT_EQ(m.blocks()[0], 1);
  // The evicted block's key is the next one to compute, as a fresh lookup says.
  const PrefixMatch fresh = kv.match_prefix(u, "");
  ASSERT_NE(m.next_block_key(), nullptr);
  ASSERT_NE(fresh.next_block_key(), nullptr);
  EXPECT_TRUE(*m.next_block_key() == *fresh.next_block_key());
  const Hash128 k0 = kv.cache().key(Hash128{}, Tokens(a.begin(), a.begin() + 4), "");
  EXPECT_TRUE(*m.next_block_key() == kv.cache().key(k0, Tokens(a.begin() + 4, a.end()), ""));
  // An admission made now but consumed after another change is refused, untouched.
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(kv.pool().free_queue(), (Ids{1, 2, 4, 3}));
  kv.revalidate(&m);
  EXPECT_EQ(m.num_cached_tokens(), 4);
  auto adm = kv.can_allocate(m, 5);
  ASSERT_TRUE(adm.ok()) << adm.message();
  EXPECT_EQ(adm->num_blocks_needed(), 3);  // block 1 revived, 2 fresh
  ASSERT_EQ(*kv.allocate(3, iota_tokens(70, 4), 4, ""), 0);  // takes block 1, evicting the hit
  EXPECT_EQ(table(kv, 3), (Ids{1}));
  const auto queue = kv.pool().free_queue();
  auto late = kv.allocate(4, *adm);
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.message().find("stale"), std::string::npos) << late.message();
  EXPECT_FALSE(kv.has_seq(4));
  EXPECT_EQ(kv.pool().free_queue(), queue);
  EXPECT_EQ(kv.stats().num_used, 1);
  EXPECT_INVARIANTS(kv);
}

TEST(KvManager, CanAllocateKeepsReserveBlocksFree) {
  KvManager kv(make_config(6, 4));  // 5 usable, no watermark
  const PrefixMatch m = kv.match_prefix(iota_tokens(0, 8), "");
  auto fits = kv.can_allocate(m, 8, 3);  // 2 blocks + 3 kept free = 5
  ASSERT_TRUE(fits.ok()) << fits.message();
  EXPECT_EQ(fits->num_blocks_needed(), 2);
  auto refused = kv.can_allocate(m, 8, 4);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.message(), "kv: 0 cached + 8 new tokens need 2 free blocks + watermark 0 + reserve 4, only 5 free");
  // An admission belongs to the KvManager that made it.
  KvManager other(make_config(6, 4));
  auto foreign = other.allocate(1, *fits);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.message(), "kv: admission made by another KvManager");
  EXPECT_EQ(other.num_seqs(), 0);
  ASSERT_EQ(*kv.allocate(1, *fits), 0);
  EXPECT_EQ(table(kv, 1), (Ids{1, 2}));  // the reserve is not taken, only kept free
  EXPECT_EQ(kv.num_free_blocks(), 3);
}

// The keys in-flight dedup compares: a running sequence's uncommitted full
// blocks, hashed once and then committed under the same keys; a waiting
// sequence's next_block_key is the key of the block it would compute first.
TEST(KvManager, UncommittedBlockKeysMeetTheNextBlockKeyOfAMatch) {
  KvManager kv(make_config(10, 4));
  const Tokens t = iota_tokens(0, 10);
  ASSERT_EQ(*kv.allocate(1, t, 4, ""), 0);  // a first chunk of 4
  const Hash128 k0 = kv.cache().key(Hash128{}, Tokens(t.begin(), t.begin() + 4), "");
  const Hash128 k1 = kv.cache().key(k0, Tokens(t.begin() + 4, t.begin() + 8), "");
  auto keys = kv.uncommitted_block_keys(1, t);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_TRUE(keys[0] == k0);
  EXPECT_TRUE(keys[1] == k1);
  // A second request for the same prompt would compute block 0 first.
  const Tokens longer = concat(t, Tokens{10, 11, 12});
  PrefixMatch w = kv.match_prefix(longer, "");
  EXPECT_EQ(w.num_cached_tokens(), 0);
  ASSERT_NE(w.next_block_key(), nullptr);
  EXPECT_TRUE(*w.next_block_key() == k0);

  kv.mark_computed(1, t, 4);
  EXPECT_EQ(kv.num_committed_blocks(1), 1);
  EXPECT_TRUE(kv.cache().key_of(table(kv, 1)[0]) == k0);
  keys = kv.uncommitted_block_keys(1, t);
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_TRUE(keys[0] == k1);
  w = kv.match_prefix(longer, "");
  EXPECT_EQ(w.num_cached_tokens(), 4);
  ASSERT_NE(w.next_block_key(), nullptr);
  EXPECT_TRUE(*w.next_block_key() == k1);

  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.append_slots(1, 6, &copies));
  kv.mark_computed(1, t, 10);
  EXPECT_TRUE(kv.uncommitted_block_keys(1, t).empty());
  EXPECT_TRUE(kv.cache().key_of(table(kv, 1)[1]) == k1);
  // Known tokens grow (an output): the block they fill is uncommitted again.
  const Tokens grown = concat(t, Tokens{10, 11});
  keys = kv.uncommitted_block_keys(1, grown);
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_TRUE(keys[0] == kv.cache().key(k1, Tokens{8, 9, 10, 11}, ""));
  // The longer prompt now hits 8 tokens and would compute exactly that block next.
  w = kv.match_prefix(longer, "");
  EXPECT_EQ(w.num_cached_tokens(), 8);
  ASSERT_NE(w.next_block_key(), nullptr);
  EXPECT_TRUE(*w.next_block_key() == keys[0]);
  EXPECT_INVARIANTS(kv);
}

}  // namespace
}  // namespace pagoda::kv
