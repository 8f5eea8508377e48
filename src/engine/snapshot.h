// A read-only picture of the engine's KV cache and queues for the live
// dashboard (issue 20): the state of every block, the prefix tree of the
// cache, every running and waiting request with its block tables, and the
// counters the time series are drawn from. Taken by Engine::snapshot on the
// engine thread between steps; it copies plain integers only (no text, no
// tokens), so it costs O(blocks + table entries) and the server encodes it off
// the engine thread.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::engine {

struct EngineStats;

// One byte per block of the pool (block 0, the null block, included).
enum class BlockState : uint8_t {
  kFree = 0,    // ref 0 and no prefix key
  kUsed = 1,    // referenced by at least one request's block table
  kCached = 2,  // ref 0 with a prefix key: free, but a hit can revive it
  // A block whose K/V moved to a lower tier (disk, Redis: issue 16). Tiers are
  // built in parallel and not wired into the snapshot yet, so nothing sets it.
  kTier = 3,
  kNull = 4,  // block 0: never handed out
  // Used or cached by another tenant (a tenant's filtered view only): neither
  // its owner nor its prefix is shown.
  kOther = 5,
};

struct SnapshotOptions {
  // The prefix tree lists at most this many cached blocks: the most hit first
  // (with their ancestors, so every listed node's chain reaches a root).
  int max_prefix_nodes = 256;
  // Waiting requests beyond this are counted (num_waiting) but not listed.
  int max_waiting_listed = 128;
  // One tenant's view (a server with per-key cache salts): only requests whose
  // cache salt starts with tenant_salt_prefix are listed, only cached blocks
  // under such a salt are in the prefix tree and the grid, and every other
  // used or cached block reads kOther. false: everything (an admin, no tenants).
  bool only_tenant = false;
  std::string tenant_salt_prefix;
};

// A block the engine holds (Engine::kv_block_keys): its KV group, where it
// lives ("cpu", "disk", "redis") and the low 64 bits of its chain key.
struct KvBlockKey {
  int32_t group = 0;
  std::string medium;
  uint64_t hash = 0;
};

// Does a cache salt belong to the tenant of `opt` (always, when not filtered)?
inline bool salt_visible(const SnapshotOptions& opt, std::string_view salt) {
  return !opt.only_tenant || salt.substr(0, opt.tenant_salt_prefix.size()) == opt.tenant_salt_prefix;
}

struct SnapshotRequest {
  uint64_t id = 0;        // engine RequestId
  int index = 0;          // choice (n > 1)
  uint64_t seq_id = 0;    // the scheduler's id (one per choice)
  std::string state;      // "running", "waiting", "preempted"
  std::string why;        // why a waiting request is not running ("" when running)
  int32_t num_prompt_tokens = 0;
  int32_t num_output_tokens = 0;
  int32_t num_computed_tokens = 0;  // tokens whose K/V are in its blocks
  int32_t num_cached_tokens = 0;    // prompt tokens served by the prefix cache (-1: not admitted yet)
  int32_t num_preemptions = 0;
  // Why its prefix hit ended there (kv/prefix_miss.h): "" until admitted, else
  // the cause, with "@P" for diverged at prompt token P.
  std::string prefix_miss;
  std::vector<std::vector<int32_t>> block_tables;  // [kv groups][logical blocks]; empty while waiting
};

// A cached block in the prefix tree. parent_block is the cached block its
// prefix extends (-1: the first block of a sequence, or a parent not listed).
struct PrefixNode {
  int32_t block = 0;
  int32_t parent_block = -1;
  int64_t hits = 0;   // admissions served from this block since it was committed
  int32_t depth = 0;  // blocks before it in its chain (0: a root)
  bool in_use = false;  // referenced by a request now (else cached-evictable)
  float pin_ttl_s = 0;  // seconds left of its longest pin (0: not pinned; issue 36)
};

struct DashboardSnapshot {
  int32_t block_size = 0;
  int32_t num_groups = 1;
  std::vector<uint8_t> block_state;   // [num_blocks] BlockState
  // [num_blocks] index into `requests` of the one request holding the block,
  // -1 when none holds it, -2 when several do (shared prefix or fork).
  std::vector<int32_t> block_owner;
  std::vector<SnapshotRequest> requests;  // running (admission order), then waiting (queue order)
  int num_running = 0;
  int num_waiting = 0;                    // all of them, listed or not
  std::vector<PrefixNode> prefix_nodes;   // parents before children
  int32_t prefix_cached_blocks = 0;       // cached blocks in all (listed or not; the tenant's when filtered)
  // Counters for the time series (EngineStats' fields, copied).
  int64_t blocks_total = 0, blocks_used = 0, blocks_cached = 0, blocks_free = 0;
  int64_t prefix_queries_tokens = 0, prefix_hits_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
};

// The time-series counters of a snapshot from EngineStats.
void copy_counters(const EngineStats& s, DashboardSnapshot* out);

}  // namespace pagoda::engine
