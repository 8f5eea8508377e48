// Pins with a TTL (kv_pins.cc, issue 36): exact block ids for pin, renew,
// expire and cap demotion on a test clock; salt isolation; reset_prefix_cache;
// and a randomized run with pins, TTLs, forks and frees checking every
// invariant after every operation.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "base/rng.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::Ids;
using testing::iota_tokens;
using testing::make_config;
using testing::Tokens;

// 20 usable blocks of 4 tokens; the default cap is a fifth: 4 blocks.
KvConfig pin_config(double fraction = 0.2) {
  KvConfig c = make_config(21, 4);
  c.pinned_fraction = fraction;
  return c;
}

// Admits `t` as `id` (all of it past the hit), asks for a pin, marks it
// computed (committing its full blocks). Returns the hit tokens, -1 if refused.
int32_t admit(KvManager& kv, SeqId id, const Tokens& t, int32_t pin_tokens, double ttl, std::string_view salt = "") {
  PrefixMatch m = kv.match_prefix(t, salt);
  const int32_t hit = m.num_cached_tokens();
  auto a = kv.can_allocate(std::move(m), static_cast<int32_t>(t.size()) - hit);
  if (!a.ok()) return -1;
  auto got = kv.allocate(id, *a);
  EXPECT_TRUE(got.ok());
  kv.pin_prefix(id, pin_tokens, ttl);
  kv.mark_computed(id, t, static_cast<int32_t>(t.size()));
  return hit;
}

Ids free_queue(const KvManager& kv) { return kv.pool().free_queue(); }

Ids range(BlockId lo, BlockId hi) {  // [lo, hi]
  Ids v;
  for (BlockId b = lo; b <= hi; ++b) v.push_back(b);
  return v;
}

Ids cat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KvPins, PinSurvivesEvictionRenewsOnHitAndExpires) {
  double t = 0;
  KvManager kv(pin_config());
  kv.set_clock([&] { return t; });
  const Tokens a = iota_tokens(100, 9);  // 2 full blocks + 1 token
  EXPECT_EQ(admit(kv, 1, a, 8, 10.0), 0);
  EXPECT_EQ(testing::table(kv, 1), (Ids{1, 2, 3}));
  EXPECT_EQ(kv.num_pinned_blocks(), 2);
  EXPECT_EQ(kv.pool().ref_count(1), 2);  // the sequence and the pin
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  // The pin keeps blocks 1 and 2 out of the free queue; the tail block 3 goes last.
  EXPECT_EQ(free_queue(kv), cat(range(4, 20), {3}));
  EXPECT_EQ(kv.num_free_blocks(), 18);
  // Unrelated traffic takes every free block: the pinned prefix stays.
  EXPECT_EQ(admit(kv, 2, iota_tokens(1000, 72), 0, 0), 0);
  EXPECT_EQ(testing::table(kv, 2), cat(range(4, 20), {3}));
  EXPECT_FALSE(testing::can_allocate(kv, iota_tokens(2000, 4), 4));  // the pool is full: pinned blocks are not free
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(testing::cached_tokens(kv, a), 8);
  EXPECT_INVARIANTS(kv);
  // A hit at t = 5 renews the pin: it lives until 15, not 10.
  t = 5;
  EXPECT_EQ(admit(kv, 3, a, 0, 0), 8);
  EXPECT_EQ(testing::table(kv, 3)[0], 1);
  EXPECT_EQ(testing::table(kv, 3)[1], 2);
  ASSERT_TRUE(kv.free(3));
  EXPECT_EQ(kv.pin_stats().renewed, 1);
  EXPECT_DOUBLE_EQ(kv.pin_expiry(1), 15.0);
  t = 12;
  EXPECT_EQ(kv.expire_pins(), 0);
  EXPECT_EQ(kv.num_pinned_blocks(), 2);
  t = 15;
  EXPECT_EQ(kv.expire_pins(), 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 0);
  EXPECT_EQ(kv.pin_stats().expired, 1);
  EXPECT_EQ(kv.pin_expiry(1), 0.0);
  // Released last block first: the head is evicted last, like any freed sequence.
  const Ids q = free_queue(kv);
  ASSERT_GE(q.size(), 2u);
  EXPECT_EQ(q[q.size() - 2], 2);
  EXPECT_EQ(q[q.size() - 1], 1);
  EXPECT_EQ(testing::cached_tokens(kv, a), 8);  // still cached, now evictable
  EXPECT_INVARIANTS(kv);
  // Traffic now evicts it like any block.
  EXPECT_EQ(admit(kv, 4, iota_tokens(3000, 80), 0, 0), 0);
  ASSERT_TRUE(kv.free(4));
  EXPECT_EQ(testing::cached_tokens(kv, a), 0);
  EXPECT_INVARIANTS(kv);
}

