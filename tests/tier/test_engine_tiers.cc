// The engine over KV tiers (stories260K, whose K/V are F32-exact): a restart
// served from the disk tier, two replicas sharing one Redis or one Redis
// Cluster, and the faults (flipped bytes on disk and in Redis, full disk,
// Redis down at start and killed mid-run, another model, another salt). Every
// output must be bitwise the cold run's.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <algorithm>

#include "common/reference_jsonl.h"
#include "engine/engine.h"
#include "engine/kv_tiers.h"
#include "gguf/gguf.h"
#include "redis_util.h"
#include "engine_run_util.h"
#include "tier_test_util.h"

namespace pagoda::engine {
namespace {

using tiertest::RedisCluster;
using tiertest::RedisServer;
using tiertest::redis_cmd;
using tiertest::TempDir;
namespace fs = std::filesystem;

constexpr int kBlock = 16;

using Result = tiertest::RunResult;

using tiertest::make_prompt;

EngineConfig config(const std::string& model = testutil::stories_path()) {
  EngineConfig c;
  c.model_path = model;
  c.threads = 1;
  c.block_size = kBlock;
  c.num_kv_blocks = 64;
  return c;
}

EngineConfig disk_config(const std::string& dir) {
  EngineConfig c = config();
  c.kv_disk_dir = dir;
  c.kv_disk_size = 64 << 20;
  return c;
}

std::unique_ptr<Engine> make(const EngineConfig& c) {
  auto e = Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

Result run(Engine& e, const std::vector<int32_t>& prompt, const std::string& salt = "") {
  return tiertest::run_greedy(e, prompt, salt);
}

// Full blocks a hit may cover (never the last token's).
int32_t hit_tokens(const std::vector<int32_t>& p) { return static_cast<int32_t>((p.size() - 1) / kBlock * kBlock); }

// The cold output of a prompt, from an engine without tiers.
std::vector<int32_t> cold(const std::vector<int32_t>& p) {
  auto e = make(config());
  return e ? run(*e, p).tokens : std::vector<int32_t>{};
}

// Waits up to 5 s for pred (stores finish on the tier threads).
template <class F>
bool eventually(F pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

const KvTierStats& tier_of(const EngineStats& s, size_t i = 0) {
  static const KvTierStats none;
  return i < s.kv_tiers.size() ? s.kv_tiers[i] : none;
}

// Start-up and reset re-announces (KV events): a block after its parent whenever
// the parent is among the announced ones, whatever order the tier found them in.
TEST(KvTierAnnounce, ParentsFirstInAnyInputOrder) {
  // Two sequences sharing blocks 10, 11; group 1 (a window group) blocks hang off
  // group 0's chain; 40 is a block whose parent (99) is not announced.
  std::vector<AnnounceRef> blocks = {
      {0, 10, std::nullopt}, {0, 11, 10}, {0, 12, 11}, {0, 13, 12}, {0, 22, 11}, {0, 23, 22},
      {1, 10, std::nullopt}, {1, 11, 10}, {1, 12, 11},  {0, 40, 99},
  };
  auto ids = [&](const std::vector<AnnounceRef>& b, const std::vector<size_t>& order) {
    std::vector<std::pair<int32_t, uint64_t>> out;
    for (size_t i : order) out.emplace_back(b[i].group, b[i].chain);
    return out;
  };
  // Preorder from the roots (sorted by group, chain), siblings by (group, chain).
  const std::vector<std::pair<int32_t, uint64_t>> want = {
      {0, 10}, {0, 11}, {0, 12}, {0, 13}, {0, 22}, {0, 23}, {1, 12}, {1, 11}, {0, 40}, {1, 10}};
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<AnnounceRef> b = blocks;
    std::shuffle(b.begin(), b.end(), rng);
    const std::vector<size_t> order = parents_first(b);
    ASSERT_EQ(order.size(), b.size());
    std::vector<bool> seen(b.size(), false);
    for (size_t k = 0; k < order.size(); ++k) {
      const size_t i = order[k];
      ASSERT_LT(i, b.size());
      ASSERT_FALSE(seen[i]) << "index " << i << " twice";
      seen[i] = true;
      if (!b[i].parent) continue;
      // Its parent (group 0), when announced, came before it.
      for (size_t j = 0; j < b.size(); ++j) {
        if (b[j].group == 0 && b[j].chain == *b[i].parent) {
          EXPECT_TRUE(seen[j]) << "child before its parent";
        }
      }
    }
    EXPECT_EQ(ids(b, order), want) << "round " << round;
  }
  // A cycle (only hash collisions could make one) is still announced, each block once.
  const std::vector<AnnounceRef> cycle = {{0, 1, 2}, {0, 2, 1}};
  const std::vector<size_t> c = parents_first(cycle);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_NE(c[0], c[1]);
  EXPECT_TRUE(parents_first({}).empty());
}

TEST(EngineDiskTier, RestartServesThePrefixFromDisk) {
  TempDir d;
  const auto p = make_prompt(150, 1);
  const auto want = cold(p);
  EngineConfig c = disk_config(d.path);
  {
    auto a = make(c);
    ASSERT_TRUE(a);
    const Result r = run(*a, p);
    EXPECT_EQ(r.tokens, want);
    EXPECT_EQ(r.cached, 0);
  }  // the engine's end drains the stores
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(d.path)) files += f.path().filename().string().size() == 32 ? 1 : 0;
  EXPECT_GE(files, static_cast<size_t>(hit_tokens(p) / kBlock));
  auto b = make(c);  // "restart": empty RAM, the same directory
  ASSERT_TRUE(b);
  const Result r = run(*b, p);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.cached, hit_tokens(p));
  const EngineStats st = b->stats();
  ASSERT_EQ(st.kv_tiers.size(), 1u);
  EXPECT_EQ(tier_of(st).kind, "disk");
  EXPECT_EQ(tier_of(st).hits, hit_tokens(p) / kBlock);
  EXPECT_EQ(tier_of(st).hit_tokens, hit_tokens(p));
  EXPECT_EQ(tier_of(st).corrupt, 0);
  EXPECT_GT(tier_of(st).bytes_read, 0);
  EXPECT_EQ(st.num_waiting_for_kv_load, 0);
  // Another salt on the same store: no hit, same output.
  const Result s = run(*b, p, "tenant-b");
  EXPECT_EQ(s.tokens, want);
  EXPECT_EQ(s.cached, 0);
}

TEST(EngineDiskTier, FlippedByteIsRecomputed) {
  TempDir d;
  const auto p = make_prompt(100, 2);
  const auto want = cold(p);
  EngineConfig c = disk_config(d.path);
  { run(*make(c), p); }
  // Flip one K/V byte in every entry file but keep the lengths.
  int flipped = 0;
  for (const auto& f : fs::directory_iterator(d.path)) {
    std::fstream s(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(200);
    const char ch = static_cast<char>(s.get());
    s.seekp(200);
    s.put(static_cast<char>(ch ^ 1));
    ++flipped;
  }
  ASSERT_GT(flipped, 0);
  auto b = make(c);
  const Result r = run(*b, p);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.cached, 0);
  // Every block's load went out at once (the request went on at the first
  // miss); each comes back corrupt and its file is dropped.
  EXPECT_TRUE(eventually([&] { return tier_of(b->stats()).corrupt == flipped; }));
  EXPECT_EQ(tier_of(b->stats()).hits, 0);
  EXPECT_TRUE(eventually([&] { return tier_of(b->stats()).stores == flipped; }));  // recomputed, written again
}

TEST(EngineDiskTier, FullDiskServesOn) {
  TempDir d;
  const auto p = make_prompt(100, 3);
  const auto want = cold(p);
  EngineConfig c = disk_config(d.path);
  c.kv_disk_inject_errno = ENOSPC;
  auto a = make(c);
  EXPECT_EQ(run(*a, p).tokens, want);
  EXPECT_EQ(run(*a, make_prompt(60, 4)).tokens.size(), 8u);
  a.reset();
  auto b = make(c);
  EXPECT_EQ(run(*b, p).tokens, want);
  EXPECT_EQ(tier_of(b->stats()).hits, 0);
  // Stores run on the tier's thread: the first fails (logged once), then
  // stores pause (skipped, not errors) until the retry a second later.
  EXPECT_TRUE(eventually([&] { return tier_of(b->stats()).errors >= 1; }));
  EXPECT_EQ(tier_of(b->stats()).stores, 0);
  EXPECT_TRUE(fs::is_empty(d.path));
}

// With a secret: an entry file holds none of its block's token ids in plain
// form; a deployment with another secret finds none of the entries (other
// names); and another tenant's entries swapped in under a tenant's names are
// corrupt, never served.
TEST(EngineDiskTier, SecretKeysNamesHidesTokensAndRefusesSwappedEntries) {
  TempDir d;
  const auto p = make_prompt(120, 9);
  const auto want = cold(p);
  EngineConfig c = disk_config(d.path + "/a");
  c.kv_tier_secret = "one deployment's secret";
  { run(*make(c), p, "tenant-a"); }
  std::vector<std::string> a_files;
  for (const auto& f : fs::directory_iterator(d.path + "/a")) a_files.push_back(f.path().string());
  ASSERT_EQ(a_files.size(), static_cast<size_t>(hit_tokens(p) / kBlock));
  for (const std::string& f : a_files) {
    std::ifstream in(f, std::ios::binary);
    const std::string blob{std::istreambuf_iterator<char>(in), {}};
    for (size_t i = 0; i + kBlock <= p.size(); i += kBlock) {
      const std::string block(reinterpret_cast<const char*>(p.data() + i), kBlock * sizeof(int32_t));
      EXPECT_EQ(blob.find(block), std::string::npos) << f << " holds the tokens at " << i;
    }
  }
  EngineConfig other = c;
  other.kv_tier_secret = "another deployment's secret";
  {
    auto e = make(other);
    const Result r = run(*e, p, "tenant-a");
    EXPECT_EQ(r.tokens, want);
    EXPECT_EQ(r.cached, 0);
    EXPECT_EQ(tier_of(e->stats()).corrupt + tier_of(e->stats()).mismatches, 0);  // other names: plain misses
  }
  // Tenant b's entries in their own directory, then each replaced by one of tenant a's.
  EngineConfig cb = c;
  cb.kv_disk_dir = d.path + "/b";
  { run(*make(cb), p, "tenant-b"); }
  size_t swapped = 0;
  for (const auto& f : fs::directory_iterator(d.path + "/b")) {
    fs::copy_file(a_files[swapped % a_files.size()], f.path(), fs::copy_options::overwrite_existing);
    ++swapped;
  }
  ASSERT_EQ(swapped, a_files.size());
  auto e = make(cb);
  const Result r = run(*e, p, "tenant-b");
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.cached, 0);
  EXPECT_TRUE(eventually([&] { return tier_of(e->stats()).corrupt == static_cast<int64_t>(swapped); }));
  EXPECT_EQ(tier_of(e->stats()).hits, 0);
}

