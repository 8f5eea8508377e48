// Randomized test: >= 100,000 random operations (allocate with prompts from a
// small alphabet so prefixes collide, compute, append, fork, free) against a
// deliberately simple reference model: the test's own copy of every block
// table, ref counts recounted from those tables, and a shadow "KV storage"
// holding the token written at each (block, offset). The shadow catches any
// prefix hit or copy-on-write that would give a sequence the wrong K/V.
// With KV cache groups (full and sliding-window), the model keeps one table
// per group and checks after every operation that a window group holds
// exactly the blocks of its window (none released inside it, none kept before
// it), and that every group's blocks hold the right tokens.
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
  std::vector<std::vector<BlockId>> tables;  // [n_groups]
  int32_t released_from = 0;  // the start of the last step: window groups hold from its window on
  std::string salt;
};

KvConfig group_config(int32_t num_blocks, int32_t block_size, double watermark, std::vector<int32_t> windows) {
  KvConfig c = testing::make_config(num_blocks, block_size, watermark, /*model_fingerprint=*/77);
  for (int32_t w : windows) c.groups.push_back(KvGroupSpec{w});
  return c;
}

class RandomKvTest {
 public:
  // salt_blind_keys: block keys ignore the salt, so equal prompts of two
  // tenants collide and only the cache's salt check keeps them apart.
  RandomKvTest(int32_t num_blocks, int32_t block_size, double watermark, uint64_t seed, bool salt_blind_keys = false,
               std::vector<int32_t> windows = {})
      : kv_(group_config(num_blocks, block_size, watermark, windows)), bs_(block_size),
        windows_(windows.empty() ? std::vector<int32_t>{0} : windows), rng_(seed),
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
          num_revalidated_shorter = 0, num_window_releases = 0, num_window_hits = 0;

