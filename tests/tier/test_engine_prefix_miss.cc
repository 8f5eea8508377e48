// Why a prefix missed, through the engine (issue 36, kv/prefix_miss.h): the
// cause on a request's first TokenEvent after its blocks were evicted from RAM,
// without a tier ("evicted") and with a disk tier in a temp dir whose entries
// are gone ("tier_miss"); a hit served from the disk tier reads "none".
#include <gtest/gtest.h>

#include <filesystem>

#include "common/reference_jsonl.h"
#include "engine/engine.h"
#include "engine_run_util.h"
#include "tier_test_util.h"

namespace pagoda::engine {
namespace {

constexpr int kBlock = 16;

struct First {
  std::string cause;
  int32_t cached = -1, position = -2;
  double ago = -2;
};

using tiertest::make_prompt;

EngineConfig config(const std::string& disk_dir) {
  EngineConfig c;
  c.model_path = testutil::stories_path();
  c.threads = 1;
  c.block_size = kBlock;
  c.num_kv_blocks = 64;
  if (!disk_dir.empty()) {
    c.kv_disk_dir = disk_dir;
    c.kv_disk_size = 64 << 20;
  }
  return c;
}

// Runs one request to its end; the prefix-miss fields of its first event.
First run(Engine& e, const std::vector<int32_t>& prompt) {
  RequestParams p;
  p.prompt = prompt;
  p.max_tokens = 4;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  auto id = e.add_request(p);
  EXPECT_TRUE(id.ok()) << id.message();
  First f;
  bool seen = false;
  for (int steps = 0; e.has_unfinished() && steps < 100000; ++steps) {
    for (const TokenEvent& ev : e.step()) {
      if (seen) {
        EXPECT_TRUE(ev.prefix_miss.empty());  // told once, on the first event
        continue;
      }
      seen = true;
      f = First{ev.prefix_miss, ev.num_cached_tokens, ev.prefix_miss_position, ev.prefix_evicted_ago_s};
    }
  }
  return f;
}

// Four unrelated 300-token prompts: 4 x 19 blocks turn the 63-block pool over.
void flood(Engine& e, uint32_t seed) {
  for (uint32_t s = seed; s < seed + 4; ++s) EXPECT_EQ(run(e, make_prompt(300, s)).cause, "never_seen");
}

TEST(EnginePrefixMiss, EvictedFromRam) {
  auto e = Engine::create(config(""));
  ASSERT_TRUE(e.ok()) << e.message();
  const auto p = make_prompt(150, 1);
  First f = run(**e, p);
  EXPECT_EQ(f.cause, "never_seen");
  EXPECT_EQ(f.cached, 0);
  f = run(**e, p);
  EXPECT_EQ(f.cause, "none");
  EXPECT_EQ(f.cached, 144);  // (150 - 1) / 16 full blocks
  flood(**e, 100);
  f = run(**e, p);
  EXPECT_EQ(f.cause, "evicted");
  EXPECT_EQ(f.cached, 0);
  EXPECT_EQ(f.position, -1);
  EXPECT_GE(f.ago, 0.0);
  EXPECT_LT(f.ago, 600.0);
}

TEST(EnginePrefixMiss, TierMissWhenTheDiskTierLostTheBlocks) {
  tiertest::TempDir d;
  auto e = Engine::create(config(d.path));
  ASSERT_TRUE(e.ok()) << e.message();
  const auto p = make_prompt(150, 2);
  EXPECT_EQ(run(**e, p).cause, "never_seen");
  flood(**e, 100);
  // The disk tier held p's blocks: loaded back, a full hit.
  First f = run(**e, p);
  EXPECT_EQ(f.cause, "none");
  EXPECT_EQ(f.cached, 144);
  flood(**e, 200);
  // Now the tier loses them (the files removed): evicted from RAM, not in the tier.
  for (const auto& ent : std::filesystem::recursive_directory_iterator(d.path)) {
    if (ent.is_regular_file()) std::filesystem::remove(ent.path());
  }
  f = run(**e, p);
  EXPECT_EQ(f.cause, "tier_miss");
  EXPECT_EQ(f.cached, 0);
  EXPECT_GE(f.ago, 0.0);
}

}  // namespace
}  // namespace pagoda::engine
