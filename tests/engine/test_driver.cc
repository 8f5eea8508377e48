// The engine's driver (engine/driver.h) in the server's mode (no accumulation) on
// the real stories260K engine: n > 1 choices give exactly the tokens of n lone
// seeded requests and finish the request once; a caller-given arrival time is the
// one TTFT and queue time count from; queue time ends at the step that first
// scheduled the request; a dropped request and a failed choice end the request
// with kError and leave nothing running. The accumulating mode is
// tests/loadgen/test_driver.cc's.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "base/timer.h"
#include "engine/driver.h"
#include "engine/engine.h"
#include "engine/forwarding_engine.h"

namespace pagoda::engine {
namespace {

std::unique_ptr<Engine> make_engine(int max_num_seqs = 64) {
  EngineConfig cfg;
  cfg.model_path = PAGODA_TEST_DATA "/stories260K.gguf";
  cfg.context_length = 256;
  cfg.threads = 1;
  cfg.max_num_seqs = max_num_seqs;
  auto e = Engine::create(cfg);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> prompt_of(int n, int32_t first) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + (i * 7) % 200);
  return p;
}

RequestParams seeded(std::vector<int32_t> prompt, int max_tokens, uint64_t seed, int n) {
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

// The reference: one request alone, Engine::step by hand; its tokens.
std::vector<int32_t> alone(const RequestParams& p) {
  auto eng = make_engine();
  std::vector<int32_t> out;
  auto id = eng->add_request(p);
  EXPECT_TRUE(id.ok()) << id.message();
  while (eng->has_unfinished())
    for (const TokenEvent& ev : eng->step())
      if (ev.id == *id) out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
  return out;
}

TEST(EngineDriver, ChoicesOfOneRequestAreTheLoneSeededRuns) {
  const int n = 3, max_tokens = 10;
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  Driver d(*eng);  // the server's mode: nothing accumulated
  auto id = d.submit(seeded(prompt_of(24, 3), max_tokens, 4321, n));
  ASSERT_TRUE(id.ok()) << id.message();
  ASSERT_NE(d.find(*id), nullptr);
  EXPECT_EQ(d.find(*id)->n, n);
  EXPECT_EQ(d.find(*id)->max_tokens, max_tokens);
  std::vector<std::vector<int32_t>> tokens(n);
  std::vector<DrivenRequest> finished;
  int steps = 0, dones = 0;
  while (d.has_unfinished()) {
    const DriverStep& st = d.step();
    ++steps;
    EXPECT_EQ(st.in_flight, finished.empty() ? 1u : 0u);
    // One request, however many choices: advanced counts it once.
    EXPECT_EQ(st.advanced, st.tokens > 0 ? 1u : 0u) << "step " << steps;
    int64_t step_tokens = 0;
    for (const DrivenEvent& de : st.driven) {
      ASSERT_EQ(de.event->id, *id);
      ASSERT_NE(de.request, nullptr);
      ASSERT_LT(de.event->index, n);
      auto& t = tokens[static_cast<size_t>(de.event->index)];
      t.insert(t.end(), de.event->tokens.begin(), de.event->tokens.end());
      step_tokens += static_cast<int64_t>(de.event->tokens.size());
      // The first event with tokens carries the request's first token; every later
      // one a gap from the previous step (0 for a second choice in the same step).
      const bool front = &de == &st.driven.front();
      EXPECT_EQ(de.first_token, steps == 1 && front);
      if (front && steps > 1) {
        EXPECT_GT(de.gap, 0.0);
      } else {
        EXPECT_EQ(de.gap, 0.0);
      }
      dones += de.done ? 1 : 0;
      // Only the last event of the request ends it (every choice ends in the last step).
      EXPECT_EQ(de.done, steps == max_tokens && &de == &st.driven.back());
      EXPECT_EQ(de.request->choices_finished, steps == max_tokens ? n : 0);
    }
    EXPECT_EQ(st.tokens, step_tokens);
    for (const DrivenRequest& r : st.finished) finished.push_back(r);
  }
  EXPECT_EQ(steps, max_tokens);  // one prefill step (every choice's first token), then one token a step
  EXPECT_EQ(dones, 1);
  ASSERT_EQ(finished.size(), 1u);
  const DrivenRequest& r = finished[0];
  EXPECT_EQ(r.id, *id);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.choices_finished, n);
  EXPECT_EQ(r.output_tokens, n * max_tokens);
  EXPECT_EQ(r.decode_steps, max_tokens - 1);  // steps, not events
  EXPECT_EQ(r.decode_tokens, n * (max_tokens - 1));
  EXPECT_EQ(r.prompt_tokens, 24);
  EXPECT_TRUE(r.tokens.empty());  // not accumulating
  EXPECT_TRUE(r.text.empty());
  EXPECT_TRUE(r.itl.empty());
  EXPECT_GE(r.scheduled, r.submitted);
  EXPECT_GE(r.first_token, r.scheduled);
  EXPECT_GE(r.last_token, r.first_token);
  EXPECT_EQ(d.num_in_flight(), 0u);
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t> ref = alone(seeded(prompt_of(24, 3), max_tokens, 4321 + static_cast<uint64_t>(i), 1));
    ASSERT_EQ(ref.size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(tokens[static_cast<size_t>(i)], ref) << "choice " << i;
  }
  EXPECT_NE(tokens[0], tokens[1]);
}

TEST(EngineDriver, TimesCountFromTheCallersArrival) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  Driver d(*eng);
  const double arrived = now_seconds() - 5.0;  // the HTTP request came in 5 s before the engine took it
  const double before = now_seconds();
  auto given = d.submit(seeded(prompt_of(16, 2), 3, 1, 1), arrived);
  auto now = d.submit(seeded(prompt_of(16, 9), 3, 1, 1));
  const double after = now_seconds();
  ASSERT_TRUE(given.ok() && now.ok());
  EXPECT_EQ(d.find(*given)->submitted, arrived);
  EXPECT_GE(d.find(*now)->submitted, before);
  EXPECT_LE(d.find(*now)->submitted, after);
  std::map<RequestId, DrivenRequest> done;
  while (d.has_unfinished())
    for (const DrivenRequest& r : d.step().finished) done[r.id] = r;
  ASSERT_EQ(done.size(), 2u);
  // Both scheduled by the same first step and given their first token by it: the
  // TTFTs differ by the 5 s before submit.
  EXPECT_EQ(done[*given].scheduled, done[*now].scheduled);
  EXPECT_EQ(done[*given].first_token, done[*now].first_token);
  EXPECT_GE(done[*given].first_token - done[*given].submitted, 5.0);
  EXPECT_LT(done[*now].first_token - done[*now].submitted, 5.0);
  EXPECT_GE(done[*given].scheduled - done[*given].submitted, 5.0);
}

