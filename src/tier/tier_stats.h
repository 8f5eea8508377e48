// A KV tier's cumulative counters (issue 16): the one declaration, filled by
// TierSet (tier/tier.h) and read through the engine's EngineStats::kv_tiers
// (engine::KvTierStats is this struct) by the server's /metrics.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pagoda::tier {

// Load latency histogram bounds in seconds (the tier metrics' buckets).
inline constexpr double kLoadLatencyBounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                0.05,   0.1,   0.25,   0.5,   1.0,  2.5};
inline constexpr size_t kNumLatencyBuckets = sizeof(kLoadLatencyBounds) / sizeof(double) + 1;  // + the +Inf bucket

struct TierStats {
  std::string kind;            // "disk", "redis": the metrics label
  int64_t lookups = 0;         // loads asked of this tier
  int64_t hits = 0;            // verified K/V block entries returned
  int64_t hit_tokens = 0;      // their tokens
  int64_t checkpoint_hits = 0;  // verified state checkpoint entries returned (hybrid models, issue 38)
  int64_t misses = 0;
  int64_t corrupt = 0;         // entries that failed size/MAC, or rejected unread (dropped)
  int64_t rejected = 0;        // of them: larger than the key implies, or not a regular file (never read)
  int64_t mismatches = 0;      // entries of another format version (ignored, left in place)
  int64_t errors = 0;          // backend errors (I/O, connection, full disk)
  int64_t stores = 0;          // entries written (blocks and checkpoints)
  int64_t checkpoint_stores = 0;  // of them: state checkpoints
  int64_t stores_dropped = 0;  // stores refused by a full queue
  int64_t expired = 0;         // entries dropped by their expiry (a pin's TTL) by the tier's sweep
  int64_t cleared = 0;         // entries removed by clear() (a reset with tiers)
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  // [kNumLatencyBuckets] per bucket of kLoadLatencyBounds (non-cumulative), last = +Inf.
  std::vector<uint64_t> load_latency_buckets = std::vector<uint64_t>(kNumLatencyBuckets, 0);
  double load_latency_sum = 0;  // seconds
};

}  // namespace pagoda::tier
