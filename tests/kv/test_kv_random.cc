// Randomized test: >= 100,000 random operations (allocate with prompts from a
// small alphabet so prefixes collide, compute, append, fork, free) against a
// deliberately simple reference model: the test's own copy of every block
// table, ref counts recounted from those tables, and a shadow "KV storage"
// holding the token written at each (block, offset). The shadow catches any
// prefix hit or copy-on-write that would give a sequence the wrong K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "base/rng.h"
#include "kv/test_util.h"

namespace pagoda::kv {
namespace {

struct RefSeq {
  std::vector<TokenId> tokens;  // known tokens
  int32_t computed = 0;
  std::vector<BlockId> table;
  std::string salt;
};

class RandomKvTest {
 public:
  // salt_blind_keys: block keys ignore the salt, so equal prompts of two
  // tenants collide and only the cache's salt check keeps them apart.
  RandomKvTest(int32_t num_blocks, int32_t block_size, double watermark, uint64_t seed, bool salt_blind_keys = false)
      : kv_(testing::make_config(num_blocks, block_size, watermark, /*model_fingerprint=*/77)), bs_(block_size),
        rng_(seed),
        shadow_(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size), -1),
        shadow_salt_(static_cast<size_t>(num_blocks)) {
    if (salt_blind_keys) {
      kv_.mutable_cache_for_testing().set_hash_fn_for_testing(
          [](const Hash128& parent, std::span<const TokenId> t, uint64_t fp, std::string_view) {
            return PrefixCache::default_hash(parent, t, fp, "");
          });
    }
    // Three base strings over {0..3}; prompts take a random prefix of one.
    for (auto& b : bases_) {
      for (int i = 0; i < 96; ++i) b.push_back(static_cast<TokenId>(rng_.uniform_int(0, 3)));
    }
  }