TEST(KvPins, CapDemotesLeastRecentlyTouchedPin) {
  double t = 0;
  KvManager kv(pin_config());  // cap 4 blocks
  kv.set_clock([&] { return t; });
  EXPECT_EQ(kv.pin_cap_blocks(), 4);
  const Tokens x = iota_tokens(100, 9), y = iota_tokens(200, 9), z = iota_tokens(300, 9);
  EXPECT_EQ(admit(kv, 1, x, 8, 100), 0);  // blocks 1, 2 (+3)
  ASSERT_TRUE(kv.free(1));
  t = 1;
  EXPECT_EQ(admit(kv, 2, y, 8, 100), 0);
  EXPECT_EQ(testing::table(kv, 2), (Ids{4, 5, 6}));
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  // x is touched again at t = 2: y becomes the least recently touched.
  t = 2;
  EXPECT_EQ(admit(kv, 3, x, 0, 0), 8);
  ASSERT_TRUE(kv.free(3));
  t = 3;
  EXPECT_EQ(admit(kv, 4, z, 8, 100), 0);
  const Ids zt = testing::table(kv, 4);
  ASSERT_TRUE(kv.free(4));
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  EXPECT_EQ(kv.pin_stats().demoted, 1);
  EXPECT_GT(kv.pin_expiry(1), 0.0);
  EXPECT_GT(kv.pin_expiry(2), 0.0);
  EXPECT_EQ(kv.pin_expiry(4), 0.0);  // y demoted
  EXPECT_EQ(kv.pin_expiry(5), 0.0);
  EXPECT_GT(kv.pin_expiry(zt[0]), 0.0);
  EXPECT_GT(kv.pin_expiry(zt[1]), 0.0);
  // y's blocks are ordinary cached ones again: in the free queue.
  EXPECT_TRUE(kv.pool().in_free_queue(4));
  EXPECT_TRUE(kv.pool().in_free_queue(5));
  EXPECT_INVARIANTS(kv);
  // A pin larger than the cap keeps its head: 6 blocks asked, 4 pinned
  // (and every other pin demoted for it).
  EXPECT_EQ(admit(kv, 5, iota_tokens(400, 25), 24, 100), 0);
  const Ids big = testing::table(kv, 5);
  ASSERT_TRUE(kv.free(5));
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  EXPECT_EQ(kv.pin_stats().num_pins, 1);
  for (int i = 0; i < 4; ++i) EXPECT_GT(kv.pin_expiry(big[static_cast<size_t>(i)]), 0.0) << i;
  EXPECT_EQ(kv.pin_expiry(big[4]), 0.0);
  EXPECT_INVARIANTS(kv);
}

TEST(KvPins, PinsFollowTheSalt) {
  double t = 0;
  KvManager kv(pin_config());
  kv.set_clock([&] { return t; });
  const Tokens a = iota_tokens(100, 9);
  EXPECT_EQ(admit(kv, 1, a, 8, 10, "tenant-a"), 0);
  ASSERT_TRUE(kv.free(1));
  EXPECT_EQ(testing::cached_tokens(kv, a, "tenant-b"), 0);  // never served to another salt
  EXPECT_EQ(testing::cached_tokens(kv, a, ""), 0);
  t = 8;
  EXPECT_EQ(admit(kv, 2, a, 0, 0, "tenant-b"), 0);  // no renewal for tenant a's pin
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(kv.pin_stats().renewed, 0);
  EXPECT_EQ(kv.num_pinned_blocks(), 2);
  t = 10;
  EXPECT_EQ(kv.expire_pins(), 1);
  EXPECT_EQ(testing::cached_tokens(kv, a, "tenant-a"), 8);
  EXPECT_INVARIANTS(kv);
}

