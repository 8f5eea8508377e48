// AsyncEngine (server/async_engine.h) stepping the real stories260K engine through
// the shared driver (engine/driver.h): n > 1 choices stream exactly the tokens of
// lone seeded requests and are counted once per request in /metrics; TTFT, queue
// and e2e times count from AsyncEngine::submit (the HTTP arrival), not from the
// engine thread's admission; a request the engine drops is answered with an error
// instead of leaving its client waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "engine/engine.h"
#include "engine/forwarding_engine.h"
#include "gguf/synth.h"
#include "server/async_engine.h"
#include "server/metrics.h"

namespace pagoda::server {
namespace {

std::unique_ptr<engine::Engine> make_engine() {
  engine::EngineConfig cfg;
  cfg.model_path = PAGODA_TEST_DATA "/stories260K.gguf";
  cfg.context_length = 256;
  cfg.threads = 1;
  auto e = engine::Engine::create(cfg);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> prompt_of(int n, int32_t first) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + (i * 7) % 200);
  return p;
}

engine::RequestParams seeded(std::vector<int32_t> prompt, int max_tokens, uint64_t seed, int n) {
  engine::RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 1.0f;
  p.seed = seed;
  p.has_seed = true;
  p.ignore_eos = true;
  p.n = n;
  return p;
}

// One request alone, Engine::step by hand (the independent reference): its tokens.
std::vector<int32_t> alone(const engine::RequestParams& p) {
  auto eng = make_engine();
  std::vector<int32_t> out;
  auto id = eng->add_request(p);
  EXPECT_TRUE(id.ok()) << id.message();
  while (eng->has_unfinished())
    for (const engine::TokenEvent& ev : eng->step())
      if (ev.id == *id) out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
  return out;
}

// What one submission's callbacks saw, from the engine thread.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  bool added = false;
  std::string add_error;
  std::map<std::pair<size_t, int>, std::vector<int32_t>> tokens;  // (prompt, choice) -> ids
  std::map<std::pair<size_t, int>, engine::FinishReason> finish;
  std::vector<std::string> errors;  // kError events
  int events_after_end = 0;

  Submission submission(std::vector<engine::RequestParams> prompts) {
    Submission s;
    s.prompts = std::move(prompts);
    s.on_added = [this](const std::string& e) {
      std::lock_guard<std::mutex> l(mu);
      added = true;
      add_error = e;
      cv.notify_all();
    };
    s.on_event = [this](size_t prompt, const engine::TokenEvent& ev) {
      std::lock_guard<std::mutex> l(mu);
      if (!errors.empty() || finish.count({prompt, ev.index})) ++events_after_end;
      if (ev.finish == engine::FinishReason::kError) {
        errors.push_back(ev.error);
      } else {
        auto& t = tokens[{prompt, ev.index}];
        t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finish != engine::FinishReason::kNone) finish[{prompt, ev.index}] = ev.finish;
      }
      cv.notify_all();
    };
    return s;
  }
  // Waits until `choices` choices finished or an error came (false after 60 s).
  bool wait(size_t choices) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(60), [&] { return !errors.empty() || finish.size() >= choices; });
  }
};

