// Byte-exact greedy golden on stories260K against llama.cpp's reference output,
// through engine::Engine (golden_util.h); the ragged-batch test drives the
// ModelRunner directly.
#include <gtest/gtest.h>

#include <cmath>

#include "common/expect_config.h"
#include "kernels/api.h"
#include "model/golden_util.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "sample/sampler.h"
#include "sched/step_plan.h"

using namespace pagoda;
using namespace pagoda::golden;

namespace {

class Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One thread: results do not depend on it (kernel contract), and OpenMP
    // barriers on a tiny model only cost time on a shared machine. The ragged
    // batch test runs with two.
    kernels::set_num_threads(1);
    auto m = model::Model::load(stories_path());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(*m).release();
    refs_ = new std::vector<Reference>(load_references());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete refs_;
  }
  static const model::Model* model_;
  static std::vector<Reference>* refs_;
};
const model::Model* Golden::model_ = nullptr;
std::vector<Reference>* Golden::refs_ = nullptr;

void expect_tokens(const std::vector<int32_t>& got, const std::vector<int32_t>& want, const std::string& what) {
  const int d = first_diff(got, want);
  EXPECT_EQ(d, -1) << what << ": first difference at generated token " << d << ": got "
                   << (d >= 0 && d < static_cast<int>(got.size()) ? got[static_cast<size_t>(d)] : -1) << ", want "
                   << (d >= 0 && d < static_cast<int>(want.size()) ? want[static_cast<size_t>(d)] : -1);
}

}  // namespace

TEST_F(Golden, ConfigOfStories260K) {
  const model::ModelConfig& c = model_->config();
  testutil::expect_config(c, {.arch = "llama", .n_layers = 5, .n_embd = 64, .n_ff = 172, .n_heads = 8,
                              .n_kv_heads = 4, .head_dim = 8, .rope_dim = 8, .n_vocab = 512, .n_ctx_train = 512,
                              .rope_base = 10000.f, .rope_neox = false, .tied_output = false});
  EXPECT_NE(model_->fingerprint(), 0u);
}

TEST_F(Golden, F32KvCacheReproducesReference) {
  ASSERT_EQ(refs_->size(), 3u);
  for (const Reference& r : *refs_) {
    expect_tokens(generate_greedy(r.prompt_tokens, static_cast<int>(r.generated_tokens.size())),
                  r.generated_tokens, "prompt '" + r.prompt + "'");
  }
}

// Without a KV cache every step recomputes the whole sequence (quadratic), so
// one test per reference line lets ctest run them in parallel.
static void expect_recompute_matches(const Reference& r) {
  GenOptions o;
  o.recompute = true;
  expect_tokens(generate_greedy(r.prompt_tokens, static_cast<int>(r.generated_tokens.size()), o),
                r.generated_tokens, "recompute, prompt '" + r.prompt + "'");
}
TEST_F(Golden, RecomputeWithoutCacheReproducesReference0) { expect_recompute_matches(refs_->at(0)); }
TEST_F(Golden, RecomputeWithoutCacheReproducesReference1) { expect_recompute_matches(refs_->at(1)); }
TEST_F(Golden, RecomputeWithoutCacheReproducesReference2) { expect_recompute_matches(refs_->at(2)); }

TEST_F(Golden, BlockSizesGiveTheSameTokens) {
  for (int32_t bs : {1, 7, 16, 256}) {
    GenOptions o;
    o.block_size = bs;
    for (const Reference& r : *refs_) {
      expect_tokens(generate_greedy(r.prompt_tokens, static_cast<int>(r.generated_tokens.size()), o),
                    r.generated_tokens, "block size " + std::to_string(bs));
    }
  }
}

TEST_F(Golden, ChunkedPrefillGivesTheSameTokens) {
  GenOptions o;
  o.max_tokens_per_step = 2;  // the 5-token prompt goes in as 2 + 2 + 1
  const Reference& r = refs_->at(0);
  expect_tokens(generate_greedy(r.prompt_tokens, 50, o),
                std::vector<int32_t>(r.generated_tokens.begin(), r.generated_tokens.begin() + 50), "chunked");
}

