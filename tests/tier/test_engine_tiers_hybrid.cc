// KV tiers for a hybrid model (issue 38): the synth tiny-lfm2 (conv, attn,
// conv, conv, attn, conv; blocks of 4 tokens, its recurrent state in S = 2
// blocks), tiny-qwen35 (gated delta-net and attention; S = 11) and
// tiny-mamba2 (selective-scan layers only, no attention; S = 114), a state
// checkpoint every 4 blocks = 16 tokens. Turn 1 is a 37-token
// prompt + 8 outputs (44 computed tokens: 11 blocks, a checkpoint at 32, none
// at its decode's end); turn 2 is turn 1 + its answer + 11 new tokens. With
// RAM emptied (a reset of the RAM prefix cache only, or a restart), turn 2's
// hit comes from the tier: 8 K/V blocks AND the checkpoint at 32, restored
// before its first step; its tokens and every logits row are bitwise a cold
// run of its whole prompt without any caching. The same through Redis (two
// replicas). K/V in a tier without their checkpoint (removed, or one byte of
// it flipped) are never used: the hit is 0 and the output still bitwise cold.
// Tiers without checkpoints (--state-checkpoint-interval 0) are refused.
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
#include "redis_util.h"
#include "tier_test_util.h"

namespace pagoda::engine {
namespace {

namespace fs = std::filesystem;

struct Out {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  int32_t cached = 0;
};

// Per preset: its model file, turn 1's prompt, turn 2's prompt and turn 2's cold output.
struct Model {
  std::string path;
  std::vector<int32_t> turn1, turn2;
  Out cold2;
};

class TierHybrid : public ::testing::TestWithParam<const char*> {
 protected:
  static void TearDownTestSuite() {
    for (const auto& [name, m] : models_) std::remove(m.path.c_str());
    models_.clear();
  }

  // interval 0: no checkpoints, so no prefix caching at all (the cold reference).
  static EngineConfig config(int interval) {
    EngineConfig c;
    c.model_path = model().path;
    c.threads = 1;
    c.kv_dtype = KvDtype::F16;
    c.block_size = 4;
    c.num_kv_blocks = 512;
    c.watermark = 0;
    c.state_checkpoint_interval = interval;
    return c;
  }
  static EngineConfig disk_config(const std::string& dir) {
    EngineConfig c = config(4);
    c.kv_disk_dir = dir;
    c.kv_disk_size = 64 << 20;
    return c;
  }

  static Out run(Engine& e, const std::vector<int32_t>& prompt) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 8;
    p.temperature = 0.0f;
    p.ignore_eos = p.return_logits = true;
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

  static std::vector<int32_t> tokens(uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(3, 300)));
    return t;
  }

