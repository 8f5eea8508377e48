// Issue #4: a prompt that hits the prefix cache gives bitwise the same logits
// and the same greedy tokens as a cold run, on stories260K and on a synthetic
// SmolLM2-135M-shaped model.
//
// The stack is the engine's step loop without its glue: the real
// sched::Scheduler + kv::KvManager (prefix cache: hash chain + token check)
// deciding, runtime::ModelRunner computing, sample::Sampler picking greedily.
// The Engine API does not expose logits, so the bitwise comparison runs here;
// an Engine-level check of tokens and logprobs on the synth model is at the end.
//
// Why bitwise: a hit run computes only the uncached tail (a few rows, attending
// to K/V the cold run stored), the cold run computes every prompt row in one
// batch. Equal bits need per-row kernels with a fixed reduction order and K/V
// that attention reads back the same way whether written this step or earlier.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/rng.h"
#include "common/expect_config.h"
#include "common/reference_jsonl.h"
#include "common/synth_model.h"
#include "gguf/synth.h"
#include "kernels/api.h"
#include "kv/kv_manager.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "sample/sampler.h"
#include "sched/scheduler.h"
#if PAGODA_PREFIX_TEST_ENGINE
#include "engine/engine.h"
#endif

namespace pagoda {
namespace {

constexpr int kGreedyTokens = 16;

struct RunResult {
  std::vector<float> first_logits;  // [n_vocab] logits of the first sampled step
  std::vector<int32_t> tokens;      // [kGreedyTokens] greedy tokens
  int32_t num_cached = -1;          // prompt tokens served from the prefix cache
  int32_t num_steps = 0;
};

// Scheduler + KvManager + ModelRunner over one model, one request at a time.
class Stack {
 public:
  // Precondition: `m` outlives the stack.
  Stack(const model::Model& m, KvTypes dtype, int32_t block_size, int32_t pool_tokens,
        int32_t max_batched_tokens = 2048) {
    runtime::RunnerOptions ro;
    ro.block_size = block_size;
    ro.num_blocks = runtime::blocks_for_context(pool_tokens, block_size);
    ro.kv_dtype = dtype;
    ro.max_tokens_per_step = max_batched_tokens;
    auto r = runtime::ModelRunner::create(m, ro);
    if (!r.ok()) {
      ADD_FAILURE() << "ModelRunner::create: " << r.message();
      return;
    }
    runner_ = std::move(r).value();
    kv::KvConfig kc;
    kc.num_blocks = ro.num_blocks;
    kc.block_size = block_size;
    kc.watermark = 0;
    kc.model_fingerprint = m.fingerprint();
    kvm_ = std::make_unique<kv::KvManager>(kc);
    sched::SchedulerConfig sc;
    sc.max_num_batched_tokens = max_batched_tokens;
    sc.max_model_len = pool_tokens;
    sched_ = std::make_unique<sched::Scheduler>(sc, kvm_.get());
  }

  bool ok() const { return runner_ != nullptr; }
  const kv::KvManager& kv() const { return *kvm_; }

  // Runs `prompt` to kGreedyTokens greedy tokens, alone. Precondition: ok(), idle.
  RunResult run(const std::vector<int32_t>& prompt) {
    RunResult res;
    sched::NewRequest nr;
    nr.id = next_id_++;
    nr.prompt = prompt;
    nr.max_tokens = kGreedyTokens;
    if (Status s = sched_->add_request(nr); !s.ok()) {
      ADD_FAILURE() << "add_request: " << s.message();
      return res;
    }
    sample::SamplingParams sp;
    sp.temperature = 0.0f;
    sample::Sampler sampler(sp, prompt);
    while (sched_->has_unfinished() && res.num_steps < 10000) {
      const sched::StepPlan plan = sched_->schedule();
      ++res.num_steps;
      if (plan.seqs.empty()) {
        ADD_FAILURE() << "the scheduler scheduled nothing";
        return res;
      }
      auto logits = runner_->execute(plan);
      if (!logits.ok()) {
        ADD_FAILURE() << "execute: " << logits.message();
        return res;
      }
      std::vector<sched::SeqOutput> outputs;
      for (int32_t i = 0; i < logits->size(); ++i) {
        const std::span<const float> row = logits->row(i);
        if (res.first_logits.empty()) res.first_logits.assign(row.begin(), row.end());
        const int32_t t = sampler.sample(row).token;
        res.tokens.push_back(t);
        // The driver decides the finish (as the engine does): kGreedyTokens outputs.
        const bool last = static_cast<int32_t>(res.tokens.size()) >= kGreedyTokens;
        outputs.push_back({nr.id, t, last ? FinishReason::kLength : FinishReason::kNone});
      }
      for (const sched::FinishedRequest& f : sched_->update(plan, outputs)) {
        res.num_cached = f.num_cached_tokens;
        EXPECT_EQ(f.output_tokens, res.tokens);
      }
      if (std::string inv = sched_->check_invariants(); !inv.empty()) ADD_FAILURE() << inv;
    }
    return res;
  }