  void run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int64_t r = rng_.uniform_int(0, 99);
      const bool crowded = seqs_.size() >= 14;
      if (seqs_.empty() || (!crowded && r < 30)) {
        do_allocate();
      } else if (r < 55) {
        do_compute();
      } else if (r < 75) {
        do_append();
      } else if (r < 83 && !crowded) {
        do_fork();
      } else {
        do_free();
      }
      check_all(op);
      if (::testing::Test::HasFailure()) return;
    }
    while (!seqs_.empty()) do_free();
    check_all(num_ops);
    EXPECT_EQ(kv_.num_free_blocks(), kv_.num_usable_blocks());
    EXPECT_EQ(kv_.stats().num_used, 0);
    EXPECT_EQ(kv_.num_seqs(), 0);
  }

  const KvManager& kv() const { return kv_; }
  int64_t num_allocs_refused = 0, num_appends_refused = 0, num_hit_allocs = 0, num_cow = 0, num_revalidated = 0,
          num_revalidated_shorter = 0;

 private:
  TokenId& slot(BlockId b, int32_t pos) {
    return shadow_[static_cast<size_t>(b) * static_cast<size_t>(bs_) + static_cast<size_t>(pos % bs_)];
  }

  SeqId pick() {
    auto it = seqs_.begin();
    std::advance(it, rng_.uniform_int(0, static_cast<int64_t>(seqs_.size()) - 1));
    return it->first;
  }

  void do_allocate() {
    RefSeq s;
    const auto& base = bases_[static_cast<size_t>(rng_.uniform_int(0, 2))];
    const int64_t shared = rng_.uniform_int(0, 48);
    s.tokens.assign(base.begin(), base.begin() + shared);
    const int64_t tail = rng_.uniform_int(1, 12);
    for (int64_t i = 0; i < tail; ++i) s.tokens.push_back(static_cast<TokenId>(rng_.uniform_int(0, 1)));
    const int64_t salt = rng_.uniform_int(0, 5);
    s.salt = salt == 0 ? "tenant" : "";
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    const int64_t lookups_before = kv_.stats().prefix_lookups;
    PrefixMatch match = kv_.match_prefix(s.tokens, s.salt);
    ASSERT_EQ(kv_.stats().prefix_lookups, lookups_before + 1);
    const int32_t cached = match.num_cached_tokens();
    ASSERT_EQ(cached % bs_, 0);
    ASSERT_LT(cached, len);
    const auto num_new = static_cast<int32_t>(rng_.uniform_int(1, len - cached));
    const SeqId id = next_id_++;
    const KvStats before = kv_.stats();
    const auto queue_before = kv_.pool().free_queue();
    if (rng_.uniform_int(0, 7) == 0) {
      // Some other change lands between the lookup and the admission: the
      // match is refused as stale, then revalidated without a lookup. With
      // no block committed in between (only taken and freed), the revalidated
      // match is exactly what a fresh lookup finds.
      const SeqId other = next_id_++;
      const bool changed = kv_.allocate(other, bases_[0], 1 + static_cast<int32_t>(rng_.uniform_int(0, 3)), "").ok();
      if (changed) kv_.free(other);
      if (changed) {
        auto stale = kv_.can_allocate(match, num_new);
        ASSERT_FALSE(stale.ok());
        ASSERT_NE(stale.message().find("stale"), std::string::npos) << stale.message();
        const PrefixMatch fresh = kv_.match_prefix(s.tokens, s.salt);
        kv_.revalidate(&match);
        ASSERT_TRUE(std::ranges::equal(match.blocks(), fresh.blocks()));
        ASSERT_EQ(match.next_block_key() != nullptr, fresh.next_block_key() != nullptr);
        if (fresh.next_block_key() != nullptr) {
          ASSERT_TRUE(*match.next_block_key() == *fresh.next_block_key());
        }
        auto again = kv_.can_allocate(match, 1);
        ASSERT_TRUE(again.ok() || again.message().find("stale") == std::string::npos) << again.message();
        ++num_revalidated;
        if (match.num_cached_tokens() < cached) ++num_revalidated_shorter;
        return;  // the pool changed under queue_before: a plain admission next time
      }
    }
    const int64_t lookups = kv_.stats().prefix_lookups;
    auto admission = kv_.can_allocate(match, num_new);
    ASSERT_EQ(kv_.stats().prefix_lookups, lookups) << "can_allocate must not look up again";
    if (!admission.ok()) {
      ++num_allocs_refused;
      // The one-call form refuses the same, and a refusal changes nothing.
      ASSERT_FALSE(kv_.allocate(id, s.tokens, num_new, s.salt).ok());
      ASSERT_FALSE(kv_.has_seq(id));
      ASSERT_EQ(kv_.pool().free_queue(), queue_before);
      ASSERT_EQ(kv_.stats().num_cached, before.num_cached);
      ASSERT_EQ(kv_.stats().prefix_query_tokens, before.prefix_query_tokens);
      return;
    }
    auto got = kv_.allocate(id, *admission);
    ASSERT_TRUE(got.ok()) << got.message();
    ASSERT_EQ(kv_.stats().prefix_lookups, lookups) << "allocate must not look up again";
    ASSERT_EQ(kv_.num_free_blocks(), static_cast<int32_t>(queue_before.size()) - admission->num_blocks_needed());
    ASSERT_EQ(*got, cached);
    if (cached > 0) ++num_hit_allocs;
    s.computed = cached;
    auto t = kv_.block_table(id);
    s.table.assign(t.begin(), t.end());
    ASSERT_EQ(static_cast<int32_t>(s.table.size()), blocks_for_tokens(cached + num_new, bs_));
    // Every cached token must really be in the shadow storage of its block.
    for (int32_t p = 0; p < cached; ++p) {
      ASSERT_EQ(slot(s.table[static_cast<size_t>(p / bs_)], p), s.tokens[static_cast<size_t>(p)])
          << "prefix hit with wrong content at position " << p;
    }
    // ... and written by a sequence of the same tenant.
    for (int32_t j = 0; j < cached / bs_; ++j) {
      const BlockId b = s.table[static_cast<size_t>(j)];
      ASSERT_EQ(shadow_salt_[static_cast<size_t>(b)], s.salt) << "prefix hit across salts at block " << b;
      ASSERT_EQ(kv_.cache().salt_of(b), s.salt) << "block " << b;
    }
    seqs_.emplace(id, std::move(s));
  }

  // One engine step for a sequence: room (and copy-on-write) for the next
  // tokens, "run" them into the shadow storage, mark them computed.
  void do_compute() {
    const SeqId id = pick();
    RefSeq& s = seqs_[id];
    const auto known = static_cast<int32_t>(s.tokens.size());
    if (s.computed >= known) return;
    const auto upto = static_cast<int32_t>(rng_.uniform_int(s.computed + 1, known));
    if (!reserve(id, upto - s.computed)) return;
    for (int32_t p = s.computed; p < upto; ++p) {
      const BlockId b = s.table[static_cast<size_t>(p / bs_)];
      // Writes go only to blocks this sequence owns alone and that are not cached.
      ASSERT_EQ(kv_.pool().ref_count(b), 1) << "write into a shared block " << b;
      ASSERT_FALSE(kv_.cache().contains(b)) << "write into a cached block " << b;
      slot(b, p) = s.tokens[static_cast<size_t>(p)];
      shadow_salt_[static_cast<size_t>(b)] = s.salt;
    }
    s.computed = upto;
    kv_.mark_computed(id, s.tokens, upto);
  }

  // New known tokens (sampled or appended); sometimes reserve their slots ahead.
  void do_append() {
    const SeqId id = pick();
    RefSeq& s = seqs_[id];
    const int64_t k = rng_.uniform_int(0, 2 * bs_);
    for (int64_t i = 0; i < k; ++i) s.tokens.push_back(static_cast<TokenId>(rng_.uniform_int(0, 1)));
    if (rng_.uniform_int(0, 1) == 0) reserve(id, static_cast<int32_t>(s.tokens.size()) - s.computed);
  }

  // append_slots(n) checked against the model; applies CoW copies to the shadow.
  bool reserve(SeqId id, int32_t n) {
    RefSeq& s = seqs_[id];
    const bool can = kv_.can_append_slots(id, n);
    std::vector<BlockCopy> copies;
    const auto queue_before = kv_.pool().free_queue();
    const bool ok = kv_.append_slots(id, n, &copies);
    EXPECT_EQ(ok, can);
    auto t = kv_.block_table(id);
    const std::vector<BlockId> table(t.begin(), t.end());
    if (!ok) {
      ++num_appends_refused;
      EXPECT_TRUE(copies.empty());
      EXPECT_EQ(table, s.table);
      EXPECT_EQ(kv_.pool().free_queue(), queue_before);
      return false;
    }
    EXPECT_GE(static_cast<int32_t>(table.size()) * bs_, s.computed + n);
    // Blocks before the first written one never change; replaced ones were shared.
    const size_t first_written = static_cast<size_t>(s.computed / bs_);
    size_t copy_i = 0;
    for (size_t j = 0; j < s.table.size(); ++j) {
      if (j < first_written || table[j] == s.table[j]) {
        EXPECT_EQ(table[j], s.table[j]);
        continue;
      }
      EXPECT_GT(kv_.pool().ref_count(s.table[j]), 0) << "replaced block " << s.table[j] << " was not shared";
      if (static_cast<int32_t>(j) * bs_ < s.computed) {
        EXPECT_LT(copy_i, copies.size());
        if (copy_i >= copies.size()) return false;
        EXPECT_EQ(copies[copy_i], (BlockCopy{s.table[j], table[j]}));
        ++copy_i;
        for (int32_t o = 0; o < bs_; ++o) {
          shadow_[static_cast<size_t>(table[j] * bs_ + o)] = shadow_[static_cast<size_t>(s.table[j] * bs_ + o)];
        }
        shadow_salt_[static_cast<size_t>(table[j])] = shadow_salt_[static_cast<size_t>(s.table[j])];
        ++num_cow;
      }
    }
    EXPECT_EQ(copy_i, copies.size());
    s.table = table;
    return true;
  }

  void do_fork() {
    const SeqId parent = pick();
    const SeqId child = next_id_++;
    ASSERT_TRUE(kv_.fork(parent, child).ok());
    seqs_.emplace(child, seqs_[parent]);
  }

  void do_free() {
    const SeqId id = pick();
    ASSERT_TRUE(kv_.free(id));
    seqs_.erase(id);
  }

  void check_all(int op) {
    ASSERT_EQ(kv_.check_invariants(), "") << "after op " << op;
    const KvStats st = kv_.stats();
    ASSERT_EQ(st.num_free + st.num_used + st.num_cached_evictable, st.num_blocks_total);
    std::vector<int32_t> refs(static_cast<size_t>(kv_.pool().num_blocks()), 0);
    for (const auto& [id, s] : seqs_) {
      auto t = kv_.block_table(id);
      ASSERT_EQ(std::vector<BlockId>(t.begin(), t.end()), s.table) << "seq " << id << " op " << op;
      ASSERT_EQ(kv_.num_computed_tokens(id), s.computed);
      for (BlockId b : s.table) ++refs[static_cast<size_t>(b)];
    }
    for (BlockId b = 1; b < kv_.pool().num_blocks(); ++b) {
      ASSERT_EQ(kv_.pool().ref_count(b), refs[static_cast<size_t>(b)]) << "block " << b << " op " << op;
      ASSERT_FALSE(refs[static_cast<size_t>(b)] > 0 && kv_.pool().in_free_queue(b)) << "block " << b;
    }
    // Every computed token of every sequence is intact in its blocks (sampled).
    if (op % 16 == 0) {
      for (const auto& [id, s] : seqs_) {
        for (int32_t p = 0; p < s.computed; ++p) {
          ASSERT_EQ(slot(s.table[static_cast<size_t>(p / bs_)], p), s.tokens[static_cast<size_t>(p)])
              << "seq " << id << " lost its token at " << p << " op " << op;
        }
      }
    }
  }

  KvManager kv_;
  int32_t bs_;
  Rng rng_;
  std::vector<TokenId> shadow_;  // [num_blocks, block_size]
  std::vector<std::string> shadow_salt_;  // [num_blocks] salt of the sequence that last wrote each block
  std::vector<TokenId> bases_[3];
  std::map<SeqId, RefSeq> seqs_;
  SeqId next_id_ = 1;
};

