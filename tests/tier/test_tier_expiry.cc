// Tier entries with an expiry (issue 36: a pinned prefix's TTL) and resets
// (POST /reset_prefix_cache?tiers=true), backend by backend: the disk tier
// under a test clock (dropped on lookup, by sweep and at start; renewed in
// place; evicted after every unpinned entry; start-up heads for the KV
// events' re-announce; clear() of one namespace) and the Redis tier against a
// real redis-server (SET PX, PEXPIRE, the sweep's report, a clear that keeps
// another engine's keys).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <thread>

#include "redis_util.h"
#include "tier/disk_tier.h"
#include "tier/redis_tier.h"
#include "tier/tier.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

using tiertest::RedisServer;
using tiertest::redis_cmd;
using tiertest::TempDir;
using tiertest::test_bytes;
using tiertest::test_key;
namespace fs = std::filesystem;

const EntryCodec kCodec("expiry test secret");
const std::vector<int32_t> kTokens = {11, 12, 13, 14};
constexpr uint64_t kKv = 256;
const uint64_t kSize = EntryCodec::entry_size(kKv, kTokens.size());

struct Clock {
  uint64_t ms = 1'000'000;
};

DiskTierOptions opts(const std::string& dir, Clock* clock, uint64_t max_bytes = 1 << 20) {
  DiskTierOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  o.fsync = false;
  o.read_heads = true;
  o.now_ms = [clock] { return clock->ms; };
  return o;
}

// Entry i of engine `model` (its namespace), expiring at `expiry` (0: never).
struct Made {
  std::string name, blob;
};
Made make(uint64_t i, uint64_t expiry, uint64_t model = 0x1234) {
  TierKey k = test_key(i);
  k.model_fingerprint = model;
  const Hash128 parent{i - 1, i + 1};
  return {kCodec.name(k), kCodec.encode(k, kTokens, test_bytes(kKv, static_cast<uint8_t>(i)), i ? &parent : nullptr, expiry)};
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(DiskTierExpiry, ExpiredEntryIsDroppedOnLookupBySweepAndAtStart) {
  TempDir d;
  Clock clock;
  const Made a = make(1, clock.ms + 5000), b = make(2, clock.ms + 8000), c = make(3, 0);
  {
    DiskTier t(opts(d.path, &clock));
    for (const Made* m : {&a, &b, &c}) ASSERT_EQ(t.put(m->name, m->blob, EntryCodec::parse_head(m->blob).expiry_ms), TierBackend::Put::kStored);
    EXPECT_EQ(t.expiry_of(a.name), clock.ms + 5000);
    EXPECT_EQ(t.get(a.name, kSize).status, TierGet::kHit);
    clock.ms += 5000;  // a's expiry: gone on lookup
    EXPECT_EQ(t.get(a.name, kSize).status, TierGet::kMiss);
    EXPECT_FALSE(fs::exists(d.path + "/" + a.name));
    EXPECT_EQ(t.take_dropped(), std::vector<std::string>{a.name});
    EXPECT_EQ(t.get(b.name, kSize).status, TierGet::kHit);
    // b renewed in place: 8 bytes of its header, read back after a restart.
    ASSERT_TRUE(t.renew(b.name, clock.ms + 20000));
    EXPECT_FALSE(t.renew(a.name, clock.ms + 20000));  // not held
    t.sweep(clock.ms + 10000);                        // nothing expired yet (b renewed)
    EXPECT_TRUE(t.take_dropped().empty());
    EXPECT_EQ(t.num_entries(), 2u);
  }
  {
    DiskTier t(opts(d.path, &clock));  // a restart: b keeps its renewed expiry, c has none
    EXPECT_EQ(t.num_entries(), 2u);
    EXPECT_EQ(t.expiry_of(b.name), clock.ms + 20000);
    EXPECT_EQ(t.expiry_of(c.name), 0u);
    std::string out;
    TierGet g = t.get(b.name, kSize);
    ASSERT_EQ(g.status, TierGet::kHit);
    TierKey kb = test_key(2);
    kb.model_fingerprint = 0x1234;
    EXPECT_EQ(kCodec.decode(g.value, kb, kTokens, kKv, &out), DecodeResult::kOk);  // the renewal left it whole
    clock.ms += 20000;
    t.sweep(clock.ms);  // the tier's own sweep
    EXPECT_EQ(t.take_dropped(), std::vector<std::string>{b.name});
    EXPECT_FALSE(fs::exists(d.path + "/" + b.name));
    EXPECT_EQ(t.get(c.name, kSize).status, TierGet::kHit);  // no expiry: stays
  }
  const Made e = make(4, clock.ms + 1000);
  {
    DiskTier t(opts(d.path, &clock));
    ASSERT_EQ(t.put(e.name, e.blob, clock.ms + 1000), TierBackend::Put::kStored);
  }
  clock.ms += 1000;
  DiskTier t(opts(d.path, &clock));  // expired while no one ran: dropped at start, never announced
  EXPECT_EQ(t.num_entries(), 1u);
  EXPECT_FALSE(fs::exists(d.path + "/" + e.name));
  const auto found = t.take_found();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, c.name);
}

