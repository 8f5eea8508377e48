// Speculative decoding (engine/speculative.h): the n-gram proposer and the
// adaptive off-switch exactly; the sampler's rejection sampling keeps the
// target distribution (chi-square on a synthetic distribution) and is greedy
// argmax bitwise; the engine's greedy outputs with drafts are the exact token
// ids of plain decoding, alone, batched with requests that do not speculate,
// through preemption and with prefix-cache hits, on stories260K and SmolLM2.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "engine/speculative.h"
#include "engine_test_util.h"
#include "sample/sampler.h"

namespace pagoda::enginetest {
namespace {

using engine::DraftThrottle;
using engine::ngram_propose;
using engine::SpeculativeConfig;

using Ids = std::vector<int32_t>;

// ------------------------------------------------------------ proposer

TEST(SpecNgram, ProposesAfterTheLatestOfTheLongestMatches) {
  // Suffix 1 2 3 occurs at 0..2 (then 4 5 9) and at 6..8 (then 7 1 2): the latest wins.
  const Ids a = {1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 1, 2, 3};
  EXPECT_EQ(ngram_propose(a, 1, 3, 3), (Ids{7, 1, 2}));
  EXPECT_EQ(ngram_propose(a, 1, 3, 1), (Ids{7}));
  // A longer match beats a later one: 5 1 2 3 occurs once before (then 8).
  const Ids b = {5, 1, 2, 3, 8, 4, 1, 2, 3, 9, 5, 1, 2, 3};
  EXPECT_EQ(ngram_propose(b, 1, 4, 3), (Ids{8, 4, 1}));
  EXPECT_EQ(ngram_propose(b, 1, 3, 3), (Ids{9, 5, 1}));  // capped at 3: both match 3, the later one
  // The proposal stops at the end of the tokens.
  EXPECT_EQ(ngram_propose(Ids{1, 2, 1, 2}, 2, 2, 5), (Ids{1, 2}));
  // Nothing repeats for min_n 2 (only the last token 3 occurs before).
  EXPECT_TRUE(ngram_propose(Ids{3, 1, 4, 2, 3}, 2, 4, 4).empty());
  EXPECT_EQ(ngram_propose(Ids{3, 1, 4, 2, 3}, 1, 4, 4), (Ids{1, 4, 2, 3}));
  EXPECT_TRUE(ngram_propose(Ids{7}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram_propose(a, 1, 3, 0).empty());
}

TEST(SpecNgram, ThrottlePausesAfterAWindowOfRejectionsAndDoubles) {
  DraftThrottle t;
  auto bad_window = [&] {
    for (int i = 0; i < DraftThrottle::kWindow; ++i) {
      ASSERT_TRUE(t.should_draft());
      t.record(4, 0);
    }
  };
  auto paused_for = [&] {
    int n = 0;
    while (!t.should_draft()) ++n;
    return n;
  };
  bad_window();
  EXPECT_EQ(paused_for(), 16);
  t.record(4, 0);  // the step that drafted after the pause (window of 8 restarts)
  for (int i = 1; i < DraftThrottle::kWindow; ++i) t.record(4, 0);
  EXPECT_EQ(paused_for(), 32);
  // A window at >= 10% acceptance resets the next pause to the first length.
  for (int i = 0; i < DraftThrottle::kWindow; ++i) t.record(10, 1);
  EXPECT_TRUE(t.should_draft());
  bad_window();
  EXPECT_EQ(paused_for(), 16);
}

TEST(SpecNgram, DraftLengthFollowsMeasuredStepCostsAndAcceptance) {
  engine::StepCostModel cost;
  EXPECT_DOUBLE_EQ(cost.cost(5), 3.0);  // nothing measured: a decode is 1, each more token 0.5
  cost.record(1, 10.0);
  cost.record(2, 11.0);
  cost.record(3, 30.0);
  EXPECT_DOUBLE_EQ(cost.cost(2), 11.0);
  cost.record(2, 16.0);  // recent steps weigh 0.2
  EXPECT_DOUBLE_EQ(cost.cost(2), 12.0);
  EXPECT_DOUBLE_EQ(cost.cost(5), 30.0 + 10.0 * 2);  // past the largest: the slope from 1 token
  cost.record(5, 40.0);
  EXPECT_DOUBLE_EQ(cost.cost(4), 35.0);  // between two measured sizes
  // (1 + a) / 12 against 1 / 10: one draft token pays from a = 0.2; two need c(3) cheaper.
  EXPECT_EQ(engine::best_draft_length(cost, 0.8, 1, 8), 1);
  EXPECT_EQ(engine::best_draft_length(cost, 0.1, 1, 8), 0);
  EXPECT_EQ(engine::best_draft_length(cost, 0.8, 1, 0), 0);
  cost.record(3, 12.0);
  for (int i = 0; i < 20; ++i) cost.record(3, 12.5);
  EXPECT_EQ(engine::best_draft_length(cost, 0.9, 1, 8), 2);
  // Among 4 decodes the same draft adds its tokens to a 4-token step (interpolated costs).
  EXPECT_EQ(engine::best_draft_length(cost, 0.9, 4, 8), 0);
  engine::AcceptanceEstimate a;
  EXPECT_DOUBLE_EQ(a.alpha(), 0.6);
  for (int i = 0; i < 30; ++i) a.record(4, 0);
  EXPECT_LT(a.alpha(), 0.15);
  for (int i = 0; i < 200; ++i) a.decay();
  EXPECT_NEAR(a.alpha(), 0.5, 1e-3);  // drifts back to an even bet: the sequence tries again
  // Two states, by how the previous draft ended. Here a draft after a
  // rejection is always taken whole and one after a whole draft always
  // rejected: each state learns its own rate.
  engine::AcceptanceEstimate b;
  for (int i = 0; i < 30; ++i) {
    b.record(8, 8);  // after a rejection (or no draft yet)
    b.record(8, 0);  // after a whole draft
  }
  EXPECT_GT(b.alpha(), 0.9);  // the last draft was rejected
  b.record(8, 8);
  EXPECT_LT(b.alpha(), 0.15);  // the last draft was taken whole
  b.decay();                   // a step without a draft ends the run
  EXPECT_GT(b.alpha(), 0.85);
}

TEST(SpecConfig, BadConfigsAreRefusedByTheEngine) {
  EngineConfig c = make_config(stories_path());
  c.speculative.num_speculative_tokens = 33;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("num_speculative_tokens must be in 0..32"), std::string::npos) << e.message();
  c.speculative = SpeculativeConfig{4, 2, 3};  // max < min
  e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("prompt_lookup_min <= prompt_lookup_max"), std::string::npos) << e.message();
  c.speculative = SpeculativeConfig{4, 3, 1};
  c.recompute = true;
  e = Engine::create(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("not with recompute"), std::string::npos) << e.message();
}

// ------------------------------------------------------------ sampler

TEST(SpecSampler, GreedyVerifyIsTheArgmaxOfPlainSampling) {
  sample::SamplingParams sp;
  sp.temperature = 0.0f;
  sp.repetition_penalty = 1.3f;  // penalties see the verified tokens as generated, in order
  sample::Sampler plain(sp, Ids{1, 2}), spec(sp, Ids{1, 2});
  Rng rng(5);
  for (int step = 0; step < 200; ++step) {
    std::vector<float> l(50);
    for (float& x : l) x = static_cast<float>(rng.uniform() * 4.0);
    const int32_t want = plain.sample(l).token;
    const int32_t draft = step % 3 == 0 ? want : static_cast<int32_t>(rng.uniform_int(0, 49));
    const auto v = spec.verify(l, draft);
    ASSERT_EQ(v.token, want) << "step " << step;
    ASSERT_EQ(v.accepted, draft == want);
  }
  EXPECT_EQ(plain.generated(), spec.generated());
}

// Pearson's chi-square of counts against probabilities p (every p > 0).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double x = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    x += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x;
}

