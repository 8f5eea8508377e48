// Engine API behaviour: n > 1 sampling, stop strings, abort, add_request errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace pagoda::enginetest {
namespace {

struct TwoChoices {
  ChoiceResult c0, c1;
};

TwoChoices run_n2(Engine* e, const RequestParams& p) {
  Driver d(e);
  const RequestId id = d.add(p);
  d.run();
  d.expect_all_finished();
  return {d.result(id, 0), d.result(id, 1)};
}

RequestParams sampled(std::vector<int32_t> prompt, int max_tokens, uint64_t seed) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.temperature = 1.0f;
  p.seed = seed;
  p.has_seed = true;
  p.ignore_eos = true;
  p.n = 2;
  return p;
}

// ------------------------------------------------------------------- n = 2

TEST(EngineSampling, TwoChoicesReproducibleWithSeed) {
  const Reference ref = load_references().at(1);
  auto e = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(e);
  const TwoChoices a = run_n2(e.get(), sampled(ref.prompt_tokens, 40, 1234));
  ASSERT_EQ(a.c0.tokens.size(), 40u);
  ASSERT_EQ(a.c1.tokens.size(), 40u);
  EXPECT_EQ(a.c0.finish, FinishReason::kLength);
  EXPECT_EQ(a.c1.finish, FinishReason::kLength);
  EXPECT_NE(a.c0.tokens, a.c1.tokens) << "the two choices sampled the same tokens";

  // Same seed on the same engine (now with a prefix-cache state), and on a fresh one.
  const TwoChoices b = run_n2(e.get(), sampled(ref.prompt_tokens, 40, 1234));
  EXPECT_EQ(b.c0.tokens, a.c0.tokens);
  EXPECT_EQ(b.c1.tokens, a.c1.tokens);
  EXPECT_EQ(b.c0.text, a.c0.text);
  auto fresh = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(fresh);
  const TwoChoices c = run_n2(fresh.get(), sampled(ref.prompt_tokens, 40, 1234));
  EXPECT_EQ(c.c0.tokens, a.c0.tokens);
  EXPECT_EQ(c.c1.tokens, a.c1.tokens);

  // Another seed gives other tokens.
  const TwoChoices d = run_n2(e.get(), sampled(ref.prompt_tokens, 40, 99));
  EXPECT_NE(d.c0.tokens, a.c0.tokens);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

TEST(EngineSampling, TwoGreedyChoicesEqualReference) {
  const Reference ref = load_references().at(2);
  auto e = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(e);
  RequestParams p = greedy(ref.prompt_tokens, 50);
  p.n = 2;
  const TwoChoices r = run_n2(e.get(), p);
  const std::vector<int32_t> want(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 50);
  EXPECT_EQ(r.c0.tokens, want);
  EXPECT_EQ(r.c1.tokens, want);
  EXPECT_EQ(r.c0.text, r.c1.text);
}

// ---------------------------------------------------------- stop strings

TEST(EngineStop, StopStringCutsTextBeforeIt) {
  const Reference ref = load_references().at(0);
  auto e = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(e);
  // "Lily" is a whole word inside the text; "play outside" spans several tokens;
  // the third list's first match is "park", before "ball".
  const std::vector<std::vector<std::string>> cases = {{"Lily"}, {"play outside"}, {"ball", "park"}};
  for (const auto& stops : cases) {
    SCOPED_TRACE(stops[0]);
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, ref.text.find(s));
    ASSERT_NE(cut, std::string::npos);
    RequestParams p = greedy(ref.prompt_tokens, 200, false);
    p.stop = stops;
    const ChoiceResult r = run_alone(e.get(), p);
    EXPECT_EQ(r.finish, FinishReason::kStop);
    EXPECT_EQ(r.text, ref.text.substr(0, cut));
    // The tokens are the reference's, up to the one that completed the stop string.
    ASSERT_GE(r.tokens.size(), 1u);
    ASSERT_LE(r.tokens.size(), ref.generated_tokens.size());
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.generated_tokens.begin(),
                                             ref.generated_tokens.begin() + static_cast<long>(r.tokens.size())));
    const std::string upto = e->tokenizer().decode(r.tokens, {.render_special = false, .strip_leading_space = false});
    const std::string before = e->tokenizer().decode(std::vector<int32_t>(r.tokens.begin(), r.tokens.end() - 1),
                                                     {.render_special = false, .strip_leading_space = false});
    bool complete_now = false, complete_before = false;
    for (const auto& s : stops) {
      complete_now |= upto.find(s) != std::string::npos;
      complete_before |= before.find(s) != std::string::npos;
    }
    EXPECT_TRUE(complete_now);
    EXPECT_FALSE(complete_before) << "generation went on after the stop string was complete";
  }
  // A stop string that never occurs: full length, whole text.
  RequestParams p = greedy(ref.prompt_tokens, 200, false);
  p.stop = {"zebra"};
  const ChoiceResult r = run_alone(e.get(), p);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.text, ref.text);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

// ------------------------------------------------------------------- abort