TEST(DiskTierExpiry, StoringAHeldEntryAgainSetsItsExpiry) {
  TempDir d;
  Clock clock;
  const Made plain = make(1, 0), pinned = make(1, clock.ms + 3000);
  ASSERT_EQ(plain.name, pinned.name);
  DiskTierOptions o = opts(d.path, &clock);
  o.fsync = true;  // the first store waits in the batch: the expiry goes into its tmp file
  DiskTier t(o);
  ASSERT_EQ(t.put(plain.name, plain.blob), TierBackend::Put::kStored);
  EXPECT_EQ(t.put(pinned.name, pinned.blob, clock.ms + 3000), TierBackend::Put::kSkipped);
  t.flush();
  EXPECT_EQ(t.expiry_of(plain.name), clock.ms + 3000);
  EXPECT_EQ(t.put(plain.name, plain.blob), TierBackend::Put::kSkipped);  // an unpinned store keeps the pin's expiry
  EXPECT_EQ(t.expiry_of(plain.name), clock.ms + 3000);
  DiskTier again(opts(d.path, &clock));
  EXPECT_EQ(again.expiry_of(plain.name), clock.ms + 3000);
}

TEST(DiskTierExpiry, PinnedEntriesAreEvictedAfterEveryOtherOne) {
  TempDir d;
  Clock clock;
  DiskTier t(opts(d.path, &clock, 4 * kSize));
  const Made p1 = make(1, clock.ms + 60000), u2 = make(2, 0), p3 = make(3, clock.ms + 60000), u4 = make(4, 0);
  for (const Made* m : {&p1, &u2, &p3, &u4}) {
    ASSERT_EQ(t.put(m->name, m->blob, EntryCodec::parse_head(m->blob).expiry_ms), TierBackend::Put::kStored);
  }
  const Made u5 = make(5, 0), u6 = make(6, 0);
  ASSERT_EQ(t.put(u5.name, u5.blob), TierBackend::Put::kStored);  // evicts u2 (p1 is older but pinned)
  EXPECT_EQ(t.take_dropped(), std::vector<std::string>{u2.name});
  ASSERT_EQ(t.put(u6.name, u6.blob), TierBackend::Put::kStored);  // then u4
  EXPECT_EQ(t.take_dropped(), std::vector<std::string>{u4.name});
  clock.ms += 60000;  // the pins expired: ordinary LRU again (p1 is the oldest)
  const Made u7 = make(7, 0);
  ASSERT_EQ(t.put(u7.name, u7.blob), TierBackend::Put::kStored);
  EXPECT_EQ(t.take_dropped(), std::vector<std::string>{p1.name});
}

TEST(DiskTierExpiry, StartUpHeadsCarryTheMeta) {
  TempDir d;
  Clock clock;
  const Made a = make(5, 0), b = make(6, clock.ms + 9000);
  {
    DiskTier t(opts(d.path, &clock));
    ASSERT_EQ(t.put(a.name, a.blob), TierBackend::Put::kStored);
    ASSERT_EQ(t.put(b.name, b.blob, clock.ms + 9000), TierBackend::Put::kStored);
    EXPECT_TRUE(t.take_found().empty());  // an empty directory at start
  }
  DiskTier t(opts(d.path, &clock));
  auto found = t.take_found();
  ASSERT_EQ(found.size(), 2u);
  std::sort(found.begin(), found.end());
  for (const auto& [name, head] : found) {
    EntryMeta m;
    ASSERT_TRUE(kCodec.decode_meta(name, head, &m)) << name;
    const uint64_t i = name == a.name ? 5 : 6;
    EXPECT_EQ(m.chain, test_key(i).chain);
    EXPECT_EQ(m.parent, (Hash128{i - 1, i + 1}));
    EXPECT_EQ(m.tokens, kTokens);
  }
  DiskTierOptions no_heads = opts(d.path, &clock);
  no_heads.read_heads = false;
  DiskTier quiet(no_heads);
  EXPECT_TRUE(quiet.take_found().empty());
  EXPECT_EQ(quiet.expiry_of(b.name), clock.ms + 9000);  // the header is read either way
}

TEST(DiskTierExpiry, ClearRemovesOnlyOneNamespace) {
  TempDir d;
  Clock clock;
  DiskTier t(opts(d.path, &clock));
  std::vector<std::string> mine, theirs;
  for (uint64_t i = 1; i <= 3; ++i) {
    const Made m = make(i, 0, 0x1234), o = make(i, 0, 0x9999);
    ASSERT_EQ(t.put(m.name, m.blob), TierBackend::Put::kStored);
    ASSERT_EQ(t.put(o.name, o.blob), TierBackend::Put::kStored);
    mine.push_back(m.name);
    theirs.push_back(o.name);
  }
  TierKey k = test_key(0);
  EXPECT_EQ(t.clear(kCodec.namespace_tag(k)), 3);
  EXPECT_EQ(sorted(t.take_dropped()), sorted(mine));
  for (const std::string& n : mine) EXPECT_FALSE(fs::exists(d.path + "/" + n));
  for (const std::string& n : theirs) EXPECT_EQ(t.get(n, kSize).status, TierGet::kHit);
  EXPECT_EQ(t.clear(kCodec.namespace_tag(k)), 0);
}