TEST(KvPins, ResetClearsPinsAndCacheOnlyWithoutSequences) {
  KvManager kv(pin_config());
  const Tokens a = iota_tokens(100, 9);
  EXPECT_EQ(admit(kv, 1, a, 8, 10), 0);
  EXPECT_FALSE(kv.reset_prefix_cache());  // a sequence holds blocks
  EXPECT_EQ(kv.num_pinned_blocks(), 2);
  ASSERT_TRUE(kv.free(1));
  EXPECT_EQ(admit(kv, 2, iota_tokens(500, 12), 0, 0), 0);
  ASSERT_TRUE(kv.free(2));
  EXPECT_GT(kv.cache().size(), 0);
  EXPECT_TRUE(kv.reset_prefix_cache());
  EXPECT_EQ(kv.cache().size(), 0);
  EXPECT_EQ(kv.num_pinned_blocks(), 0);
  EXPECT_EQ(kv.pin_stats().cleared, 1);
  EXPECT_EQ(kv.num_free_blocks(), kv.num_usable_blocks());
  EXPECT_EQ(testing::cached_tokens(kv, a), 0);
  EXPECT_INVARIANTS(kv);
}

TEST(KvPins, UnpinOldestFreesRoom) {
  double t = 0;
  KvManager kv(pin_config(0.5));  // cap 10
  kv.set_clock([&] { return t; });
  EXPECT_EQ(admit(kv, 1, iota_tokens(100, 21), 20, 50), 0);  // 5 blocks pinned
  ASSERT_TRUE(kv.free(1));
  t = 1;
  EXPECT_EQ(admit(kv, 2, iota_tokens(200, 21), 20, 50), 0);
  ASSERT_TRUE(kv.free(2));
  EXPECT_EQ(kv.num_pinned_blocks(), 10);
  EXPECT_EQ(kv.num_free_blocks(), 10);
  EXPECT_FALSE(testing::can_allocate(kv, iota_tokens(900, 60), 60));  // 15 blocks
  EXPECT_TRUE(kv.unpin_oldest());
  EXPECT_EQ(kv.num_free_blocks(), 15);
  EXPECT_EQ(testing::cached_tokens(kv, iota_tokens(200, 21)), 20);  // the newer pin stays
  EXPECT_TRUE(testing::can_allocate(kv, iota_tokens(900, 60), 60));
  EXPECT_TRUE(kv.unpin_oldest());
  EXPECT_FALSE(kv.unpin_oldest());
  EXPECT_INVARIANTS(kv);
}

// Eviction classes (the priority policy): a worse class's cached blocks are
// evicted first, blocks holding no prefix before any cached one, LRU within a class.
TEST(KvEvictionClasses, WorseClassFirstLruWithin) {
  KvConfig c = make_config(21, 4);
  c.eviction_classes = 3;
  KvManager kv(c);
  const Tokens a = iota_tokens(100, 9), b = iota_tokens(200, 9);
  PrefixMatch m = kv.match_prefix(a, "");
  auto adm = kv.can_allocate(std::move(m), 9);
  ASSERT_TRUE(adm.ok());
  ASSERT_TRUE(kv.allocate(1, *adm).ok());
  kv.set_eviction_class(1, 0);  // the best class: evicted last
  kv.mark_computed(1, a, 9);
  ASSERT_TRUE(kv.free(1));
  m = kv.match_prefix(b, "");
  adm = kv.can_allocate(std::move(m), 9);
  ASSERT_TRUE(adm.ok());
  ASSERT_TRUE(kv.allocate(2, *adm).ok());
  kv.set_eviction_class(2, 1);
  kv.mark_computed(2, b, 9);
  ASSERT_TRUE(kv.free(2));
  // Class 2 (fresh and uncached tail blocks 3 and 6), class 1 (b's), class 0 (a's).
  EXPECT_EQ(free_queue(kv), cat(cat(range(7, 20), {3, 6}), {5, 4, 2, 1}));
  EXPECT_EQ(kv.pool().free_head(), 7);
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(admit(kv, 3, iota_tokens(1000, 64), 0, 0), 0);
  EXPECT_EQ(testing::table(kv, 3), cat(range(7, 20), {3, 6}));
  EXPECT_EQ(admit(kv, 4, iota_tokens(2000, 4), 0, 0), 0);
  EXPECT_EQ(testing::table(kv, 4), (Ids{5}));  // b's tail block goes first, a's stay
  EXPECT_EQ(testing::cached_tokens(kv, a), 8);
  EXPECT_EQ(testing::cached_tokens(kv, b), 4);
  EXPECT_INVARIANTS(kv);
}

