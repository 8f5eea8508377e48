// The Redis tier against real redis-server processes on loopback ports: one
// node, down at start, killed mid-run, and a 3-node cluster (slot routing,
// MOVED after a reshard, a node killed).
#include <gtest/gtest.h>

#include <thread>

#include "redis_util.h"
#include "tier/redis_tier.h"

namespace pagoda::tier {
namespace {

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
    g = t.get(name);
    if (g.status != TierGet::kError) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return g;
}

TEST(RedisTier, OneNodePutGetTtl) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  RedisTierOptions o = opts("redis://127.0.0.1:" + std::to_string(s.port()));
  o.ttl_seconds = 100;
  RedisTier t(o);
  EXPECT_FALSE(t.is_cluster());
  EXPECT_EQ(t.get(name_of(1)).status, TierGet::kMiss);
  const std::string value("binary\0value", 12);
  EXPECT_EQ(t.put(name_of(1), value), TierBackend::Put::kStored);
  const TierGet g = t.get(name_of(1));
  EXPECT_EQ(g.status, TierGet::kHit);
  EXPECT_EQ(g.value, value);
  const int ttl = std::stoi(redis_cmd(s.port(), {"TTL", "pagoda:kv:" + name_of(1)}));
  EXPECT_GT(ttl, 90);
  EXPECT_LE(ttl, 100);
  t.drop(name_of(1));
  EXPECT_EQ(t.get(name_of(1)).status, TierGet::kMiss);
}

TEST(RedisTier, DownAtStartThenUp) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  const int port = tiertest::free_port();
  RedisTier t(opts("redis://127.0.0.1:" + std::to_string(port)));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(t.get(name_of(1)).status, TierGet::kError);
  EXPECT_EQ(t.put(name_of(1), "x"), TierBackend::Put::kError);
  // Refused connections are quick, and the backoff skips the next tries.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  RedisServer s(d.path, port);
  EXPECT_EQ(get_eventually(t, name_of(1)).status, TierGet::kMiss);
  EXPECT_EQ(t.put(name_of(1), "x"), TierBackend::Put::kStored);
  EXPECT_EQ(t.get(name_of(1)).value, "x");
}

TEST(RedisTier, KilledMidRunThenBack) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  RedisTier t(opts("redis://127.0.0.1:" + std::to_string(s.port())));
  ASSERT_EQ(t.put(name_of(1), "x"), TierBackend::Put::kStored);
  s.stop(SIGKILL);
  EXPECT_EQ(t.get(name_of(1)).status, TierGet::kError);
  EXPECT_EQ(t.put(name_of(2), "y"), TierBackend::Put::kError);
  s.start();  // empty again (no persistence)
  EXPECT_EQ(get_eventually(t, name_of(1)).status, TierGet::kMiss);
  EXPECT_EQ(t.put(name_of(2), "y"), TierBackend::Put::kStored);
  EXPECT_EQ(t.get(name_of(2)).value, "y");
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
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(t.get(name_of(i)).value, "v" + std::to_string(i)) << i;

  // Move 2000 slots (with their keys) from node 0 to node 1: the tier's map is
  // stale, so node 0 answers MOVED and every key is still found.
  const std::string from = redis_cmd(c.node(0).port(), {"CLUSTER", "MYID"});
  const std::string to = redis_cmd(c.node(1).port(), {"CLUSTER", "MYID"});
  const std::string cmd = "redis-cli --cluster reshard 127.0.0.1:" + std::to_string(c.node(0).port()) +
                          " --cluster-from " + from + " --cluster-to " + to +
                          " --cluster-slots 2000 --cluster-yes >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (int i = 0; i < 250 && !c.ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(std::stoi(redis_cmd(c.node(1).port(), {"DBSIZE"})), on_node[1]);
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(t.get(name_of(i)).value, "v" + std::to_string(i)) << i;

  // Node 2 killed: its keys are errors, the others still hit.
  const int lost = std::stoi(redis_cmd(c.node(2).port(), {"DBSIZE"}));
  c.node(2).stop(SIGKILL);
  int hits = 0, errors = 0;
  for (int i = 0; i < kKeys; ++i) {
    const TierGet g = t.get(name_of(i));
    hits += g.status == TierGet::kHit ? 1 : 0;
    errors += g.status == TierGet::kError ? 1 : 0;
  }
  EXPECT_EQ(hits, kKeys - lost);
  EXPECT_EQ(errors, lost);
}

}  // namespace
}  // namespace pagoda::tier