TEST(EngineDriver, QueueTimeEndsAtTheFirstScheduledStep) {
  auto eng = make_engine(/*max_num_seqs=*/1);  // the second request waits for the first
  ASSERT_TRUE(eng);
  Driver d(*eng);
  auto a = d.submit(seeded(prompt_of(16, 2), 4, 1, 1));
  auto b = d.submit(seeded(prompt_of(16, 5), 4, 1, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  std::map<RequestId, DrivenRequest> done;
  std::vector<double> starts;
  while (d.has_unfinished()) {
    const DriverStep& st = d.step();
    starts.push_back(st.start);
    for (const DrivenRequest& r : st.finished) done[r.id] = r;
  }
  ASSERT_EQ(done.size(), 2u);
  ASSERT_EQ(starts.size(), 8u);  // 4 steps each, one after the other
  EXPECT_EQ(done[*a].scheduled, starts[0]);
  EXPECT_EQ(done[*b].scheduled, starts[4]);  // the step after a's last
  EXPECT_GT(done[*b].scheduled, done[*a].last_token);
  // b waited the whole of a: its prefill time counts those steps too (in flight).
  EXPECT_GT(done[*b].prefill_s, done[*a].prefill_s);
}

TEST(EngineDriver, ADroppedRequestFinishesWithAnErrorEvent) {
  ForwardingEngine eng(make_engine());
  Driver d(eng);
  auto kept = d.submit(seeded(prompt_of(12, 2), 3, 7, 2));
  eng.drop_next = true;
  auto lost = d.submit(seeded(prompt_of(12, 6), 3, 7, 2));
  ASSERT_TRUE(kept.ok() && lost.ok());
  ASSERT_EQ(eng.drop, *lost);
  std::map<RequestId, DrivenRequest> done;
  int dropped_events = 0;
  while (d.has_unfinished()) {
    const DriverStep& st = d.step();
    for (const TokenEvent& ev : st.events) EXPECT_NE(ev.id, *lost);
    for (const DrivenEvent& de : st.driven) {
      if (de.event->id != *lost) continue;
      ++dropped_events;
      EXPECT_TRUE(de.done);
      EXPECT_EQ(de.event->finish, FinishReason::kError);
      EXPECT_EQ(de.event->error, "the engine dropped the request");
      EXPECT_EQ(de.request->finish, FinishReason::kError);
      ASSERT_EQ(st.dropped.size(), 1u);
      EXPECT_EQ(de.event, &st.dropped[0]);
    }
    for (const DrivenRequest& r : st.finished) done[r.id] = r;
  }
  EXPECT_EQ(dropped_events, 1);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[*kept].finish, FinishReason::kLength);
  EXPECT_EQ(done[*kept].output_tokens, 6);
  EXPECT_EQ(done[*lost].finish, FinishReason::kError);
  EXPECT_EQ(done[*lost].error, "the engine dropped the request");
  EXPECT_EQ(d.num_in_flight(), 0u);
}

TEST(EngineDriver, AFailedChoiceEndsTheWholeRequest) {
  ForwardingEngine eng(make_engine());
  Driver d(eng);
  auto id = d.submit(seeded(prompt_of(12, 2), 20, 7, 3));
  ASSERT_TRUE(id.ok());
  d.step();
  d.step();
  eng.fail_id = *id;  // choice 1's next event says kError; the engine itself would go on
  eng.fail_index = 1;
  const DriverStep& st = d.step();
  ASSERT_EQ(st.finished.size(), 1u);
  EXPECT_EQ(st.finished[0].finish, FinishReason::kError);
  EXPECT_EQ(st.finished[0].error, "injected failure");
  int done = 0;
  for (const DrivenEvent& de : st.driven) done += de.done ? 1 : 0;
  EXPECT_EQ(done, 1);
  // The other choices were aborted with it: nothing left running.
  EXPECT_EQ(d.num_in_flight(), 0u);
  EXPECT_FALSE(eng.has_unfinished());
  EXPECT_EQ(eng.stats().blocks_used, 0);
}

TEST(EngineDriver, AbortedRequestLeavesNoRecord) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  Driver d(*eng);
  auto a = d.submit(seeded(prompt_of(12, 2), 30, 1, 2));
  ASSERT_TRUE(a.ok());
  d.step();
  d.abort(*a);
  EXPECT_EQ(d.find(*a), nullptr);
  EXPECT_FALSE(d.has_unfinished());
  EXPECT_EQ(eng->stats().blocks_used, 0);
}

}  // namespace
}  // namespace pagoda::engine