 private:
  std::unique_ptr<runtime::ModelRunner> runner_;
  std::unique_ptr<kv::KvManager> kvm_;
  std::unique_ptr<sched::Scheduler> sched_;
  sched::RequestId next_id_ = 1;
};

// memcmp of two logits rows, with the first differing index on failure.
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  if (std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0) return;
  size_t i = 0;
  while (i < want.size() && std::memcmp(&got[i], &want[i], sizeof(float)) == 0) ++i;
  int ndiff = 0;
  for (size_t j = i; j < want.size(); ++j) ndiff += std::memcmp(&got[j], &want[j], sizeof(float)) != 0;
  ADD_FAILURE() << what << ": logits differ in " << ndiff << " of " << want.size() << " entries; first at " << i
                << ": got " << got[i] << ", want " << want[i];
}

std::string dtype_name(KvTypes d) { return kv_types_name(d); }

// The stories260K runs' KV types: every type (K and V the same) and two mixed pairs.
std::vector<KvTypes> stories_dtypes() {
  std::vector<KvTypes> t(std::begin(kAllKvDtypes), std::end(kAllKvDtypes));
  t.emplace_back(KvDtype::Q8_0, KvDtype::Q4_0);
  t.emplace_back(KvDtype::F16, KvDtype::Q5_1);
  return t;
}

// Full hit: the prompt runs cold, then again on the same stack. Each of `lens`
// is cut from `tokens`; the hit covers every full block that does not hold the
// last prompt token (that one is always computed, for logits).
void check_full_hit(const model::Model& m, KvTypes dt, const std::vector<int32_t>& tokens,
                    const std::vector<size_t>& lens) {
  constexpr int32_t kBlock = 16;
  for (size_t len : lens) {
    SCOPED_TRACE(std::string("kv ") + dtype_name(dt) + ", prompt of " + std::to_string(len) + " tokens");
    ASSERT_LE(len, tokens.size());
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + static_cast<long>(len));
    Stack st(m, dt, kBlock, 1024);
    ASSERT_TRUE(st.ok());
    const RunResult cold = st.run(prompt);
    const RunResult hit = st.run(prompt);
    EXPECT_EQ(cold.num_cached, 0);
    const int32_t want_hit = static_cast<int32_t>((len - 1) / kBlock * kBlock);
    EXPECT_EQ(hit.num_cached, want_hit);
    EXPECT_EQ(st.kv().stats().prefix_hit_tokens, want_hit);
    ASSERT_EQ(cold.tokens.size(), static_cast<size_t>(kGreedyTokens));
    EXPECT_EQ(hit.tokens, cold.tokens);
    expect_bitwise(hit.first_logits, cold.first_logits, "full hit vs cold");
  }
}

// Partial hit: `a` runs first; `b` shares its first `shared` tokens (a multiple
// of the block size) and then differs, so only those blocks hit. The hit run of
// b is compared with b run cold on a fresh stack.
void check_partial_hit(const model::Model& m, KvTypes dt, const std::vector<int32_t>& a,
                       const std::vector<int32_t>& b, int32_t shared) {
  constexpr int32_t kBlock = 16;
  SCOPED_TRACE(std::string("kv ") + dtype_name(dt) + ", partial hit of " + std::to_string(shared) + " of " +
               std::to_string(b.size()) + " tokens");
  ASSERT_EQ(shared % kBlock, 0);
  ASSERT_GT(b.size(), static_cast<size_t>(shared + kBlock));  // at least one full block of b misses
  ASSERT_TRUE(std::equal(a.begin(), a.begin() + shared, b.begin()));
  ASSERT_NE(a[static_cast<size_t>(shared)], b[static_cast<size_t>(shared)]);
  Stack warm(m, dt, kBlock, 1024);
  Stack fresh(m, dt, kBlock, 1024);
  ASSERT_TRUE(warm.ok() && fresh.ok());
  warm.run(a);
  const RunResult hit = warm.run(b);
  const RunResult cold = fresh.run(b);
  EXPECT_EQ(hit.num_cached, shared);
  EXPECT_EQ(cold.num_cached, 0);
  ASSERT_EQ(cold.tokens.size(), static_cast<size_t>(kGreedyTokens));
  EXPECT_EQ(hit.tokens, cold.tokens);
  expect_bitwise(hit.first_logits, cold.first_logits, "partial hit vs cold");
}