 private:
  int32_t ngroups() const { return static_cast<int32_t>(windows_.size()); }
  // First position group g must still hold before a step from `start` (the
  // window of the step's first token); 0 for a full group.
  int32_t first_kept(int32_t g, int32_t start) const {
    const int32_t w = windows_[static_cast<size_t>(g)];
    return w == 0 ? 0 : std::max(0, start - w + 1) / bs_ * bs_;
  }
  std::vector<std::vector<BlockId>> tables_of(SeqId id) const {
    std::vector<std::vector<BlockId>> t;
    for (int32_t g = 0; g < ngroups(); ++g) {
      auto x = kv_.block_table(id, g);
      t.emplace_back(x.begin(), x.end());
    }
    return t;
  }
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
        const bool plain = ngroups() == 1 && windows_[0] == 0;  // one full-context group
        if (plain || match.num_cached_tokens() == fresh.num_cached_tokens()) {
          for (int32_t g = 0; g < ngroups(); ++g) ASSERT_TRUE(std::ranges::equal(match.blocks(g), fresh.blocks(g)));
        }
        if (plain) {
          ASSERT_EQ(match.next_block_key() != nullptr, fresh.next_block_key() != nullptr);
          if (fresh.next_block_key() != nullptr) {
            ASSERT_TRUE(*match.next_block_key() == *fresh.next_block_key());
          }
        } else {
          // Groups: revalidate and a fresh walk may differ either way (a window
          // group may need, at a shorter hit, blocks the first walk never looked
          // up; a window group 0 walks its whole chain afresh but revalidates
          // only its window). What it keeps must still hold the right tokens.
          for (int32_t g = 0; g < ngroups(); ++g) {
            const auto blocks = match.blocks(g);
            for (int32_t p = 0; p < match.num_cached_tokens(); ++p) {
              const BlockId b = blocks[static_cast<size_t>(p / bs_)];
              if (b != kNullBlock) {
                ASSERT_EQ(slot(b, p), s.tokens[static_cast<size_t>(p)]) << "revalidated group " << g;
              }
            }
          }
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
    s.released_from = cached;
    s.tables = tables_of(id);
    for (int32_t g = 0; g < ngroups(); ++g) {
      const auto& table = s.tables[static_cast<size_t>(g)];
      ASSERT_EQ(static_cast<int32_t>(table.size()), blocks_for_tokens(cached + num_new, bs_));
      // A window group takes only the hit blocks its window needs.
      const int32_t lo = first_kept(g, cached);
      for (int32_t j = 0; j < static_cast<int32_t>(table.size()); ++j) {
        ASSERT_EQ(table[static_cast<size_t>(j)] == kNullBlock, j * bs_ < lo) << "group " << g << " entry " << j;
      }
      if (lo > 0 && cached > 0) ++num_window_hits;
      // Every cached token it holds must really be in the shadow storage of its block ...
      for (int32_t p = lo; p < cached; ++p) {
        ASSERT_EQ(slot(table[static_cast<size_t>(p / bs_)], p), s.tokens[static_cast<size_t>(p)])
            << "prefix hit with wrong content at position " << p << " group " << g;
      }
      // ... written by a sequence of the same tenant.
      for (int32_t j = lo / bs_; j < cached / bs_; ++j) {
        const BlockId b = table[static_cast<size_t>(j)];
        ASSERT_EQ(shadow_salt_[static_cast<size_t>(b)], s.salt) << "prefix hit across salts at block " << b;
        ASSERT_EQ(kv_.cache().salt_of(b), s.salt) << "block " << b;
      }
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
    for (const auto& table : s.tables) {
      for (int32_t p = s.computed; p < upto; ++p) {
        const BlockId b = table[static_cast<size_t>(p / bs_)];
        // Writes go only to blocks this sequence owns alone and that are not cached.
        ASSERT_NE(b, kNullBlock) << "write into the null block at " << p;
        ASSERT_EQ(kv_.pool().ref_count(b), 1) << "write into a shared block " << b;
        ASSERT_FALSE(kv_.cache().contains(b)) << "write into a cached block " << b;
        slot(b, p) = s.tokens[static_cast<size_t>(p)];
        shadow_salt_[static_cast<size_t>(b)] = s.salt;
      }
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
    const auto tables = tables_of(id);
    if (!ok) {
      ++num_appends_refused;
      EXPECT_TRUE(copies.empty());
      EXPECT_EQ(tables, s.tables);
      EXPECT_EQ(kv_.pool().free_queue(), queue_before);
      return false;
    }
    size_t copy_i = 0;
    for (int32_t g = 0; g < ngroups(); ++g) {
      const auto& table = tables[static_cast<size_t>(g)];
      const auto& old = s.tables[static_cast<size_t>(g)];
      EXPECT_GE(static_cast<int32_t>(table.size()) * bs_, s.computed + n);
      // A window group released exactly the blocks wholly before the window of
      // this step's first token (the entries become the null block).
      const int32_t lo = first_kept(g, s.computed);
      // Blocks before the first written one never change (but for the
      // release); replaced ones were shared.
      const size_t first_written = static_cast<size_t>(s.computed / bs_);
      for (size_t j = 0; j < old.size(); ++j) {
        if (static_cast<int32_t>(j) * bs_ < lo) {
          EXPECT_EQ(table[j], kNullBlock) << "group " << g << " kept block " << old[j] << " before its window";
          if (old[j] != kNullBlock) ++num_window_releases;
          continue;
        }
        if (j < first_written || table[j] == old[j]) {
          EXPECT_EQ(table[j], old[j]);
          continue;
        }
        EXPECT_GT(kv_.pool().ref_count(old[j]), 0) << "replaced block " << old[j] << " was not shared";
        if (static_cast<int32_t>(j) * bs_ < s.computed) {
          EXPECT_LT(copy_i, copies.size());
          if (copy_i >= copies.size()) return false;
          EXPECT_EQ(copies[copy_i], (BlockCopy{old[j], table[j]}));
          ++copy_i;
          for (int32_t o = 0; o < bs_; ++o) {
            shadow_[static_cast<size_t>(table[j] * bs_ + o)] = shadow_[static_cast<size_t>(old[j] * bs_ + o)];
          }
          shadow_salt_[static_cast<size_t>(table[j])] = shadow_salt_[static_cast<size_t>(old[j])];
          ++num_cow;
        }
      }
    }
    EXPECT_EQ(copy_i, copies.size());
    s.tables = tables;
    s.released_from = s.computed;
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
    int64_t held = 0;
    for (const auto& [id, s] : seqs_) {
      ASSERT_EQ(tables_of(id), s.tables) << "seq " << id << " op " << op;
      ASSERT_EQ(kv_.num_computed_tokens(id), s.computed);
      for (int32_t g = 0; g < ngroups(); ++g) {
        const auto& table = s.tables[static_cast<size_t>(g)];
        // Null exactly before the window of the last step (none inside it).
        const int32_t lo = first_kept(g, s.released_from);
        for (size_t j = 0; j < table.size(); ++j) {
          ASSERT_EQ(table[j] == kNullBlock, static_cast<int32_t>(j) * bs_ < lo)
              << "seq " << id << " group " << g << " entry " << j << " op " << op;
          if (table[j] != kNullBlock) ++refs[static_cast<size_t>(table[j])];
        }
      }
    }
    for (int64_t r : refs) held += r > 0 ? 1 : 0;
    ASSERT_EQ(st.num_used, held) << "op " << op;  // no leaked block: used == referenced by some table
    for (BlockId b = 1; b < kv_.pool().num_blocks(); ++b) {
      ASSERT_EQ(kv_.pool().ref_count(b), refs[static_cast<size_t>(b)]) << "block " << b << " op " << op;
      ASSERT_FALSE(refs[static_cast<size_t>(b)] > 0 && kv_.pool().in_free_queue(b)) << "block " << b;
    }
    // Every computed token of every sequence is intact in its blocks (sampled).
    if (op % 16 == 0) {
      for (const auto& [id, s] : seqs_) {
        for (int32_t g = 0; g < ngroups(); ++g) {
          for (int32_t p = first_kept(g, s.released_from); p < s.computed; ++p) {
            ASSERT_EQ(slot(s.tables[static_cast<size_t>(g)][static_cast<size_t>(p / bs_)], p),
                      s.tokens[static_cast<size_t>(p)])
                << "seq " << id << " group " << g << " lost its token at " << p << " op " << op;
          }
        }
      }
    }
  }

  KvManager kv_;
  int32_t bs_;
  std::vector<int32_t> windows_;  // [n_groups] 0 = full
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

// Runs t and checks that the workload exercised what it claims to (both case
// tables below). False after a fatal failure.
bool run_and_check_workload(RandomKvTest& t, int ops, int64_t min_hit_allocs) {
  t.run(ops);
  if (::testing::Test::HasFatalFailure()) return false;
  const KvStats st = t.kv().stats();
  EXPECT_GT(st.prefix_hit_tokens, 0);
  EXPECT_GT(st.num_evictions, 0);
  EXPECT_GT(t.num_allocs_refused, 0);
  EXPECT_GT(t.num_hit_allocs, min_hit_allocs);
  return true;
}

TEST(KvRandom, HundredThousandOpsAgainstReference) {
  const Case cases[] = {{48, 4, 0.0, 100000}, {160, 1, 0.02, 20000}, {20, 16, 0.05, 20000}, {12, 2, 0.0, 20000}};
  uint64_t seed = 1234;
  for (const Case& c : cases) {
    SCOPED_TRACE("block_size " + std::to_string(c.block_size));
    RandomKvTest t(c.num_blocks, c.block_size, c.watermark, seed++);
    if (!run_and_check_workload(t, c.ops, 100)) return;
    const KvStats st = t.kv().stats();
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

// KV cache groups: full + window groups over one pool (Gemma-like), a window
// group first (the chain anchored on a window group), and one window group
// alone (Mistral-like). 100,000 operations in all; every check above after
// every one of them.
TEST(KvRandom, GroupsAndWindowsAgainstReference) {
  struct GroupCase {
    std::vector<int32_t> windows;
    int32_t num_blocks, block_size;
    double watermark;
    int ops;
  };
  const GroupCase cases[] = {{{0, 6, 6}, 120, 4, 0.0, 40000},
                             {{0, 0, 9}, 90, 2, 0.02, 20000},
                             {{5, 0}, 60, 4, 0.0, 20000},
                             {{7}, 40, 2, 0.0, 20000}};
  uint64_t seed = 4321;
  for (const GroupCase& c : cases) {
    SCOPED_TRACE("groups " + std::to_string(c.windows.size()) + " block_size " + std::to_string(c.block_size));
    RandomKvTest t(c.num_blocks, c.block_size, c.watermark, seed++, /*salt_blind_keys=*/false, c.windows);
    if (!run_and_check_workload(t, c.ops, 50)) return;
    const KvStats st = t.kv().stats();
    EXPECT_GT(t.num_window_releases, 1000);  // windows really release as sequences advance
    EXPECT_GT(t.num_window_hits, 10);        // and prefix hits take only the window's blocks
    EXPECT_GT(t.num_cow, 0);
    std::printf("groups=%zu bs=%d blocks=%d: hit tokens %lld / %lld, evictions %lld, cow %lld, window releases %lld, "
                "window hits %lld, refused alloc %lld append %lld\n",
                c.windows.size(), c.block_size, c.num_blocks, static_cast<long long>(st.prefix_hit_tokens),
                static_cast<long long>(st.prefix_query_tokens), static_cast<long long>(st.num_evictions),
                static_cast<long long>(t.num_cow), static_cast<long long>(t.num_window_releases),
                static_cast<long long>(t.num_window_hits), static_cast<long long>(t.num_allocs_refused),
                static_cast<long long>(t.num_appends_refused));
  }
}

}  // namespace
}  // namespace pagoda::kv
