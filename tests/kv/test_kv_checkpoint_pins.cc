// Pins of a hybrid model's state checkpoints (kv/kv_pins.cc, issue 38): a pinned
// prefix also pins the checkpoints cached at boundaries inside it, the ones
// there when the pin is made and the ones made later while it lives. KvManager
// with one full-attention group and a recurrent state group of S = 2 blocks,
// blocks of 4 tokens, a checkpoint every 2 blocks (8 tokens), the pin cap the
// whole pool; exact block ids and counters, the invariants after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "base/rng.h"
#include "kv/kv_manager.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

using testing::Ids;
using testing::Tokens;
using Copies = std::vector<BlockCopy>;

KvManager make_kv(int32_t num_blocks) {
  KvConfig c = testing::make_config(num_blocks, 4);
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  c.state_checkpoint_interval = 2;
  c.pinned_fraction = 1.0;
  return KvManager(c);
}

Copies flush(KvManager& kv) {
  Copies done;
  kv.flush_checkpoints([&](BlockId src, BlockId dst) { done.emplace_back(src, dst); });
  return done;
}

int32_t admit(KvManager& kv, SeqId id, const Tokens& t, int32_t num_new, Copies* restore) {
  auto a = kv.can_allocate(kv.match_prefix(t, ""), num_new);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.message());
  if (!a.ok()) return -1;
  auto got = kv.allocate(id, *a, restore);
  EXPECT_TRUE(got.ok()) << (got.ok() ? "" : got.message());
  return got.ok() ? *got : -1;
}

// An unrelated prompt of n tokens, computed whole in one step (no checkpoint: n is no boundary) and freed.
void flood(KvManager& kv, SeqId id, TokenId start, int32_t n) {
  Copies restore;
  const Tokens t = testing::iota_tokens(start, n);
  ASSERT_EQ(admit(kv, id, t, n, &restore), 0);
  kv.mark_computed(id, t, n);
  EXPECT_EQ(kv.num_pending_checkpoint_copies(), 0);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(id));
  EXPECT_INVARIANTS(kv);
}

TEST(KvCheckpointPins, ChunksAlsoEndAtThePinsLastBoundary) {
  KvManager kv = make_kv(16);
  // Boundaries every 8 tokens; a pin of 21 tokens ends its checkpoints at 16.
  EXPECT_EQ(kv.checkpoint_chunk(0, 30), 24) << "no pin: the latest boundary";
  EXPECT_EQ(kv.checkpoint_chunk(0, 30, 21), 16) << "the pin's last boundary first";
  EXPECT_EQ(kv.checkpoint_chunk(16, 14, 21), 8) << "then as without a pin";
  EXPECT_EQ(kv.checkpoint_chunk(0, 16, 21), 16) << "a chunk ending there needs no cut";
  EXPECT_EQ(kv.checkpoint_chunk(0, 12, 21), 8) << "a chunk before it: as without a pin";
  EXPECT_EQ(kv.checkpoint_chunk(3, 30, 7), 29) << "a pin shorter than a checkpoint interval: no cut of its own";
  KvConfig c = testing::make_config(16, 4);
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  c.state_checkpoint_interval = 0;
  EXPECT_EQ(KvManager(c).checkpoint_chunk(0, 30, 21), 30) << "no checkpoints: no cut";
}