// Rejection sampling keeps the target distribution: for a likely draft, an
// unlikely one, and one that top-k removes, the tokens verify() returns follow
// p (chi-square, 4 degrees of freedom, 0.1% critical value 18.47), and the
// draft is accepted with probability p(draft). Fixed seeds: deterministic.
TEST(SpecSampler, RejectionSamplingKeepsTheDistribution) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f};
  struct Case {
    int32_t draft;
    int top_k;
    float temperature;
  };
  for (const Case c : {Case{2, 0, 1.0f}, Case{4, 0, 1.0f}, Case{1, 0, 0.7f}, Case{4, 3, 1.0f}}) {
    sample::SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_k = c.top_k;
    sp.seed = 1234 + static_cast<uint64_t>(c.draft);
    // The target: softmax(logits / T) over the top-k survivors.
    std::vector<double> p(logits.size(), 0.0);
    double z = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const bool kept = c.top_k == 0 || logits[i] >= 0.5f;  // top-3 of these logits: ids 1, 2, 3
      if (kept) z += p[i] = std::exp(static_cast<double>(logits[i]) / c.temperature);
    }
    for (double& x : p) x /= z;
    sample::Sampler s(sp);
    const int n = 40000;
    std::vector<int> counts(logits.size(), 0);
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      const auto v = s.verify(logits, c.draft);
      ++counts[static_cast<size_t>(v.token)];
      accepted += v.accepted ? 1 : 0;
    }
    std::vector<int> kc;
    std::vector<double> kp;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] > 0) {
        kc.push_back(counts[i]);
        kp.push_back(p[i]);
      } else {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is outside top-k";
      }
    }
    EXPECT_LT(chi_square(kc, kp, n), 18.47) << "draft " << c.draft << " top_k " << c.top_k;
    const double pd = p[static_cast<size_t>(c.draft)];
    EXPECT_NEAR(static_cast<double>(accepted) / n, pd, 4 * std::sqrt(pd * (1 - pd) / n) + 1e-9);
  }
}

