// Helpers of the engine-level tier tests (test_engine_tiers, test_engine_tier_pins,
// test_engine_prefix_miss): prompts of stories260K's vocabulary and one greedy
// request run to its end.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace pagoda::tiertest {

// A prompt of n token ids of stories260K's vocabulary (512), fixed by seed.
inline std::vector<int32_t> make_prompt(int n, uint32_t seed) {
  std::vector<int32_t> p = {1};
  uint32_t x = seed * 2654435761u + 1;
  while (static_cast<int>(p.size()) < n) {
    x = x * 1664525u + 1013904223u;
    p.push_back(static_cast<int32_t>(3 + (x >> 8) % 500));
  }
  return p;
}

struct RunResult {
  std::vector<int32_t> tokens;
  int32_t cached = -1;  // the request's prefix-cache hit (-1: no event reported one)
  engine::FinishReason finish = engine::FinishReason::kNone;
};

// One greedy request of 8 tokens (EOS ignored), alone in the engine, run to its
// end; it must end by length. pin_tokens/ttl: RequestParams' pin.
inline RunResult run_greedy(engine::Engine& e, const std::vector<int32_t>& prompt, const std::string& salt = "",
                            int32_t pin_tokens = 0, double ttl = 0) {
  engine::RequestParams p;
  p.prompt = prompt;
  p.max_tokens = 8;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.cache_salt = salt;
  p.pin_tokens = pin_tokens;
  p.pin_ttl_s = ttl;
  auto id = e.add_request(p);
  EXPECT_TRUE(id.ok()) << id.message();
  RunResult r;
  for (int steps = 0; e.has_unfinished() && steps < 100000; ++steps) {
    for (const engine::TokenEvent& ev : e.step()) {
      EXPECT_EQ(ev.id, *id);
      r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.num_cached_tokens > 0 || r.cached < 0) r.cached = std::max(r.cached, ev.num_cached_tokens);
      if (ev.finish != engine::FinishReason::kNone) r.finish = ev.finish;
    }
  }
  EXPECT_EQ(r.finish, engine::FinishReason::kLength);
  return r;
}

}  // namespace pagoda::tiertest