TEST(KvCheckpointPins, APinnedPrefixKeepsItsCheckpointUntilUnpinned) {
  // 15 usable blocks. Seq 1 computes 8 tokens: K/V 1, 2, state 3, 4, the checkpoint at 8 in 5, 6.
  KvManager kv = make_kv(16);
  double now = 1000;
  kv.set_clock([&] { return now; });
  const Tokens t = testing::iota_tokens(100, 10);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, 8, &restore), 0);
  kv.mark_computed(1, t, 8);
  EXPECT_EQ(flush(kv), (Copies{{3, 5}, {4, 6}}));
  // Pinned once computed: its 2 K/V blocks and the checkpoint's 2 blocks.
  kv.pin_prefix(1, 8, 60);
  EXPECT_EQ(kv.pin_stats().num_pins, 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  EXPECT_EQ(kv.pin_expiry(5), 1060);
  EXPECT_EQ(kv.pin_expiry(6), 1060);
  EXPECT_EQ(kv.pool().ref_count(5), 1) << "the pin's reference";
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  EXPECT_EQ(kv.pool().free_queue(), (Ids{7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 3}));
  EXPECT_INVARIANTS(kv);

  // Traffic takes every free block (9 K/V + 2 state): the checkpoint's are not among them.
  flood(kv, 2, 700, 36);
  EXPECT_EQ(kv.stats().checkpoints_evicted, 0);
  EXPECT_EQ(kv.stats().num_checkpoints, 1);
  // The second turn hits the pinned checkpoint: restored from 5, 6.
  const Tokens t2 = testing::concat(Tokens(t.begin(), t.begin() + 10), testing::iota_tokens(500, 4));
  const PrefixMatch m = kv.match_prefix(t2, "");
  EXPECT_EQ(m.num_cached_tokens(), 8);
  EXPECT_EQ(Ids(m.checkpoint_blocks().begin(), m.checkpoint_blocks().end()), (Ids{5, 6}));
  ASSERT_EQ(admit(kv, 3, t2, 6, &restore), 8);
  ASSERT_EQ(restore.size(), 2u);
  EXPECT_EQ(restore[0].first, 5);
  EXPECT_EQ(restore[1].first, 6);
  EXPECT_EQ(kv.stats().checkpoints_hit, 1);
  EXPECT_EQ(kv.pin_stats().renewed, 1) << "a hit over the whole pinned prefix renews it";
  EXPECT_EQ(kv.pool().ref_count(5), 2) << "the pin and the restore hold";
  kv.mark_computed(3, t2, 14);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(3));
  EXPECT_INVARIANTS(kv);

  // Expired: K/V and checkpoint become cached-evictable, and the same traffic (now 15 blocks) evicts them.
  now += 61;
  EXPECT_EQ(kv.expire_pins(), 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 0);
  EXPECT_EQ(kv.pool().ref_count(5), 0);
  EXPECT_TRUE(kv.cache().contains(5));
  EXPECT_EQ(testing::cached_tokens(kv, t2), 8);
  EXPECT_INVARIANTS(kv);
  flood(kv, 4, 900, 52);
  EXPECT_EQ(kv.stats().checkpoints_evicted, 1);
  EXPECT_EQ(kv.stats().num_checkpoints, 0);
  EXPECT_EQ(testing::cached_tokens(kv, t2), 0);
}

TEST(KvCheckpointPins, CheckpointsMadeLaterInsideAPinAreAddedToIt) {
  // 23 usable blocks. The pin is asked before the prompt runs (16 tokens of 18): one
  // chunk of 16 checkpoints only at 16, and the pin then takes K/V 1..4 and that checkpoint's 7, 8.
  KvManager kv = make_kv(24);
  double now = 1000;
  kv.set_clock([&] { return now; });
  const Tokens t = testing::iota_tokens(100, 18);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, kv.checkpoint_chunk(0, 18), &restore), 0);
  kv.pin_prefix(1, 16, 60);
  EXPECT_EQ(kv.pin_stats().num_pins, 0) << "deferred until its blocks are committed";
  kv.mark_computed(1, t, 16);
  EXPECT_EQ(kv.pin_stats().num_pins, 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 6);
  EXPECT_EQ(kv.pin_expiry(7), 1060);
  EXPECT_EQ(kv.pool().ref_count(7), 2) << "the pin and the pending copy";
  EXPECT_EQ(flush(kv), (Copies{{5, 7}, {6, 8}}));
  EXPECT_EQ(kv.pool().ref_count(7), 1);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  EXPECT_INVARIANTS(kv);

  // A prompt of the first 12 tokens finds no checkpoint inside its 3 cached blocks: it
  // computes 8 (one chunk to the boundary: K/V 9, 10, state 11, 12) and checkpoints at 8
  // into 13, 14, the pin's K/V block 2 ending there: the pin takes them too.
  const Tokens head(t.begin(), t.begin() + 12);
  EXPECT_EQ(testing::cached_tokens(kv, head), 0);
  ASSERT_EQ(admit(kv, 2, head, kv.checkpoint_chunk(0, 12), &restore), 0);
  kv.mark_computed(2, head, 8);
  EXPECT_EQ(kv.pin_stats().checkpoints_added, 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 8);
  EXPECT_EQ(kv.pin_expiry(13), 1060);
  EXPECT_EQ(kv.pin_expiry(14), 1060);
  EXPECT_EQ(flush(kv), (Copies{{11, 13}, {12, 14}}));
  EXPECT_EQ(kv.pool().ref_count(13), 1);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);

  // Traffic takes all 15 free blocks; both checkpoints stay and hit.
  flood(kv, 3, 700, 52);
  EXPECT_EQ(kv.stats().checkpoints_evicted, 0);
  EXPECT_EQ(testing::cached_tokens(kv, head), 8);
  EXPECT_EQ(testing::cached_tokens(kv, t), 16);

  // Expired: all 8 blocks go back; traffic of the whole pool evicts both checkpoints.
  now += 61;
  EXPECT_EQ(kv.expire_pins(), 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 0);
  EXPECT_INVARIANTS(kv);
  flood(kv, 4, 900, 84);
  EXPECT_EQ(kv.stats().checkpoints_evicted, 2);
  EXPECT_EQ(testing::cached_tokens(kv, t), 0);
}

