// The load driver (loadgen/driver.h: the engine's driver loop, engine/driver.h,
// accumulating tokens and text) on the real stories260K engine: its records against
// a hand-written loop over Engine::step (the independent reference), the per-step
// counters, errors, aborts and run_one.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/forwarding_engine.h"
#include "loadgen/driver.h"

namespace pagoda::loadgen {
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

engine::RequestParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  engine::RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

// The reference: Engine::step by hand, the tokens and text of one request and the
// number of steps up to its first token.
struct Reference {
  std::vector<int32_t> tokens;
  std::string text;
  int steps_to_first = 0;
  int steps = 0;
  int32_t num_kv_blocks = 0;  // at the last step that gave tokens
};
Reference by_hand(const engine::RequestParams& p) {
  auto eng = make_engine();
  Reference ref;
  auto id = eng->add_request(p);
  EXPECT_TRUE(id.ok()) << id.message();
  while (eng->has_unfinished()) {
    ++ref.steps;
    for (const engine::TokenEvent& ev : eng->step()) {
      if (ev.id != *id) continue;
      if (ref.tokens.empty() && !ev.tokens.empty()) ref.steps_to_first = ref.steps;
      if (!ev.tokens.empty()) ref.num_kv_blocks = ev.num_kv_blocks;
      ref.tokens.insert(ref.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      ref.text += ev.text;
    }
  }
  return ref;
}

std::vector<int32_t> prompt_of(int n, int32_t first) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + (i * 7) % 200);
  return p;
}

