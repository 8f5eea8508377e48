// KV tiers with KV cache groups (issue 16 x issue 15): the 6-layer synth
// tiny-gemma3 (layer 5 global, the others window 8; blocks of 4 tokens: one
// full group and five window groups of one layer slot) restarted over a disk
// tier, with the hybrid manager on and off. Each restart must report the
// cached tokens and give outputs (tokens and every logits row) bitwise those
// of the cold run without tiers. A prompt sharing only a prefix with the
// stored one hits it at the prefix's end: its window groups' blocks there were
// not asked for at first (the full hit's window lies further on) and must be.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/rng.h"
#include "engine/engine.h"
#include "gguf/synth.h"
#include "tier_test_util.h"

namespace pagoda::engine {
namespace {

constexpr int kBlock = 4;

struct Out {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  int32_t cached = 0;
};

class TierGroups : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gguf::SynthOptions o;
    o.shape = *gguf::find_synth_preset("tiny-gemma3");  // gemma3's pattern of 6: layer 5 global, 0..4 window 8
    o.shape.weight_std = 0.3;                            // attention that depends on which keys it sees
    o.type = GgmlType::F32;
    o.seed = 16;
    path_ = new std::string(::testing::TempDir() + "pagoda_tier_groups_" + std::to_string(::getpid()) + ".gguf");
    ASSERT_TRUE(gguf::synth_model_file(o, *path_).ok());
  }
  static void TearDownTestSuite() {
    if (path_) std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
  }

  static EngineConfig config(bool hybrid, const std::string& disk_dir) {
    EngineConfig c;
    c.model_path = *path_;
    c.threads = 1;
    c.kv_dtype = KvDtype::F32;
    c.block_size = kBlock;
    c.num_kv_blocks = 1024;
    c.disable_hybrid_kv_cache_manager = !hybrid;
    c.kv_disk_dir = disk_dir;
    c.kv_disk_size = disk_dir.empty() ? 0 : 256 << 20;
    return c;
  }

  static Out run(Engine& e, const std::vector<int32_t>& prompt) {
    RequestParams p;
    p.prompt = prompt;
    p.max_tokens = 6;
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
      EXPECT_EQ(0, std::memcmp(want.logits[s].data(), got.logits[s].data(), want.logits[s].size() * sizeof(float)))
          << what << ": step " << s;
    }
  }

  static std::vector<int32_t> tokens(uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(3, 255)));
    return t;
  }

  static std::string* path_;
};
std::string* TierGroups::path_ = nullptr;

TEST_F(TierGroups, RestartFromDiskIsBitwiseTheColdRunWithAndWithoutTheHybridManager) {
  // P: 150 tokens (37 full blocks a hit may cover). Q: P's first 96 tokens and
  // another tail (133 tokens, 33 blocks): its hit ends at block 24, where the
  // window groups need blocks 22 and 23, not the 31 and 32 of Q's own full hit.
  const auto p = tokens(1, 150);
  auto q = std::vector<int32_t>(p.begin(), p.begin() + 96);
  const auto tail = tokens(2, 37);
  q.insert(q.end(), tail.begin(), tail.end());
  Out cold_p, cold_q;
  {
    auto e = make(config(true, ""));
    ASSERT_TRUE(e);
    cold_p = run(*e, p);
  }
  {
    auto e = make(config(true, ""));
    ASSERT_TRUE(e);
    cold_q = run(*e, q);
  }
  ASSERT_EQ(cold_p.tokens.size(), 6u);
  for (bool hybrid : {true, false}) {
    const std::string mode = hybrid ? "hybrid" : "one group";
    tiertest::TempDir d;
    const EngineConfig c = config(hybrid, d.path);
    {
      auto a = make(c);
      ASSERT_TRUE(a);
      const Out r = run(*a, p);
      EXPECT_EQ(r.cached, 0) << mode;
      expect_bitwise(cold_p, r, mode + " first run");
    }  // the engine's end drains the stores
    size_t files = 0;
    for (const auto& f : std::filesystem::directory_iterator(d.path)) files += f.is_regular_file() ? 1 : 0;
    // Every group's committed blocks, one entry each: 38 = (150 + 6 - 1) / 4 (the
    // last sampled token is never computed); hybrid: 6 groups.
    EXPECT_EQ(files, hybrid ? 6u * 38u : 38u) << mode;
    {
      auto b = make(c);  // restart: empty RAM, the same directory
      ASSERT_TRUE(b);
      const Out rq = run(*b, q);
      EXPECT_EQ(rq.cached, 96) << mode;
      expect_bitwise(cold_q, rq, mode + " restart, shared prefix");
      const Out rp = run(*b, p);  // blocks 0..23 now in RAM, the rest from disk
      EXPECT_EQ(rp.cached, 148) << mode;
      expect_bitwise(cold_p, rp, mode + " restart, whole prompt");
      const EngineStats st = b->stats();
      EXPECT_EQ(st.num_waiting_for_kv_load, 0);
      EXPECT_EQ(st.blocks_used, 0) << mode << ": imported blocks are all released";
      EXPECT_GT(st.blocks_cached, 0) << mode;
    }
    {
      // The other layout never reads these entries (its blocks hold other layers).
      auto o = make(config(!hybrid, d.path));
      ASSERT_TRUE(o);
      const Out r = run(*o, p);
      EXPECT_EQ(r.cached, 0) << mode;
      expect_bitwise(cold_p, r, mode + " read by the other layout");
    }
  }
}

}  // namespace
}  // namespace pagoda::engine
