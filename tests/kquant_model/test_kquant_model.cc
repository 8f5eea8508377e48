// Q2_K, Q3_K and IQ4_XS models end to end through the built CLI: a synthetic
// file of each type (every matmul weight and token_embd in the type,
// output.weight Q6_K as in llama.cpp's Q2_K / Q3_K_S mixes) is listed by `pagoda inspect`
// (such files used to be refused at load) and generates with `pagoda run`.
// The integer cpu kernels match the ref kernels' logits within the 8-bit
// activation rounding, and greedy tokens do not depend on the thread count.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/run_pagoda.h"
#include <vector>

#include "base/ggml_types.h"
#include "gguf/synth.h"
#include "gguf/writer.h"

namespace pagoda {
namespace {

using Result = testutil::CliResult;
using testutil::run_pagoda;

using testutil::read_floats;

constexpr int64_t kLayers = 2, kVocab = 512, kEmbd = 256, kFf = 512;

gguf::SynthOptions options(GgmlType type) {
  gguf::SynthOptions o;
  o.shape = *gguf::find_synth_preset("smollm2-135m");
  o.shape.name = "kquant-e2e";
  o.shape.n_vocab = kVocab;
  o.shape.n_embd = kEmbd;  // a multiple of 256: every weight holds whole super-blocks
  o.shape.n_head = 4;
  o.shape.n_head_kv = 2;
  o.shape.n_ff = kFf;
  o.shape.tied = false;
  o.type = type;
  o.n_layers_override = kLayers;
  o.seed = 11;
  return o;
}

// A file name of this test process: ctest runs these tests as parallel processes,
// which must not rewrite each other's files.
std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "/pagoda_kquant_" + std::to_string(getpid()) + "_" + stem;
}

// The synthetic model of `type`, written once per type.
std::string model_path(GgmlType type) {
  const std::string path = temp_path(std::string(ggml_type_info(type).name) + ".gguf");
  gguf::GgufWriter w;
  const Status s = gguf::synth_model(options(type), &w);
  EXPECT_TRUE(s.ok()) << s.message();
  const Status ws = w.write_file(path);
  EXPECT_TRUE(ws.ok()) << ws.message();
  return path;
}

const GgmlType kTypes[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS};

// The model files go when the test program ends.
class RemoveModels : public ::testing::Environment {
 public:
  void TearDown() override {
    for (GgmlType type : kTypes) std::remove(temp_path(std::string(ggml_type_info(type).name) + ".gguf").c_str());
    std::remove(temp_path("logits.f32").c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const g_remove_models = ::testing::AddGlobalTestEnvironment(new RemoveModels);
const std::string kPrompt = "1,17,300,42,99,5,250,128,64";

TEST(KQuantModel, InspectListsTheTensors) {
  for (GgmlType type : kTypes) {
    const std::string name = ggml_type_info(type).name;
    const Result r = run_pagoda("inspect --json '" + model_path(type) + "'", true);
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.out;
    const auto j = nlohmann::json::parse(r.out);
    const auto& types = j.at("tensor_types");
    // 7 matmul weights per layer and the (untied) token_embd; output.weight is Q6_K.
    const int64_t q_dim = kEmbd, kv_dim = kEmbd / 2;  // 4 heads of 64, 2 KV heads
    const int64_t per_layer = 2 * kEmbd * q_dim + 2 * kEmbd * kv_dim + 3 * kEmbd * kFf;
    const int64_t elems = kLayers * per_layer + kVocab * kEmbd;
    EXPECT_EQ(types.at(name).at("count").get<int64_t>(), 7 * kLayers + 1) << name;
    EXPECT_EQ(types.at(name).at("bytes").get<int64_t>(),
              static_cast<int64_t>(ggml_row_bytes(type, static_cast<size_t>(elems))))
        << name;
    EXPECT_EQ(types.at("Q6_K").at("count").get<int64_t>(), 1) << name;
  }
}

// Last-position logits of the prompt, cpu kernels and ref kernels.
std::vector<float> prompt_logits(GgmlType type, bool ref) {
  const std::string out = temp_path("logits.f32");
  std::remove(out.c_str());
  const Result r = run_pagoda("run -m '" + model_path(type) + "' --prompt-ids " + kPrompt +
                                  " -n 1 --temp 0 --kv-dtype f32 -c 64 -t 1 --json --logits-out '" + out + "'" +
                                  (ref ? " --ref-kernels" : ""),
                              true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return read_floats(out);
}

// The cpu path multiplies q8_K activations (one f32 scale per 256 values), so
// each weight row sees x within amax/254 per element: the logits stay within 2%
// of the largest one (as the Q8_0 / Q4_1 model parity tests allow). Q2_K and
// Q3_K quantize the same float weights differently, so their logits differ by
// far more: the bound is not vacuous.
TEST(KQuantModel, CpuKernelsMatchRefKernels) {
  std::vector<std::vector<float>> refs;
  for (GgmlType type : kTypes) {
    const std::string name = ggml_type_info(type).name;
    const auto cpu = prompt_logits(type, false), ref = prompt_logits(type, true);
    ASSERT_EQ(cpu.size(), static_cast<size_t>(kVocab)) << name;
    ASSERT_EQ(ref.size(), static_cast<size_t>(kVocab)) << name;
    double max_abs = 0, max_err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(cpu[i])) << name << " logit " << i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(ref[i])));
      max_err = std::max(max_err, std::fabs(static_cast<double>(cpu[i]) - ref[i]));
    }
    ASSERT_GT(max_abs, 0.0) << name;
    EXPECT_LE(max_err, 2e-2 * max_abs) << name;
    refs.push_back(ref);
  }
  double max_abs = 0, diff = 0;
  for (size_t i = 0; i < refs[0].size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(refs[0][i])));
    diff = std::max(diff, std::fabs(static_cast<double>(refs[0][i]) - refs[1][i]));
  }
  EXPECT_GT(diff, 4 * 2e-2 * max_abs) << "Q2_K and Q3_K logits should differ well beyond the tolerance";
}

TEST(KQuantModel, GreedyTokensDoNotDependOnThreads) {
  for (GgmlType type : kTypes) {
    const std::string name = ggml_type_info(type).name;
    std::vector<std::vector<int32_t>> runs;
    for (int threads : {1, 2}) {
      const Result r = run_pagoda("run -m '" + model_path(type) + "' --prompt-ids " + kPrompt +
                                  " -n 12 --temp 0 --ignore-eos --kv-dtype f32 -c 64 --json -t " +
                                  std::to_string(threads));
      ASSERT_EQ(r.exit_code, 0) << name << ": " << r.out;
      const auto j = nlohmann::json::parse(r.out);
      runs.push_back(j.at("generated_tokens").get<std::vector<int32_t>>());
      ASSERT_EQ(runs.back().size(), 12u) << name;
      for (int32_t t : runs.back()) ASSERT_TRUE(t >= 0 && t < kVocab) << name;
    }
    EXPECT_EQ(runs[0], runs[1]) << name;
  }
}

}  // namespace
}  // namespace pagoda