// ------------------------------------------------------------------ stories260K

class PrefixBitwiseStories : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    kernels::set_num_threads(1);
    auto m = model::Model::load(testutil::stories_path());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  // The first reference prompt continued by its reference tokens (a real text, 80+ tokens).
  static std::vector<int32_t> text_tokens() {
    const std::vector<testutil::Reference> refs = testutil::load_references();
    if (refs.empty()) return {};
    std::vector<int32_t> p = refs[0].prompt_tokens;
    p.insert(p.end(), refs[0].generated_tokens.begin(), refs[0].generated_tokens.end());
    return p;
  }
  static const model::Model* model_;
};
const model::Model* PrefixBitwiseStories::model_ = nullptr;

TEST_F(PrefixBitwiseStories, FullHitSameLogitsAndTokens) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> text = text_tokens();
  ASSERT_GE(text.size(), 64u);
  // 55: 3 full blocks hit, 7 computed. 64: 4 full blocks, 3 hit, 16 computed.
  for (KvTypes dt : stories_dtypes()) check_full_hit(*model_, dt, text, {55, 64});
}

TEST_F(PrefixBitwiseStories, PartialHitSameLogitsAndTokens) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> a = text_tokens();
  ASSERT_GE(a.size(), 64u);
  std::vector<int32_t> b(a.begin(), a.begin() + 32);  // 2 blocks shared
  for (int i = 0; i < 30; ++i) b.push_back(static_cast<int32_t>(3 + (i * 37 + 11) % 500));  // then another text
  if (b[32] == a[32]) b[32] = a[32] == 3 ? 4 : 3;
  for (KvTypes dt : stories_dtypes())
    check_partial_hit(*model_, dt, std::vector<int32_t>(a.begin(), a.begin() + 64), b, 32);
}

// -------------------------------------------------------- synthetic SmolLM2-135M

// SmolLM2-135M's shape per layer (hidden 576, 9 heads, 3 KV heads, head_dim 64,
// FFN 1536, vocab 49152, tied embeddings, rope base 100000) with 2 of its 30
// layers, Q4_1 weights like the default model file: every kernel and every
// buffer size the real model uses, at a test's cost.
constexpr int kSynthLayers = 2;

// KV types of the synth runs: f16 (the engine's default), f32, q8_0/q4_0 and iq4_nl;
// f16 only under ASan, where the 49152-row head makes each run ~20x slower.
std::vector<KvTypes> synth_dtypes() {
#if defined(__SANITIZE_ADDRESS__)
  return {KvDtype::F16};
#else
  return {KvDtype::F16, KvDtype::F32, KvTypes(KvDtype::Q8_0, KvDtype::Q4_0), KvDtype::IQ4_NL};
#endif
}

class PrefixBitwiseSynthSmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    kernels::set_num_threads(1);
    path_ = new std::string;
    testing_common::load_synth_preset("pagoda_prefix_synth_smollm2", "smollm2-135m", GgmlType::Q4_1, kSynthLayers, 4, path_, &model_);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    if (path_) std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
  }
  // `n` random ids past the 3 specials of the smollm vocabulary.
  static std::vector<int32_t> random_tokens(uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.uniform_int(3, 49151)));
    return t;
  }
  static const model::Model* model_;
  static std::string* path_;
};
const model::Model* PrefixBitwiseSynthSmolLM2::model_ = nullptr;
std::string* PrefixBitwiseSynthSmolLM2::path_ = nullptr;

TEST_F(PrefixBitwiseSynthSmolLM2, ShapeIsSmolLM2PerLayer) {
  ASSERT_NE(model_, nullptr);
  const model::ModelConfig& c = model_->config();
  testutil::expect_config(c, {.n_layers = kSynthLayers, .n_embd = 576, .n_ff = 1536, .n_heads = 9, .n_kv_heads = 3,
                              .head_dim = 64, .n_vocab = 49152, .rope_base = 100000.f, .tied_output = true});
}

TEST_F(PrefixBitwiseSynthSmolLM2, FullHitSameLogitsAndTokens) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> text = random_tokens(1, 64);
  for (KvTypes dt : synth_dtypes()) check_full_hit(*model_, dt, text, {55, 64});
}

TEST_F(PrefixBitwiseSynthSmolLM2, PartialHitSameLogitsAndTokens) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> a = random_tokens(2, 64);
  std::vector<int32_t> b(a.begin(), a.begin() + 32);
  for (int32_t t : random_tokens(3, 27)) b.push_back(t);  // 59 tokens: 3 full blocks, 2 hit
  for (KvTypes dt : synth_dtypes()) check_partial_hit(*model_, dt, a, b, 32);
}

