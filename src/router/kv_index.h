// The router's view of the replicas' prefix caches, rebuilt from their KV events
// (kv_wire.h). The router cannot recompute a replica's block hashes (they cover a
// model fingerprint and the tenant salt), so, as NVIDIA Dynamo's KV router does,
// it keeps its own chain hash over token ids: each BlockStored block maps the
// engine's hash to router_hash = H(router hash of its parent, its token ids), and
// each router hash to the (replica, medium) pairs that hold it. A prompt's router
// chain (router_chain) then finds, per replica, how many of its leading blocks
// that replica holds in RAM and on any medium.
//
// Only group_idx 0 (the first full-attention group) is indexed: a prefix hit is
// decided by it. The block size is learned from the first BlockStored; an event
// with another size is refused (the caller logs it).
//
// Not thread-safe: KvSubscriber guards it with a mutex.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "router/kv_wire.h"
#include "router/ring.h"

namespace pagoda::router {

enum class KvMedium : uint8_t { kCpu = 0, kDisk = 1, kRedis = 2, kOther = 3 };
constexpr int kNumKvMedia = 4;
// "cpu" (and "gpu": a replica's primary cache), "disk", "redis", any case; another name is kOther.
KvMedium parse_kv_medium(const std::string& name);
const char* kv_medium_name(KvMedium m);

// The router hash of one block: H(parent's router hash, its tokens); the first
// block of a sequence (no parent) is hashed from a fixed seed.
uint64_t router_block_hash(std::optional<uint64_t> parent, const int32_t* tokens, size_t n);
// The router hashes of the first whole blocks of `tokens` (all of them, or at most max_blocks).
std::vector<uint64_t> router_chain(const std::vector<int32_t>& tokens, int block_size,
                                   size_t max_blocks = SIZE_MAX);

// How much of a prompt one replica holds: its leading blocks held in RAM (cpu),
// and its leading blocks held on any medium (>= ram_blocks).
struct PrefixMatch {
  int ram_blocks = 0;
  int any_blocks = 0;
  bool operator==(const PrefixMatch& o) const { return ram_blocks == o.ram_blocks && any_blocks == o.any_blocks; }
};

class KvIndex {
 public:
  explicit KvIndex(int num_replicas);

  struct Applied {
    size_t blocks = 0;       // (block, medium) entries added or removed
    size_t orphans = 0;      // stored blocks dropped: their parent is unknown here
    size_t unknown = 0;      // removed blocks this index did not hold on that medium
    bool ignored = false;    // a group other than 0: not indexed
    std::string refused;     // non-empty: the event was refused (why)
  };
  Applied apply(int replica, const KvEvent& ev);
  void clear(int replica);  // drops every entry of the replica (AllBlocksCleared, restart, unhealthy)

  int block_size() const { return block_size_; }  // 0 until a BlockStored taught it
  // Per replica, how many leading blocks of `chain` (router hashes) it holds.
  std::vector<PrefixMatch> match(const std::vector<uint64_t>& chain) const;

  size_t entries(int replica, KvMedium m) const { return counts_[static_cast<size_t>(replica)][static_cast<size_t>(m)]; }
  size_t distinct_hashes() const { return holders_.size(); }
  // Inspection for tests: the router hash an engine hash maps to on a replica, and
  // the media (bit 1 << KvMedium) a replica holds a router hash on.
  std::optional<uint64_t> router_hash_of(int replica, uint64_t engine_hash) const;
  unsigned media_of(int replica, uint64_t router_hash) const;
  // Recounts everything from the per-replica maps; an empty string when consistent.
  std::string check_invariants() const;

 private:
  struct EngineEntry {
    uint64_t router_hash;
    unsigned media;  // bit per KvMedium
  };
  struct Holder {
    int replica;
    std::array<uint32_t, kNumKvMedia> count;  // engine hashes of the replica mapping here, per medium
  };
  void add(int replica, uint64_t router_hash, KvMedium m);
  void remove(int replica, uint64_t router_hash, KvMedium m);

  int block_size_ = 0;
  std::vector<std::unordered_map<uint64_t, EngineEntry>> engine_;     // per replica: engine hash -> entry
  std::unordered_map<uint64_t, std::vector<Holder>> holders_;          // router hash -> replicas
  std::vector<std::array<size_t, kNumKvMedia>> counts_;                // per replica, per medium
};

// The scoring rule: a RAM block counts 1, a block held only on a tier (disk,
// redis) counts tier_weight (default 0.5): at equal length RAM wins, and a tier
// prefix beats a RAM one only when it is longer by the factor 1 / tier_weight
// (twice as long by default) -- loading from a tier is much cheaper than a
// prefill but not free.
double kv_score(const PrefixMatch& m, double tier_weight);

// How event routing weighs a match (the router's --kv-* flags).
struct KvRouting {
  double tier_weight = 0.5;  // kv_score
  // --kv-min-match: a replica is a candidate only when it holds at least that
  // many leading blocks of the prompt (any medium); a shorter match leaves the
  // choice to the ring, whose owner keeps the prefix warm for the next request.
  int min_blocks = 1;
  // --kv-match-threshold (SGLang's cache_threshold): when the longest match
  // covers less than this fraction of the prompt's whole blocks, it is not
  // followed; the request goes by the ring from the prompt's first block past
  // the match (see choose_kv). 0: every match is followed.
  double match_threshold = 0;
  // --kv-max-imbalance: the load bound (load_limit's factor) a replica holding a
  // followed match is held to; a negative value: choose_kv's max_imbalance. A hit
  // saves its prefill, worth more queueing than the ring's guess.
  double hold_imbalance = -1;
};

// Event routing: the eligible replica with the highest kv_score that is within
// the holders' load bound (load_limit with how.hold_imbalance, or max_imbalance). Ties are broken by the ring's order from
// chain[m], m the longest match among the candidates (clamped to the last entry):
// chain[b] is the prompt's chain key through its first b + 1 blocks
// (router_chain), so equal matches go where the ring sends the prompt's first
// block past them. A match shorter than how.match_threshold x chain.size()
// blocks is not followed: the first replica within the ring's bound
// (max_imbalance) in that same ring
// order gets the request, so prompts that share only a system prompt spread over
// the replicas by what follows it instead of all going to the head's holder. An
// empty chain: ties follow `key` and the threshold is off. Returns {-1} when no
// eligible replica within the bound holds at least max(1, how.min_blocks)
// leading blocks of the prompt: the caller falls back to the ring. A choice has
// kind kKvEvents.
RouteChoice choose_kv(const std::vector<PrefixMatch>& matches, const KvRouting& how, const HashRing& ring,
                      uint64_t key, const std::vector<uint64_t>& chain, const std::vector<int>& in_flight,
                      const std::vector<bool>& eligible, double max_imbalance);

}  // namespace pagoda::router