TEST(EngineDiskTier, AnotherModelFileNeverHits) {
  TempDir d;
  // stories260K with one weight byte changed: same hyper-parameters, other weights.
  const std::string other = d.path + "/other.gguf";
  fs::copy_file(testutil::stories_path(), other);
  {
    auto f = gguf::GgufFile::open(other);
    ASSERT_TRUE(f.ok());
    const uint64_t off = (*f)->data_offset() + (*f)->tensors().back().offset + 4;
    std::fstream s(other, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(static_cast<std::streamoff>(off));
    s.put('\x11');
  }
  const auto p = make_prompt(100, 5);
  EngineConfig c = disk_config(d.path + "/kv");
  { run(*make(c), p); }
  EngineConfig c2 = c;
  c2.model_path = other;
  auto b = make(c2);
  const Result r = run(*b, p);
  EXPECT_EQ(r.cached, 0);
  EXPECT_EQ(tier_of(b->stats()).hits, 0);
  EXPECT_EQ(tier_of(b->stats()).mismatches, 0);  // other names, not just other contents
}

// KV types (issue 39): an entry is keyed by the K and the V type. A restart
// with the same pair hits and gives the cold output of that pair; every other
// pair, even with the same block bytes (K and V swapped; q4_0 and iq4_nl are
// both 18 bytes per 32), never loads it. Same-type keys keep their old value.
TEST(EngineDiskTier, AnotherKvTypeNeverHits) {
  EXPECT_EQ(tier_kv_dtype(KvDtype::F16), 1u);  // the values of same-type caches are what they were
  EXPECT_EQ(tier_kv_dtype(KvDtype::Q8_0), 3u);
  EXPECT_NE(tier_kv_dtype(KvTypes(KvDtype::F16, KvDtype::F32)), tier_kv_dtype(KvDtype::F16));
  EXPECT_NE(tier_kv_dtype(KvTypes(KvDtype::Q8_0, KvDtype::Q4_0)), tier_kv_dtype(KvTypes(KvDtype::Q4_0, KvDtype::Q8_0)));
  // Rows below 8 bits are Hadamard-rotated (base/kv_dtype.h): their keys carry bit 17,
  // so an entry written before the rotation (key k, or k | v << 8 | 1 << 16) is never
  // loaded into a rotated cache; f32, f16, bf16 and q8_0 keys are unchanged.
  for (KvDtype t : kAllKvDtypes) {
    const auto old_key = static_cast<uint32_t>(t);
    EXPECT_EQ(tier_kv_dtype(t), kv_dtype_rotated(t) ? old_key | 1u << 17 : old_key) << kv_dtype_name(t);
  }
  EXPECT_EQ(tier_kv_dtype(KvTypes(KvDtype::Q8_0, KvDtype::Q4_0)), (3u | 4u << 8 | 1u << 16) | 1u << 17);
  EXPECT_EQ(tier_kv_dtype(KvTypes(KvDtype::F16, KvDtype::Q8_0)), 1u | 3u << 8 | 1u << 16);
  TempDir d;
  const auto p = make_prompt(100, 7);
  const KvTypes written(KvDtype::Q8_0, KvDtype::Q4_0);
  EngineConfig c = disk_config(d.path);
  c.kv_dtype = written;
  EngineConfig plain = config();
  plain.kv_dtype = written;
  const auto want = run(*make(plain), p).tokens;
  { EXPECT_EQ(run(*make(c), p).tokens, want); }
  for (KvTypes other : {KvTypes(KvDtype::Q4_0, KvDtype::Q8_0), KvTypes(KvDtype::Q8_0, KvDtype::IQ4_NL),
                        KvTypes(KvDtype::Q8_0), KvTypes(KvDtype::Q4_0), KvTypes(KvDtype::F16)}) {
    EngineConfig c2 = c;
    c2.kv_dtype = other;
    auto b = make(c2);
    ASSERT_TRUE(b);
    const Result r = run(*b, p);
    EXPECT_EQ(r.cached, 0) << kv_types_name(other);
    EXPECT_EQ(tier_of(b->stats()).hits, 0) << kv_types_name(other);
    EXPECT_EQ(tier_of(b->stats()).mismatches, 0) << kv_types_name(other);  // other names, not just contents
  }
  auto same = make(c);
  const Result r = run(*same, p);
  EXPECT_EQ(r.cached, hit_tokens(p));
  EXPECT_EQ(r.tokens, want);
}

TEST(EngineRedisTier, TwoReplicasShareOneRedisAndAFlippedValueIsRecomputed) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisServer s(d.path);
  const auto p = make_prompt(200, 6);
  const auto want = cold(p);
  EngineConfig c = config();
  c.kv_redis = "redis://127.0.0.1:" + std::to_string(s.port());
  auto a = make(c);
  auto b = make(c);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(run(*a, p).tokens, want);
  a.reset();  // drains its stores
  const Result r = run(*b, p);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.cached, hit_tokens(p));
  EXPECT_GE(r.cached, static_cast<int32_t>(0.9 * static_cast<double>(p.size())));
  EXPECT_EQ(tier_of(b->stats()).kind, "redis");
  EXPECT_EQ(tier_of(b->stats()).hits, hit_tokens(p) / kBlock);

  // A flipped byte in every stored value: a third replica recomputes.
  const std::string keys = redis_cmd(s.port(), {"KEYS", "pagoda:kv:*"});
  int flipped = 0;
  for (size_t at = 0, nl; (nl = keys.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string k = keys.substr(at, nl - at);
    const std::string v = redis_cmd(s.port(), {"GETRANGE", k, "100", "100"});
    ASSERT_EQ(v.size(), 1u);
    redis_cmd(s.port(), {"SETRANGE", k, "100", std::string(1, static_cast<char>(v[0] ^ 4))});
    ++flipped;
  }
  EXPECT_EQ(flipped, hit_tokens(p) / kBlock);
  auto e = make(c);
  const Result r3 = run(*e, p);
  EXPECT_EQ(r3.tokens, want);
  EXPECT_EQ(r3.cached, 0);
  EXPECT_TRUE(eventually([&] { return tier_of(e->stats()).corrupt == flipped; }));
  // Another tenant (salt) on the same Redis: nothing of A's is served.
  auto t = make(c);
  const Result other = run(*t, p, "tenant-b");
  EXPECT_EQ(other.tokens, want);
  EXPECT_EQ(other.cached, 0);
  EXPECT_EQ(tier_of(t->stats()).hits, 0);
}

