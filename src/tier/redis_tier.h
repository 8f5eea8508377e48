// RedisTier: KV tier entries in Redis (`--kv-redis redis://HOST:PORT[,HOST:PORT...]`),
// shared by every replica serving the same model file. Eviction is Redis's own
// (maxmemory-policy allkeys-lru); entries may get a TTL.
//
// One node or a Redis Cluster, found out at the first connection: CLUSTER
// SLOTS gives the slot map (the seeds are only where to ask), a key goes to
// the node of its CRC16 slot, a MOVED reply refreshes the map and retries, an
// ASK reply retries once on the named node after ASKING. A node that does not
// answer (down at start, killed mid-run, a timeout) makes the call an error
// and is retried after an exponential backoff (50 ms doubling to 5 s), so a
// dead node costs one failed connect per backoff, not a timeout per block. The
// engine serves on: a failed load is a miss, a failed store is dropped.
// Expiry (issues 36, 37): a pinned entry is written with SET ... PX and
// renewed with PEXPIRE; with --kv-redis-ttl every entry gets EX. The tier
// remembers the expiry of every key it wrote with one. With key_events (KV
// events on) it subscribes to Redis's keyspace notifications
// (redis_key_events.h) and sweep() reports each key of its own that Redis
// expired or evicted (checked with EXISTS: a key stored again since stays),
// each stored key's removal at most once; while a node's notifications are not
// live (CONFIG refused, the connection down) and without key_events, sweep()
// reports a key dropped once its expiry passed by the tier's clock (then
// another replica renewing the key is not seen, nor an eviction). clear() removes every key under this
// engine's prefix (the key prefix carries the engine's namespace tag, so a
// shared Redis keeps other engines' keys), with SCAN + UNLINK on every node.
// Called from one thread (the TierSet worker).
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tier/redis_key_events.h"
#include "tier/tier.h"

struct redisContext;
struct redisReply;

namespace pagoda::tier {

struct RedisTierOptions {
  std::vector<std::pair<std::string, int>> seeds;  // host, port
  int ttl_seconds = 0;                             // 0: no TTL
  int timeout_ms = 1000;                           // connect and command timeout
  std::string key_prefix = "pagoda:kv:";
  // KV events (issue 37): subscribe to keyspace notifications (expired, evicted;
  // CONFIG SET notify-keyspace-events when allowed) and track the keys stored.
  bool key_events = false;
};

// "redis://HOST:PORT[,HOST:PORT...]" (the scheme may be left out) into seeds.
Expected<std::vector<std::pair<std::string, int>>> parse_redis_url(const std::string& url);
// Redis Cluster's key slot: CRC16 (XMODEM) of the key, or of its {hash tag}, mod 16384.
uint16_t redis_key_slot(std::string_view key);

class RedisTier final : public TierBackend {
 public:
  explicit RedisTier(RedisTierOptions opt);
  ~RedisTier() override;
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  const char* kind() const override { return "redis"; }
  // GETRANGE key 0 max_bytes: at most one byte more than an entry may hold
  // crosses the wire, however large the value under the key is.
  TierGet get(const std::string& name, uint64_t max_bytes) override;
  Put put(const std::string& name, const std::string& value, uint64_t expiry_ms = 0) override;
  void drop(const std::string& name) override;
  bool renew(const std::string& name, uint64_t expiry_ms) override;
  void sweep(uint64_t now_ms) override;
  int64_t clear(uint64_t ns) override;

  bool is_cluster() const { return cluster_; }

 private:
  struct Node {
    std::string host;
    int port = 0;
    redisContext* c = nullptr;
    std::chrono::steady_clock::time_point retry_at{};
    int backoff_ms = 0;
    bool logged_down = false;
  };
  // One command on the key's node, following MOVED / ASK. nullptr: an error (logged per node).
  redisReply* command(const std::string& key, const std::vector<std::string_view>& argv);
  // CLUSTER SLOTS from the first node that answers. First time (refresh
  // false): one node, or a cluster and its slot map; then (true): the map again.
  bool discover(bool refresh);
  bool load_slots(const redisReply* r);
  int node_index(const std::string& host, int port);
  bool connect(Node& n);
  void fail(Node& n, const char* what);
  // One command on node n (no redirection); nullptr: an error.
  redisReply* node_command(Node& n, const std::vector<std::string_view>& argv);
  void set_expiry(const std::string& name, uint64_t expiry_ms);
  // The nodes whose keyspace notifications cover this tier's keys: every node
  // serving a slot (cluster) or the one node; empty before the topology is known.
  std::vector<std::pair<std::string, int>> notify_nodes();
  // A key of this tier's gone (KV events): reported once per store with key_events.
  void report_dropped(const std::string& name);
  bool key_missing(const std::string& name);  // EXISTS answered 0 (false: it exists, or no answer)

  RedisTierOptions opt_;
  // Seeds first, then nodes learned from the slot map. A deque: a Node& stays
  // valid while node_index() adds nodes (load_slots inside discover, MOVED).
  std::deque<Node> nodes_;
  bool topology_known_ = false;
  bool cluster_ = false;
  int single_ = 0;               // one node: its index
  std::vector<int> slot_node_;   // cluster: [16384] node index, -1 unknown
  // Keys written with an expiry: name -> expiry (unix ms), and by expiry (a
  // renewed key's older record is stale: sweep checks it against expiry_).
  std::unordered_map<std::string, uint64_t> expiry_;
  std::multimap<uint64_t, std::string> by_expiry_;
  // key_events: the notifications, and the names stored and not reported dropped since.
  std::unique_ptr<RedisKeyEvents> key_events_;
  std::unordered_set<std::string> held_;
};

}  // namespace pagoda::tier
