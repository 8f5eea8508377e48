// cpu::matmul against ref::matmul for every weight type over odd shapes, on
// both ISA paths, and the batch-invariance contract (bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/api.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using testing::BitwiseEqual;
using testing::IsaScope;
using testing::make_weight;
using testing::random_vec;
using testing::WithinTol;

const GgmlType kAllTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

bool quantizes_activations(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::Q8_0;
}

std::vector<int64_t> cols_for(GgmlType t) {
  const uint32_t bs = ggml_type_info(t).block_size;
  if (bs == 1) return {1, 3, 17, 31, 33, 255, 257};
  if (bs == 32) return {32, 96, 160, 256, 576};  // 1, 3, 5, 8, 18 blocks: every tail shape
  return {256, 512, 768};
}

// Per-output tolerance.
// * Types that quantize x to 8 bits per block of 32 (d = amax/127, round to
//   nearest): each x_c moves by at most d_b / 2, so |dy| <= sum_b d_b/2 * sum_{c in b} |w_c|;
//   plus float rounding of the per-group accumulation (a few ops per 32 values,
//   each relative 2^-24 of terms bounded by 2 * max|w_b| * sum|x_b|), taken as 1e-5 of that.
// * Float-path types: classic dot-product bound K * 2^-24 * sum |w_c x_c|, doubled.
std::vector<double> tolerances(const WeightView& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<double> tol(static_cast<size_t>(n_tokens * w.rows));
  std::vector<float> row(static_cast<size_t>(w.cols));
  const bool q = quantizes_activations(w.type);
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, w.cols, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x.data() + t * w.cols;
      double bound = 0;
      if (q) {
        for (int64_t b = 0; b < w.cols / 32; ++b) {
          double amax = 0, wsum = 0, wmax = 0, xsum = 0;
          for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
            amax = std::max(amax, std::fabs(static_cast<double>(xt[c])));
            wsum += std::fabs(row[c]);
            wmax = std::max(wmax, std::fabs(static_cast<double>(row[c])));
            xsum += std::fabs(xt[c]);
          }
          bound += amax / 127.0 / 2.0 * wsum * 1.0001 + 1e-5 * 2 * wmax * xsum;
        }
      } else {
        double s = 0;
        for (int64_t c = 0; c < w.cols; ++c) s += std::fabs(static_cast<double>(row[c]) * xt[c]);
        bound = 2.0 * static_cast<double>(w.cols + 4) * 0x1.0p-24 * s;
      }
      tol[t * w.rows + r] = bound + 1e-30;
    }
  }
  return tol;
}

// Every type x odd shape x token count, checked on every ISA path against one
// reference computation.
TEST(Matmul, MatchesReferenceOverOddShapes) {
  const auto isas = testing::isas();
  IsaScope scope("auto");
  uint64_t seed = 1;
  for (GgmlType type : kAllTypes) {
    for (int64_t cols : cols_for(type)) {
      for (int64_t rows : {1, 3, 17, 31, 33, 255, 257}) {
        for (int64_t n_tokens : {1, 2, 5, 7}) {
          if (rows > 100 && n_tokens > 1 && n_tokens != 5) continue;   // keep the test fast
          if (rows * cols * n_tokens > 700000) continue;
          auto w = make_weight(type, rows, cols, seed++);
          const auto x = random_vec(static_cast<size_t>(n_tokens * cols), seed++);
          std::vector<float> want(static_cast<size_t>(n_tokens * rows));
          ref::matmul(w.view, x.data(), n_tokens, want.data());
          const auto tol = tolerances(w.view, x, n_tokens);
          for (const auto& isa : isas) {
            ASSERT_TRUE(cpu::set_isa(isa.c_str()));
            std::vector<float> got(want.size(), -1.0f);
            cpu::matmul(w.view, x.data(), n_tokens, got.data());
            ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
                << ggml_type_info(type).name << " rows=" << rows << " cols=" << cols << " n_tokens=" << n_tokens
                << " isa=" << cpu::isa_name();
          }
        }
      }
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<std::string> {};

// The tolerance above must not be vacuous: a wrong weight row must fail it.
TEST_P(MatmulTest, ToleranceCatchesAWrongRow) {
  IsaScope scope(GetParam());
  for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16}) {
    const int64_t cols = 256, rows = 8;
    auto w = make_weight(type, rows, cols, 99);
    auto w2 = make_weight(type, rows, cols, 100);  // different weights
    const auto x = random_vec(static_cast<size_t>(cols), 5);
    std::vector<float> want(rows), got(rows);
    ref::matmul(w.view, x.data(), 1, want.data());
    cpu::matmul(w2.view, x.data(), 1, got.data());
    const auto tol = tolerances(w.view, x, 1);
    EXPECT_FALSE(WithinTol(got.data(), want.data(), tol.data(), got.size())) << ggml_type_info(type).name;
  }
}

// y[t, :] of one token is bitwise the same alone, inside batches of 2, 7, 33
// and 64 tokens at random offsets among random other tokens, and with 1 or 2
// threads.
TEST_P(MatmulTest, BatchInvariantBitwise) {
  IsaScope scope(GetParam());
  uint64_t seed = 1000;
  for (GgmlType type : kAllTypes) {
    const int64_t cols = ggml_type_info(type).block_size == 256 ? 512 : (ggml_type_info(type).block_size == 32 ? 576 : 257);
    const int64_t rows = 67;
    auto w = make_weight(type, rows, cols, seed++);
    const auto x0 = random_vec(static_cast<size_t>(cols), seed++);
    std::vector<float> alone(rows);
    set_num_threads(1);
    cpu::matmul(w.view, x0.data(), 1, alone.data());
    Rng rng(seed++);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (int64_t n : {1, 2, 7, 33, 64}) {
        auto x = random_vec(static_cast<size_t>(n * cols), seed++, 3.0);
        const int64_t at = rng.uniform_int(0, n - 1);
        std::copy(x0.begin(), x0.end(), x.begin() + at * cols);
        std::vector<float> y(static_cast<size_t>(n * rows));
        cpu::matmul(w.view, x.data(), n, y.data());
        ASSERT_TRUE(BitwiseEqual(y.data() + at * rows, alone.data(), rows))
            << ggml_type_info(type).name << " n_tokens=" << n << " at=" << at << " threads=" << threads
            << " isa=" << cpu::isa_name();
      }
    }
  }
}

