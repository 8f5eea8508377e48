// `pagoda router --kv-events` without sockets: the event decoder (kv_wire.*), the
// router's chain hash and its index of which replica holds which block on which
// medium (kv_index.*), and the choice it routes on (choose_kv). Payloads are built
// with msgpuck exactly as the publisher (or vLLM's msgspec array_like) lays them out.
#include <gtest/gtest.h>
#include <msgpuck.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/hash.h"
#include "router/kv_index.h"
#include "router/kv_wire.h"

namespace pagoda::router {
namespace {

// A msgpack writer over a growing buffer.
struct Mp {
  std::string buf;
  char* reserve(size_t n) {
    const size_t at = buf.size();
    buf.resize(at + n);
    return buf.data() + at;
  }
  template <typename F>
  Mp& put(size_t max, F f) {
    char* start = reserve(max);
    char* end = f(start);
    buf.resize(buf.size() - max + static_cast<size_t>(end - start));
    return *this;
  }
  Mp& arr(uint32_t n) { return put(5, [&](char* w) { return mp_encode_array(w, n); }); }
  Mp& u(uint64_t v) { return put(9, [&](char* w) { return mp_encode_uint(w, v); }); }
  Mp& i(int64_t v) { return v >= 0 ? u(static_cast<uint64_t>(v)) : put(9, [&](char* w) { return mp_encode_int(w, v); }); }
  Mp& d(double v) { return put(9, [&](char* w) { return mp_encode_double(w, v); }); }
  Mp& s(const std::string& v) {
    return put(5 + v.size(), [&](char* w) { return mp_encode_str(w, v.data(), static_cast<uint32_t>(v.size())); });
  }
  Mp& nil() { return put(1, [&](char* w) { return mp_encode_nil(w); }); }
  Mp& hashes(const std::vector<uint64_t>& h) {
    arr(static_cast<uint32_t>(h.size()));
    for (uint64_t x : h) u(x);
    return *this;
  }
  Mp& stored(const std::vector<uint64_t>& h, std::optional<uint64_t> parent, const std::vector<int32_t>& toks, int bs,
             const std::string& medium = "cpu", int group = 0) {
    arr(10).s("BlockStored").hashes(h);
    if (parent) u(*parent);
    else nil();
    arr(static_cast<uint32_t>(toks.size()));
    for (int32_t t : toks) i(t);
    return i(bs).nil().s(medium).nil().nil().i(group);
  }
  Mp& removed(const std::vector<uint64_t>& h, const std::string& medium = "cpu", int group = 0) {
    return arr(4).s("BlockRemoved").hashes(h).s(medium).i(group);
  }
  Mp& cleared() { return arr(1).s("AllBlocksCleared"); }
};

std::vector<int32_t> iota(int n, int32_t start = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) t[static_cast<size_t>(k)] = start + k;
  return t;
}

KvEvent decode_one(Mp& ev) {
  Mp p;
  p.arr(3).d(1.5).arr(1);
  p.buf += ev.buf;
  p.i(0);
  auto b = decode_kv_batch(p.buf.data(), p.buf.size());
  EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.message());
  EXPECT_EQ(b->events.size(), 1u);
  return b->events[0];
}

TEST(KvWire, DecodesTheThreeEventsOfABatch) {
  Mp p;
  p.arr(3).d(1733000000.25).arr(3);
  p.stored({0xfedcba9876543210ull, 7}, 42, iota(8), 4, "disk", 0);
  p.removed({7}, "cpu", 1);
  p.cleared();
  p.i(0);
  auto b = decode_kv_batch(p.buf.data(), p.buf.size());
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->ts, 1733000000.25);
  EXPECT_EQ(b->dp_rank, 0);
  ASSERT_EQ(b->events.size(), 3u);
  const KvEvent& s = b->events[0];
  EXPECT_EQ(s.kind, KvEventKind::kStored);
  EXPECT_EQ(s.block_hashes, (std::vector<uint64_t>{0xfedcba9876543210ull, 7}));
  EXPECT_EQ(s.parent_hash, std::optional<uint64_t>(42));
  EXPECT_EQ(s.token_ids, iota(8));
  EXPECT_EQ(s.block_size, 4);
  EXPECT_EQ(s.medium, "disk");
  EXPECT_EQ(s.group_idx, 0);
  const KvEvent& r = b->events[1];
  EXPECT_EQ(r.kind, KvEventKind::kRemoved);
  EXPECT_EQ(r.block_hashes, (std::vector<uint64_t>{7}));
  EXPECT_EQ(r.medium, "cpu");
  EXPECT_EQ(r.group_idx, 1);
  EXPECT_EQ(b->events[2].kind, KvEventKind::kCleared);
}

