// Pinned prefixes through the Engine (issue 36), on a tiny synthetic llama
// (64 wide, 2 layers, 16k context) so a prefix of 8,192 tokens is fast: the
// pinned prefix survives unrelated traffic that turns the pool over three
// times (the same traffic evicts it without the pin), and after its TTL on the
// test clock it is evicted like any block. reset_prefix_cache refuses while
// requests run, and with force preempts them: every output stays exact.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "gguf/synth.h"

namespace pagoda::enginetest {
namespace {
using engine::TokenEvent;
using engine::EngineConfig;

constexpr int kPrefix = 8192;  // 512 blocks of 16
constexpr int kPoolTokens = 9216;  // 576 blocks: the pinned prefix and 64 more
constexpr int kTrafficPrompt = 768;

bool g_tiny_written = false;

const std::string& tiny_path() {
  static const std::string path = [] {
    const std::string p = ::testing::TempDir() + "pagoda_pins_tiny_" + std::to_string(::getpid()) + ".gguf";
    const gguf::SynthShape* s = gguf::find_synth_preset("tiny-llama3");
    if (s == nullptr) return std::string();
    gguf::SynthOptions o;
    o.shape = *s;
    o.shape.n_ctx = 16384;
    o.type = GgmlType::F32;
    o.seed = 36;
    if (!gguf::synth_model_file(o, p).ok()) return std::string();
    g_tiny_written = true;
    return p;
  }();
  return path;
}

// The model file goes when the test program ends.
class RemoveTinyModel : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_tiny_written) std::remove(tiny_path().c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const g_remove_tiny = ::testing::AddGlobalTestEnvironment(new RemoveTinyModel);

std::vector<int32_t> tokens(uint64_t seed, int n) {
  Rng rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(3, 300)));
  return t;
}

struct PinEngine {
  double t = 0;
  std::unique_ptr<Engine> e;
  explicit PinEngine(const std::string& policy = "fcfs") {
    EngineConfig c = make_config(tiny_path(), kPoolTokens);
    c.max_num_batched_tokens = 2048;
    c.kv_pinned_fraction = 0.9;  // 518 blocks: the whole prefix
    c.scheduling_policy = policy;
    c.kv_clock_for_testing = [this] { return t; };
    e = make_engine(c);
  }
};

// Unrelated traffic of 3 x the pool's tokens: 36 prompts of 768 tokens.
void turn_pool_over_three_times(Engine* e, uint64_t seed) {
  Driver d(e);
  std::vector<RequestId> ids;
  for (int i = 0; i < 3 * kPoolTokens / kTrafficPrompt; ++i)
    ids.push_back(d.add(greedy(tokens(seed + static_cast<uint64_t>(i), kTrafficPrompt), 1)));
  d.run();
  for (RequestId id : ids) EXPECT_EQ(d.result(id).tokens.size(), 1u);
}

int32_t cached_for_prefix_plus(Engine* e, const std::vector<int32_t>& prefix, uint64_t seed) {
  std::vector<int32_t> p = prefix;
  const std::vector<int32_t> tail = tokens(seed, 40);
  p.insert(p.end(), tail.begin(), tail.end());
  return run_alone(e, greedy(p, 1)).first_num_cached;
}

