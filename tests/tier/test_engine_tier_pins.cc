// Pinned prefixes in the KV tiers (issue 36) and resets with tiers, through
// the engine (stories260K): a pin is written to the disk and Redis tiers with
// its expiry (disk header, Redis PX), renewed by a new hit, outlives the RAM
// copy (a RAM-only reset) and a restart, and is gone after its TTL (a short
// real one: the tiers' clock is the wall clock); pins never serve another
// salt; reset_prefix_cache with tiers removes exactly this engine's entries.
// Every output must be bitwise the cold run's.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/reference_jsonl.h"
#include "engine/engine.h"
#include "redis_util.h"
#include "tier/entry.h"
#include "tier/tier.h"
#include "engine_run_util.h"
#include "tier_test_util.h"

namespace pagoda::engine {
namespace {

using tiertest::RedisServer;
using tiertest::redis_cmd;
using tiertest::TempDir;
namespace fs = std::filesystem;

constexpr int kBlock = 16;

using tiertest::make_prompt;

EngineConfig config() {
  EngineConfig c;
  c.model_path = testutil::stories_path();
  c.threads = 1;
  c.block_size = kBlock;
  c.num_kv_blocks = 64;
  return c;
}

std::unique_ptr<Engine> make(const EngineConfig& c) {
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

using Result = tiertest::RunResult;

Result run(Engine& e, const std::vector<int32_t>& prompt, const std::string& salt = "", int32_t pin_tokens = 0,
           double ttl = 0) {
  return tiertest::run_greedy(e, prompt, salt, pin_tokens, ttl);
}

int32_t hit_tokens(const std::vector<int32_t>& p) { return static_cast<int32_t>((p.size() - 1) / kBlock * kBlock); }

template <class F>
bool eventually(F pred, int ms = 5000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Every entry file of the directory with its header's expiry (unix ms, 0: none).
std::map<std::string, uint64_t> disk_expiries(const std::string& dir) {
  std::map<std::string, uint64_t> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string n = f.path().filename().string();
    if (n.size() != 32) continue;
    std::ifstream in(f.path(), std::ios::binary);
    std::string head(128, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    out[n] = tier::EntryCodec::parse_head(head).expiry_ms;
  }
  return out;
}

TEST(EngineTierPins, APinOutlivesRamAndARestartUntilItsTtl) {
  TempDir d;
  const auto p = make_prompt(150, 7);  // 9 full blocks, all pinned
  const int32_t pin = hit_tokens(p);
  std::vector<int32_t> want;
  {
    auto cold = make(config());
    ASSERT_TRUE(cold);
    want = run(*cold, p).tokens;
  }
  EngineConfig c = config();
  c.kv_disk_dir = d.path;
  c.kv_disk_size = 64 << 20;
  const double ttl = 6.0;  // room for a reset and a restart under load before it passes
  uint64_t first_expiry = 0;
  {
    auto e = make(c);
    ASSERT_TRUE(e);
    const uint64_t t0 = tier::unix_now_ms();
    EXPECT_EQ(run(*e, p, "", pin, ttl).tokens, want);
    EXPECT_EQ(e->stats().pins, 1);
    // Every block of the pinned prefix on disk with the pin's expiry.
    ASSERT_TRUE(eventually([&] {
      const auto ex = disk_expiries(d.path);
      return ex.size() == static_cast<size_t>(pin / kBlock) &&
             std::all_of(ex.begin(), ex.end(), [](const auto& kv) { return kv.second != 0; });
    }));
    for (const auto& [n, ex] : disk_expiries(d.path)) {
      EXPECT_GE(ex, t0 + static_cast<uint64_t>(ttl * 1000) - 100) << n;
      EXPECT_LE(ex, tier::unix_now_ms() + static_cast<uint64_t>(ttl * 1000)) << n;
      first_expiry = std::max(first_expiry, ex);
    }
    // A new hit renews the pin, and the tier's expiry with it.
    std::this_thread::sleep_for(std::chrono::milliseconds(1300));
    const Result again = run(*e, p);
    EXPECT_EQ(again.tokens, want);
    EXPECT_EQ(again.cached, pin);
    ASSERT_TRUE(eventually([&] {
      const auto ex = disk_expiries(d.path);
      return std::all_of(ex.begin(), ex.end(), [&](const auto& kv) { return kv.second >= first_expiry + 1000; });
    }));
    first_expiry = disk_expiries(d.path).begin()->second;
    // RAM loses it (a reset of the RAM cache only): the tier serves it.
    ASSERT_TRUE(e->reset_prefix_cache(false).ok());
    EXPECT_EQ(e->stats().pins, 0);
    const Result from_tier = run(*e, p);
    EXPECT_EQ(from_tier.tokens, want);
    EXPECT_EQ(from_tier.cached, pin);
    EXPECT_EQ(e->stats().kv_tiers[0].hits, pin / kBlock);
  }
  {
    auto e = make(c);  // a restart on the same directory: the pin's entries, their expiry read back
    ASSERT_TRUE(e);
    const Result r = run(*e, p);
    EXPECT_EQ(r.tokens, want);
    EXPECT_EQ(r.cached, pin);
  }
  // After the TTL: the entries are gone (dropped at start), a miss.
  const uint64_t now = tier::unix_now_ms();
  if (first_expiry + 50 > now) std::this_thread::sleep_for(std::chrono::milliseconds(first_expiry + 50 - now));
  auto e = make(c);
  ASSERT_TRUE(e);
  EXPECT_TRUE(disk_expiries(d.path).empty());
  const Result r = run(*e, p);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.cached, 0);
}

TEST(EngineTierPins, PinsInRedisWithPxNeverServeAnotherSalt) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer srv(d.path);
  const auto p = make_prompt(100, 11);  // 6 full blocks
  const int32_t pin = hit_tokens(p);
  EngineConfig c = config();
  c.kv_redis = "redis://127.0.0.1:" + std::to_string(srv.port());
  std::vector<int32_t> want;
  {
    auto e = make(c);
    ASSERT_TRUE(e);
    want = run(*e, p, "tenant-a", pin, 3.0).tokens;
    // Every block of the pinned prefix (all the prompt's) under a PX of at most the TTL.
    auto pttls = [&] {
      std::vector<long long> out;
      const std::string keys = redis_cmd(srv.port(), {"KEYS", "pagoda:kv:*"});
      for (size_t at = 0, nl; (nl = keys.find('\n', at)) != std::string::npos; at = nl + 1) {
        out.push_back(std::stoll(redis_cmd(srv.port(), {"PTTL", keys.substr(at, nl - at)})));
      }
      return out;
    };
    ASSERT_TRUE(eventually([&] {
      const auto t = pttls();
      return t.size() == static_cast<size_t>(pin / kBlock) && std::all_of(t.begin(), t.end(), [](long long v) { return v > 0; });
    }));
    for (long long v : pttls()) EXPECT_LE(v, 3000);
  }
  {
    auto e = make(c);  // fresh RAM: another tenant is never served the pin, its owner is
    ASSERT_TRUE(e);
    const Result other = run(*e, p, "tenant-b");
    EXPECT_EQ(other.cached, 0);
    EXPECT_EQ(other.tokens, want);
    const Result own = run(*e, p, "tenant-a");
    EXPECT_EQ(own.cached, pin);
    EXPECT_EQ(own.tokens, want);
  }
  // After the TTL Redis dropped the pinned keys (tenant-b's own blocks were stored without one).
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));
  auto e = make(c);
  ASSERT_TRUE(e);
  const Result late = run(*e, p, "tenant-a");
  EXPECT_EQ(late.cached, 0);
  EXPECT_EQ(late.tokens, want);
}

