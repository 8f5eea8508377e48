// Routing arithmetic of `pagoda router`, free of sockets so it is unit-tested on
// its own: the chain hash of a prompt's first blocks, the consistent-hash ring
// (virtual nodes) that maps that hash to a replica, and the bounded-load choice
// that walks the ring past replicas carrying too much of the in-flight load.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagoda::router {

// The hash of the first min(max_blocks, tokens / block_size) whole blocks of
// `tokens`, chained block by block (block i is hashed with block i-1's hash as the
// seed, the way a replica's prefix cache chains its block keys), so two prompts get the same
// key exactly when those blocks are equal. nullopt when the prompt has no whole
// block: such a prompt has nothing a replica could have cached.
// Preconditions: block_size >= 1, max_blocks >= 1.
std::optional<uint64_t> prefix_key(const std::vector<int32_t>& tokens, int block_size, int max_blocks);

// A consistent-hash ring: each replica owns `vnodes` points (hashes of its URL and
// the point's number); a key belongs to the first point at or after it, wrapping.
// Removing a replica moves only the keys it owned, which is why the router keeps
// the ring fixed and skips unhealthy replicas while walking it instead of
// rebuilding it: a replica that comes back gets back exactly its old keys.
class HashRing {
 public:
  HashRing(const std::vector<std::string>& replica_names, int vnodes = 160);
  // Every replica once, in the order the ring meets them walking from `key`.
  std::vector<int> walk(uint64_t key) const;
  int num_replicas() const { return num_replicas_; }

 private:
  struct Point {
    uint64_t hash;
    int replica;
  };
  std::vector<Point> points_;  // sorted by hash
  int num_replicas_ = 0;
};

// kKvEvents: the replica holding the longest prefix by the replicas' KV events (kv_index.h).
enum class RouteKind { kAffinity, kFallback, kLeastLoaded, kRoundRobin, kKvEvents };
constexpr int kNumRouteKinds = 5;
// "affinity", "fallback", "least_loaded", "round_robin", "kv_events"
const char* route_kind_name(RouteKind k);

struct RouteChoice {
  int replica = -1;  // -1: no eligible replica
  RouteKind kind = RouteKind::kLeastLoaded;
};

// The load bound: a replica whose in-flight count exceeds (1 + max_imbalance) x the
// mean in-flight count of the eligible replicas, plus one, takes no new affinity
// request (the +1 lets an idle pool send a group's first requests to its owner).
double load_limit(const std::vector<int>& in_flight, const std::vector<bool>& eligible, double max_imbalance);

// Prefix affinity: the first eligible replica on the ring from `key` (kAffinity),
// or, when that one is over load_limit, the next eligible one on the ring that is
// not (kFallback). Some eligible replica is always within the limit (the least
// loaded is at most the mean), so the result is -1 only when none is eligible.
RouteChoice choose_affinity(const HashRing& ring, uint64_t key, const std::vector<int>& in_flight,
                            const std::vector<bool>& eligible, double max_imbalance);

// The eligible replica with the fewest in-flight requests; ties go to the first at
// or after `tie_start` (a rotating counter spreads an idle pool's requests).
RouteChoice choose_least_loaded(const std::vector<int>& in_flight, const std::vector<bool>& eligible,
                                uint64_t tie_start);

// The eligible replica at or after `counter` modulo the replica count.
RouteChoice choose_round_robin(const std::vector<bool>& eligible, uint64_t counter);

}  // namespace pagoda::router
