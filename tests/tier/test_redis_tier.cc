// The Redis tier against real redis-server processes on loopback ports: one
// node, down at start, killed mid-run, and a 3-node cluster (slot routing,
// ASK and MOVED while a slot migrates, a node killed).
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "redis_util.h"
#include "tier/redis_key_events.h"
#include "tier/redis_tier.h"

namespace pagoda::tier {
namespace {

constexpr uint64_t kAny = 1 << 20;  // a bound no test value reaches

using tiertest::RedisCluster;
using tiertest::RedisServer;
using tiertest::redis_cmd;
using tiertest::TempDir;

RedisTierOptions opts(const std::string& url) {
  RedisTierOptions o;
  auto seeds = parse_redis_url(url);
  EXPECT_TRUE(seeds.ok());
  if (seeds.ok()) o.seeds = *seeds;
  o.timeout_ms = 500;
  return o;
}

std::string name_of(int i) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%032x", i * 2654435761u);
  return buf;
}

// Gets until a call succeeds (the backoff lets a call through every few 10 ms).
TierGet get_eventually(RedisTier& t, const std::string& name) {
  TierGet g;
  for (int i = 0; i < 200; ++i) {
    g = t.get(name, kAny);
    if (g.status != TierGet::kError) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return g;
}

// Redis unreachable: a load of `get_key` and a store of `put_key` both fail (counted, no throw).
void expect_down(RedisTier& t, int get_key, int put_key, const std::string& value) {
  EXPECT_EQ(t.get(name_of(get_key), kAny).status, TierGet::kError);
  EXPECT_EQ(t.put(name_of(put_key), value), TierBackend::Put::kError);
}

// Redis back, empty (no persistence): once reconnected `get_key` is a miss and a store round-trips.
void expect_back_empty(RedisTier& t, int get_key, int put_key, const std::string& value) {
  EXPECT_EQ(get_eventually(t, name_of(get_key)).status, TierGet::kMiss);
  EXPECT_EQ(t.put(name_of(put_key), value), TierBackend::Put::kStored);
  EXPECT_EQ(t.get(name_of(put_key), kAny).value, value);
}

TEST(RedisTier, OneNodePutGetTtl) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  RedisTierOptions o = opts("redis://127.0.0.1:" + std::to_string(s.port()));
  o.ttl_seconds = 100;
  RedisTier t(o);
  EXPECT_FALSE(t.is_cluster());
  EXPECT_EQ(t.get(name_of(1), kAny).status, TierGet::kMiss);
  const std::string value("binary\0value", 12);
  EXPECT_EQ(t.put(name_of(1), value), TierBackend::Put::kStored);
  const TierGet g = t.get(name_of(1), kAny);
  EXPECT_EQ(g.status, TierGet::kHit);
  EXPECT_EQ(g.value, value);
  const int ttl = std::stoi(redis_cmd(s.port(), {"TTL", "pagoda:kv:" + name_of(1)}));
  EXPECT_GT(ttl, 90);
  EXPECT_LE(ttl, 100);
  t.drop(name_of(1));
  EXPECT_EQ(t.get(name_of(1), kAny).status, TierGet::kMiss);
}

int64_t net_output_bytes(int port) {
  const std::string info = redis_cmd(port, {"INFO", "stats"});
  const std::string field = "total_net_output_bytes:";
  const size_t at = info.find(field);
  return at == std::string::npos ? -1 : std::stoll(info.substr(at + field.size()));
}

// A huge value planted under a real key is never transferred: GETRANGE sends
// at most one byte more than the entry may hold, and the value is rejected.
TEST(RedisTier, AValueLargerThanAskedIsRejectedUnread) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  RedisTier t(opts("redis://127.0.0.1:" + std::to_string(s.port())));
  const std::string huge(64 << 20, 'h');
  ASSERT_EQ(redis_cmd(s.port(), {"SET", "pagoda:kv:" + name_of(1), huge}), "OK");
  ASSERT_EQ(t.put(name_of(2), std::string(1000, 'e')), TierBackend::Put::kStored);
  const int64_t before = net_output_bytes(s.port());
  ASSERT_GE(before, 0);
  const TierGet g = t.get(name_of(1), 1000);
  EXPECT_EQ(g.status, TierGet::kRejected);
  EXPECT_TRUE(g.value.empty());
  const TierGet exact = t.get(name_of(2), 1000);  // exactly the bound: read
  EXPECT_EQ(exact.status, TierGet::kHit);
  EXPECT_EQ(exact.value, std::string(1000, 'e'));
  EXPECT_EQ(t.get(name_of(2), 999).status, TierGet::kRejected);
  // Both gets and the INFO replies: a few KB, not 64 MiB.
  EXPECT_LT(net_output_bytes(s.port()) - before, 64 << 10);
}