// The test above must be able to fail: always accepting the draft is far from p.
TEST(SpecSampler, ChiSquareRejectsAWrongDistribution) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  EXPECT_GT(chi_square({1000, 2000, 3000, 4000 + 600}, p, 10600), 18.47);
  EXPECT_LT(chi_square({1000, 2000, 3000, 4000}, p, 10000), 1e-9);
}

// ------------------------------------------------------------ engine

// Every proposed token drafted: no timing-dependent trimming, so which steps
// speculate is a function of the tokens alone.
SpeculativeConfig ngram(int k, int min_n = 1, int max_n = 3) {
  SpeculativeConfig c{k, max_n, min_n};
  c.adaptive_length = false;
  return c;
}

EngineConfig stories_spec(int k) {
  EngineConfig c = make_config(stories_path(), 16384);
  c.speculative = ngram(k);
  return c;
}

struct SpecRun {
  std::vector<Ids> tokens;     // per request
  std::vector<int32_t> cached;  // per request: num_cached_tokens
  EngineStats stats;
};

// An engine of config c with every request added (one at a time, each run
// to its end, when sequential), and a driver that takes multi-token events.
struct Started {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Driver> driver;
  std::vector<RequestId> ids;
};
Started start(const EngineConfig& c, const std::vector<RequestParams>& reqs, bool sequential = false) {
  Started s;
  s.engine = make_engine(c);
  if (!s.engine) return s;
  s.driver = std::make_unique<Driver>(s.engine.get());
  s.driver->multi_token_steps = true;
  for (const RequestParams& p : reqs) {
    s.ids.push_back(s.driver->add(p));
    if (sequential) s.driver->run();
  }
  return s;
}

// start(), then runs every request to completion.
SpecRun run_requests(const EngineConfig& c, const std::vector<RequestParams>& reqs, bool sequential = false) {
  SpecRun out;
  Started s = start(c, reqs, sequential);
  if (!s.engine) return out;
  Driver& d = *s.driver;
  d.run();
  d.expect_all_finished();
  for (RequestId id : s.ids) {
    out.tokens.push_back(d.result(id).tokens);
    out.cached.push_back(d.result(id).first_num_cached);
  }
  out.stats = s.engine->stats();
  EXPECT_EQ(out.stats.blocks_used, 0) << "blocks leaked";
  return out;
}

// Copy-heavy stories260K prompts: a reference prompt, its reference output,
// then the prompt again, so the model's continuation repeats its context.
std::vector<RequestParams> copy_prompts(int n, int max_tokens) {
  const auto refs = load_references();
  std::vector<RequestParams> out;
  for (int i = 0; i < n; ++i) {
    const Reference& r = refs.at(static_cast<size_t>(i) % refs.size());
    Ids p = r.prompt_tokens;
    p.insert(p.end(), r.generated_tokens.begin(), r.generated_tokens.begin() + std::min<size_t>(48, r.generated_tokens.size()));
    p.insert(p.end(), r.prompt_tokens.begin() + 1, r.prompt_tokens.end());  // no second BOS
    out.push_back(greedy(p, max_tokens + i % 7));
  }
  return out;
}

