// Helpers shared by the KvManager tests (tests/kv) and the scheduler tests
// (tests/sched): configs, token lists, block tables, and the admission calls
// in their one-lookup form.
#pragma once
#include <gtest/gtest.h>

#include <numeric>
#include <string_view>
#include <vector>

#include "kv/kv_manager.h"

namespace pagoda::kv::testing {

using Ids = std::vector<BlockId>;
using Tokens = std::vector<TokenId>;

inline KvConfig make_config(int32_t num_blocks, int32_t block_size, double watermark = 0.0,
                            uint64_t model_fingerprint = 0x5eed) {
  return KvConfig{.num_blocks = num_blocks, .block_size = block_size, .watermark = watermark,
                  .model_fingerprint = model_fingerprint, .groups = {}};  // one full-context group
}

// start, start + 1, ..., start + n - 1
inline Tokens iota_tokens(TokenId start, int n) {
  Tokens t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

inline Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline Ids table(const KvManager& kv, SeqId s) {
  auto t = kv.block_table(s);
  return Ids(t.begin(), t.end());
}

// Tokens of `t` an admission would take from the cache now (one lookup).
inline int32_t cached_tokens(const KvManager& kv, const Tokens& t, std::string_view salt = "") {
  return kv.match_prefix(t, salt).num_cached_tokens();
}

// Whether admitting `t` with num_new slots past its hit would succeed now.
inline bool can_allocate(const KvManager& kv, const Tokens& t, int32_t num_new, std::string_view salt = "") {
  return kv.can_allocate(kv.match_prefix(t, salt), num_new).ok();
}

// Admits `t` as sequence id (computing all of it past its hit) and marks it
// computed, so its full blocks are committed. Returns the hit tokens, -1 when refused.
inline int32_t prefill(KvManager& kv, SeqId id, const Tokens& t, std::string_view salt = "") {
  const auto n = static_cast<int32_t>(t.size());
  PrefixMatch m = kv.match_prefix(t, salt);
  const int32_t num_new = n - m.num_cached_tokens();
  auto admission = kv.can_allocate(std::move(m), num_new);
  EXPECT_TRUE(admission.ok()) << "seq " << id << ": " << (admission.ok() ? "" : admission.message());
  if (!admission.ok()) return -1;
  auto got = kv.allocate(id, *admission);
  EXPECT_TRUE(got.ok()) << "seq " << id << ": " << (got.ok() ? "" : got.message());
  if (!got.ok()) return -1;
  kv.mark_computed(id, t, n);
  return *got;
}

// Prefills `t` as sequence 1 (with no hit) and frees it: its full blocks stay
// in the prefix cache, free but revivable, the setup of most prefix-hit tests.
inline void cache_prefix(KvManager& kv, const Tokens& t) {
  EXPECT_EQ(prefill(kv, 1, t), 0) << "cache_prefix wants a manager without a hit on t";
  EXPECT_TRUE(kv.free(1));
}

// A manager of config `c` whose prefix cache holds t's full blocks (cache_prefix).
inline KvManager with_cached(const KvConfig& c, const Tokens& t) {
  KvManager kv(c);
  cache_prefix(kv, t);
  return kv;
}

// Prefills `t` as sequence 1 and forks it into sequence 2, sharing all its blocks.
inline void prefill_and_fork(KvManager& kv, const Tokens& t) {
  EXPECT_EQ(prefill(kv, 1, t), 0);
  EXPECT_TRUE(kv.fork(1, 2).ok());
}

#define EXPECT_INVARIANTS(kv) EXPECT_EQ((kv).check_invariants(), "")

}  // namespace pagoda::kv::testing