TEST(KvCheckpointPins, ACheckpointImportedFromATierInsideAPinJoinsIt) {
  // 15 usable blocks. Seq 1 computes 10 tokens in one step: 3 K/V blocks, its state, no checkpoint
  // (10 is no boundary). Its pin of 8 tokens holds K/V 1, 2 alone: no hit (no checkpoint).
  KvManager kv = make_kv(16);
  const Tokens t = testing::iota_tokens(100, 10);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, 10, &restore), 0);
  kv.mark_computed(1, t, 10);
  EXPECT_EQ(kv.stats().checkpoints_stored, 0);
  kv.pin_prefix(1, 8, 60);
  EXPECT_EQ(kv.num_pinned_blocks(), 2);
  ASSERT_TRUE(kv.free(1));
  EXPECT_EQ(testing::cached_tokens(kv, t), 0);
  // A tier brings the checkpoint at 8 (import_blocks: K/V from RAM, the checkpoint loaded): the pin takes it.
  int32_t parts = 0;
  EXPECT_EQ(kv.import_blocks(
                t, "", 2, [](int32_t g, int32_t i) { return g == 1 && i == 1; }, [](int32_t, int32_t, BlockId) {},
                [&](int32_t i, int32_t, BlockId) { EXPECT_EQ(i, 1); ++parts; }),
            2);
  EXPECT_EQ(parts, 2);
  EXPECT_EQ(kv.pin_stats().checkpoints_added, 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 4);
  EXPECT_INVARIANTS(kv);
  EXPECT_EQ(testing::cached_tokens(kv, t), 8);
  // Traffic over the 11 free blocks, twice (unpinned, the checkpoint would be among the second's): it stays.
  flood(kv, 2, 700, 36);
  flood(kv, 3, 900, 36);
  EXPECT_EQ(kv.stats().checkpoints_evicted, 0);
  EXPECT_EQ(testing::cached_tokens(kv, t), 8);
}

TEST(KvCheckpointPins, ACheckpointPastTheCapStaysUnpinned) {
  // Cap 6 of 23 usable blocks: the pin of 16 tokens takes 4 K/V + 2 checkpoint blocks = the cap, so
  // the checkpoint made later at 8 finds no room and stays an ordinary cached one.
  KvConfig c = testing::make_config(24, 4);
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  c.state_checkpoint_interval = 2;
  c.pinned_fraction = 0.27;
  KvManager kv(c);
  ASSERT_EQ(kv.pin_cap_blocks(), 6);
  const Tokens t = testing::iota_tokens(100, 18);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, 16, &restore), 0);
  kv.pin_prefix(1, 16, 60);
  kv.mark_computed(1, t, 16);
  EXPECT_EQ(kv.num_pinned_blocks(), 6);
  flush(kv);
  ASSERT_TRUE(kv.free(1));
  const Tokens head(t.begin(), t.begin() + 12);
  ASSERT_EQ(admit(kv, 2, head, 8, &restore), 0);
  kv.mark_computed(2, head, 8);
  EXPECT_EQ(kv.stats().checkpoints_stored, 2);
  EXPECT_EQ(kv.pin_stats().checkpoints_added, 0);
  EXPECT_EQ(kv.pin_stats().checkpoints_over_cap, 1);
  EXPECT_EQ(kv.num_pinned_blocks(), 6);
  EXPECT_EQ(flush(kv), (Copies{{11, 13}, {12, 14}}));
  EXPECT_EQ(kv.pool().ref_count(13), 0);
  EXPECT_EQ(kv.pin_expiry(13), 0);
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(2));
  EXPECT_INVARIANTS(kv);
}