TEST(KvWire, OlderShorterEventsTakeDefaults) {
  Mp ev;  // vLLM's first BlockStored: no medium, no group
  ev.arr(6).s("BlockStored").hashes({1}).nil().arr(2).i(5).i(6).i(2).nil();
  const KvEvent e = decode_one(ev);
  EXPECT_FALSE(e.parent_hash.has_value());
  EXPECT_EQ(e.medium, "cpu");
  EXPECT_EQ(e.group_idx, 0);
  Mp neg;  // a negative (signed) hash keeps its bits
  neg.arr(2).s("BlockRemoved").arr(1).i(-1);
  EXPECT_EQ(decode_one(neg).block_hashes, (std::vector<uint64_t>{~uint64_t{0}}));
}

TEST(KvWire, RefusesWrongShapes) {
  auto bad = [](Mp ev) {
    Mp p;
    p.arr(3).d(0).arr(1);
    p.buf += ev.buf;
    p.i(0);
    auto b = decode_kv_batch(p.buf.data(), p.buf.size());
    return b.ok() ? std::string() : b.message();
  };
  EXPECT_NE(bad(Mp().stored({1, 2}, std::nullopt, iota(7), 4)).find("7 token ids for 2 blocks of 4"),
            std::string::npos);
  EXPECT_NE(bad(Mp().arr(1).s("BlockMoved")).find("unknown event tag 'BlockMoved'"), std::string::npos);
  EXPECT_NE(bad(Mp().arr(2).s("BlockRemoved").s("x")).find("block_hashes is not an array"), std::string::npos);
  EXPECT_NE(bad(Mp().stored({1}, std::nullopt, iota(0), 0)).find("block_size must be at least 1"), std::string::npos);
  Mp p;
  p.arr(3).d(0).arr(1).cleared().i(0);
  for (size_t cut = 0; cut < p.buf.size(); ++cut)  // every truncation is refused, none is misread
    EXPECT_FALSE(decode_kv_batch(p.buf.data(), cut).ok()) << cut;
  std::string extra = p.buf + "x";
  EXPECT_FALSE(decode_kv_batch(extra.data(), extra.size()).ok());
}

TEST(KvWire, SequenceNumbersAreBigEndian) {
  unsigned char b[8];
  encode_seq(0x0102030405060708ull, b);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[7], 8);
  EXPECT_EQ(decode_seq(b, 8), std::optional<uint64_t>(0x0102030405060708ull));
  EXPECT_FALSE(decode_seq(b, 7).has_value());
}

TEST(KvIndex, RouterChainSpelledOut) {
  const auto t = iota(10);
  const uint64_t h0 = xxh3_64(t.data(), 4 * sizeof(int32_t), 0x6b76726f75746572ull);
  const uint64_t h1 = xxh3_64(t.data() + 4, 4 * sizeof(int32_t), h0);
  EXPECT_EQ(router_chain(t, 4), (std::vector<uint64_t>{h0, h1}));  // 2 whole blocks of 4; 2 tokens left over
  EXPECT_EQ(router_chain(t, 4, 1), (std::vector<uint64_t>{h0}));
  EXPECT_EQ(router_block_hash(std::nullopt, t.data(), 4), h0);
  EXPECT_EQ(router_block_hash(h0, t.data() + 4, 4), h1);
}

// Applies one event and checks the index's invariants after it.
KvIndex::Applied apply(KvIndex& ix, int r, Mp ev) {
  const KvIndex::Applied a = ix.apply(r, decode_one(ev));
  EXPECT_EQ(ix.check_invariants(), "");
  return a;
}

