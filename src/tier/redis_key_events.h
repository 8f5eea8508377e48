// Redis keyspace notifications for the Redis tier's KV events (issue 37): a key
// of this engine's that Redis expires (its TTL: a pin's PX, --kv-redis-ttl, or
// another replica's pin of the same entry) or evicts (maxmemory) must produce
// BlockRemoved(medium="redis"), and neither is a call this process makes.
//
// One subscriber connection per Redis node (notifications are node-local: every
// master of a cluster), PSUBSCRIBEd to __keyevent@*__:expired and
// __keyevent@*__:evicted. The server must notify them: at connection the
// subscriber reads `notify-keyspace-events` (CONFIG GET) and adds the flags it
// lacks of "Exe" (CONFIG SET, keeping the others). Where CONFIG is not allowed
// (a managed Redis, a renamed command) it logs the requirement once and the
// node is not `live`: the tier then reports expiries by its own clock, as
// without notifications, and evictions are not seen (docs/kv-events.md).
//
// Notifications are fire-and-forget: one published while the connection is
// down is lost. A node whose connection fails is not live until it is
// subscribed again (retried with a backoff, 50 ms doubling to 5 s); the tier's
// clock covers expiries meanwhile. Deletions by other clients (DEL, another
// replica's reset with tiers) are not subscribed to: the flags would echo this
// process's own deletes.
//
// Not thread-safe: the Redis tier's worker thread calls poll() from sweep().
#pragma once
#include <chrono>
#include <string>
#include <utility>
#include <vector>

struct redisContext;

namespace pagoda::tier {

class RedisKeyEvents {
 public:
  RedisKeyEvents(std::string key_prefix, int timeout_ms);
  ~RedisKeyEvents();
  RedisKeyEvents(const RedisKeyEvents&) = delete;
  RedisKeyEvents& operator=(const RedisKeyEvents&) = delete;

  // Keeps one subscription per node of `nodes` (host, port; nodes no longer
  // listed are closed), subscribing those that are not (after their backoff),
  // and appends to `names` the entry name (the key less the prefix) of every
  // expired or evicted key under the prefix notified since the last call; never
  // blocks on a subscribed connection. True when every node is subscribed and
  // known to notify (its flags read or set): only then may the caller leave
  // expiries to the notifications.
  bool poll(const std::vector<std::pair<std::string, int>>& nodes, std::vector<std::string>* names);

  // The flags `current` (a notify-keyspace-events value) lacks of "Exe" ("A"
  // stands for every key-event class); "" when none.
  static std::string missing_flags(const std::string& current);

 private:
  struct Sub {
    std::string host;
    int port = 0;
    redisContext* c = nullptr;
    bool notifying = false;  // the server's flags cover expired and evicted key events
    std::chrono::steady_clock::time_point retry_at{};
    int backoff_ms = 0;
    bool logged_down = false;
    bool logged_config = false;
  };
  bool subscribe(Sub& s);
  void fail(Sub& s, const char* what);
  // Reads what the connection holds without blocking; false: the connection failed.
  bool drain(Sub& s, std::vector<std::string>* names);

  std::string prefix_;
  int timeout_ms_;
  std::vector<Sub> subs_;
};

}  // namespace pagoda::tier