// A series' value in the exposition text ("name value" line); -1 when absent.
double scrape(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

TEST(AsyncEngineDriver, ChoicesStreamTheLoneSeededRunsAndCountOnce) {
  const int max_tokens = 6;
  Metrics metrics;
  Seen seen;
  {
    AsyncEngine ae(make_engine(), &metrics);
    ae.submit(seen.submission({seeded(prompt_of(20, 3), max_tokens, 11, 2), seeded(prompt_of(9, 40), max_tokens, 50, 2)}));
    ASSERT_TRUE(seen.wait(4));
    ae.stop();
  }
  EXPECT_TRUE(seen.added);
  EXPECT_EQ(seen.add_error, "");
  EXPECT_TRUE(seen.errors.empty());
  EXPECT_EQ(seen.events_after_end, 0);
  ASSERT_EQ(seen.finish.size(), 4u);
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(20, 3), prompt_of(9, 40)};
  const uint64_t seeds[2] = {11, 50};
  for (size_t p = 0; p < 2; ++p) {
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ((seen.finish[{p, c}]), engine::FinishReason::kLength);
      EXPECT_EQ((seen.tokens[{p, c}]), alone(seeded(prompts[p], max_tokens, seeds[p] + static_cast<uint64_t>(c), 1)))
          << "prompt " << p << " choice " << c;
    }
  }
  // Per engine request (two, of two choices each), as AsyncEngine counted before the
  // shared driver: one success, one TTFT, every choice's tokens.
  const std::string text = metrics.render();
  EXPECT_EQ(metrics.counter("pagoda:request_success_total", "length"), 2);
  EXPECT_EQ(scrape(text, "pagoda:request_params_n_sum"), 4);
  EXPECT_EQ(scrape(text, "pagoda:request_params_n_count"), 2);
  EXPECT_EQ(scrape(text, "pagoda:request_generation_tokens_sum"), 2 * 2 * max_tokens);
  EXPECT_EQ(scrape(text, "pagoda:request_max_num_generation_tokens_sum"), 2 * max_tokens);
  EXPECT_EQ(scrape(text, "pagoda:request_prompt_tokens_sum"), 20 + 9);
  EXPECT_EQ(scrape(text, "pagoda:time_to_first_token_seconds_count"), 2);
  // Every later event observes an inter-token latency (per event: the second choice
  // of a step observes a gap of 0): 2 requests x (2 x 6 events - 1 first).
  EXPECT_EQ(scrape(text, "pagoda:inter_token_latency_seconds_count"), 2 * (2 * max_tokens - 1));
  EXPECT_EQ(scrape(text, "pagoda:e2e_request_latency_seconds_count"), 2);
}

TEST(AsyncEngineDriver, TimesCountFromSubmitNotFromAdmission) {
  Metrics metrics;
  Seen seen;
  {
    AsyncEngine ae(make_engine(), &metrics);
    // The engine thread is busy (a control function) while the request arrives and
    // for 0.3 s after: the request waits in the inbox, and that wait is queue time.
    std::atomic<bool> release{false};
    ae.control([&release](engine::Engine&) -> AsyncEngine::Reply {
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return {};
    });
    ae.submit(seen.submission({seeded(prompt_of(12, 5), 3, 1, 1)}));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    release = true;
    ASSERT_TRUE(seen.wait(1));
    ae.stop();
  }
  ASSERT_TRUE(seen.errors.empty());
  const std::string text = metrics.render();
  ASSERT_EQ(scrape(text, "pagoda:time_to_first_token_seconds_count"), 1);
  EXPECT_GE(scrape(text, "pagoda:time_to_first_token_seconds_sum"), 0.3);
  EXPECT_GE(scrape(text, "pagoda:request_queue_time_seconds_sum"), 0.3);
  EXPECT_GE(scrape(text, "pagoda:e2e_request_latency_seconds_sum"), 0.3);
  // The steps themselves take milliseconds: the queue wait is not prefill.
  EXPECT_LT(scrape(text, "pagoda:request_prefill_time_seconds_sum"), 0.3);
}

TEST(AsyncEngineDriver, ADroppedRequestIsAnsweredWithAnError) {
  Metrics metrics;
  Seen lost, kept;
  {
    auto fwd = std::make_unique<engine::ForwardingEngine>(make_engine());
    engine::ForwardingEngine* eng = fwd.get();
    eng->drop_next = true;  // the engine will abort the next request silently
    AsyncEngine ae(std::move(fwd), &metrics);
    ae.submit(lost.submission({seeded(prompt_of(12, 5), 4, 1, 2)}));
    ASSERT_TRUE(lost.wait(2)) << "the dropped request's client was left waiting";
    // The server goes on serving.
    ae.submit(kept.submission({seeded(prompt_of(12, 7), 4, 3, 1)}));
    ASSERT_TRUE(kept.wait(1));
    ae.stop();
  }
  EXPECT_TRUE(lost.added);
  EXPECT_EQ(lost.add_error, "");
  EXPECT_EQ(lost.errors, std::vector<std::string>{"the engine dropped the request"});
  EXPECT_EQ(lost.events_after_end, 0);
  EXPECT_TRUE(kept.errors.empty());
  EXPECT_EQ((kept.finish[{0, 0}]), engine::FinishReason::kLength);
  EXPECT_EQ((kept.tokens[{0, 0}]), alone(seeded(prompt_of(12, 7), 4, 3, 1)));
  EXPECT_EQ(metrics.counter("pagoda:request_success_total", "error"), 1);
  EXPECT_EQ(metrics.counter("pagoda:request_success_total", "length"), 1);
}