TEST(KvCheckpointPins, OverTheCapAPinKeepsTheLongestHeadEndingAtACheckpoint) {
  // Cap 6 of 23 usable blocks. 16 tokens in two chunks of 8: K/V 1, 2, 7, 8, state 3, 4, checkpoints at
  // 8 (5, 6) and 16 (9, 10). All of it is 4 K/V + 4 checkpoint blocks = 8: over the cap, the pin keeps
  // K/V 1, 2, 7, 8 and the checkpoint at 16 only (6 blocks; the former rule, the longest head that fits,
  // kept K/V 1, 2, 7 and the checkpoint at 8: a hit of 8 tokens only).
  KvConfig c = testing::make_config(24, 4);
  c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
  c.state_checkpoint_interval = 2;
  c.pinned_fraction = 0.27;
  KvManager kv(c);
  ASSERT_EQ(kv.pin_cap_blocks(), 6);
  const Tokens t = testing::iota_tokens(100, 18);
  Copies restore;
  ASSERT_EQ(admit(kv, 1, t, 8, &restore), 0);
  kv.mark_computed(1, t, 8);
  EXPECT_EQ(flush(kv), (Copies{{3, 5}, {4, 6}}));
  Copies copies;
  ASSERT_TRUE(kv.append_slots(1, 8, &copies));
  kv.mark_computed(1, t, 16);
  EXPECT_EQ(flush(kv), (Copies{{3, 9}, {4, 10}}));
  EXPECT_EQ(kv.stats().num_checkpoints, 2);
  EXPECT_INVARIANTS(kv);
  kv.pin_prefix(1, 16, 60);
  EXPECT_EQ(kv.num_pinned_blocks(), 6);
  for (BlockId b : {1, 2, 7, 8, 9, 10}) EXPECT_GT(kv.pin_expiry(b), 0) << b;
  for (BlockId b : {5, 6}) EXPECT_EQ(kv.pin_expiry(b), 0) << b;
  EXPECT_INVARIANTS(kv);
  ASSERT_TRUE(kv.free(1));
  EXPECT_INVARIANTS(kv);
  // Traffic over every free block: the checkpoint at 8 goes, the pinned one at 16 stays.
  flood(kv, 2, 700, 60);
  EXPECT_EQ(kv.stats().checkpoints_evicted, 1);
  EXPECT_EQ(testing::cached_tokens(kv, t), 16);
  EXPECT_EQ(testing::cached_tokens(kv, Tokens(t.begin(), t.begin() + 12)), 0) << "the one at 8 was not pinned";
}

