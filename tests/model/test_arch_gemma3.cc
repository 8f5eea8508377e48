// The real Gemma 3 270M (Q4_K_M; scripts/setup fetches it to
// models/gemma-3-270m-q4_k_m.gguf, or set PAGODA_GEMMA3=path). Skipped when the
// file is absent (it is never committed: Gemma terms of use).
//  - the config read from its metadata: 5 local : 1 global layers, window 512,
//    rope bases 10000 / 1e6, head size 256, attention scale 1/16, sqrt(640)
//    embedding scale, tied output;
//  - greedy tokens of a plain prompt with the cpu kernels, recorded from pagoda
//    and equal to llama.cpp's greedy tokens for the same ids (docs/parity/results.md);
//  - the scalar reference kernels, teacher-forced on those tokens, pick the
//    same argmax at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/expect_config.h"
#include "model/model.h"
#include "model/arch_test_util.h"
#include "runtime/model_runner.h"

using namespace pagoda;

namespace {

std::string gemma_path() {
  if (const char* p = std::getenv("PAGODA_GEMMA3")) return p;
  return std::string(PAGODA_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
}

// "The capital of France is" (BOS + 5 tokens, Gemma's tokenizer).
const std::vector<int32_t> kPrompt = {2, 818, 5279, 529, 7001, 563};
// pagoda cpu kernels, f16 KV, greedy: " the capital of the country of France. It is"
const std::vector<int32_t> kGreedy = {506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563};

class Gemma3 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(gemma_path())) GTEST_SKIP() << gemma_path() << " absent (scripts/setup fetches it)";
    auto m = model::Model::load(gemma_path());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(*m);
  }

  // Greedy (or teacher-forced on `forced`) argmax tokens after the prompt.
  std::vector<int32_t> argmax_steps(model::KernelBackend backend, const std::vector<int32_t>& forced, size_t n) {
    runtime::RunnerOptions ro;
    ro.block_size = 16;
    ro.num_blocks = runtime::blocks_for_context(64, 16);
    ro.kv_dtype = kernels::KvDtype::F16;
    ro.backend = backend;
    auto runner = runtime::ModelRunner::create(*model_, ro);
    EXPECT_TRUE(runner.ok()) << runner.message();
    if (!runner.ok()) return {};
    archtest::OneSeq seq(**runner, ro.block_size);
    std::vector<float> l = seq.feed(kPrompt);
    std::vector<int32_t> out;
    for (size_t i = 0; i < n && !l.empty(); ++i) {
      out.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      const int32_t next = forced.empty() ? out.back() : forced[i];
      l = seq.feed(std::span<const int32_t>(&next, 1));
    }
    return out;
  }

  std::unique_ptr<model::Model> model_;
};

TEST_F(Gemma3, ConfigFromMetadata) {
  const model::ModelConfig& c = model_->config();
  testutil::expect_config(c, {.arch = "gemma3", .n_layers = 18, .n_embd = 640, .n_heads = 4, .n_kv_heads = 1,
                              .head_dim = 256, .n_vocab = 262144, .rope_neox = true, .tied_output = true,
                              .qk_norm = true, .post_norms = true});
  EXPECT_EQ(c.ffn_act, model::FfnAct::GeluTanh);
  EXPECT_FLOAT_EQ(c.embd_scale, std::sqrt(640.0f));
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / 16.0f);
  for (int32_t l = 0; l < 18; ++l) {
    const bool global = (l + 1) % 6 == 0;
    EXPECT_EQ(c.layers[static_cast<size_t>(l)].window, global ? 0 : 512) << l;
    EXPECT_EQ(c.layers[static_cast<size_t>(l)].rope_base, global ? 1e6f : 1e4f) << l;
  }
}

TEST_F(Gemma3, GreedyCpuTokensAndRefAgreesTeacherForced) {
  EXPECT_EQ(argmax_steps(model::KernelBackend::Cpu, {}, kGreedy.size()), kGreedy);
  EXPECT_EQ(argmax_steps(model::KernelBackend::Ref, kGreedy, kGreedy.size()), kGreedy);
}

}  // namespace