TEST(LoadgenDriver, RunOneMatchesTheHandWrittenLoop) {
  const engine::RequestParams p = greedy(prompt_of(40, 3), 12);
  const Reference ref = by_hand(p);
  ASSERT_EQ(ref.tokens.size(), 12u);
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  int steps = 0;
  auto s = run_one(*eng, p, [&](const Step& st) {
    ++steps;
    EXPECT_LE(st.start, st.end);
    EXPECT_EQ(st.in_flight, 1u);
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->tokens, ref.tokens);
  EXPECT_EQ(s->text, ref.text);
  EXPECT_EQ(steps, ref.steps);
  EXPECT_EQ(s->finish, engine::FinishReason::kLength);
  EXPECT_TRUE(s->error.empty());
  EXPECT_EQ(s->prompt_tokens, 40);
  EXPECT_EQ(s->cached_tokens, 0);
  // One token a step after the first: 11 decode steps, 11 gaps, all after the first token.
  EXPECT_EQ(s->decode_steps, 11);
  EXPECT_EQ(s->decode_tokens, 11);
  ASSERT_EQ(s->itl.size(), 11u);
  for (double g : s->itl) EXPECT_GE(g, 0.0);
  EXPECT_GE(s->first_token, s->submitted);
  EXPECT_GE(s->last_token, s->first_token);
  EXPECT_GT(s->prefill_s, 0.0);
  EXPECT_GT(s->decode_s, 0.0);
  EXPECT_EQ(ref.steps_to_first, 1);
  EXPECT_EQ(s->num_kv_blocks, ref.num_kv_blocks);
  EXPECT_GE(s->num_kv_blocks, 4);  // 40 prompt tokens + 11 fed ones, blocks of 16
  EXPECT_FALSE(eng->has_unfinished());
}

TEST(LoadgenDriver, ChunkedPrefillStepsCountAsPrefill) {
  engine::EngineConfig cfg;
  cfg.model_path = PAGODA_TEST_DATA "/stories260K.gguf";
  cfg.context_length = 256;
  cfg.threads = 1;
  cfg.max_num_batched_tokens = 16;  // a 40-token prompt takes 3 steps
  auto eng = engine::Engine::create(cfg);
  ASSERT_TRUE(eng.ok()) << eng.message();
  std::vector<size_t> tokens_per_step;
  auto s = run_one(**eng, greedy(prompt_of(40, 5), 4), [&](const Step& st) {
    tokens_per_step.push_back(static_cast<size_t>(st.tokens));
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(tokens_per_step, (std::vector<size_t>{0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(s->decode_steps, 3);
  EXPECT_EQ(s->tokens.size(), 4u);
  EXPECT_EQ(s->tokens, by_hand(greedy(prompt_of(40, 5), 4)).tokens);
}

TEST(LoadgenDriver, ManyRequestsFinishWithTheirSoloTokens) {
  const std::vector<engine::RequestParams> ps = {greedy(prompt_of(20, 1), 3), greedy(prompt_of(33, 9), 9),
                                                 greedy(prompt_of(7, 50), 5)};
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  Driver d(*eng);
  std::map<engine::RequestId, size_t> index;
  for (size_t i = 0; i < ps.size(); ++i) {
    auto id = d.submit(ps[i]);
    ASSERT_TRUE(id.ok()) << id.message();
    index[*id] = i;
  }
  EXPECT_EQ(d.num_in_flight(), 3u);
  std::map<size_t, Stream> done;
  std::map<engine::RequestId, int64_t> given;  // tokens per request, from the step counters' events
  int step = 0;
  while (d.has_unfinished()) {
    const size_t before = d.num_in_flight();
    const Step& st = d.step();
    ++step;
    EXPECT_EQ(st.in_flight, before);
    // Step 1 prefills all three; every later step has all in flight decoding.
    EXPECT_EQ(st.all_decoding, step > 1) << "step " << step;
    int64_t tokens = 0;
    size_t advanced = 0;
    for (const engine::TokenEvent& ev : st.events) {
      tokens += static_cast<int64_t>(ev.tokens.size());
      advanced += ev.tokens.empty() ? 0 : 1;
      given[ev.id] += static_cast<int64_t>(ev.tokens.size());
    }
    EXPECT_EQ(st.tokens, tokens);
    EXPECT_EQ(st.advanced, advanced);
    for (const Stream& s : st.finished) {
      EXPECT_EQ(d.find(s.id), nullptr);
      done[index.at(s.id)] = s;
    }
    EXPECT_EQ(d.num_in_flight(), before - st.finished.size());
  }
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(step, 9);  // the longest: 1 prefill step + 8 decode steps
  for (size_t i = 0; i < ps.size(); ++i) {
    const Reference ref = by_hand(ps[i]);
    EXPECT_EQ(done[i].tokens, ref.tokens) << "request " << i;
    EXPECT_EQ(done[i].text, ref.text) << "request " << i;
    EXPECT_EQ(static_cast<int64_t>(done[i].tokens.size()), given[done[i].id]);
    EXPECT_EQ(done[i].decode_steps, static_cast<int64_t>(ps[i].max_tokens) - 1);
    EXPECT_EQ(done[i].itl.size(), static_cast<size_t>(ps[i].max_tokens - 1));
  }
}

TEST(LoadgenDriver, RefusedRequestLeavesNothing) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  Driver d(*eng);
  auto bad = d.submit(greedy({}, 4));  // an empty prompt: the engine refuses it
  EXPECT_FALSE(bad.ok());
  engine::RequestParams two = greedy(prompt_of(8, 1), 4);
  two.n = 2;
  auto n2 = d.submit(two);
  ASSERT_FALSE(n2.ok());
  EXPECT_NE(n2.message().find("one choice per request"), std::string::npos) << n2.message();
  EXPECT_EQ(d.num_in_flight(), 0u);
  EXPECT_FALSE(eng->has_unfinished());
}

TEST(LoadgenDriver, AbortLeavesTheDriverAndTheEngine) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  Driver d(*eng);
  auto a = d.submit(greedy(prompt_of(30, 2), 50));
  auto b = d.submit(greedy(prompt_of(30, 4), 3));
  ASSERT_TRUE(a.ok() && b.ok());
  d.step();
  ASSERT_NE(d.find(*a), nullptr);
  EXPECT_EQ(d.find(*a)->tokens.size(), 1u);
  d.abort(*a);
  EXPECT_EQ(d.find(*a), nullptr);
  EXPECT_EQ(d.num_in_flight(), 1u);
  std::vector<engine::RequestId> finished;
  while (d.has_unfinished())
    for (const Stream& s : d.step().finished) finished.push_back(s.id);
  EXPECT_EQ(finished, std::vector<engine::RequestId>{*b});
  EXPECT_EQ(d.num_in_flight(), 0u);
}

TEST(LoadgenDriver, RunOneStopsOnTheCallbacksError) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  int steps = 0;
  auto s = run_one(*eng, greedy(prompt_of(10, 3), 20), [&](const Step&) {
    return ++steps == 2 ? Status(errorf("stop here")) : Status::Ok();
  });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "stop here");
  EXPECT_EQ(steps, 2);
}

TEST(LoadgenDriver, RunOneGivesTheEnginesRefusal) {
  auto eng = make_engine();
  ASSERT_TRUE(eng);
  auto s = run_one(*eng, greedy(prompt_of(10, 3), 1000));  // 10 + 1000 > context 256
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
  EXPECT_FALSE(eng->has_unfinished());
}

// The real engine, except that its step() silently drops one request (aborts it with
// no event): the driver must answer that request with an error, not lose it.
using DroppingEngine = engine::ForwardingEngine;

TEST(LoadgenDriver, ADroppedRequestFinishesWithAnError) {
  DroppingEngine eng(make_engine());
  Driver d(eng);
  auto kept = d.submit(greedy(prompt_of(12, 2), 3));
  eng.drop_next = true;
  auto lost = d.submit(greedy(prompt_of(12, 6), 3));
  ASSERT_TRUE(kept.ok() && lost.ok());
  ASSERT_EQ(eng.drop, *lost);
  std::map<engine::RequestId, Stream> done;
  while (d.has_unfinished())
    for (const Stream& s : d.step().finished) done[s.id] = s;
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[*kept].finish, engine::FinishReason::kLength);
  EXPECT_EQ(done[*kept].tokens.size(), 3u);
  EXPECT_EQ(done[*lost].finish, engine::FinishReason::kError);
  EXPECT_EQ(done[*lost].error, "the engine dropped the request");
  EXPECT_EQ(d.num_in_flight(), 0u);
  // run_one turns it into an error.
  DroppingEngine eng2(make_engine());
  eng2.drop_next = true;
  auto s = run_one(eng2, greedy(prompt_of(12, 2), 3));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "the engine dropped the request");
}

}  // namespace
}  // namespace pagoda::loadgen