TEST(KvIndex, StoreRemoveClearAndLongestPrefixPerReplica) {
  KvIndex ix(3);
  const auto prompt = iota(18);  // 4 whole blocks of 4
  const auto chain = router_chain(prompt, 4);
  ASSERT_EQ(chain.size(), 4u);
  EXPECT_EQ(ix.match(chain), (std::vector<PrefixMatch>(3)));

  // Replica 0 stores blocks 0..2 in two events (the second hangs from the first's last block).
  EXPECT_EQ(apply(ix, 0, Mp().stored({101, 102}, std::nullopt, iota(8), 4)).blocks, 2u);
  EXPECT_EQ(ix.block_size(), 4);
  EXPECT_EQ(apply(ix, 0, Mp().stored({103}, 102, iota(4, 9), 4)).blocks, 1u);
  EXPECT_EQ(ix.router_hash_of(0, 101), std::optional<uint64_t>(chain[0]));
  EXPECT_EQ(ix.router_hash_of(0, 102), std::optional<uint64_t>(chain[1]));
  EXPECT_EQ(ix.router_hash_of(0, 103), std::optional<uint64_t>(chain[2]));
  // Replica 1 holds block 0 under its own engine hash (another salt): same router hash.
  apply(ix, 1, Mp().stored({9001}, std::nullopt, iota(4), 4));
  EXPECT_EQ(ix.router_hash_of(1, 9001), std::optional<uint64_t>(chain[0]));
  EXPECT_EQ(ix.distinct_hashes(), 3u);
  EXPECT_EQ(ix.match(chain), (std::vector<PrefixMatch>{{3, 3}, {1, 1}, {0, 0}}));
  EXPECT_EQ(ix.entries(0, KvMedium::kCpu), 3u);

  // A replayed event changes nothing.
  EXPECT_EQ(apply(ix, 0, Mp().stored({103}, 102, iota(4, 9), 4)).blocks, 0u);
  EXPECT_EQ(ix.entries(0, KvMedium::kCpu), 3u);

  // Demotion: block 1 leaves RAM for the disk tier.
  apply(ix, 0, Mp().removed({102}, "cpu"));
  EXPECT_EQ(ix.match(chain)[0], (PrefixMatch{1, 1}));  // the chain is cut at block 1
  apply(ix, 0, Mp().stored({102}, 101, iota(4, 5), 4, "disk"));
  EXPECT_EQ(ix.media_of(0, chain[1]), 1u << static_cast<unsigned>(KvMedium::kDisk));
  EXPECT_EQ(ix.media_of(0, chain[2]), 1u << static_cast<unsigned>(KvMedium::kCpu));
  EXPECT_EQ(ix.match(chain)[0], (PrefixMatch{1, 3}));
  EXPECT_EQ(ix.entries(0, KvMedium::kDisk), 1u);

  // Removing what is not held (or on another medium) is counted and harmless.
  const auto u = apply(ix, 0, Mp().removed({102, 555}, "redis"));
  EXPECT_EQ(u.unknown, 2u);
  EXPECT_EQ(u.blocks, 0u);

  // A block stored under a parent the index does not hold cannot match: dropped.
  const auto o = apply(ix, 2, Mp().stored({301, 302}, 300, iota(8, 5), 4));
  EXPECT_EQ(o.orphans, 2u);
  EXPECT_EQ(ix.entries(2, KvMedium::kCpu), 0u);
  // Another group (sliding window) is not indexed; another block size is refused.
  EXPECT_TRUE(apply(ix, 2, Mp().stored({401}, std::nullopt, iota(4), 4, "cpu", 1)).ignored);
  EXPECT_NE(apply(ix, 2, Mp().stored({402}, std::nullopt, iota(8), 8)).refused.find("block_size 8"),
            std::string::npos);
  EXPECT_EQ(ix.match(chain)[2], (PrefixMatch{0, 0}));

  // AllBlocksCleared drops one replica only.
  EXPECT_EQ(apply(ix, 0, Mp().cleared()).blocks, 3u);
  EXPECT_EQ(ix.match(chain), (std::vector<PrefixMatch>{{0, 0}, {1, 1}, {0, 0}}));
  EXPECT_EQ(ix.distinct_hashes(), 1u);
  ix.clear(1);
  EXPECT_EQ(ix.distinct_hashes(), 0u);
  EXPECT_EQ(ix.check_invariants(), "");
}

