// Helpers of the engine tests: model paths, engine configs, a driver that steps
// an Engine to completion while checking every TokenEvent against the rules of
// engine.h (known id, no event after finish or abort, counts consistent, pool
// accounting consistent after each step), and the synthetic SmolLM2-shaped model.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/rng.h"
#include "common/reference_jsonl.h"
#include "engine/engine.h"
#include "gguf/synth.h"
#include "tok/tokenizer.h"

namespace pagoda::enginetest {

using engine::Engine;
using engine::EngineConfig;
using engine::EngineStats;
using engine::FinishReason;
using pagoda::KvDtype;
using engine::RequestId;
using engine::RequestParams;
using engine::TokenEvent;

// Reduced counts under sanitizers (CI runs the binary under ASan) or on request.
inline bool quick_mode() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#else
  const char* q = std::getenv("PAGODA_TEST_QUICK");
  return q != nullptr && std::string(q) == "1";
#endif
}
inline int scaled(int full, int quick) { return quick_mode() ? quick : full; }

// stories260K and its reference outputs: tests/common/reference_jsonl.h.
using testutil::load_references;
using testutil::Reference;
using testutil::stories_path;
inline std::string smollm_path() { return std::string(PAGODA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }
inline bool file_exists(const std::string& p) { return std::ifstream(p).good(); }

// A config for `path` with a pool of `pool_tokens` tokens (rounded up to blocks,
// plus the null block), so tests do not allocate the 256 MiB default.
inline EngineConfig make_config(const std::string& path, int64_t pool_tokens = 8192, int block_size = 16) {
  EngineConfig c;
  c.model_path = path;
  c.threads = 1;  // OpenMP spin-waits make 2 threads slow on a loaded 2-core machine
  c.block_size = block_size;
  c.num_kv_blocks = static_cast<int>((pool_tokens + block_size - 1) / block_size) + 1;
  return c;
}

inline std::unique_ptr<Engine> make_engine(const EngineConfig& c) {
  auto e = Engine::create(c);
  if (!e.ok()) {
    ADD_FAILURE() << "Engine::create(" << c.model_path << "): " << e.message();
    return nullptr;
  }
  return std::move(e).value();
}

// The engine most tests run: stories260K with a pool of 2048 tokens.
inline std::unique_ptr<Engine> stories_engine() { return make_engine(make_config(stories_path(), 2048)); }

// Fixture: a fresh stories_engine() per test, which must end with every KV
// block returned (finished requests free theirs; cached ones count as free).
class StoriesEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(e); }
  void TearDown() override {
    if (e) {
      EXPECT_EQ(e->stats().blocks_used, 0) << "the test left KV blocks in use";
    }
  }
  std::unique_ptr<Engine> e = stories_engine();
};

inline RequestParams greedy(std::vector<int32_t> prompt, int max_tokens, bool ignore_eos = true) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 0.0f;
  p.ignore_eos = ignore_eos;
  return p;
}

// Seeded sampling (temperature 1), exact lengths, n choices.
inline RequestParams seeded(std::vector<int32_t> prompt, int max_tokens, uint64_t seed, int n) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 1.0f;
  p.seed = seed;
  p.has_seed = true;
  p.ignore_eos = true;
  p.n = n;
  return p;
}

inline bool stats_equal(const EngineStats& a, const EngineStats& b) {
  return a.num_running == b.num_running && a.num_waiting == b.num_waiting && a.blocks_total == b.blocks_total &&
         a.blocks_free == b.blocks_free && a.blocks_used == b.blocks_used && a.blocks_cached == b.blocks_cached &&
         a.kv_usage == b.kv_usage && a.prefix_queries_tokens == b.prefix_queries_tokens &&
         a.prefix_hits_tokens == b.prefix_hits_tokens && a.num_preemptions == b.num_preemptions &&
         a.prompt_tokens_total == b.prompt_tokens_total && a.generation_tokens_total == b.generation_tokens_total;
}

