// KvManager::explain_miss: the cause of a prefix miss (kv/prefix_miss.h).
#include "kv/prefix_miss.h"

#include <algorithm>

#include "kv/kv_manager.h"

namespace pagoda::kv {

const char* miss_cause_name(MissCause c) {
  switch (c) {
    case MissCause::kNone: return "none";
    case MissCause::kNeverSeen: return "never_seen";
    case MissCause::kEvicted: return "evicted";
    case MissCause::kSalt: return "salt";
    case MissCause::kTierMiss: return "tier_miss";
    case MissCause::kDiverged: return "diverged";
  }
  return "none";
}

PrefixMiss KvManager::explain_miss(const PrefixMatch& m, std::span<const TokenId> tokens,
                                   std::string_view cache_salt) const {
  PrefixMiss r;
  r.matched_tokens = m.num_cached_tokens();
  if (!config_.enable_prefix_caching || !m.has_next_key_) return r;
  const PrefixCache& cache = blocks_->cache;
  const size_t bs = static_cast<size_t>(config_.block_size);
  const auto i = static_cast<size_t>(m.num_blocks_);  // the block that missed
  const auto block = tokens.subspan(i * bs, bs);
  const EntryId parent = i == 0 ? kRootEntry : m.entries_.back();
  const Hash128& key = m.next_key_;
  const double now = blocks_->evicted.now();
  auto was_evicted = [&](const Hash128& k) {
    const auto t = blocks_->evicted.evicted_at(k);
    if (!t) return false;
    r.cause = tiers_configured_ ? MissCause::kTierMiss : MissCause::kEvicted;
    r.evicted_ago_s = std::max(0.0, now - *t);
    return true;
  };
  auto holds = [&](BlockId b, std::string_view salt) {
    return b != kNullBlock && cache.salt_of(b) == salt && std::ranges::equal(cache.tokens_of(b), block);
  };
  const BlockId under_key = cache.block_of_key(key);
  if (holds(under_key, cache_salt) && cache.parent_of(under_key) == parent) {
    // Group 0 holds the block: a window group lacked one it needs.
    for (int32_t g = 1; g < num_groups(); ++g) {
      if (was_evicted(group_key(key, g))) return r;
    }
    r.cause = MissCause::kNeverSeen;
    return r;
  }
  if (was_evicted(key)) return r;
  if (!cache_salt.empty() || cache.num_salts() > 0) {
    // The salt-free chain key of the block: the key its tokens after the same
    // token prefix have under the empty salt.
    Hash128 u{};
    for (size_t t = 0; t <= i; ++t) u = cache.key(u, tokens.subspan(t * bs, bs), {});
    const BlockId unsalted = cache.block_of_key(u);
    const bool other = (!cache_salt.empty() && holds(unsalted, {})) ||
                       cache.miss_index().salted_count(u) > (holds(under_key, cache_salt) ? 1 : 0);
    if (other) {
      r.cause = MissCause::kSalt;
      return r;
    }
  }
  int32_t best = -1;
  if (i > 0) cache.miss_index().for_each_child(parent, [&](BlockId c) {
    if (cache.salt_of(c) != cache_salt) return;
    const auto ct = cache.tokens_of(c);
    const auto n = std::min(ct.size(), block.size());
    const auto lcp = static_cast<int32_t>(std::mismatch(ct.begin(), ct.begin() + static_cast<std::ptrdiff_t>(n),
                                                        block.begin()).first - ct.begin());
    if (lcp < static_cast<int32_t>(bs)) best = std::max(best, lcp);
  });
  // Only past a matched block: at the root every prompt starting with the same
  // BOS would "diverge" from every other.
  if (i > 0 && best >= 0) {
    r.cause = MissCause::kDiverged;
    r.position = static_cast<int32_t>(i * bs) + best;
    return r;
  }
  r.cause = MissCause::kNeverSeen;
  return r;
}

}  // namespace pagoda::kv
