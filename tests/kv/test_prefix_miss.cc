// Why a prefix missed (issue 36, kv/prefix_miss.h): scripted KvManager
// sequences for every cause, with exact matched tokens, positions and times
// (the eviction log's clock is a test clock), and the invariants after each step.
#include <gtest/gtest.h>

#include "kv/miss_index.h"
#include "kv/prefix_miss.h"
#include "test_util.h"

namespace pagoda::kv::testing {
namespace {

PrefixMiss explain(const KvManager& kv, const Tokens& t, std::string_view salt = "") {
  const PrefixMatch m = kv.match_prefix(t, salt);
  return kv.explain_miss(m, t, salt);
}

// The result as one comparable string: "cause matched position ago".
std::string str(const PrefixMiss& m) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s %d %d %g", miss_cause_name(m.cause), m.matched_tokens, m.position,
                m.evicted_ago_s);
  return buf;
}

TEST(PrefixMiss, CauseNames) {
  EXPECT_STREQ(miss_cause_name(MissCause::kNone), "none");
  EXPECT_STREQ(miss_cause_name(MissCause::kNeverSeen), "never_seen");
  EXPECT_STREQ(miss_cause_name(MissCause::kEvicted), "evicted");
  EXPECT_STREQ(miss_cause_name(MissCause::kSalt), "salt");
  EXPECT_STREQ(miss_cause_name(MissCause::kTierMiss), "tier_miss");
  EXPECT_STREQ(miss_cause_name(MissCause::kDiverged), "diverged");
}

// Shorter than a block + 1 token, or every hittable block matched: none.
TEST(PrefixMiss, NoneWhenNothingCouldHitOrAllMatched) {
  KvManager kv(make_config(16, 4));
  EXPECT_EQ(str(explain(kv, iota_tokens(100, 4))), "none 0 -1 -1");  // (4-1)/4 = 0 hittable blocks
  const Tokens a = iota_tokens(100, 12);
  cache_prefix(kv, a);
  EXPECT_INVARIANTS(kv);
  // 12 tokens: blocks 0 and 1 are hittable (never the last token's), both cached.
  EXPECT_EQ(str(explain(kv, a)), "none 8 -1 -1");
  // 13 tokens: block 2 is hittable too, and cached.
  EXPECT_EQ(str(explain(kv, concat(a, Tokens{1}))), "none 12 -1 -1");
}

TEST(PrefixMiss, NeverSeen) {
  KvManager kv(make_config(16, 4));
  EXPECT_EQ(str(explain(kv, iota_tokens(100, 12))), "never_seen 0 -1 -1");
  cache_prefix(kv, iota_tokens(100, 12));
  // Another first block: no block matched, not a divergence.
  EXPECT_EQ(str(explain(kv, iota_tokens(500, 12))), "never_seen 0 -1 -1");
  // Past the whole cached chain (its last block has no child): never seen.
  EXPECT_EQ(str(explain(kv, concat(iota_tokens(100, 12), iota_tokens(7, 8)))), "never_seen 12 -1 -1");
  EXPECT_INVARIANTS(kv);
}

TEST(PrefixMiss, DivergedAtTheExactToken) {
  KvManager kv(make_config(16, 4));
  const Tokens a = iota_tokens(100, 12);  // blocks [100..103] [104..107] [108..111]
  cache_prefix(kv, a);
  // Inside block 1: 104, 105 shared, then 7.
  EXPECT_EQ(str(explain(kv, concat(iota_tokens(100, 6), Tokens{7, 7, 7, 7, 7, 7}))), "diverged 4 6 -1");
  // At a block boundary: block 2 starts with 9 instead of 108.
  EXPECT_EQ(str(explain(kv, concat(iota_tokens(100, 8), Tokens{9, 9, 9, 9, 1, 1}))), "diverged 8 8 -1");
  // Inside the first block: no block matched, so nothing diverged (every
  // prompt starting with the same BOS would otherwise diverge from every other).
  EXPECT_EQ(str(explain(kv, Tokens{100, 101, 5, 5, 5, 5, 5, 5})), "never_seen 0 -1 -1");
  // Two cached children of block 0: the one sharing more tokens tells the position.
  ASSERT_EQ(prefill(kv, 2, concat(iota_tokens(100, 4), Tokens{104, 105, 106, 1, 1, 1, 1, 1})), 4);
  EXPECT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(str(explain(kv, concat(iota_tokens(100, 7), Tokens{2, 2, 2, 2, 2}))), "diverged 4 7 -1");
  // Explaining changes nothing: no collision counted, the same hit after.
  EXPECT_EQ(kv.stats().collisions_refused, 0);
  EXPECT_EQ(cached_tokens(kv, a), 8);
}

