// Packed Q5_0 / Q5_1 through a whole model (issue 22): a synth SmolLM2-shaped
// file of each type (n_embd 576: every row ends in a partial group of 4
// blocks) gives bitwise the same logits with its matrices packed at load and
// with packing off (PAGODA_PACK=0, the GGUF rows), for a 9-token prompt and
// greedy decode steps; the packed load really holds packed Q5 copies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gguf/synth.h"
#include "kernels/api.h"
#include "model/arch_test_util.h"
#include "model/model.h"
#include "runtime/model_runner.h"

namespace pagoda {
namespace {

std::unique_ptr<model::Model> load(const std::string& path, bool pack) {
  if (pack) {
    ::unsetenv("PAGODA_PACK");
  } else {
    ::setenv("PAGODA_PACK", "0", 1);
  }
  auto m = model::Model::load(path);
  ::unsetenv("PAGODA_PACK");
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Logits after a 9-token prompt, then after each of 3 greedy steps.
std::vector<std::vector<float>> run(const model::Model& m) {
  runtime::RunnerOptions ro;
  ro.block_size = 16;
  ro.num_blocks = runtime::blocks_for_context(64, ro.block_size);
  auto runner = runtime::ModelRunner::create(m, ro);
  EXPECT_TRUE(runner.ok()) << runner.message();
  if (!runner.ok()) return {};
  archtest::OneSeq seq(**runner, ro.block_size);
  std::vector<std::vector<float>> out;
  out.push_back(seq.feed(std::vector<int32_t>{1, 17, 4242, 99, 31000, 7, 12345, 600, 48000}));
  for (int i = 0; i < 3 && !out.back().empty(); ++i) {
    const std::vector<float>& last = out.back();
    const auto next = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(seq.feed(std::vector<int32_t>{next}));
  }
  return out;
}

TEST(PackQ5Model, PackedAndUnpackedLogitsAreBitwiseEqual) {
  if (!kernels::cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "only the AVX-512 path packs weights";
  kernels::cpu::set_isa("auto");
  for (GgmlType type : {GgmlType::Q5_0, GgmlType::Q5_1}) {
    const std::string path = ::testing::TempDir() + "pagoda_pack_q5_model_" + ggml_type_info(type).name + "_" +
                             std::to_string(::getpid()) + ".gguf";
    gguf::SynthOptions o;
    o.shape = *gguf::find_synth_preset("smollm2-135m");
    o.type = type;
    o.n_layers_override = 2;
    o.seed = 5;
    ASSERT_TRUE(gguf::synth_model_file(o, path).ok());
    const auto packed = load(path, true);
    const auto rows = load(path, false);
    std::remove(path.c_str());
    ASSERT_TRUE(packed && rows);
    const model::LayerWeights& l = packed->weights().layers[0];
    EXPECT_EQ(l.wq.type, type);
    EXPECT_NE(l.wq.packed, nullptr);
    EXPECT_NE(l.w_down.packed, nullptr);
    EXPECT_EQ(rows->weights().layers[0].wq.packed, nullptr);
    for (int threads : {1, 2}) {
      kernels::set_num_threads(threads);
      const auto a = run(*packed), b = run(*rows);
      ASSERT_EQ(a.size(), 4u);
      ASSERT_EQ(a.size(), b.size());
      for (size_t s = 0; s < a.size(); ++s) {
        ASSERT_FALSE(a[s].empty());
        ASSERT_EQ(a[s].size(), b[s].size());
        EXPECT_EQ(0, std::memcmp(a[s].data(), b[s].data(), a[s].size() * sizeof(float)))
            << ggml_type_info(type).name << " step " << s << " threads " << threads;
      }
    }
    kernels::set_num_threads(1);
  }
}

}  // namespace
}  // namespace pagoda