inline std::string stats_string(const EngineStats& s) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "running %d waiting %d blocks total %lld free %lld used %lld cached %lld prefix q %lld hit %lld "
                "preempt %lld prompt %lld gen %lld",
                s.num_running, s.num_waiting, static_cast<long long>(s.blocks_total),
                static_cast<long long>(s.blocks_free), static_cast<long long>(s.blocks_used),
                static_cast<long long>(s.blocks_cached), static_cast<long long>(s.prefix_queries_tokens),
                static_cast<long long>(s.prefix_hits_tokens), static_cast<long long>(s.num_preemptions),
                static_cast<long long>(s.prompt_tokens_total), static_cast<long long>(s.generation_tokens_total));
  return buf;
}

// What one choice of one request produced, from its events.
struct ChoiceResult {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  int32_t first_num_cached = -1;  // num_cached_tokens of the first event
  int32_t num_prompt = -1;
  int events = 0;
  int first_step = -1;  // driver step of the first event
  int finish_step = -1;
};

// Steps an engine and records events per (request, choice), reporting every
// protocol violation as a test failure (at most kMaxViolations of them).
class Driver {
 public:
  explicit Driver(Engine* e) : e_(e) {}
  // Speculative decoding: an event may carry the accepted drafts and one more token.
  bool multi_token_steps = false;

  // Adds a request; 0 (and a test failure) when the engine refuses it.
  RequestId add(const RequestParams& p) {
    auto id = e_->add_request(p);
    if (!id.ok()) {
      ADD_FAILURE() << "add_request: " << id.message();
      return 0;
    }
    meta_[*id] = Meta{p.n, static_cast<int32_t>(p.prompt.size())};
    return *id;
  }

  void abort(RequestId id) {
    e_->abort(id);
    aborted_.insert(id);
  }

  std::vector<TokenEvent> step() {
    std::vector<TokenEvent> evs = e_->step();
    for (const TokenEvent& ev : evs) record(ev);
    const EngineStats s = e_->stats();
    if (s.blocks_used + s.blocks_free + s.blocks_cached != s.blocks_total || s.blocks_used < 0 ||
        s.blocks_free < 0 || s.blocks_cached < 0)
      violation("step " + std::to_string(steps_) + ": pool accounting off: " + stats_string(s));
    ++steps_;
    return evs;
  }

  // Steps until nothing is unfinished; false (and a failure) after max_steps.
  bool run(int64_t max_steps = 1000000) {
    for (int64_t i = 0; i < max_steps; ++i) {
      if (!e_->has_unfinished()) return true;
      step();
    }
    ADD_FAILURE() << "engine still has unfinished requests after " << max_steps << " steps";
    return false;
  }

  // Result of choice `index` of request `id` (empty if it produced no events).
  const ChoiceResult& result(RequestId id, int index = 0) { return results_[{id, index}]; }
  bool has_events(RequestId id) const {
    auto it = results_.lower_bound({id, 0});
    return it != results_.end() && it->first.first == id;
  }
  int steps() const { return steps_; }

  // Every added, non-aborted request: each of its n choices has finished.
  void expect_all_finished() {
    for (const auto& [id, m] : meta_) {
      if (aborted_.count(id)) continue;
      for (int i = 0; i < m.n; ++i) {
        auto it = results_.find({id, i});
        if (it == results_.end() || it->second.finish == FinishReason::kNone)
          violation("request " + std::to_string(id) + " choice " + std::to_string(i) + " never finished");
      }
    }
  }

  // The engine once everything has finished or been aborted: nothing running
  // or waiting, no block in use, every block free or cached. Returns its stats.
  EngineStats expect_drained() const {
    const EngineStats s = e_->stats();
    EXPECT_EQ(s.blocks_used, 0);
    EXPECT_EQ(s.num_running, 0);
    EXPECT_EQ(s.num_waiting, 0);
    EXPECT_EQ(s.blocks_free + s.blocks_cached, s.blocks_total);
    return s;
  }

 private:
  struct Meta {
    int n = 1;
    int32_t prompt_len = 0;
  };
  static constexpr int kMaxViolations = 20;

  void violation(const std::string& msg) {
    if (++num_violations_ <= kMaxViolations) ADD_FAILURE() << msg;
  }