// Through TierSet: stores with an expiry, the worker's own sweep, clear().
TEST(TierSetExpiry, SweepReportsExpiredEntriesAndClearCounts) {
  TempDir d;
  std::vector<std::unique_ptr<TierBackend>> b;
  DiskTierOptions o;
  o.dir = d.path;
  o.max_bytes = 1 << 20;
  o.fsync = false;
  b.push_back(std::make_unique<DiskTier>(o));
  TierSetOptions so;
  so.sweep_ms = 20;
  auto codec = std::make_shared<const EntryCodec>(kCodec);
  TierSet set(std::move(b), codec, so);
  set.set_record_events(true);
  const TierKey k1 = test_key(1), k2 = test_key(2);
  const uint64_t soon = unix_now_ms() + 150;
  set.store(k1, kTokens, test_bytes(kKv, 1), nullptr, soon);
  set.store(k2, kTokens, test_bytes(kKv, 2));
  set.drain();
  bool expired = false;
  for (int i = 0; i < 300 && !expired; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    expired = set.stats()[0].expired == 1;
  }
  ASSERT_TRUE(expired);
  std::vector<std::pair<int, std::string>> ev;
  for (const TierEvent& e : set.take_events()) ev.emplace_back(e.kind, e.name);
  const std::vector<std::pair<int, std::string>> want = {
      {TierEvent::kStored, kCodec.name(k1)}, {TierEvent::kStored, kCodec.name(k2)}, {TierEvent::kDropped, kCodec.name(k1)}};
  EXPECT_EQ(ev, want);
  EXPECT_EQ(set.clear(kCodec.namespace_tag(k1)), std::vector<int64_t>{1});
  EXPECT_EQ(set.stats()[0].cleared, 1);
  const auto after = set.take_events();
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].kind, TierEvent::kDropped);
  EXPECT_EQ(after[0].name, kCodec.name(k2));
}

TEST(RedisTierExpiry, PxRenewSweepAndAClearThatKeepsOtherEngines) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer srv(d.path);
  RedisTierOptions o;
  o.seeds = {{"127.0.0.1", srv.port()}};
  o.key_prefix = "pagoda:kv:00000000000000aa:";
  RedisTier t(o);
  RedisTierOptions other_opts = o;
  other_opts.key_prefix = "pagoda:kv:00000000000000bb:";
  RedisTier other(other_opts);
  const std::string n1 = "0000000000000000000000000000000a", n2 = "0000000000000000000000000000000b";
  const uint64_t now = unix_now_ms();
  ASSERT_EQ(t.put(n1, "pinned", now + 60000), TierBackend::Put::kStored);
  ASSERT_EQ(t.put(n2, "plain"), TierBackend::Put::kStored);
  ASSERT_EQ(other.put(n1, "another engine's"), TierBackend::Put::kStored);
  const long long pttl = std::stoll(redis_cmd(srv.port(), {"PTTL", o.key_prefix + n1}));
  EXPECT_GT(pttl, 55000);
  EXPECT_LE(pttl, 60000);
  EXPECT_EQ(redis_cmd(srv.port(), {"PTTL", o.key_prefix + n2}), "-1");  // no expiry
  // A renewal (a new hit on the pin): PEXPIRE.
  ASSERT_TRUE(t.renew(n1, now + 120000));
  EXPECT_GT(std::stoll(redis_cmd(srv.port(), {"PTTL", o.key_prefix + n1})), 115000);
  EXPECT_FALSE(t.renew("0000000000000000000000000000000c", now + 120000));  // no such key
  // The sweep reports a key once its expiry passed, and only then.
  t.sweep(now + 60000);
  EXPECT_TRUE(t.take_dropped().empty());  // renewed to now + 120 s
  t.sweep(now + 120000);
  EXPECT_EQ(t.take_dropped(), std::vector<std::string>{n1});
  // A short real TTL: Redis drops the key itself.
  ASSERT_EQ(t.put(n1, "short", unix_now_ms() + 200), TierBackend::Put::kStored);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(t.get(n1, 1 << 20).status, TierGet::kMiss);
  t.sweep(unix_now_ms());
  EXPECT_EQ(t.take_dropped(), std::vector<std::string>{n1});
  // clear(): this engine's keys only.
  ASSERT_EQ(t.put(n1, "again"), TierBackend::Put::kStored);
  EXPECT_EQ(t.clear(0), 2);
  EXPECT_EQ(sorted(t.take_dropped()), sorted({n1, n2}));
  EXPECT_EQ(t.get(n1, 1 << 20).status, TierGet::kMiss);
  EXPECT_EQ(t.get(n2, 1 << 20).status, TierGet::kMiss);
  EXPECT_EQ(other.get(n1, 1 << 20).value, "another engine's");
  EXPECT_EQ(redis_cmd(srv.port(), {"DBSIZE"}), "1");
}

}  // namespace
}  // namespace pagoda::tier