// The test clock drives the eviction times.
TEST(PrefixMiss, EvictedAfterPoolPressureWithItsTime) {
  double now = 10;
  KvManager kv(make_config(16, 4));  // 15 usable blocks
  kv.set_clock_for_testing([&] { return now; });
  const Tokens a = iota_tokens(100, 12);
  cache_prefix(kv, a);  // blocks 1, 2, 3; the free queue ends 3, 2, 1
  EXPECT_EQ(kv.pool().free_queue(), (Ids{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 2, 1}));
  now = 25;
  // 13 blocks for an unrelated prompt: the 12 fresh ones, then block 3 (a's block 2) is evicted.
  ASSERT_EQ(prefill(kv, 2, iota_tokens(1000, 52)), 0);
  EXPECT_EQ(kv.stats().num_evictions, 1);
  EXPECT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);
  now = 40.5;
  EXPECT_EQ(str(explain(kv, concat(a, Tokens{1}))), "evicted 8 -1 15.5");
  // With a tier configured, the same miss is the tier's: it should have held the block.
  kv.set_tiers_configured(true);
  EXPECT_EQ(str(explain(kv, concat(a, Tokens{1}))), "tier_miss 8 -1 15.5");
  kv.set_tiers_configured(false);
  // Committed again: no longer a miss.
  ASSERT_EQ(prefill(kv, 3, concat(a, Tokens{1})), 8);
  EXPECT_TRUE(kv.free(3));
  EXPECT_EQ(str(explain(kv, concat(a, Tokens{1}))), "none 12 -1 -1");
  EXPECT_INVARIANTS(kv);
}

// The log remembers the last num_blocks evicted keys: a key evicted longer ago
// than that reads never_seen.
TEST(PrefixMiss, EvictionLogIsBounded) {
  EvictionLog log(3);
  double now = 1;
  log.set_clock([&] { return now; });
  const Hash128 k1{1, 1}, k2{2, 2}, k3{3, 3}, k4{4, 4};
  log.record(k1);
  now = 2;
  log.record(k2);
  log.record(k3);
  EXPECT_EQ(log.evicted_at(k1), 1.0);
  now = 3;
  log.record(k1);  // evicted again: remembered at its last eviction
  EXPECT_EQ(log.evicted_at(k1), 3.0);
  log.record(k4);  // the ring drops the oldest record (k2)
  EXPECT_FALSE(log.evicted_at(k2).has_value());
  EXPECT_EQ(log.evicted_at(k3), 2.0);
  EXPECT_EQ(log.size(), 3);
  log.record(k4);  // drops k3's record; k1's first record is already gone, its second stays
  EXPECT_FALSE(log.evicted_at(k3).has_value());
  EXPECT_EQ(log.evicted_at(k1), 3.0);

  // In a KvManager of 16 blocks the log keeps the last 16 evicted keys.
  double t = 0;
  KvManager kv(make_config(16, 4));
  kv.set_clock_for_testing([&] { return t; });
  const Tokens a = iota_tokens(100, 8);  // blocks 1 (a's first) and 2 cached; one hittable
  cache_prefix(kv, a);
  ASSERT_EQ(prefill(kv, 2, iota_tokens(1000, 60)), 0);  // 15 blocks: evicts block 2, then block 1 (a's first)
  EXPECT_TRUE(kv.free(2));
  EXPECT_EQ(str(explain(kv, a)), "evicted 0 -1 0");
  ASSERT_EQ(prefill(kv, 3, iota_tokens(5000, 60)), 0);  // 15 more evictions: 15 records after a's first
  EXPECT_TRUE(kv.free(3));
  EXPECT_EQ(kv.stats().num_evictions, 17);
  EXPECT_EQ(str(explain(kv, a)), "evicted 0 -1 0");
  ASSERT_EQ(prefill(kv, 4, iota_tokens(9000, 4)), 0);  // the 16th record after it: forgotten
  EXPECT_EQ(kv.stats().num_evictions, 18);
  EXPECT_EQ(str(explain(kv, a)), "never_seen 0 -1 -1");
  EXPECT_INVARIANTS(kv);
}