TEST(KvIndex, RandomEventsKeepTheInvariants) {
  // Random stores/removes/clears over 3 replicas and 3 media; after every event the
  // index equals a model kept here (engine hash -> media) and its counts agree.
  KvIndex ix(3);
  uint64_t rng = 12345;
  auto next = [&] { return rng = rng * 6364136223846793005ull + 1442695040888963407ull, rng >> 33; };
  std::vector<std::map<uint64_t, unsigned>> model(3);
  const char* media[] = {"cpu", "disk", "redis"};
  for (int step = 0; step < 3000; ++step) {
    const int r = static_cast<int>(next() % 3);
    const uint64_t h = next() % 24;  // engine hashes 0..23, block of token h
    const int m = static_cast<int>(next() % 3);
    const int op = static_cast<int>(next() % 100);
    if (op < 55) {
      ix.apply(r, decode_one(Mp().stored({h}, std::nullopt, {int32_t(h), 0}, 2, media[m])));
      model[r][h] |= 1u << m;
    } else if (op < 98) {
      ix.apply(r, decode_one(Mp().removed({h}, media[m])));
      if (model[r].count(h) && (model[r][h] &= ~(1u << m)) == 0) model[r].erase(h);
    } else {
      ix.apply(r, decode_one(Mp().cleared()));
      model[r].clear();
    }
    ASSERT_EQ(ix.check_invariants(), "") << step;
    for (int q = 0; q < 3; ++q) {
      size_t per[3] = {0, 0, 0};
      for (const auto& [eh, bits] : model[q])
        for (int k = 0; k < 3; ++k) per[k] += (bits >> k) & 1;
      for (int k = 0; k < 3; ++k) ASSERT_EQ(ix.entries(q, KvMedium(k)), per[k]) << step;
    }
  }
}

TEST(ChooseKv, LongestPrefixRamBeforeTierWithinTheLoadBound) {
  const HashRing ring({"http://a:1", "http://b:1", "http://c:1"});
  const std::vector<bool> all(3, true);
  const std::vector<int> idle(3, 0);
  const uint64_t key = 77;
  const int ring_first = ring.walk(key)[0];
  // Nobody holds anything: the ring decides.
  EXPECT_EQ(choose_kv({{0, 0}, {0, 0}, {0, 0}}, {}, ring, key, {}, idle, all, 0.5).replica, -1);
  // The longest prefix wins.
  auto c = choose_kv({{2, 2}, {0, 0}, {5, 5}}, {}, ring, key, {}, idle, all, 0.5);
  EXPECT_EQ(c.replica, 2);
  EXPECT_EQ(c.kind, RouteKind::kKvEvents);
  // RAM beats a tier at equal length; a tier prefix wins only when more than twice as long.
  EXPECT_EQ(choose_kv({{4, 4}, {0, 4}, {0, 0}}, {}, ring, key, {}, idle, all, 0.5).replica, 0);
  EXPECT_EQ(choose_kv({{4, 4}, {0, 9}, {0, 0}}, {}, ring, key, {}, idle, all, 0.5).replica, 1);
  EXPECT_EQ(choose_kv({{4, 4}, {2, 7}, {0, 0}}, {}, ring, key, {}, idle, all, 0.5).replica, 1);  // 2 + 2.5 > 4
  // Equal scores: the ring's order from the key.
  EXPECT_EQ(choose_kv({{3, 3}, {3, 3}, {3, 3}}, {}, ring, key, {}, idle, all, 0.5).replica, ring_first);
  // Over the load bound ((1 + 0.5) x mean + 1): the next best holder; no holder within it: the ring.
  EXPECT_EQ(choose_kv({{2, 2}, {0, 0}, {5, 5}}, {}, ring, key, {}, {0, 0, 9}, all, 0.5).replica, 0);
  EXPECT_EQ(choose_kv({{0, 0}, {0, 0}, {5, 5}}, {}, ring, key, {}, {0, 0, 9}, all, 0.5).replica, -1);
  // Ineligible (unhealthy, or tried already) replicas are skipped.
  EXPECT_EQ(choose_kv({{2, 2}, {0, 0}, {5, 5}}, {}, ring, key, {}, idle, {true, true, false}, 0.5).replica, 0);
}