// Same inputs, repeated calls, different thread counts: identical outputs for
// a large GEMM that spans many row chunks and token tiles.
TEST_P(MatmulTest, ThreadCountDoesNotChangeGemm) {
  IsaScope scope(GetParam());
  for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16}) {
    const int64_t rows = 193, cols = 576, n = 45;
    auto w = make_weight(type, rows, cols, 7);
    const auto x = random_vec(static_cast<size_t>(n * cols), 8);
    std::vector<float> y1(static_cast<size_t>(n * rows)), y2(y1.size());
    set_num_threads(1);
    cpu::matmul(w.view, x.data(), n, y1.data());
    set_num_threads(2);
    cpu::matmul(w.view, x.data(), n, y2.data());
    ASSERT_TRUE(BitwiseEqual(y1.data(), y2.data(), y1.size())) << ggml_type_info(type).name;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, MatmulTest, ::testing::ValuesIn(testing::isas()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Hand-built blocks with known values check ref's dequantizers against ggml's layout.
TEST(Dequantize, KnownBlocks) {
  {  // Q4_0: d = 0.5, byte j = (lo = j % 16, hi = 15 - j % 16)
    BlockQ4_0 b{};
    b.d = fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float y[32];
    dequantize_row(GgmlType::Q4_0, &b, 32, y);
    EXPECT_EQ(y[0], -4.0f);    // (0 - 8) * 0.5
    EXPECT_EQ(y[15], 3.5f);    // (15 - 8) * 0.5
    EXPECT_EQ(y[16], 3.5f);    // hi nibble of byte 0 = 15
    EXPECT_EQ(y[31], -4.0f);
  }
  {  // Q4_1: d = 0.25, m = -1
    BlockQ4_1 b{};
    b.d = fp32_to_fp16(0.25f);
    b.m = fp32_to_fp16(-1.0f);
    b.qs[3] = 0x4A;  // element 3 = 10, element 19 = 4
    float y[32];
    dequantize_row(GgmlType::Q4_1, &b, 32, y);
    EXPECT_EQ(y[3], 1.5f);
    EXPECT_EQ(y[19], 0.0f);
    EXPECT_EQ(y[0], -1.0f);
  }
  {  // Q5_0: high bit of element 2 and element 18
    BlockQ5_0 b{};
    b.d = fp32_to_fp16(1.0f);
    const uint32_t qh = (1u << 2) | (1u << 18);
    std::memcpy(b.qh, &qh, 4);
    b.qs[2] = 0x31;
    float y[32];
    dequantize_row(GgmlType::Q5_0, &b, 32, y);
    EXPECT_EQ(y[2], 1.0f);    // (1 | 16) - 16
    EXPECT_EQ(y[18], 3.0f);   // (3 | 16) - 16
    EXPECT_EQ(y[0], -16.0f);
  }
  {  // Q8_0
    BlockQ8_0 b{};
    b.d = fp32_to_fp16(2.0f);
    b.qs[5] = -7;
    float y[32];
    dequantize_row(GgmlType::Q8_0, &b, 32, y);
    EXPECT_EQ(y[5], -14.0f);
    EXPECT_EQ(y[6], 0.0f);
  }
  {  // Q6_K: element 0 uses ql[0] low nibble, qh[0] bits 0-1, scale[0]
    BlockQ6_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.ql[0] = 0x05;
    b.qh[0] = 0x02;  // high bits of element 0 = 2 -> q = 5 | 32 = 37 - 32 = 5
    b.scales[0] = 3;
    float y[256];
    dequantize_row(GgmlType::Q6_K, &b, 256, y);
    EXPECT_EQ(y[0], 7.5f);  // 0.5 * 3 * 5
    EXPECT_EQ(y[1], 0.5f * 3 * -32);
  }
  {  // Q4_K: sub-block 0 scale 2 min 1; sub-block 1 (high nibbles) scale 4 min 0
    BlockQ4_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(0.5f);
    b.scales[0] = 2;
    b.scales[4] = 1;
    b.scales[1] = 4;
    b.qs[0] = 0x73;
    float y[256];
    dequantize_row(GgmlType::Q4_K, &b, 256, y);
    EXPECT_EQ(y[0], 2.0f * 3 - 0.5f);
    EXPECT_EQ(y[32], 4.0f * 7);
  }
}

}  // namespace
}  // namespace pagoda::kernels