struct Case {
  int32_t num_blocks, block_size;
  double watermark;
  int ops;
};

TEST(KvRandom, HundredThousandOpsAgainstReference) {
  const Case cases[] = {{48, 4, 0.0, 100000}, {160, 1, 0.02, 20000}, {20, 16, 0.05, 20000}, {12, 2, 0.0, 20000}};
  uint64_t seed = 1234;
  for (const Case& c : cases) {
    SCOPED_TRACE("block_size " + std::to_string(c.block_size));
    RandomKvTest t(c.num_blocks, c.block_size, c.watermark, seed++);
    t.run(c.ops);
    if (HasFatalFailure()) return;
    const KvStats st = t.kv().stats();
    // The workload must exercise what it claims to.
    EXPECT_GT(st.prefix_hit_tokens, 0);
    EXPECT_GT(st.num_evictions, 0);
    EXPECT_GT(t.num_allocs_refused, 0);
    EXPECT_GT(t.num_hit_allocs, 100);
    EXPECT_GT(t.num_revalidated, 100);
    EXPECT_GT(t.num_revalidated_shorter, 0);  // some stale matches lost blocks to eviction
    if (c.block_size > 1) {
      EXPECT_GT(t.num_cow, 0);  // 1-token blocks are never partly written
    }
    std::printf("bs=%d blocks=%d: hit tokens %lld / %lld, evictions %lld, cow %lld, refused alloc %lld append %lld, "
                "revalidated %lld (%lld shorter)\n",
                c.block_size, c.num_blocks, static_cast<long long>(st.prefix_hit_tokens),
                static_cast<long long>(st.prefix_query_tokens), static_cast<long long>(st.num_evictions),
                static_cast<long long>(t.num_cow), static_cast<long long>(t.num_allocs_refused),
                static_cast<long long>(t.num_appends_refused), static_cast<long long>(t.num_revalidated),
                static_cast<long long>(t.num_revalidated_shorter));
  }
}

TEST(KvRandom, SaltBlindKeysNeverHitAcrossTenants) {
  // Every prompt's keys collide with the same prompt of the other tenant: the
  // salt stored with each entry is all that separates them.
  RandomKvTest t(48, 4, 0.0, 99, /*salt_blind_keys=*/true);
  t.run(20000);
  if (HasFatalFailure()) return;
  const KvStats st = t.kv().stats();
  EXPECT_GT(st.prefix_hit_tokens, 0);
  EXPECT_GT(t.num_hit_allocs, 100);
  EXPECT_GT(st.collisions_refused, 100);  // cross-tenant key matches happened and were refused
}

}  // namespace
}  // namespace pagoda::kv