TEST(ChooseKv, TiesFollowThePromptPastTheLongestMatch) {
  const HashRing ring({"http://a:1", "http://b:1", "http://c:1", "http://d:1"});
  const std::vector<bool> all(4, true);
  const std::vector<int> idle(4, 0);
  // 64 prompts that share a 2-block head (every replica holds it) and differ after it.
  std::map<int, int> chosen;
  for (int p = 0; p < 64; ++p) {
    std::vector<int32_t> prompt(4 * 16, 7);
    for (int t = 32; t < 64; ++t) prompt[static_cast<size_t>(t)] = 1000 + p * 64 + t;
    const std::vector<uint64_t> chain = router_chain(prompt, 16);
    ASSERT_EQ(chain.size(), 4u);
    const uint64_t head_key = *prefix_key(prompt, 16, 2);
    const std::vector<PrefixMatch> m(4, PrefixMatch{2, 2});
    // Without the chain, every one goes to the head's ring owner.
    EXPECT_EQ(choose_kv(m, {}, ring, head_key, {}, idle, all, 0.5).replica, ring.walk(head_key)[0]);
    // With it, to the ring owner of its first block past the head (chain[2]).
    const RouteChoice c = choose_kv(m, {}, ring, head_key, chain, idle, all, 0.5);
    EXPECT_EQ(c.replica, ring.walk(chain[2])[0]);
    ++chosen[c.replica];
    // A longer match still wins over the tie order; the order is from past the longest match.
    std::vector<PrefixMatch> m2 = m;
    m2[1] = {3, 3};
    EXPECT_EQ(choose_kv(m2, {}, ring, head_key, chain, idle, all, 0.5).replica, 1);
    m2[2] = {3, 3};
    const int first_of_1_2 = [&] {
      for (int r : ring.walk(chain[3]))
        if (r == 1 || r == 2) return r;
      return -1;
    }();
    EXPECT_EQ(choose_kv(m2, {}, ring, head_key, chain, idle, all, 0.5).replica, first_of_1_2);
  }
  // The 64 prompts spread over all four replicas.
  EXPECT_EQ(chosen.size(), 4u);
  for (const auto& [r, n] : chosen) EXPECT_GE(n, 6) << "replica " << r;
}

TEST(ChooseKv, AHolderIsHeldToItsOwnLoadBound) {
  const HashRing ring({"http://a:1", "http://b:1", "http://c:1", "http://d:1"});
  const std::vector<bool> all(4, true);
  const std::vector<PrefixMatch> m{{0, 0}, {0, 0}, {6, 6}, {0, 0}};
  // Mean in flight 2: the ring's bound (0.5) is 4, the holders' (2) is 7.
  const std::vector<int> busy{1, 1, 5, 1};
  EXPECT_EQ(choose_kv(m, {}, ring, 1, {}, busy, all, 0.5).replica, -1);  // over 4: the caller's ring
  EXPECT_EQ(choose_kv(m, {.hold_imbalance = 2}, ring, 1, {}, busy, all, 0.5).replica, 2);
  const std::vector<int> busier{1, 1, 9, 1};  // mean 3: bound 10 holds it, 1.5 x 3 + 1 = 5.5 does not
  EXPECT_EQ(choose_kv(m, {.hold_imbalance = 2}, ring, 1, {}, busier, all, 0.5).replica, 2);
  EXPECT_EQ(choose_kv(m, {.hold_imbalance = 1}, ring, 1, {}, busier, all, 0.5).replica, -1);  // 2 x 3 + 1 = 7
  // Never tighter than max_imbalance.
  EXPECT_EQ(choose_kv(m, {.hold_imbalance = 0}, ring, 1, {}, busy, all, 2.0).replica, 2);
}