TEST(EngineAbort, MidGenerationFreesBlocksAndStopsEvents) {
  const auto refs = load_references();
  auto e = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(e);
  Driver d(e.get());
  const RequestId a = d.add(greedy(refs[0].prompt_tokens, 100));
  const RequestId b = d.add(greedy(refs[1].prompt_tokens, 100));
  const RequestId c = d.add(greedy(refs[2].prompt_tokens, 60));
  for (int i = 0; i < 20; ++i) d.step();
  ASSERT_EQ(d.result(b).tokens.size(), 20u);
  EXPECT_GT(e->stats().blocks_used, 0);
  d.abort(b);  // the driver fails the test on any later event for b
  EXPECT_EQ(e->stats().num_running, 2);
  for (int i = 0; i < 30; ++i) d.step();
  d.abort(a);
  d.abort(a);       // twice: ignored
  d.abort(999999);  // unknown: ignored
  d.run();
  EXPECT_EQ(d.result(b).finish, FinishReason::kNone);
  EXPECT_EQ(d.result(a).tokens.size(), 50u);
  const ChoiceResult& rc = d.result(c);
  EXPECT_EQ(rc.finish, FinishReason::kLength);
  EXPECT_EQ(rc.tokens, std::vector<int32_t>(refs[2].generated_tokens.begin(), refs[2].generated_tokens.begin() + 60));
  EXPECT_FALSE(e->has_unfinished());
  const EngineStats s = e->stats();
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
  EXPECT_TRUE(d.step().empty());
}

TEST(EngineAbort, LastRunningRequestFreesEverything) {
  const Reference ref = load_references().at(0);
  auto e = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(e);
  Driver d(e.get());
  RequestParams p = greedy(ref.prompt_tokens, 150);
  p.n = 2;
  const RequestId id = d.add(p);
  for (int i = 0; i < 40; ++i) d.step();
  EXPECT_EQ(d.result(id, 0).tokens.size(), 40u);
  EXPECT_EQ(d.result(id, 1).tokens.size(), 40u);
  d.abort(id);  // both choices
  EXPECT_EQ(e->stats().blocks_used, 0);
  EXPECT_FALSE(e->has_unfinished());
  EXPECT_TRUE(d.step().empty());
  EXPECT_EQ(e->stats().blocks_used, 0);
  EXPECT_EQ(e->stats().num_running, 0);
  // The engine is still usable, and the cached prefix gives the same tokens.
  const ChoiceResult r = run_alone(e.get(), greedy(ref.prompt_tokens, 40));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.generated_tokens.begin(), ref.generated_tokens.begin() + 40));
}

TEST(EngineAbort, WaitingRequestNeverProducesEvents) {
  const auto refs = load_references();
  EngineConfig c = make_config(stories_path(), 2048);
  c.max_num_seqs = 1;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  Driver d(e.get());
  const RequestId a = d.add(greedy(refs[0].prompt_tokens, 30));
  const RequestId b = d.add(greedy(refs[1].prompt_tokens, 30));  // waits behind a
  d.step();
  EXPECT_EQ(e->stats().num_waiting, 1);
  d.abort(b);
  EXPECT_EQ(e->stats().num_waiting, 0);
  d.run();
  EXPECT_FALSE(d.has_events(b));
  EXPECT_EQ(d.result(a).tokens.size(), 30u);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

// ---------------------------------------------------------- request errors

TEST(EngineErrors, RejectedRequestsChangeNothing) {
  const Reference ref = load_references().at(0);
  auto e = make_engine(make_config(stories_path(), 2048));
  ASSERT_TRUE(e);
  Driver d(e.get());
  const RequestId running = d.add(greedy(ref.prompt_tokens, 30));
  for (int i = 0; i < 3; ++i) d.step();
  const EngineStats before = e->stats();

  std::vector<RequestParams> bad;
  bad.push_back(greedy({}, 10));                       // empty prompt
  bad.push_back(greedy({1, 512, 3}, 10));              // id == vocab size
  bad.push_back(greedy({1, -1}, 10));                  // negative id
  bad.push_back(greedy(ref.prompt_tokens, 0));         // max_tokens < 1
  bad.push_back(greedy(ref.prompt_tokens, 512 - 4));   // 5 + 508 > 512
  bad.push_back(greedy(std::vector<int32_t>(500, 7), 13));  // 513 > 512
  RequestParams n0 = greedy(ref.prompt_tokens, 10);
  n0.n = 0;
  bad.push_back(n0);
  RequestParams n65 = greedy(ref.prompt_tokens, 10);
  n65.n = 65;
  bad.push_back(n65);
  for (size_t i = 0; i < bad.size(); ++i) {
    auto r = e->add_request(bad[i]);
    EXPECT_FALSE(r.ok()) << "bad request " << i << " accepted";
    EXPECT_TRUE(stats_equal(e->stats(), before)) << "bad request " << i << " changed " << stats_string(e->stats());
  }
  // The limit itself is fine: 5 + 507 == 512.
  const RequestId edge = d.add(greedy(ref.prompt_tokens, 512 - 5));
  EXPECT_NE(edge, 0u);
  d.run();
  EXPECT_EQ(d.result(running).tokens, std::vector<int32_t>(ref.generated_tokens.begin(),
                                                           ref.generated_tokens.begin() + 30));
  EXPECT_EQ(d.result(edge).tokens.size(), 507u);
  EXPECT_EQ(d.result(edge).finish, FinishReason::kLength);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

}  // namespace
}  // namespace pagoda::enginetest
