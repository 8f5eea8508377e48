// Pins of a hybrid model's state checkpoints through the Engine (issue 38,
// kv/kv_pins.cc): on the synth tiny-lfm2 (S = 2 state blocks) and tiny-qwen35
// (S = 11), blocks of 4 tokens, a checkpoint every 4 blocks. Turn 1 is a
// 37-token prompt + 8 outputs pinning its first 32 tokens: the pin holds their
// 8 K/V blocks and the checkpoint at 32 (8 + S blocks). Unrelated traffic that
// turns the 64-block pool over evicts everything else, and turn 2 (turn 1 +
// its answer + 11 tokens) still hits 32 tokens, restoring that checkpoint, its
// tokens and every logits row bitwise a cold run's. The same traffic without
// the pin, or after its TTL, leaves turn 2 no hit. With a disk tier the pinned
// checkpoint's entry carries the pin's expiry like its K/V blocks' entries,
// and in Redis the pin's PX.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/rng.h"
#include "engine/engine.h"
#include "gguf/synth.h"
#include "tier/entry.h"
#include "redis_util.h"
#include "tier/tier.h"
#include "tier_test_util.h"

namespace pagoda::engine {
namespace {

namespace fs = std::filesystem;

struct Out {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  int32_t cached = 0;
};

struct Model {
  std::string path;
  std::vector<int32_t> turn1, turn2;
  Out cold2;
};

constexpr int32_t kPin = 32;  // turn 1's pinned tokens: 8 blocks, the checkpoint at their end

std::vector<int32_t> tokens(uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(3, 300)));
  return t;
}

class HybridPins : public ::testing::TestWithParam<const char*> {
 protected:
  static void TearDownTestSuite() {
    for (const auto& [name, m] : models_) std::remove(m.path.c_str());
    models_.clear();
  }

  // interval 0: no checkpoints, so no prefix caching at all (the cold reference).
  EngineConfig config(int interval) {
    EngineConfig c;
    c.model_path = model().path;
    c.threads = 1;
    c.kv_dtype = KvDtype::F16;
    c.block_size = 4;
    c.num_kv_blocks = 64;
    c.watermark = 0;
    c.state_checkpoint_interval = interval;
    c.kv_pinned_fraction = 0.5;
    c.kv_clock_for_testing = [this] { return clock_; };
    return c;
  }

  static Out run(Engine& e, const std::vector<int32_t>& prompt, int32_t pin_tokens = 0, double ttl = 0) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 8;
    p.temperature = 0.0f;
    p.ignore_eos = p.return_logits = true;
    p.pin_tokens = pin_tokens;
    p.pin_ttl_s = ttl;
    auto id = e.add_request(p);
    EXPECT_TRUE(id.ok()) << id.message();
    Out o;
    while (e.has_unfinished()) {
      for (const TokenEvent& ev : e.step()) {
        EXPECT_TRUE(ev.error.empty()) << ev.error;
        o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        if (!ev.tokens.empty()) o.logits.push_back(ev.logits);
        o.cached = std::max(o.cached, ev.num_cached_tokens);
      }
      const std::string broken = e.check_invariants();
      EXPECT_EQ(broken, "");
      if (!broken.empty()) break;
    }
    return o;
  }

  static std::unique_ptr<Engine> make(const EngineConfig& c) {
    auto e = Engine::create(c);
    EXPECT_TRUE(e.ok()) << e.message();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  static void expect_bitwise(const Out& want, const Out& got, const std::string& what) {
    ASSERT_EQ(want.tokens, got.tokens) << what;
    ASSERT_EQ(want.logits.size(), got.logits.size()) << what;
    for (size_t s = 0; s < want.logits.size(); ++s) {
      ASSERT_EQ(want.logits[s].size(), got.logits[s].size()) << what;
      ASSERT_FALSE(want.logits[s].empty()) << what;
      ASSERT_EQ(0, std::memcmp(want.logits[s].data(), got.logits[s].data(), want.logits[s].size() * sizeof(float)))
          << what << ": step " << s;
    }
  }

  // Unrelated traffic: 6 prompts of 60 tokens one after another, 102 K/V blocks in all (the pool: 63).
  static void flood(Engine& e, uint64_t seed) {
    for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(run(e, tokens(seed + i, 60)).cached, 0);
  }

  static int32_t state_blocks() { return std::string(GetParam()) == "tiny-lfm2" ? 2 : 11; }
  static Model& model() { return models_[GetParam()]; }

  void SetUp() override {
    Model& m = model();
    if (m.turn2.empty()) make_model(&m);
  }
  void make_model(Model* mp) {
    Model& m = *mp;
    gguf::SynthOptions o;
    o.shape = *gguf::find_synth_preset(GetParam());
    o.type = GgmlType::F32;
    o.seed = 38;
    m.path = ::testing::TempDir() + "pagoda_hpins_" + GetParam() + "_" + std::to_string(::getpid()) + ".gguf";
    ASSERT_TRUE(gguf::synth_model_file(o, m.path).ok());
    m.turn1 = tokens(11, 37);
    auto e = make(config(0));
    ASSERT_TRUE(e);
    const Out t1 = run(*e, m.turn1);
    ASSERT_EQ(t1.tokens.size(), 8u);
    m.turn2 = m.turn1;
    m.turn2.insert(m.turn2.end(), t1.tokens.begin(), t1.tokens.end());
    const auto more = tokens(12, 11);
    m.turn2.insert(m.turn2.end(), more.begin(), more.end());
    auto f = make(config(0));
    ASSERT_TRUE(f);
    m.cold2 = run(*f, m.turn2);
    ASSERT_EQ(m.cold2.cached, 0);
  }

  double clock_ = 1000;
  static std::map<std::string, Model> models_;
};
std::map<std::string, Model> HybridPins::models_;