TEST(ChooseKv, MatchThresholdLeavesShortMatchesToTheRingPastThem) {
  const HashRing ring({"http://a:1", "http://b:1", "http://c:1", "http://d:1"});
  const std::vector<bool> all(4, true);
  const std::vector<int> idle(4, 0);
  std::vector<int32_t> prompt(10 * 16);
  for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = static_cast<int32_t>(500 + t);
  const std::vector<uint64_t> chain = router_chain(prompt, 16);  // 10 blocks
  const KvRouting half{.match_threshold = 0.5};
  // One replica alone holds 4 of 10 blocks (< 5): not followed; the ring from
  // chain[4] over every replica within the bound (holders or not).
  const int past4 = ring.walk(chain[4])[0];
  const int holder = (past4 + 1) % 4;
  std::vector<PrefixMatch> m(4);
  m[static_cast<size_t>(holder)] = {4, 4};
  RouteChoice c = choose_kv(m, half, ring, 1, chain, idle, all, 0.5);
  EXPECT_EQ(c.replica, past4);
  EXPECT_EQ(c.kind, RouteKind::kKvEvents);
  // Without the threshold the holder wins; at 5 of 10 blocks the match is followed.
  EXPECT_EQ(choose_kv(m, {}, ring, 1, chain, idle, all, 0.5).replica, holder);
  std::vector<PrefixMatch> m5(4);
  m5[static_cast<size_t>(holder)] = {5, 5};
  EXPECT_EQ(choose_kv(m5, half, ring, 1, chain, idle, all, 0.5).replica, holder);
  // The ring's pick over the bound: the next replica of that order within it.
  std::vector<int> busy(4, 0);
  busy[static_cast<size_t>(past4)] = 9;
  EXPECT_EQ(choose_kv(m, half, ring, 1, chain, busy, all, 0.5).replica, ring.walk(chain[4])[1]);
  // No holder: -1 (the caller's ring), whatever the threshold.
  EXPECT_EQ(choose_kv(std::vector<PrefixMatch>(4), half, ring, 1, chain, idle, all, 0.5).replica, -1);
}

TEST(ChooseKv, MinMatchLeavesShortMatchesToTheRing) {
  const HashRing ring({"http://a:1", "http://b:1", "http://c:1"});
  const std::vector<bool> all(3, true);
  const std::vector<int> idle(3, 0);
  const uint64_t key = 77;
  // min 1 (the default) is the rule above: any held block counts.
  EXPECT_EQ(choose_kv({{1, 1}, {0, 0}, {0, 0}}, {.min_blocks = 1}, ring, key, {}, idle, all, 0.5).replica, 0);
  EXPECT_EQ(choose_kv({{1, 1}, {0, 0}, {0, 0}}, {}, ring, key, {}, idle, all, 0.5).replica, 0);
  // min 0 is min 1: a replica holding nothing is never an event choice.
  EXPECT_EQ(choose_kv({{0, 0}, {0, 0}, {0, 0}}, {.min_blocks = 0}, ring, key, {}, idle, all, 0.5).replica, -1);
  // min 3: 2 blocks are not enough (the ring decides), 3 are, on any medium.
  EXPECT_EQ(choose_kv({{2, 2}, {0, 0}, {0, 0}}, {.min_blocks = 3}, ring, key, {}, idle, all, 0.5).replica, -1);
  EXPECT_EQ(choose_kv({{3, 3}, {0, 0}, {0, 0}}, {.min_blocks = 3}, ring, key, {}, idle, all, 0.5).replica, 0);
  // A replica below the minimum does not compete, even with a higher score (2 RAM blocks:
  // 2) than a qualifying one (3 tier blocks: 1.5).
  EXPECT_EQ(choose_kv({{2, 2}, {0, 3}, {0, 0}}, {.min_blocks = 3}, ring, key, {}, idle, all, 0.5).replica, 1);
  // Over the load bound the qualifying replica is skipped and, no other qualifying, the ring decides.
  EXPECT_EQ(choose_kv({{2, 2}, {0, 0}, {5, 5}}, {.min_blocks = 3}, ring, key, {}, {0, 0, 9}, all, 0.5).replica, -1);
}

}  // namespace
}  // namespace pagoda::router