TEST(PrefixMiss, SaltAnotherTenantHoldsIt) {
  KvManager kv(make_config(16, 4));
  const Tokens a = iota_tokens(100, 12);
  ASSERT_EQ(prefill(kv, 1, a, "tenant-1"), 0);
  EXPECT_TRUE(kv.free(1));
  EXPECT_EQ(str(explain(kv, a, "tenant-1")), "none 8 -1 -1");
  EXPECT_EQ(str(explain(kv, a, "tenant-2")), "salt 0 -1 -1");
  EXPECT_EQ(str(explain(kv, a, "")), "salt 0 -1 -1");
  // Past tenant-1's chain: nothing held under any salt.
  EXPECT_EQ(str(explain(kv, concat(a, iota_tokens(1, 5)), "tenant-1")), "never_seen 12 -1 -1");
  // Other tokens: not a salt miss (and under tenant-2 nothing diverges either).
  EXPECT_EQ(str(explain(kv, Tokens{100, 101, 5, 5, 5, 5, 5, 5}, "tenant-2")), "never_seen 0 -1 -1");
  EXPECT_EQ(str(explain(kv, concat(iota_tokens(100, 6), Tokens{5, 5, 5, 5, 5, 5}), "tenant-1")), "diverged 4 6 -1");
  // The unsalted tenant's blocks, asked for under a salt.
  ASSERT_EQ(prefill(kv, 2, iota_tokens(300, 8), ""), 0);
  EXPECT_TRUE(kv.free(2));
  EXPECT_EQ(str(explain(kv, iota_tokens(300, 8), "tenant-1")), "salt 0 -1 -1");
  // A block deeper in tenant-1's chain under tenant-2, once tenant-2 shares its first block.
  ASSERT_EQ(prefill(kv, 3, iota_tokens(100, 5), "tenant-2"), 0);
  EXPECT_TRUE(kv.free(3));
  EXPECT_EQ(str(explain(kv, a, "tenant-2")), "salt 4 -1 -1");
  EXPECT_INVARIANTS(kv);
}

// Evicting a block drops it from the child and salt-free indexes: an evicted
// sibling is no divergence, and an evicted salted block no salt miss.
TEST(PrefixMiss, IndexesFollowEvictions) {
  double now = 0;
  KvManager kv(make_config(8, 4));  // 7 usable blocks
  kv.set_clock_for_testing([&] { return now; });
  const Tokens a = iota_tokens(100, 8);
  ASSERT_EQ(prefill(kv, 1, a, "s"), 0);
  EXPECT_TRUE(kv.free(1));
  now = 1;
  ASSERT_EQ(prefill(kv, 2, iota_tokens(900, 28)), 0);  // all 7 blocks: a's evicted
  EXPECT_TRUE(kv.free(2));
  const Tokens first(a.begin(), a.begin() + 4);
  EXPECT_EQ(kv.cache().miss_index().salted_count(kv.cache().key(Hash128{}, first, "")), 0);
  EXPECT_EQ(str(explain(kv, a, "t")), "never_seen 0 -1 -1");
  EXPECT_EQ(str(explain(kv, a, "s")), "evicted 0 -1 0");
  EXPECT_INVARIANTS(kv);
}

}  // namespace
}  // namespace pagoda::kv::testing