TEST_F(Golden, RefKernelsMatchCpuKernels) {
  GenOptions o;
  o.ref_kernels = true;
  const Reference& r = refs_->at(1);
  expect_tokens(generate_greedy(r.prompt_tokens, 24, o),
                std::vector<int32_t>(r.generated_tokens.begin(), r.generated_tokens.begin() + 24), "ref kernels");

  // Logits after the prompt: ref vs cpu agree closely.
  std::vector<float> logits[2];
  for (int b = 0; b < 2; ++b) {
    GenOptions ob;
    ob.ref_kernels = b == 1;
    ASSERT_EQ(generate_greedy(r.prompt_tokens, 1, ob, &logits[b]).size(), 1u);
  }
  ASSERT_EQ(logits[0].size(), 512u);
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_NEAR(logits[0][i], logits[1][i], 1e-3f * (1.0f + std::fabs(logits[1][i]))) << "logit " << i;
  }
}

TEST_F(Golden, LowPrecisionKvStaysCloseToReference) {
  // Not bit-exact by design; the first tokens must still agree.
  for (KvDtype d : {KvDtype::F16, KvDtype::BF16, KvDtype::Q8_0}) {
    GenOptions o;
    o.kv_dtype = d;
    const Reference& r = refs_->at(0);
    const auto got = generate_greedy(r.prompt_tokens, 200, o);
    const int d0 = first_diff(got, r.generated_tokens);
    EXPECT_TRUE(d0 == -1 || d0 >= 8) << kernels::kv_dtype_name(d) << " diverges at token " << d0;
  }
}

// Three sequences in one ragged step (prefill together, then decode together)
// give each its solo greedy output: the batch-invariance contract end to end.
TEST_F(Golden, RaggedBatchOfThreeSequencesMatchesEachAlone) {
  const int32_t bs = 16, n_gen = 60;
  kernels::set_num_threads(2);
  runtime::RunnerOptions ro;
  ro.block_size = bs;
  ro.num_blocks = 1 + 3 * 8;
  auto runner = runtime::ModelRunner::create(*model_, ro);
  ASSERT_TRUE(runner.ok());
  sched::StepPlan plan;
  std::vector<std::vector<int32_t>> out(3);
  std::vector<sample::Sampler> samplers;
  sample::SamplingParams sp;
  sp.temperature = 0.0f;
  for (int s = 0; s < 3; ++s) {
    sched::ScheduledSeq q;
    q.request_id = static_cast<uint64_t>(100 + s);
    // Interleaved, non-contiguous blocks: seq s owns blocks 1 + s, 4 + s, 7 + s, ...
    for (int b = 0; b < 8; ++b) q.block_ids.push_back(1 + s + 3 * b);
    q.token_ids = refs_->at(static_cast<size_t>(s)).prompt_tokens;
    q.wants_logits = true;
    plan.seqs.push_back(q);
    samplers.emplace_back(sp);
  }
  for (int step = 0; step < n_gen; ++step) {
    auto logits = (*runner)->execute(plan);
    ASSERT_TRUE(logits.ok()) << logits.message();
    ASSERT_EQ(logits->size(), 3);
    for (int i = 0; i < 3; ++i) {
      const int32_t s = logits->seq_indices[static_cast<size_t>(i)];
      const int32_t t = samplers[static_cast<size_t>(s)].sample(logits->row(i)).token;
      out[static_cast<size_t>(s)].push_back(t);
      sched::ScheduledSeq& q = plan.seqs[static_cast<size_t>(s)];
      q.start_pos += static_cast<int32_t>(q.token_ids.size());
      q.token_ids = {t};
    }
  }
  for (size_t s = 0; s < 3; ++s) {
    const auto& want = refs_->at(s).generated_tokens;
    expect_tokens(out[s], std::vector<int32_t>(want.begin(), want.begin() + n_gen), "batched seq " + std::to_string(s));
  }
  kernels::set_num_threads(1);
}
