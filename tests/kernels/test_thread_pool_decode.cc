// The thread pool under a real decode (issue 22): a synthetic SmolLM2-shaped
// model gives bitwise the same logits at 1 and 2 threads, prompt and decode
// steps alike (threads split output rows, never a reduction), and one decode
// step at 2 threads launches exactly the pool loops (fork/joins, i.e. barriers)
// the layer structure needs: Q/K/V as one launch, attention, W_o, gate/up as
// one launch, W_down per layer, and the output matmul once.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/synth_model.h"
#include "gguf/synth.h"
#include "kernels/api.h"
#include "kernels/cpu/thread_pool.h"
#include "model/arch_test_util.h"
#include "model/model.h"
#include "runtime/model_runner.h"

namespace pagoda {
namespace {

constexpr int kLayers = 2;

class PoolDecode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string;
    testing_common::load_synth_preset("pagoda_pool_decode", "smollm2-135m", GgmlType::Q4_0, kLayers, 22, path_, &model_);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    if (path_) std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
    kernels::set_num_threads(1);
  }

  // A 9-token prompt, then `n_decode` greedy steps; the logits of every step
  // (the prompt's last token first). launches_per_step: the pool launches of
  // each decode step, when not null.
  static std::vector<std::vector<float>> run(int threads, kernels::KvDtype kv, int n_decode,
                                             std::vector<int64_t>* launches_per_step = nullptr) {
    kernels::set_num_threads(threads);
    runtime::RunnerOptions ro;
    ro.block_size = 16;
    ro.num_blocks = runtime::blocks_for_context(64, ro.block_size);
    ro.kv_dtype = kv;
    auto runner = runtime::ModelRunner::create(*model_, ro);
    EXPECT_TRUE(runner.ok()) << runner.message();
    if (!runner.ok()) return {};
    archtest::OneSeq seq(**runner, ro.block_size);
    std::vector<std::vector<float>> out;
    out.push_back(seq.feed(std::vector<int32_t>{1, 17, 4242, 99, 31000, 7, 12345, 600, 48000}));
    for (int i = 0; i < n_decode; ++i) {
      const std::vector<float>& last = out.back();
      if (last.empty()) break;
      const int32_t next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
      const int64_t l0 = kernels::cpu::detail::pool_launches();
      out.push_back(seq.feed(std::vector<int32_t>{next}));
      if (launches_per_step) launches_per_step->push_back(kernels::cpu::detail::pool_launches() - l0);
    }
    return out;
  }

  static const model::Model* model_;
  static std::string* path_;
};
const model::Model* PoolDecode::model_ = nullptr;
std::string* PoolDecode::path_ = nullptr;

TEST_F(PoolDecode, OneAndTwoThreadsGiveBitwiseTheSameLogits) {
  ASSERT_NE(model_, nullptr);
  for (kernels::KvDtype kv : {kernels::KvDtype::F16, kernels::KvDtype::F32}) {
    const auto one = run(1, kv, 6);
    const auto two = run(2, kv, 6);
    ASSERT_EQ(one.size(), 7u);
    ASSERT_EQ(two.size(), one.size());
    for (size_t s = 0; s < one.size(); ++s) {
      ASSERT_EQ(one[s].size(), static_cast<size_t>(model_->config().n_vocab));
      ASSERT_EQ(two[s].size(), one[s].size());
      EXPECT_EQ(std::memcmp(one[s].data(), two[s].data(), one[s].size() * sizeof(float)), 0)
          << kernels::kv_dtype_name(kv) << " step " << s;
    }
  }
}

TEST_F(PoolDecode, ADecodeStepLaunchesFiveLoopsPerLayerAndOneForTheOutput) {
  ASSERT_NE(model_, nullptr);
  const model::ModelConfig& c = model_->config();
  ASSERT_EQ(c.n_layers, kLayers);
  ASSERT_GT(c.n_kv_heads, 1);  // attention has more than one item at decode: it launches
  // A stall (a preempted worker on a loaded machine) would run later loops
  // inline and change the count: no backoff window here.
  kernels::cpu::detail::set_pool_solo_window(0, 0);
  std::vector<int64_t> launches;
  run(2, kernels::KvDtype::F16, 3, &launches);
  kernels::cpu::detail::set_pool_solo_window(2'000, 64'000);
  ASSERT_EQ(launches.size(), 3u);
  for (int64_t n : launches) EXPECT_EQ(n, 5 * kLayers + 1);
}

}  // namespace
}  // namespace pagoda