TEST(RedisTier, DownAtStartThenUp) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  const int port = tiertest::free_port();
  RedisTier t(opts("redis://127.0.0.1:" + std::to_string(port)));
  const auto t0 = std::chrono::steady_clock::now();
  expect_down(t, 1, 1, "x");
  // Refused connections are quick, and the backoff skips the next tries.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  RedisServer s(d.path, port);
  expect_back_empty(t, 1, 1, "x");
}

TEST(RedisTier, KilledMidRunThenBack) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  RedisTier t(opts("redis://127.0.0.1:" + std::to_string(s.port())));
  ASSERT_EQ(t.put(name_of(1), "x"), TierBackend::Put::kStored);
  s.stop(SIGKILL);
  expect_down(t, 1, 2, "y");
  s.start();  // empty again (no persistence)
  expect_back_empty(t, 1, 2, "y");
}

TEST(RedisTier, ClusterRoutesBySlotFollowsMovedAndSurvivesANodeKill) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisCluster c(d.path);
  ASSERT_TRUE(c.ok());
  // Seeded with one node only: the slot map comes from CLUSTER SLOTS.
  RedisTier t(opts("redis://127.0.0.1:" + std::to_string(c.node(0).port())));
  EXPECT_TRUE(t.is_cluster());
  constexpr int kKeys = 60;
  for (int i = 0; i < kKeys; ++i) ASSERT_EQ(t.put(name_of(i), "v" + std::to_string(i)), TierBackend::Put::kStored) << i;
  int on_node[3] = {0, 0, 0};
  for (int n = 0; n < 3; ++n) on_node[n] = std::stoi(redis_cmd(c.node(n).port(), {"DBSIZE"}));
  EXPECT_EQ(on_node[0] + on_node[1] + on_node[2], kKeys);
  for (int n = 0; n < 3; ++n) EXPECT_GT(on_node[n], 0) << "node " << n;
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(t.get(name_of(i), kAny).value, "v" + std::to_string(i)) << i;

  // Move the slot of one key held by node 0 to node 1 by hand, as a reshard
  // does: while the slot is migrating and the key already moved, node 0
  // answers ASK; once the slot is node 1's, MOVED. The key is found each time.
  const std::string id0 = redis_cmd(c.node(0).port(), {"CLUSTER", "MYID"});
  const std::string id1 = redis_cmd(c.node(1).port(), {"CLUSTER", "MYID"});
  int moved = -1;
  for (int i = 0; i < kKeys && moved < 0; ++i) {
    if (redis_cmd(c.node(0).port(), {"EXISTS", "pagoda:kv:" + name_of(i)}) == "1") moved = i;
  }
  ASSERT_GE(moved, 0);
  const std::string key = "pagoda:kv:" + name_of(moved);
  const std::string slot = std::to_string(redis_key_slot(key));
  EXPECT_EQ(redis_cmd(c.node(1).port(), {"CLUSTER", "SETSLOT", slot, "IMPORTING", id0}), "OK");
  EXPECT_EQ(redis_cmd(c.node(0).port(), {"CLUSTER", "SETSLOT", slot, "MIGRATING", id1}), "OK");
  EXPECT_EQ(redis_cmd(c.node(0).port(), {"MIGRATE", "127.0.0.1", std::to_string(c.node(1).port()), key, "0", "5000"}),
            "OK");
  EXPECT_EQ(t.get(name_of(moved), kAny).value, "v" + std::to_string(moved));  // via ASK
  for (int n = 0; n < 3; ++n) redis_cmd(c.node(n).port(), {"CLUSTER", "SETSLOT", slot, "NODE", id1});
  EXPECT_EQ(t.get(name_of(moved), kAny).value, "v" + std::to_string(moved));  // via MOVED
  EXPECT_EQ(redis_cmd(c.node(1).port(), {"EXISTS", key}), "1");
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(t.get(name_of(i), kAny).value, "v" + std::to_string(i)) << i;

  // Node 2 killed: its keys are errors, the others still hit.
  const int lost = std::stoi(redis_cmd(c.node(2).port(), {"DBSIZE"}));
  c.node(2).stop(SIGKILL);
  int hits = 0, errors = 0;
  for (int i = 0; i < kKeys; ++i) {
    const TierGet g = t.get(name_of(i), kAny);
    hits += g.status == TierGet::kHit ? 1 : 0;
    errors += g.status == TierGet::kError ? 1 : 0;
  }
  EXPECT_EQ(hits, kKeys - lost);
  EXPECT_EQ(errors, lost);
}