// Random operations with pins, TTLs, forks and frees over a small alphabet
// (prefixes collide); every invariant (pins included: count <= cap, pinned
// blocks cached, ref counts = table references + pins) after every operation.
TEST(KvPins, RandomizedWithPinsTtlsAndForks) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    double t = 0;
    KvManager kv(make_config(41, 4));  // cap 8
    kv.set_clock([&] { return t; });
    Rng rng(seed);
    std::vector<Tokens> bases(3);
    for (auto& b : bases)
      for (int i = 0; i < 64; ++i) b.push_back(static_cast<TokenId>(rng.uniform_int(0, 3)));
    std::map<SeqId, Tokens> seqs;
    SeqId next = 1;
    int64_t pins_made = 0;
    for (int op = 0; op < 6000; ++op) {
      const double r = rng.uniform();
      if (r < 0.25 || seqs.empty()) {
        const Tokens& b = bases[static_cast<size_t>(rng.uniform_int(0, 2))];
        Tokens p(b.begin(), b.begin() + rng.uniform_int(1, 64));
        for (int64_t i = rng.uniform_int(0, 6); i > 0; --i) p.push_back(static_cast<TokenId>(rng.uniform_int(0, 3)));
        PrefixMatch m = kv.match_prefix(p, rng.uniform() < 0.2 ? "s" : "");
        const int32_t hit = m.num_cached_tokens();
        const int32_t n = std::min<int32_t>(static_cast<int32_t>(p.size()) - hit, 8);
        auto a = kv.can_allocate(std::move(m), n);
        if (!a.ok()) {
          if (rng.uniform() < 0.5) kv.unpin_oldest();
        } else {
          ASSERT_TRUE(kv.allocate(next, *a).ok());
          if (rng.uniform() < 0.5) kv.pin_prefix(next, static_cast<int32_t>(rng.uniform_int(0, 40)), 1 + 29 * rng.uniform());
          kv.mark_computed(next, p, hit + n);
          seqs[next++] = p;
        }
      } else if (r < 0.65) {  // a step: the rest of the prompt in chunks, then decodes
        auto it = seqs.begin();
        std::advance(it, rng.uniform_int(0, static_cast<int64_t>(seqs.size()) - 1));
        Tokens& tok = it->second;
        const int32_t done = kv.num_computed_tokens(it->first);
        if (done == static_cast<int32_t>(tok.size())) tok.push_back(static_cast<TokenId>(rng.uniform_int(0, 3)));
        const int32_t n = std::min<int32_t>(static_cast<int32_t>(tok.size()) - done, 8);
        std::vector<BlockCopy> copies;
        if (kv.append_slots(it->first, n, &copies)) kv.mark_computed(it->first, tok, done + n);
      } else if (r < 0.75) {
        auto it = seqs.begin();
        std::advance(it, rng.uniform_int(0, static_cast<int64_t>(seqs.size()) - 1));
        if (kv.num_computed_tokens(it->first) == static_cast<int32_t>(it->second.size())) {
          ASSERT_TRUE(kv.fork(it->first, next).ok());
          seqs[next++] = it->second;
        }
      } else if (r < 0.9) {
        auto it = seqs.begin();
        std::advance(it, rng.uniform_int(0, static_cast<int64_t>(seqs.size()) - 1));
        ASSERT_TRUE(kv.free(it->first));
        seqs.erase(it);
      } else {
        t += 5 * rng.uniform();
        kv.expire_pins();
      }
      ASSERT_EQ(kv.check_invariants(), "") << "seed " << seed << " op " << op;
      ASSERT_LE(kv.num_pinned_blocks(), kv.pin_cap_blocks());
      pins_made = kv.pin_stats().created;
    }
    EXPECT_GT(pins_made, 50) << "seed " << seed;
    EXPECT_GT(kv.pin_stats().expired, 10) << "seed " << seed;
    EXPECT_GT(kv.pin_stats().demoted, 0) << "seed " << seed;
    for (auto& [id, tok] : seqs) ASSERT_TRUE(kv.free(id));
    t += 1000;
    kv.expire_pins();
    EXPECT_EQ(kv.num_free_blocks(), kv.num_usable_blocks()) << "seed " << seed;
    EXPECT_EQ(kv.check_invariants(), "");
  }
}

}  // namespace
}  // namespace pagoda::kv