TEST(EnginePins, PinnedPrefixSurvivesThreePoolTurnoversThenExpires) {
  ASSERT_FALSE(tiny_path().empty());
  PinEngine pe;
  ASSERT_TRUE(pe.e);
  Engine* e = pe.e.get();
  const std::vector<int32_t> prefix = tokens(1, kPrefix);
  RequestParams first = greedy(prefix, 1);
  first.pin_tokens = kPrefix;
  first.pin_ttl_s = 3600;
  EXPECT_EQ(run_alone(e, first).first_num_cached, 0);
  EngineStats s = e->stats();
  EXPECT_EQ(s.pins, 1);
  EXPECT_EQ(s.blocks_pinned, kPrefix / 16);
  EXPECT_EQ(s.pins_created, 1);
  pe.t = 1800;
  turn_pool_over_three_times(e, 1000);
  EXPECT_GE(cached_for_prefix_plus(e, prefix, 7), kPrefix - 16);  // a hit renews the pin (t = 1800)
  s = e->stats();
  EXPECT_EQ(s.pins_expired, 0);
  EXPECT_GE(s.pins_renewed, 1);
  // 3599 s after that hit (5399 s after the pin was made): still pinned, so the
  // TTL runs from the last touch.
  pe.t = 1800 + 3599;
  EXPECT_GE(cached_for_prefix_plus(e, prefix, 8), kPrefix - 16);
  s = e->stats();
  EXPECT_EQ(s.pins_expired, 0);
  EXPECT_EQ(s.blocks_pinned, kPrefix / 16);
  // An hour after the last touch (1800 + 3599 + 3600): expired at the next
  // step, then evicted by traffic like any block.
  pe.t = 1800 + 3599 + 3600;
  turn_pool_over_three_times(e, 3000);
  s = e->stats();
  EXPECT_EQ(s.pins_expired, 1);
  EXPECT_EQ(s.blocks_pinned, 0);
  EXPECT_LT(cached_for_prefix_plus(e, prefix, 9), 16 * 16);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

TEST(EnginePins, WithoutThePinTheSameTrafficEvictsThePrefix) {
  ASSERT_FALSE(tiny_path().empty());
  PinEngine pe;
  ASSERT_TRUE(pe.e);
  const std::vector<int32_t> prefix = tokens(1, kPrefix);
  EXPECT_EQ(run_alone(pe.e.get(), greedy(prefix, 1)).first_num_cached, 0);
  turn_pool_over_three_times(pe.e.get(), 1000);
  EXPECT_LT(cached_for_prefix_plus(pe.e.get(), prefix, 7), 16 * 16);
}

TEST(EnginePins, BadPinAndPolicyValuesAreRefused) {
  ASSERT_FALSE(tiny_path().empty());
  PinEngine pe;
  ASSERT_TRUE(pe.e);
  RequestParams p = greedy(tokens(2, 40), 1);
  p.pin_tokens = 32;
  p.pin_ttl_s = 0;
  auto r = pe.e->add_request(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("TTL"), std::string::npos) << r.message();
  p.pin_tokens = -1;
  EXPECT_FALSE(pe.e->add_request(p).ok());
  EXPECT_FALSE(pe.e->has_unfinished());
  EngineConfig c = make_config(tiny_path(), 1024);
  c.scheduling_policy = "lifo";
  auto bad = Engine::create(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--scheduling-policy"), std::string::npos);
  c.scheduling_policy = "fcfs";
  c.kv_pinned_fraction = 1.5;
  EXPECT_FALSE(Engine::create(c).ok());
}

// reset_prefix_cache: refused while requests run; force preempts them and
// they complete with exactly the tokens of an undisturbed run.
TEST(EnginePins, ResetPrefixCacheRefusesOrForces) {
  ASSERT_FALSE(tiny_path().empty());
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 3; ++i) {
    PinEngine ref;
    ASSERT_TRUE(ref.e);
    want.push_back(run_alone(ref.e.get(), greedy(tokens(50 + i, 300), 12)).tokens);
  }
  PinEngine pe("priority");
  ASSERT_TRUE(pe.e);
  Engine* e = pe.e.get();
  RequestParams pinned = greedy(tokens(40, 200), 1);
  pinned.pin_tokens = 160;
  pinned.pin_ttl_s = 60;
  run_alone(e, pinned);
  EXPECT_EQ(e->stats().pins, 1);
  Driver d(e);
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(d.add(greedy(tokens(50 + i, 300), 12)));
  for (int i = 0; i < 3; ++i) d.step();
  ASSERT_GT(e->stats().num_running, 0);
  Status refused = e->reset_prefix_cache(false);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("running"), std::string::npos) << refused.message();
  EXPECT_EQ(e->stats().pins, 1);  // nothing changed
  ASSERT_TRUE(e->reset_prefix_cache(true).ok());
  EngineStats s = e->stats();
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.pins, 0);
  EXPECT_EQ(s.pins_cleared, 1);
  EXPECT_EQ(s.blocks_cached, 0);
  EXPECT_EQ(s.prefix_cache_resets, 1);
  d.run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(d.result(ids[static_cast<size_t>(i)]).tokens, want[static_cast<size_t>(i)]) << i;
  EXPECT_TRUE(e->reset_prefix_cache(false).ok());  // idle: allowed
  EXPECT_EQ(e->stats().blocks_free, e->stats().blocks_total);
}

}  // namespace
}  // namespace pagoda::enginetest