TEST(RedisKeyEvents, MissingFlagsKeepWhatTheServerHas) {
  EXPECT_EQ(RedisKeyEvents::missing_flags(""), "Exe");
  EXPECT_EQ(RedisKeyEvents::missing_flags("Ex"), "e");
  EXPECT_EQ(RedisKeyEvents::missing_flags("Kg$"), "Exe");
  EXPECT_EQ(RedisKeyEvents::missing_flags("KA"), "E");  // A covers x and e, not E
  EXPECT_EQ(RedisKeyEvents::missing_flags("AKE"), "");
  EXPECT_EQ(RedisKeyEvents::missing_flags("Exe"), "");
  EXPECT_EQ(RedisKeyEvents::missing_flags("xeKE"), "");
}

// Sweeps until `name` is reported dropped (at most `ms`); every report is appended to `seen`.
bool swept_until(RedisTier& t, const std::string& name, int ms, std::vector<std::string>* seen) {
  for (int i = 0; i < ms / 20; ++i) {
    t.sweep(unix_now_ms());
    for (std::string& n : t.take_dropped()) seen->push_back(std::move(n));
    if (std::find(seen->begin(), seen->end(), name) != seen->end()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string notify_flags(int port) {
  const std::string r = redis_cmd(port, {"CONFIG", "GET", "notify-keyspace-events"});
  return r.substr(r.find('\n') + 1);  // redis_cmd: the reply's lines; the value is the second
}

// With key_events the tier turns keyspace notifications on, reports a key Redis
// expired once, keeps a key another client made persistent past its expiry (the
// grace of 5 s, then EXISTS), and subscribes again after Redis restarts.
TEST(RedisTier, KeyEventsReportExpiriesOnceAndResubscribeAfterARestart) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  RedisTierOptions o = opts("redis://127.0.0.1:" + std::to_string(s.port()));
  o.key_events = true;
  RedisTier t(o);
  const std::string flags = notify_flags(s.port());
  for (char f : std::string("Exe")) EXPECT_NE(flags.find(f), std::string::npos) << flags;
  std::vector<std::string> seen;
  ASSERT_EQ(t.put(name_of(1), "a", unix_now_ms() + 300), TierBackend::Put::kStored);
  ASSERT_EQ(t.put(name_of(2), "b"), TierBackend::Put::kStored);
  ASSERT_EQ(t.put(name_of(3), "c", unix_now_ms() + 300), TierBackend::Put::kStored);
  ASSERT_EQ(redis_cmd(s.port(), {"PERSIST", "pagoda:kv:" + name_of(3)}), "1");
  EXPECT_TRUE(swept_until(t, name_of(1), 5000, &seen));
  // Past the kept key's expiry plus the grace: still held, never reported.
  std::this_thread::sleep_for(std::chrono::milliseconds(5500));
  t.sweep(unix_now_ms());
  for (std::string& n : t.take_dropped()) seen.push_back(std::move(n));
  EXPECT_EQ(seen, std::vector<std::string>{name_of(1)});
  EXPECT_EQ(redis_cmd(s.port(), {"EXISTS", "pagoda:kv:" + name_of(3)}), "1");
  // Dropped by this tier: reported once (its own DEL is not echoed).
  t.drop(name_of(2));
  EXPECT_EQ(t.take_dropped(), std::vector<std::string>{name_of(2)});

  // Redis restarts (empty, default flags): the subscriber sets them again and
  // a key expired after that is reported by its notice (a kept one is not).
  s.stop(SIGKILL);
  s.start();
  for (int i = 0; i < 250 && notify_flags(s.port()).find('E') == std::string::npos; ++i) {
    t.sweep(unix_now_ms());
    t.take_dropped();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(notify_flags(s.port()).find('E'), std::string::npos) << "not subscribed again";
  TierBackend::Put put = TierBackend::Put::kError;
  for (int i = 0; i < 100 && put != TierBackend::Put::kStored; ++i) {
    put = t.put(name_of(4), "d", unix_now_ms() + 300);
    if (put != TierBackend::Put::kStored) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(put, TierBackend::Put::kStored);
  seen.clear();
  EXPECT_TRUE(swept_until(t, name_of(4), 5000, &seen));
  EXPECT_EQ(seen, std::vector<std::string>{name_of(4)});
}

}  // namespace
}  // namespace pagoda::tier