  static Model& model() { return models_[GetParam()]; }
  // The preset's model (synthesized once) and its turns, the cold one without any caching.
  void SetUp() override {
    Model& m = model();
    if (m.turn2.empty()) make_model(&m);
    turn1_ = m.turn1;
    turn2_ = m.turn2;
    cold2_ = m.cold2;
  }
  static void make_model(Model* mp) {
    Model& m = *mp;
    gguf::SynthOptions o;
    o.shape = *gguf::find_synth_preset(GetParam());
    o.type = GgmlType::F32;
    o.seed = 38;
    m.path = ::testing::TempDir() + "pagoda_tier_" + GetParam() + "_" + std::to_string(::getpid()) + ".gguf";
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

  static const KvTierStats& tier(const EngineStats& s) {
    static const KvTierStats none;
    return s.kv_tiers.empty() ? none : s.kv_tiers[0];
  }
  // Waits up to 5 s for pred (stores run on the tier threads).
  template <class F>
  static bool eventually(F pred) {
    for (int i = 0; i < 500 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return pred();
  }

  static std::map<std::string, Model> models_;
  std::vector<int32_t> turn1_, turn2_;
  Out cold2_;
};
std::map<std::string, Model> TierHybrid::models_;

// Turn 1 stores 11 K/V blocks and 1 checkpoint (at 32 tokens).
constexpr int64_t kTurn1Blocks = 11;
constexpr int32_t kHit = 32;

// Entry files of the directory, by size: a checkpoint (S = 2 blocks) is the largest.
std::vector<std::pair<uintmax_t, fs::path>> entries(const std::string& dir) {
  std::vector<std::pair<uintmax_t, fs::path>> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.is_regular_file() && f.path().filename().string().size() == 32) out.emplace_back(f.file_size(), f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_P(TierHybrid, ResetRamThenSecondTurnRestoresTheCheckpointFromDiskBitwise) {
  tiertest::TempDir d;
  auto a = make(disk_config(d.path));
  ASSERT_TRUE(a);
  const Out t1 = run(*a, turn1_);
  EXPECT_EQ(t1.cached, 0);
  ASSERT_TRUE(eventually([&] { return tier(a->stats()).stores == kTurn1Blocks + 1; })) << tier(a->stats()).stores;
  EXPECT_EQ(tier(a->stats()).checkpoint_stores, 1);
  EXPECT_EQ(a->stats().checkpoints_stored, 1);
  // RAM only: every cached block and checkpoint goes, the tier keeps its entries.
  // Turn 1's lookups: its 8 blocks up to the last boundary (32) and that checkpoint, all missed.
  EXPECT_EQ(tier(a->stats()).lookups, 8 + 1);
  EXPECT_EQ(tier(a->stats()).misses, 8 + 1);
  ASSERT_TRUE(a->reset_prefix_cache(false).ok());
  EXPECT_EQ(a->stats().blocks_cached, 0);
  const Out t2 = run(*a, turn2_);
  EXPECT_EQ(t2.cached, kHit);
  expect_bitwise(cold2_, t2, "turn 2 after a RAM reset");
  const EngineStats st = a->stats();
  // Turn 2's 13 full blocks end at boundary 48 (block 12 is past the last
  // boundary: never asked for): its 11 stored blocks load, the 8 before the
  // checkpoint at 32 are imported (48's checkpoint missed).
  EXPECT_EQ(tier(st).hits, kTurn1Blocks);
  EXPECT_EQ(tier(st).lookups, 9 + 12 + 2) << "12 blocks and 2 checkpoints (48: missed, then 32)";
  EXPECT_EQ(tier(st).checkpoint_hits, 1);
  EXPECT_EQ(tier(st).corrupt, 0);
  EXPECT_EQ(st.checkpoints_hit, 1) << "the loaded checkpoint restored";
  EXPECT_EQ(st.num_waiting_for_kv_load, 0);
  EXPECT_EQ(st.blocks_used, 0);
}

TEST_P(TierHybrid, RestartServesKvAndCheckpointFromDiskBitwise) {
  tiertest::TempDir d;
  {
    auto a = make(disk_config(d.path));
    ASSERT_TRUE(a);
    run(*a, turn1_);
  }  // the engine's end drains the stores
  const auto files = entries(d.path);
  ASSERT_EQ(files.size(), static_cast<size_t>(kTurn1Blocks + 1));
  EXPECT_GT(files.back().first, files[files.size() - 2].first) << "the checkpoint: twice a block's bytes";
  auto b = make(disk_config(d.path));
  ASSERT_TRUE(b);
  const Out t2 = run(*b, turn2_);
  EXPECT_EQ(t2.cached, kHit);
  expect_bitwise(cold2_, t2, "turn 2 after a restart");
  EXPECT_EQ(tier(b->stats()).checkpoint_hits, 1);
  EXPECT_EQ(b->stats().checkpoints_hit, 1);
  // Turn 2 stored its own checkpoint (at 48): a third turn on a third engine restores that one.
  auto third = turn2_;
  third.insert(third.end(), t2.tokens.begin(), t2.tokens.end());
  b.reset();
  auto c = make(disk_config(d.path));
  ASSERT_TRUE(c);
  auto cold = make(config(0));
  ASSERT_TRUE(cold);
  const Out want = run(*cold, third);
  const Out got = run(*c, third);
  EXPECT_EQ(got.cached, 48);
  expect_bitwise(want, got, "turn 3 after another restart");
}

// K/V blocks whose checkpoint is gone, or fails verification, are no hit.
TEST_P(TierHybrid, KvWithoutAUsableCheckpointIsRecomputed) {
  for (bool flip : {false, true}) {
    const std::string what = flip ? "checkpoint flipped" : "checkpoint removed";
    tiertest::TempDir d;
    {
      auto a = make(disk_config(d.path));
      ASSERT_TRUE(a);
      run(*a, turn1_);
    }
    const auto files = entries(d.path);
    ASSERT_EQ(files.size(), static_cast<size_t>(kTurn1Blocks + 1));
    const fs::path ckpt = files.back().second;
    if (flip) {
      std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(200);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(200);
      f.write(&c, 1);
    } else {
      fs::remove(ckpt);
    }
    auto b = make(disk_config(d.path));
    ASSERT_TRUE(b);
    const Out t2 = run(*b, turn2_);
    EXPECT_EQ(t2.cached, 0) << what;
    expect_bitwise(cold2_, t2, what);
    const EngineStats st = b->stats();
    EXPECT_EQ(st.checkpoints_hit, 0) << what;
    EXPECT_EQ(tier(st).checkpoint_hits, 0) << what;
    EXPECT_EQ(tier(st).corrupt, flip ? 1 : 0) << what;
  }
}

TEST_P(TierHybrid, TwoReplicasShareCheckpointsThroughRedisBitwise) {
  PAGODA_REQUIRE_REDIS();
  tiertest::TempDir d;
  tiertest::RedisServer s(d.path);
  EngineConfig c = config(4);
  c.kv_redis = "redis://127.0.0.1:" + std::to_string(s.port());
  auto a = make(c);
  auto b = make(c);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(run(*a, turn1_).cached, 0);
  a.reset();  // drains its stores
  const Out t2 = run(*b, turn2_);
  EXPECT_EQ(t2.cached, kHit);
  expect_bitwise(cold2_, t2, "turn 2 on the other replica");
  const EngineStats st = b->stats();
  EXPECT_EQ(tier(st).kind, "redis");
  EXPECT_EQ(tier(st).hits, kTurn1Blocks);
  EXPECT_EQ(tier(st).checkpoint_hits, 1);
  EXPECT_EQ(st.checkpoints_hit, 1);
}

TEST_P(TierHybrid, TiersWithoutCheckpointsAreRefused) {
  tiertest::TempDir d;
  EngineConfig c = disk_config(d.path);
  c.state_checkpoint_interval = 0;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("need state checkpoints (--state-checkpoint-interval > 0)"), std::string::npos)
      << e.message();
}

// tiny-mamba2: no attention layer; its token group's blocks carry the K/V
// entries (nothing in them) and S = 114 state blocks make each checkpoint.
INSTANTIATE_TEST_SUITE_P(Presets, TierHybrid, ::testing::Values("tiny-lfm2", "tiny-qwen35", "tiny-mamba2"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           const std::string p = i.param;
                           return p == "tiny-lfm2" ? std::string("TinyLfm2") : p == "tiny-qwen35" ? std::string("TinyQwen35")
                                                                                              : std::string("TinyMamba2");
                         });

}  // namespace
}  // namespace pagoda::engine
