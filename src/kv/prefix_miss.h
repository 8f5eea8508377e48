// Why a prompt's prefix-cache hit ended where it did (issue 36): the result of
// KvManager::explain_miss for a PrefixMatch, made once per request at its first
// admission. The block it explains is the first full block past the hit that a
// hit could have covered (never the block of the last token).
//
// Causes, checked in this order (the first that holds):
//   none        the hit covers every such block (the whole prompt matched, or the
//               prompt is shorter than one block + 1 token)
//   evicted     the block's key was cached and evicted (seconds ago in
//               evicted_ago_s), still within the eviction log (kv/miss_index.h:
//               the last num_blocks evicted keys)
//   tier_miss   as evicted, but a tier below RAM is configured
//               (KvManager::set_tiers_configured): the block was written
//               through, so the tier should have brought it back and did not
//   salt        the same tokens after the same token prefix are cached under
//               another cache salt (another tenant): found by the salt-free
//               chain key (MissIndex), trusting the 128-bit hash
//   diverged    the last matched block (at least one block matched) has a cached
//               child under the same salt whose tokens differ: position is the
//               prompt index of the first token that differs from the child
//               sharing the longest common start with the prompt
//   never_seen  none of the above: nothing we remember held this key
// With sliding-window groups a hit can also end where group 0 holds the block
// but a window group does not; then only evicted / tier_miss (the window
// group's key in the log) or never_seen is told.
#pragma once
#include <cstdint>

namespace pagoda::kv {

enum class MissCause : uint8_t { kNone, kNeverSeen, kEvicted, kSalt, kTierMiss, kDiverged };
inline constexpr int kNumMissCauses = 6;

// "none", "never_seen", "evicted", "salt", "tier_miss", "diverged".
const char* miss_cause_name(MissCause c);

struct PrefixMiss {
  int32_t matched_tokens = 0;  // the hit: prompt tokens served from the cache
  MissCause cause = MissCause::kNone;
  int32_t position = -1;       // diverged: the first differing prompt token; else -1
  double evicted_ago_s = -1;   // evicted / tier_miss: seconds since the eviction; else -1
};

}  // namespace pagoda::kv