void expect_same_tokens(const SpecRun& got, const SpecRun& want, const char* what) {
  ASSERT_EQ(got.tokens.size(), want.tokens.size());
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    EXPECT_FALSE(want.tokens[i].empty());
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << what << ": request " << i << " differs at token "
                                              << common_prefix(got.tokens[i], want.tokens[i]);
  }
}

TEST(SpecEngine, StoriesGreedyIsBitwisePlainDecodingAloneAndBatched) {
  const auto reqs = copy_prompts(scaled(12, 4), 64);
  EngineConfig plain = make_config(stories_path(), 16384);
  plain.max_num_seqs = 1;
  const SpecRun want = run_requests(plain, reqs);
  EXPECT_EQ(want.stats.spec_num_drafts, 0);
  for (int k : {1, 4, 8}) {
    EngineConfig c = make_config(stories_path(), 16384);
    c.speculative = ngram(k);
    c.max_num_seqs = 1;
    const SpecRun alone = run_requests(c, reqs);
    expect_same_tokens(alone, want, "alone");
    EXPECT_GT(alone.stats.spec_num_drafts, 0);
    EXPECT_GT(alone.stats.spec_num_accepted_tokens, alone.stats.spec_num_drafts / 4) << "k " << k;
    EXPECT_LE(alone.stats.spec_num_accepted_tokens, alone.stats.spec_num_draft_tokens);
    ASSERT_EQ(alone.stats.spec_accepted_per_pos.size(), static_cast<size_t>(k));
    int64_t sum = 0;
    for (size_t j = 0; j < alone.stats.spec_accepted_per_pos.size(); ++j) {
      sum += alone.stats.spec_accepted_per_pos[j];
      if (j > 0) {
        EXPECT_LE(alone.stats.spec_accepted_per_pos[j], alone.stats.spec_accepted_per_pos[j - 1]);
      }
    }
    EXPECT_EQ(sum, alone.stats.spec_num_accepted_tokens);
    // Every output token is counted once, whichever step made it.
    int64_t n_out = 0;
    for (const Ids& t : want.tokens) n_out += static_cast<int64_t>(t.size());
    EXPECT_EQ(alone.stats.generation_tokens_total, n_out);
    // All at once, with a small budget (chunked prefills next to verify steps).
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 40;
    expect_same_tokens(run_requests(c, reqs), want, "batched");
  }
}

TEST(SpecEngine, RequestsThatDoNotSpeculateRunBesideOnesThatDo) {
  auto reqs = copy_prompts(scaled(6, 3), 48);
  // Logprobs and return_logits requests decode one token a step, with their own outputs unchanged.
  reqs[0].logprobs = 2;
  reqs[1].return_logits = true;
  const SpecRun want = run_requests(make_config(stories_path(), 16384), reqs);
  Started s = start(stories_spec(4), reqs);
  ASSERT_TRUE(s.engine);
  const std::vector<RequestId>& ids = s.ids;
  std::map<RequestId, int> max_tokens_per_event;
  while (s.engine->has_unfinished()) {
    for (const TokenEvent& ev : s.driver->step()) {
      int& m = max_tokens_per_event[ev.id];
      m = std::max(m, static_cast<int>(ev.tokens.size()));
    }
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(s.driver->result(ids[i]).tokens, want.tokens[i]) << "request " << i;
  }
  EXPECT_EQ(max_tokens_per_event[ids[0]], 1);
  EXPECT_EQ(max_tokens_per_event[ids[1]], 1);
  int most = 0;
  for (size_t i = 2; i < ids.size(); ++i) most = std::max(most, max_tokens_per_event[ids[i]]);
  EXPECT_GT(most, 1) << "no request speculated";
}