TEST_P(HybridPins, TrafficEvictsTheCheckpointWithoutAPin) {
  const Model& m = model();
  auto e = make(config(4));
  ASSERT_TRUE(e);
  EXPECT_EQ(run(*e, m.turn1).cached, 0);
  EXPECT_EQ(e->stats().checkpoints, 1);
  flood(*e, 100);
  const Out t2 = run(*e, m.turn2);
  EXPECT_EQ(t2.cached, 0);
  expect_bitwise(m.cold2, t2, "turn 2 after the traffic, no pin");
  EXPECT_EQ(e->stats().checkpoints_hit, 0);
}

TEST_P(HybridPins, APinnedPrefixKeepsItsCheckpointThroughTrafficUntilItsTtl) {
  const Model& m = model();
  const int32_t S = state_blocks();
  auto e = make(config(4));
  ASSERT_TRUE(e);
  EXPECT_EQ(run(*e, m.turn1, kPin, 60).cached, 0);
  EngineStats st = e->stats();
  EXPECT_EQ(st.pins, 1);
  EXPECT_EQ(st.blocks_pinned, 8 + S) << "8 K/V blocks and the checkpoint at 32";
  EXPECT_EQ(st.checkpoints_stored, 1);
  flood(*e, 100);
  st = e->stats();
  EXPECT_EQ(st.blocks_pinned, 8 + S);
  EXPECT_EQ(st.checkpoints_hit, 0);
  const Out t2 = run(*e, m.turn2);
  EXPECT_EQ(t2.cached, kPin);
  expect_bitwise(m.cold2, t2, "turn 2 after the traffic, pinned");
  st = e->stats();
  EXPECT_EQ(st.checkpoints_hit, 1);
  EXPECT_EQ(st.pins_renewed, 1) << "turn 2's hit covers the whole pinned prefix";
  // The TTL passes (the next step releases it); the same traffic then evicts it.
  clock_ += 61;
  flood(*e, 200);
  st = e->stats();
  EXPECT_EQ(st.pins_expired, 1);
  EXPECT_EQ(st.blocks_pinned, 0);
  const Out again = run(*e, m.turn2);
  EXPECT_EQ(again.cached, 0);
  expect_bitwise(m.cold2, again, "turn 2 after the TTL and the traffic");
  EXPECT_EQ(e->stats().checkpoints_hit, 1);
}

// A pin of 20 tokens (5 blocks): turn 1's prefill is cut at 16, the pin's last
// boundary, so it has a checkpoint there to pin (else its one chunk of 32
// checkpoints only at 32, past the pin): turn 2 hits 16 after the traffic.
TEST_P(HybridPins, APinBetweenBoundariesPinsTheCheckpointAtItsLastOne) {
  const Model& m = model();
  auto e = make(config(4));
  ASSERT_TRUE(e);
  EXPECT_EQ(run(*e, m.turn1, 20, 60).cached, 0);
  EngineStats st = e->stats();
  EXPECT_EQ(st.checkpoints_stored, 2) << "at 16 (the pin's cut) and 32";
  EXPECT_EQ(st.blocks_pinned, 5 + state_blocks());
  flood(*e, 100);
  const Out t2 = run(*e, m.turn2);
  EXPECT_EQ(t2.cached, 16);
  expect_bitwise(m.cold2, t2, "turn 2 after the traffic, 20 tokens pinned");
  EXPECT_EQ(e->stats().checkpoints_hit, 1);
}