// Hybrid models (issue 38): the recurrent-state checkpoints a live pin takes in
// (KvManager::PinStats) reach /metrics. tiny-lfm2, blocks of 16, a checkpoint at
// every block boundary. A: 40 tokens, its first 32 pinned: its prompt runs to the
// boundary 32 (a checkpoint there), and the pin takes K/V blocks 0, 1 and that
// checkpoint's one block. B: A's first 24 tokens: block 0 is cached but has no
// checkpoint at 16, so B computes to 16 and checkpoints there, inside A's pin: the
// pin takes it (added 1) unless the cap is full (the cap of 3 blocks is: over_cap 1).
struct PinCase {
  double pinned_fraction = 0;
  int64_t added = 0, over_cap = 0, pinned_blocks = 0;
};
class HybridPinMetrics : public ::testing::TestWithParam<PinCase> {};

TEST_P(HybridPinMetrics, CheckpointsInsideAPinAreCounted) {
  const PinCase pc = GetParam();
  const std::string path = ::testing::TempDir() + "pagoda_ae_lfm2_" + std::to_string(::getpid()) + ".gguf";
  gguf::SynthOptions o;
  o.shape = *gguf::find_synth_preset("tiny-lfm2");
  o.type = GgmlType::F32;
  ASSERT_TRUE(gguf::synth_model_file(o, path).ok());
  engine::EngineConfig cfg;
  cfg.model_path = path;
  cfg.context_length = 256;
  cfg.threads = 1;
  cfg.num_kv_blocks = 64;
  cfg.state_checkpoint_interval = 1;
  cfg.kv_pinned_fraction = pc.pinned_fraction;
  auto e = engine::Engine::create(cfg);
  std::remove(path.c_str());
  ASSERT_TRUE(e.ok()) << e.message();
  Metrics metrics;
  const std::vector<int32_t> a = prompt_of(40, 5);
  engine::RequestParams pa = seeded(a, 1, 1, 1);
  pa.pin_tokens = 32;
  pa.pin_ttl_s = 600;
  const engine::RequestParams pb = seeded(std::vector<int32_t>(a.begin(), a.begin() + 24), 1, 2, 1);
  {
    AsyncEngine ae(std::move(e).value(), &metrics);
    Seen first, second;
    ae.submit(first.submission({pa}));
    ASSERT_TRUE(first.wait(1));
    ae.submit(second.submission({pb}));
    ASSERT_TRUE(second.wait(1));
    ae.stop();
    ASSERT_TRUE(first.errors.empty() && second.errors.empty());
  }
  const std::string text = metrics.render();
  EXPECT_EQ(scrape(text, "pagoda:kv_pins"), 1);
  EXPECT_EQ(scrape(text, "pagoda:kv_pinned_blocks"), pc.pinned_blocks);
  EXPECT_EQ(scrape(text, "pagoda:kv_pins_checkpoints_added_total"), pc.added);
  EXPECT_EQ(scrape(text, "pagoda:kv_pins_checkpoints_over_cap_total"), pc.over_cap);
  EXPECT_NE(text.find("# TYPE pagoda:kv_pins_checkpoints_added_total counter"), std::string::npos);
  EXPECT_NE(text.find("# TYPE pagoda:kv_pins_checkpoints_over_cap_total counter"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(TinyLfm2, HybridPinMetrics,
                         ::testing::Values(PinCase{0.2, 1, 0, 4}, PinCase{0.05, 0, 1, 3}),
                         [](const ::testing::TestParamInfo<PinCase>& i) {
                           return i.param.added > 0 ? std::string("Added") : std::string("OverCap");
                         });

}  // namespace
}  // namespace pagoda::server