TEST(EngineRedisTier, DownAtStartAndKilledMidRunServeOn) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  const auto p = make_prompt(100, 7), q = make_prompt(90, 8);
  const auto want_p = cold(p), want_q = cold(q);
  EngineConfig c = config();
  const int port = tiertest::free_port();
  c.kv_redis = "redis://127.0.0.1:" + std::to_string(port);
  auto a = make(c);  // nothing listens yet
  ASSERT_TRUE(a);
  EXPECT_EQ(run(*a, p).tokens, want_p);
  EXPECT_GT(tier_of(a->stats()).errors, 0);
  RedisServer s(d.path, port);
  // Past the backoff the tier works: q stored by a, then served to b.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(run(*a, q).tokens, want_q);
  a.reset();
  auto b = make(c);
  const Result r = run(*b, q);
  EXPECT_EQ(r.tokens, want_q);
  EXPECT_EQ(r.cached, hit_tokens(q));
  // Killed mid-run: the next requests complete, the errors are counted.
  s.stop(SIGKILL);
  const int64_t errors_before = tier_of(b->stats()).errors;
  EXPECT_EQ(run(*b, p).tokens, want_p);
  EXPECT_GT(tier_of(b->stats()).errors, errors_before);
}

TEST(EngineRedisTier, TwoReplicasShareARedisCluster) {
  PAGODA_REQUIRE_REDIS();
  TempDir d;
  RedisCluster cl(d.path);
  ASSERT_TRUE(cl.ok());
  const auto p = make_prompt(200, 9);
  const auto want = cold(p);
  EngineConfig c = config();
  c.kv_redis = cl.url();
  { EXPECT_EQ(run(*make(c), p).tokens, want); }
  auto b = make(c);
  const Result r = run(*b, p);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.cached, hit_tokens(p));
  // One node killed: its blocks are misses, the request still completes bitwise.
  cl.node(1).stop(SIGKILL);
  auto e = make(c);
  const Result r2 = run(*e, p);
  EXPECT_EQ(r2.tokens, want);
  EXPECT_LT(r2.cached, hit_tokens(p));
  EXPECT_GT(tier_of(e->stats()).errors, 0);
}

}  // namespace
}  // namespace pagoda::engine
