// Decode-packed weights and resident memory (issue 22): after Model::load packs
// the matrices of a ~100 MB synth model (kernels::pack_weight; a Q4_0 file, a
// Q5_0 file, a Q4_K_M file, whose Q4_K and Q6_K matrices take the K-quant layout,
// and a Q3_K file) and gives
// the mapped originals' pages back (MADV_DONTNEED), the process holds about
// one copy of the weights: VmRSS grows by at most file + 64 MiB (no KV cache is
// allocated here). Without the release it would grow by about two copies
// (the mapping read while packing, plus the packed copy): more than the bound,
// because the file is bigger than 64 MiB. Skipped where the AVX-512 path (the
// only one that packs) is not available.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "gguf/synth.h"
#include "kernels/api.h"
#include "model/model.h"

namespace pagoda::model {
namespace {

int64_t vm_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmRSS:   1234 kB"
  return -1;
}

void expect_one_copy(GgmlType type, bool q4_k_m, int n_layer = 10) {
  gguf::SynthOptions opt;
  opt.shape.name = "pack-rss";
  opt.shape.arch = "llama";
  opt.shape.pre = "smollm";
  opt.shape.n_embd = 1024;
  opt.shape.n_layer = n_layer;
  opt.shape.n_head = 16;
  opt.shape.n_head_kv = 16;
  opt.shape.n_ff = 4096;
  opt.shape.n_vocab = 4096;
  opt.shape.n_ctx = 256;
  opt.type = type;
  opt.q4_k_m = q4_k_m;
  const std::string path = ::testing::TempDir() + "/pagoda_pack_rss_" + ggml_type_info(type).name + "_" +
                           std::to_string(::getpid()) + ".gguf";  // concurrent runs do not clash
  {
    const Status s = gguf::synth_model_file(opt, path);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const int64_t file = st.st_size;
  ASSERT_GT(file, int64_t{90} << 20);  // the bound below only discriminates for a file > 64 MiB

  const int64_t before = vm_rss_bytes();
  ASSERT_GT(before, 0);
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.message();
  const int64_t after = vm_rss_bytes();
  std::remove(path.c_str());

  const auto& w = (*m)->weights();
  ASSERT_NE(w.packed, nullptr);
  EXPECT_EQ(w.packed->matrices, 1u + 7u * static_cast<size_t>(n_layer));  // the tied output/embedding + 7 per layer
  for (const LayerWeights& l : w.layers) {
    EXPECT_NE(l.wq.packed, nullptr);
    EXPECT_NE(l.w_down.packed, nullptr);
  }
  EXPECT_EQ(w.token_embd.packed, w.output.packed);  // tied: one copy
  const auto packed = static_cast<int64_t>(w.packed->buf.size());
  std::printf("file %.1f MiB, packed %.1f MiB, released %.1f MiB, VmRSS +%.1f MiB over the load\n", file / 1048576.0,
              packed / 1048576.0, static_cast<double>(w.packed->released_bytes) / 1048576.0,
              (after - before) / 1048576.0);
  EXPECT_GT(packed, file * 9 / 10);  // the packed copy is about the file's size
  // Nearly all of it given back (whole pages inside each matrix).
  EXPECT_GT(static_cast<int64_t>(w.packed->released_bytes), packed * 9 / 10);
  // The measure is real: the packed copy itself is resident.
  EXPECT_GE(after - before, packed * 9 / 10);
  EXPECT_LE(after - before, file + (int64_t{64} << 20))
      << "VmRSS grew by " << (after - before) / (1 << 20) << " MiB for a " << file / (1 << 20) << " MiB file";
}

TEST(PackRss, LoadedModelHoldsOneCopyOfItsWeights) {
  if (!kernels::cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "only the AVX-512 path packs weights";
  kernels::cpu::set_isa("auto");
  expect_one_copy(GgmlType::Q4_0, false);
}

// Q5_0 (its tied output/embedding is Q8_0, as in llama.cpp's files).
TEST(PackRss, Q5ModelHoldsOneCopyOfItsWeights) {
  if (!kernels::cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "only the AVX-512 path packs weights";
  kernels::cpu::set_isa("auto");
  expect_one_copy(GgmlType::Q5_0, false);
}

TEST(PackRss, KQuantModelHoldsOneCopyOfItsWeights) {
  if (!kernels::cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "only the AVX-512 path packs weights";
  kernels::cpu::set_isa("auto");
  expect_one_copy(GgmlType::Q4_K, true);
}

// Q3_K (session 10): 14 layers, so that the smaller file is still > 90 MiB.
TEST(PackRss, Q3KModelHoldsOneCopyOfItsWeights) {
  if (!kernels::cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "only the AVX-512 path packs weights";
  kernels::cpu::set_isa("auto");
  expect_one_copy(GgmlType::Q3_K, false, 14);
}

}  // namespace
}  // namespace pagoda::model