TEST(EngineTierPins, ResetWithTiersClearsOnlyThisEnginesEntries) {
  PAGODA_REQUIRE_REDIS();
  TempDir d, disk;
  RedisServer srv(d.path);
  const auto p = make_prompt(90, 3), q = make_prompt(70, 4);
  EngineConfig c = config();
  c.kv_disk_dir = disk.path;
  c.kv_disk_size = 64 << 20;
  c.kv_redis = "redis://127.0.0.1:" + std::to_string(srv.port());
  // Another engine's entries in the same directory and Redis (another block size: another namespace).
  EngineConfig other = c;
  other.block_size = 32;
  {
    auto o = make(other);
    ASSERT_TRUE(o);
    run(*o, p);
  }
  const size_t other_files = disk_expiries(disk.path).size();
  const std::string other_keys = redis_cmd(srv.port(), {"DBSIZE"});
  ASSERT_EQ(other_files, 3u);  // 97 computed tokens: 3 full blocks of 32
  ASSERT_EQ(other_keys, "3");
  redis_cmd(srv.port(), {"SET", "unrelated", "x"});
  auto e = make(c);
  ASSERT_TRUE(e);
  const Result first = run(*e, p);
  run(*e, q);
  // Full blocks of the computed tokens (prompt + 7 of the 8 generated); p and q share no block.
  const int64_t mine = static_cast<int64_t>((p.size() + 7) / kBlock + (q.size() + 7) / kBlock);
  ASSERT_TRUE(eventually([&] {
    const EngineStats s = e->stats();
    return s.kv_tiers.size() == 2 && s.kv_tiers[0].stores == mine && s.kv_tiers[1].stores == mine;
  }));
  std::vector<std::pair<std::string, int64_t>> cleared;
  ASSERT_TRUE(e->reset_prefix_cache(false, true, &cleared).ok());
  const std::vector<std::pair<std::string, int64_t>> want = {{"disk", mine}, {"redis", mine}};
  EXPECT_EQ(cleared, want);
  const EngineStats s = e->stats();
  EXPECT_EQ(s.kv_tiers[0].cleared, mine);
  EXPECT_EQ(s.kv_tiers[1].cleared, mine);
  EXPECT_EQ(disk_expiries(disk.path).size(), other_files);  // the other engine's files stay
  EXPECT_EQ(redis_cmd(srv.port(), {"DBSIZE"}), "4");       // its keys and the unrelated one too
  EXPECT_EQ(redis_cmd(srv.port(), {"GET", "unrelated"}), "x");
  const Result after = run(*e, p);  // RAM and tiers empty: computed again, the same tokens
  EXPECT_EQ(after.cached, 0);
  EXPECT_EQ(after.tokens, first.tokens);
  EXPECT_EQ(e->stats().kv_tiers[0].hits + e->stats().kv_tiers[1].hits, 0);
  // The other engine still finds its own entries.
  e.reset();
  auto o = make(other);
  ASSERT_TRUE(o);
  EXPECT_EQ(run(*o, p).cached, 64);
}

}  // namespace
}  // namespace pagoda::engine