// Every entry file of the directory with its header's expiry (unix ms, 0: none), largest first.
std::vector<std::pair<uintmax_t, uint64_t>> disk_entries(const std::string& dir) {
  std::vector<std::pair<uintmax_t, uint64_t>> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (!f.is_regular_file() || f.path().filename().string().size() != 32) continue;
    std::ifstream in(f.path(), std::ios::binary);
    std::string head(128, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    out.emplace_back(f.file_size(), tier::EntryCodec::parse_head(head).expiry_ms);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

TEST_P(HybridPins, ThePinnedCheckpointGoesToTheDiskTierWithThePinsExpiry) {
  const Model& m = model();
  tiertest::TempDir d;
  EngineConfig c = config(4);
  c.kv_disk_dir = d.path;
  c.kv_disk_size = 64 << 20;
  const uint64_t t0 = tier::unix_now_ms();
  {
    auto e = make(c);
    ASSERT_TRUE(e);
    EXPECT_EQ(run(*e, m.turn1, kPin, 60).cached, 0);
  }  // the engine's end drains the stores
  // 11 K/V blocks and the checkpoint (the largest entry: S blocks); the pinned 8 and the checkpoint expire.
  const auto files = disk_entries(d.path);
  ASSERT_EQ(files.size(), 12u);
  int with_expiry = 0;
  for (const auto& [size, expiry] : files) {
    if (expiry == 0) continue;
    ++with_expiry;
    EXPECT_GE(expiry, t0 + 60000 - 100);
    EXPECT_LE(expiry, tier::unix_now_ms() + 60000);
  }
  EXPECT_EQ(with_expiry, 8 + 1);
  EXPECT_NE(files[0].second, 0u) << "the checkpoint's entry carries the pin's expiry";
  // A restart serves the pinned prefix with its checkpoint from disk.
  auto b = make(c);
  ASSERT_TRUE(b);
  const Out t2 = run(*b, m.turn2);
  EXPECT_EQ(t2.cached, kPin);
  expect_bitwise(m.cold2, t2, "turn 2 after a restart");
  EXPECT_EQ(b->stats().checkpoints_hit, 1);
}

TEST_P(HybridPins, ThePinnedCheckpointGoesToRedisUnderThePinsPx) {
  PAGODA_REQUIRE_REDIS();
  const Model& m = model();
  tiertest::TempDir d;
  tiertest::RedisServer srv(d.path);
  EngineConfig c = config(4);
  c.kv_redis = "redis://127.0.0.1:" + std::to_string(srv.port());
  {
    auto e = make(c);
    ASSERT_TRUE(e);
    EXPECT_EQ(run(*e, m.turn1, kPin, 60).cached, 0);
  }  // drains the stores
  // Every key as (value bytes, PTTL): 11 K/V blocks and the checkpoint, the largest.
  std::vector<std::pair<long long, long long>> keys;
  const std::string names = tiertest::redis_cmd(srv.port(), {"KEYS", "pagoda:kv:*"});
  for (size_t at = 0, nl; (nl = names.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string k = names.substr(at, nl - at);
    keys.emplace_back(std::stoll(tiertest::redis_cmd(srv.port(), {"STRLEN", k})),
                      std::stoll(tiertest::redis_cmd(srv.port(), {"PTTL", k})));
  }
  std::sort(keys.rbegin(), keys.rend());
  ASSERT_EQ(keys.size(), 12u);
  EXPECT_GT(keys[0].second, 0) << "the checkpoint under the pin's PX";
  EXPECT_LE(keys[0].second, 60000);
  const auto with_px = std::count_if(keys.begin(), keys.end(), [](const auto& k) { return k.second > 0; });
  EXPECT_EQ(with_px, 8 + 1);
  // Another replica serves the pinned prefix with its checkpoint.
  auto b = make(c);
  ASSERT_TRUE(b);
  const Out t2 = run(*b, m.turn2);
  EXPECT_EQ(t2.cached, kPin);
  expect_bitwise(m.cold2, t2, "turn 2 on another replica");
  EXPECT_EQ(b->stats().checkpoints_hit, 1);
}

INSTANTIATE_TEST_SUITE_P(Presets, HybridPins, ::testing::Values("tiny-lfm2", "tiny-qwen35"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param) == "tiny-lfm2" ? std::string("TinyLfm2") : std::string("TinyQwen35");
                         });

}  // namespace
}  // namespace pagoda::engine