// Random admissions (some pinning, before their prompt runs), chunks cut at
// boundaries (and at the pin's), decodes, forks, frees, TTLs passing, the
// pending checkpoint copies flushed after each step: every invariant holds
// after every operation, pins never pass the cap, and checkpoints are pinned
// both with their pin and later.
TEST(KvCheckpointPins, RandomizedWithCheckpointsPinsAndForks) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    double now = 0;
    KvConfig c = testing::make_config(61, 4);
    c.groups = {KvGroupSpec{0, 0}, KvGroupSpec{0, 2}};
    c.state_checkpoint_interval = 2;
    c.pinned_fraction = 0.3;  // 18 blocks
    KvManager kv(c);
    kv.set_clock([&] { return now; });
    Rng rng(seed);
    std::vector<Tokens> bases(3);
    for (auto& b : bases)
      for (int i = 0; i < 64; ++i) b.push_back(static_cast<TokenId>(rng.uniform_int(0, 3)));
    std::map<SeqId, Tokens> seqs;
    std::map<SeqId, int32_t> pin_of;
    SeqId next = 1;
    int64_t max_pinned = 0;
    for (int op = 0; op < 4000; ++op) {
      const double r = rng.uniform();
      if (r < 0.25 || seqs.empty()) {
        const Tokens& b = bases[static_cast<size_t>(rng.uniform_int(0, 2))];
        Tokens p(b.begin(), b.begin() + rng.uniform_int(1, 64));
        for (int64_t i = rng.uniform_int(0, 6); i > 0; --i) p.push_back(static_cast<TokenId>(rng.uniform_int(0, 3)));
        const int32_t pin = rng.uniform() < 0.5 ? static_cast<int32_t>(rng.uniform_int(0, 48)) : 0;
        PrefixMatch m = kv.match_prefix(p, "");
        const int32_t hit = m.num_cached_tokens();
        const int32_t n = kv.checkpoint_chunk(hit, std::min<int32_t>(static_cast<int32_t>(p.size()) - hit, 12), pin);
        auto a = kv.can_allocate(std::move(m), n);
        if (!a.ok()) {
          if (rng.uniform() < 0.5) kv.unpin_oldest();
        } else {
          Copies restore;
          ASSERT_TRUE(kv.allocate(next, *a, &restore).ok());
          if (pin > 0) kv.pin_prefix(next, pin, 1 + 29 * rng.uniform());
          kv.mark_computed(next, p, hit + n);
          pin_of[next] = pin;
          seqs[next++] = p;
        }
      } else if (r < 0.65) {  // a step: the rest of the prompt in chunks, then decodes
        auto it = seqs.begin();
        std::advance(it, rng.uniform_int(0, static_cast<int64_t>(seqs.size()) - 1));
        Tokens& tok = it->second;
        const int32_t done = kv.num_computed_tokens(it->first);
        if (done == static_cast<int32_t>(tok.size())) tok.push_back(static_cast<TokenId>(rng.uniform_int(0, 3)));
        const int32_t n = kv.checkpoint_chunk(done, std::min<int32_t>(static_cast<int32_t>(tok.size()) - done, 12),
                                              pin_of[it->first]);
        Copies copies;
        if (kv.append_slots(it->first, n, &copies)) kv.mark_computed(it->first, tok, done + n);
      } else if (r < 0.72) {
        auto it = seqs.begin();
        std::advance(it, rng.uniform_int(0, static_cast<int64_t>(seqs.size()) - 1));
        if (kv.num_computed_tokens(it->first) == static_cast<int32_t>(it->second.size()) &&
            kv.fork(it->first, next).ok()) {
          pin_of[next] = 0;
          seqs[next++] = it->second;
        }
      } else if (r < 0.9) {
        auto it = seqs.begin();
        std::advance(it, rng.uniform_int(0, static_cast<int64_t>(seqs.size()) - 1));
        ASSERT_TRUE(kv.free(it->first));
        seqs.erase(it);
      } else {
        now += 5 * rng.uniform();
        kv.expire_pins();
      }
      flush(kv);
      ASSERT_EQ(kv.check_invariants(), "") << "seed " << seed << " op " << op;
      ASSERT_LE(kv.num_pinned_blocks(), kv.pin_cap_blocks());
      max_pinned = std::max<int64_t>(max_pinned, kv.num_pinned_blocks());
    }
    const KvManager::PinStats st = kv.pin_stats();
    EXPECT_GT(st.created, 50) << "seed " << seed;
    EXPECT_GT(st.expired, 10) << "seed " << seed;
    EXPECT_GT(st.checkpoints_added, 0) << "seed " << seed;
    EXPECT_GT(kv.stats().checkpoints_hit, 50) << "seed " << seed;
    for (auto& [id, tok] : seqs) ASSERT_TRUE(kv.free(id));
    now += 1000;
    kv.expire_pins();
    EXPECT_EQ(kv.num_free_blocks(), kv.num_usable_blocks()) << "seed " << seed;
    EXPECT_EQ(kv.check_invariants(), "");
  }
}

}  // namespace
}  // namespace pagoda::kv