// A cold prefill split into chunks (max_num_batched_tokens 16) computes the
// same rows as the hit run's tail step: same logits again.
TEST_F(PrefixBitwiseSynthSmolLM2, ChunkedColdEqualsHit) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> prompt = random_tokens(5, 55);
  Stack chunked(*model_, kernels::KvDtype::F16, 16, 1024, /*max_batched_tokens=*/16);
  Stack whole(*model_, kernels::KvDtype::F16, 16, 1024);
  ASSERT_TRUE(chunked.ok() && whole.ok());
  const RunResult a = chunked.run(prompt);
  whole.run(prompt);
  const RunResult hit = whole.run(prompt);
  EXPECT_EQ(a.num_steps, 4 + kGreedyTokens - 1);  // 16 + 16 + 16 + 7, then 15 decodes
  EXPECT_EQ(hit.num_cached, 48);
  EXPECT_EQ(hit.tokens, a.tokens);
  expect_bitwise(hit.first_logits, a.first_logits, "hit vs chunked cold");
}

// The comparison can fail: a change as small as the KV cache's rounding (f16
// instead of f32) changes the logits' bits.
TEST_F(PrefixBitwiseSynthSmolLM2, BitwiseCheckSeesKvRounding) {
  ASSERT_NE(model_, nullptr);
  const std::vector<int32_t> prompt = random_tokens(7, 40);
  Stack f16(*model_, kernels::KvDtype::F16, 16, 1024), f32(*model_, kernels::KvDtype::F32, 16, 1024);
  ASSERT_TRUE(f16.ok() && f32.ok());
  const RunResult a = f16.run(prompt), b = f32.run(prompt);
  ASSERT_EQ(a.first_logits.size(), b.first_logits.size());
  EXPECT_NE(std::memcmp(a.first_logits.data(), b.first_logits.data(), a.first_logits.size() * sizeof(float)), 0);
}

#if PAGODA_PREFIX_TEST_ENGINE
// The same through the Engine API (default f16 KV): tokens, the cached count it
// reports, and the logprobs of every step (log-softmax of the logits) bitwise.
TEST_F(PrefixBitwiseSynthSmolLM2, EngineHitSameTokensAndLogprobs) {
  ASSERT_NE(path_, nullptr);
  engine::EngineConfig c;
  c.model_path = *path_;
  c.threads = 1;
  c.num_kv_blocks = 1024 / 16 + 1;
  c.context_length = 1024;
  auto e = engine::Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.message();
  engine::RequestParams p;
  p.prompt = random_tokens(6, 55);
  p.max_tokens = kGreedyTokens;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.logprobs = 5;
  struct Out {
    std::vector<int32_t> tokens;
    std::vector<engine::TokenLogprob> logprobs;
    int32_t num_cached = -1;
  };
  auto run = [&]() {
    Out o;
    auto id = (*e)->add_request(p);
    EXPECT_TRUE(id.ok()) << id.message();
    for (int s = 0; s < 1000 && (*e)->has_unfinished(); ++s) {
      for (const engine::TokenEvent& ev : (*e)->step()) {
        if (o.num_cached < 0) o.num_cached = ev.num_cached_tokens;
        o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        o.logprobs.insert(o.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      }
    }
    return o;
  };
  const Out cold = run();
  const Out hit = run();
  EXPECT_EQ(cold.num_cached, 0);
  EXPECT_EQ(hit.num_cached, 48);
  ASSERT_EQ(cold.tokens.size(), static_cast<size_t>(kGreedyTokens));
  EXPECT_EQ(hit.tokens, cold.tokens);
  ASSERT_EQ(hit.logprobs.size(), cold.logprobs.size());
  for (size_t i = 0; i < cold.logprobs.size(); ++i) {
    const engine::TokenLogprob &x = hit.logprobs[i], &y = cold.logprobs[i];
    EXPECT_EQ(x.token, y.token) << "step " << i;
    EXPECT_EQ(std::memcmp(&x.logprob, &y.logprob, sizeof(float)), 0)
        << "step " << i << ": " << x.logprob << " vs " << y.logprob;
    ASSERT_EQ(x.top.size(), 5u);
    ASSERT_EQ(x.top.size(), y.top.size());
    for (size_t k = 0; k < x.top.size(); ++k) {
      EXPECT_EQ(x.top[k].first, y.top[k].first) << "step " << i << " alternative " << k;
      EXPECT_EQ(std::memcmp(&x.top[k].second, &y.top[k].second, sizeof(float)), 0)
          << "step " << i << " alternative " << k;
    }
  }
}
#endif

}  // namespace
}  // namespace pagoda