  void record(const TokenEvent& ev) {
    const std::string who = "step " + std::to_string(steps_) + " request " + std::to_string(ev.id) + " choice " +
                            std::to_string(ev.index) + ": ";
    auto m = meta_.find(ev.id);
    if (m == meta_.end()) return violation(who + "event for an unknown id");
    if (aborted_.count(ev.id)) return violation(who + "event after abort");
    if (ev.index < 0 || ev.index >= m->second.n) return violation(who + "choice index out of range");
    if (ev.finish == FinishReason::kError) violation(who + "finished with error: " + ev.error);
    ChoiceResult& r = results_[{ev.id, ev.index}];
    if (r.finish != FinishReason::kNone) return violation(who + "event after finish");
    if (r.events == 0) {
      r.first_num_cached = ev.num_cached_tokens;
      r.first_step = steps_;
    } else if (ev.num_cached_tokens != 0) {
      violation(who + "num_cached_tokens reported again on a later event");
    }
    r.num_prompt = ev.num_prompt_tokens;
    if (ev.num_prompt_tokens != m->second.prompt_len) violation(who + "wrong num_prompt_tokens");
    ++r.events;
    if (ev.tokens.size() > 1 && !multi_token_steps) violation(who + "more than one token in one step");
    if (ev.tokens.empty() && ev.finish == FinishReason::kNone) violation(who + "an event without progress");
    r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    r.text += ev.text;
    if (ev.num_output_tokens != static_cast<int32_t>(r.tokens.size()))
      violation(who + "num_output_tokens " + std::to_string(ev.num_output_tokens) + " but " +
                std::to_string(r.tokens.size()) + " tokens seen");
    if (ev.finish != FinishReason::kNone) {
      r.finish = ev.finish;
      r.finish_step = steps_;
    }
  }

  Engine* e_;
  int steps_ = 0;
  int num_violations_ = 0;
  std::map<RequestId, Meta> meta_;
  std::set<RequestId> aborted_;
  std::map<std::pair<RequestId, int>, ChoiceResult> results_;
};

// Runs one request alone on `e` (which must be idle) and returns choice 0.
inline ChoiceResult run_alone(Engine* e, const RequestParams& p) {
  Driver d(e);
  const RequestId id = d.add(p);
  d.run();
  return d.result(id);
}

// Length of the common prefix of a and b.
inline int common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

// A synthetic SmolLM2-135M-shaped model (q8_0 weights, `layers` layers), written
// once per process under the gtest temp dir and removed at exit.
inline const std::string& synth_smollm_path(int layers = 2) {
  static const std::string path = [layers] {
    const std::string p = ::testing::TempDir() + "pagoda_engine_synth_smollm2_" + std::to_string(::getpid()) + ".gguf";
    gguf::SynthOptions o;
    const gguf::SynthShape* s = gguf::find_synth_preset("smollm2-135m");
    if (s == nullptr) {
      ADD_FAILURE() << "no smollm2-135m synth preset";
      return std::string();
    }
    o.shape = *s;
    o.type = GgmlType::Q8_0;
    o.n_layers_override = layers;
    o.seed = 42;
    if (Status st = gguf::synth_model_file(o, p); !st.ok()) {
      ADD_FAILURE() << "synth_model_file: " << st.message();
      return std::string();
    }
    static const std::string cleanup = p;
    std::atexit([] { std::remove(cleanup.c_str()); });
    return p;
  }();
  return path;
}

// Prompts made of `bos` (if >= 0) then random ids in [lo, hi], lengths in [min_len, max_len].
inline std::vector<int32_t> random_prompt(Rng* rng, int32_t bos, int32_t lo, int32_t hi, int min_len, int max_len) {
  std::vector<int32_t> p;
  const int n = static_cast<int>(rng->uniform_int(min_len, max_len));
  if (bos >= 0) p.push_back(bos);
  while (static_cast<int>(p.size()) < n) p.push_back(static_cast<int32_t>(rng->uniform_int(lo, hi)));
  return p;
}

}  // namespace pagoda::enginetest