TEST(SpecEngine, PreemptionAndPrefixHitsKeepTheTokens) {
  const auto reqs = copy_prompts(scaled(10, 4), 64);
  EngineConfig plain = make_config(stories_path(), 65536);
  plain.max_num_seqs = 1;
  const SpecRun want = run_requests(plain, reqs);
  // A pool too small for every request at once: the scheduler preempts.
  EngineConfig small = make_config(stories_path());
  small.num_kv_blocks = scaled(41, 22);
  small.speculative = ngram(6);
  const SpecRun pre = run_requests(small, reqs);
  EXPECT_GT(pre.stats.num_preemptions, 0);
  EXPECT_GT(pre.stats.spec_num_accepted_tokens, 0);
  expect_same_tokens(pre, want, "preempted");
  // Each request twice, one after the other: the second is a prefix hit over
  // blocks committed by a speculating run (verified tokens only).
  std::vector<RequestParams> twice;
  for (const RequestParams& p : reqs) {
    twice.push_back(p);
    twice.push_back(p);
  }
  EngineConfig c = make_config(stories_path(), 65536);
  c.speculative = ngram(6);
  const SpecRun hits = run_requests(c, twice, /*sequential=*/true);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(hits.tokens[2 * i], want.tokens[i]) << "request " << i;
    EXPECT_EQ(hits.tokens[2 * i + 1], want.tokens[i]) << "request " << i << " again";
    EXPECT_GT(hits.cached[2 * i + 1], 0) << "request " << i << " again";
  }
  // A prompt that continues with a speculating run's output hits the blocks
  // that run committed: its prompt + output, verified tokens only.
  std::vector<RequestParams> cont;
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestParams p = reqs[i];
    p.prompt.insert(p.prompt.end(), want.tokens[i].begin(), want.tokens[i].end());
    p.max_tokens = 16;
    cont.push_back(p);
  }
  std::vector<RequestParams> both = reqs;
  both.insert(both.end(), cont.begin(), cont.end());
  const SpecRun warm = run_requests(c, both, /*sequential=*/true);
  EngineConfig cold = plain;
  cold.enable_prefix_caching = false;
  const SpecRun cold_run = run_requests(cold, cont);
  for (size_t i = 0; i < cont.size(); ++i) {
    EXPECT_EQ(warm.tokens[reqs.size() + i], cold_run.tokens[i]) << "continuation " << i;
    const int32_t full = static_cast<int32_t>(cont[i].prompt.size() - 1) / 16 * 16;
    EXPECT_EQ(warm.cached[reqs.size() + i], full) << "continuation " << i;
  }
}

TEST(SpecEngine, SampledRequestsSpeculateAndFinish) {
  auto reqs = copy_prompts(scaled(6, 3), 40);
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestParams& p = reqs[i];
    p.temperature = 0.5f;
    p.top_k = 20;
    p.seed = 100 + i;
    p.has_seed = true;
    p.n = i % 2 == 0 ? 2 : 1;
  }
  Started s = start(stories_spec(4), reqs);
  ASSERT_TRUE(s.engine);
  Engine* e = s.engine.get();
  Driver& d = *s.driver;
  const std::vector<RequestId>& ids = s.ids;
  d.run();
  d.expect_all_finished();
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (int k = 0; k < reqs[i].n; ++k) {
      const ChoiceResult& r = d.result(ids[i], k);
      EXPECT_EQ(static_cast<int>(r.tokens.size()), reqs[i].max_tokens) << "request " << i << " choice " << k;
      for (int32_t t : r.tokens) EXPECT_TRUE(t >= 0 && t < e->model_info().vocab_size);
    }
  }
  EXPECT_GT(e->stats().spec_num_accepted_tokens, 0);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

// SmolLM2-135M Q4_1 on a "repeat this code" chat prompt: spec on and off give
// the same token ids, and drafts are accepted.
TEST(SpecEngine, SmolLM2CopyPromptIsBitwisePlainDecoding) {
  const std::string path = smollm_path();
  if (!file_exists(path)) GTEST_SKIP() << path << " missing (scripts/setup fetches it)";
  EngineConfig c = make_config(path, 4096);
  c.threads = 2;
  auto e = make_engine(c);
  ASSERT_TRUE(e);
  const std::string code =
      "<|im_start|>user\nRepeat this code exactly:\n"
      "def scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v * factor)\n"
      "    return out\n<|im_end|>\n<|im_start|>assistant\n";
  Ids prompt = e->tokenizer().encode(code, /*add_special=*/false, /*parse_special=*/true);
  e.reset();
  const std::vector<RequestParams> reqs = {greedy(prompt, scaled(40, 24), /*ignore_eos=*/false)};
  const SpecRun want = run_requests(c, reqs);
  c.speculative = ngram(6, 2, 4);
  const SpecRun got = run_requests(c, reqs);
  expect_same_tokens(got, want, "smollm2");
  EXPECT_GT(got.stats.spec_num_accepted_tokens, 0);
}

}  // namespace
}  // namespace pagoda::enginetest
