// cpu::matmul against ref::matmul for every weight type over odd shapes, on
// both ISA paths, and the batch-invariance contract (bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "base/ggml_quant.h"
#include "base/aligned.h"
#include "kernels/api.h"
#include "kernels/backend.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h: make_weight, random_vec, IsaScope, the matchers

const GgmlType kAllTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                              GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

bool quantizes_activations(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::Q8_0 || t == GgmlType::IQ4_NL;
}

std::vector<int64_t> cols_for(GgmlType t) {
  const uint32_t bs = ggml_type_info(t).block_size;
  if (bs == 1) return {1, 3, 17, 31, 33, 255, 257};
  if (bs == 32) return {32, 96, 160, 256, 576};  // 1, 3, 5, 8, 18 blocks: every tail shape
  return {256, 512, 768};
}

// f16 min m of block b of a Q4_1/Q5_1 row (0 for the other types).
double block_min(const WeightView& w, int64_t r, int64_t b) {
  if (w.type != GgmlType::Q4_1 && w.type != GgmlType::Q5_1) return 0.0;
  const uint8_t* blk = static_cast<const uint8_t*>(w.data) + r * w.row_bytes + b * ggml_type_info(w.type).type_size;
  uint16_t h;
  std::memcpy(&h, blk + 2, 2);
  return fp16_to_fp32(h);
}

// Per-output tolerance.
// * Types that quantize x to 8 bits per block of 32 like ggml (d = f16(amax/127),
//   q = round(x * 127/amax)): x_c becomes q_c * d16, off by at most
//   d/2 (rounding) + 127 * |d16 - d| <= amax * (1/254 + 2^-11). A Q4_1/Q5_1 block's
//   min term m * s uses s = f16(d * sum q), off from sum_c x_c by at most
//   32 * amax * (1/254 + 2^-11) too; the other weights are q_w * d_w with
//   |q_w * d_w| <= |w_c| + |m|. Plus float rounding of the per-group accumulation
//   (a few ops per 32 values, each relative 2^-24 of terms bounded by
//   2 * max|w_b| * sum|x_b|), taken as 1e-5 of that.
// * Float-path types: classic dot-product bound K * 2^-24 * sum |w_c x_c|, doubled.
std::vector<double> tolerances(const WeightView& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<double> tol(static_cast<size_t>(n_tokens * w.rows));
  std::vector<float> row(static_cast<size_t>(w.cols));
  const bool q = quantizes_activations(w.type);
  const double per_amax = 1.0001 / 254.0 + 1.001 * 0x1.0p-11;
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, row.data(), w.cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x.data() + t * w.cols;
      double bound = 0;
      if (q) {
        for (int64_t b = 0; b < w.cols / 32; ++b) {
          double amax = 0, wsum = 0, wmax = 0, xsum = 0;
          const double m = std::fabs(block_min(w, r, b));
          for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
            amax = std::max(amax, std::fabs(static_cast<double>(xt[c])));
            wsum += std::fabs(row[c]) + m;
            wmax = std::max(wmax, std::fabs(static_cast<double>(row[c])));
            xsum += std::fabs(xt[c]);
          }
          bound += amax * per_amax * (wsum + 32 * m) + 1e-5 * 2 * (wmax + m) * xsum;
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

// ---- ggml's integer dot products, emulated in double --------------------------------
// Written from ggml's x86 quantize_row_q8_0/q8_1 and ggml_vec_dot_{q4_0,q4_1,q5_0,
// q5_1,q8_0}_q8_{0,1}: the only rounding left in cpu::matmul is float summation.
struct GgmlQ8Block {
  int32_t q[32];
  double d16;  // f16(amax / 127)
  double s16;  // f16(f32(amax / 127) * sum q)  (block_q8_1's s)
};

GgmlQ8Block ggml_quantize_block(const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  GgmlQ8Block b;
  int32_t sum = 0;
  for (int i = 0; i < 32; ++i) {
    b.q[i] = static_cast<int32_t>(std::nearbyint(x[i] * id));  // round half to even (default mode)
    sum += b.q[i];
  }
  b.d16 = fp16_to_fp32(fp32_to_fp16(d));
  b.s16 = fp16_to_fp32(fp32_to_fp16(d * static_cast<float>(sum)));
  return b;
}

// Integer weights of block b: dequantized with d = 1 and m = 0, so Q4_0/Q5_0
// give q - 8 / q - 16 as ggml's dot products use them.
void weight_block_ints(const WeightView& w, int64_t r, int64_t b, int32_t* qw, double* dw, double* mw) {
  const auto& info = ggml_type_info(w.type);
  const uint8_t* blk = static_cast<const uint8_t*>(w.data) + r * w.row_bytes + b * info.type_size;
  std::vector<uint8_t> copy(blk, blk + info.type_size);
  uint16_t dh;
  std::memcpy(&dh, blk, 2);
  *dw = fp16_to_fp32(dh);
  *mw = block_min(w, r, b);
  testing::put_f16(copy.data(), 1.0f);
  if (w.type == GgmlType::Q4_1 || w.type == GgmlType::Q5_1) testing::put_f16(copy.data() + 2, 0.0f);
  float v[32];
  dequantize_row(w.type, copy.data(), v, 32);
  for (int i = 0; i < 32; ++i) qw[i] = static_cast<int32_t>(v[i]);
}

// cpu::matmul of the 8-bit types equals ggml's formula up to float summation:
// y = sum_b d_w * d16_x * sum(q_w * q_x) [+ m_w * s16_x], within 1e-5 of the sum of
// the terms' magnitudes. An f32 d (not rounded to f16) or a different rounding
// of q would miss by ~1e-4 or more.
TEST(Matmul, MatchesGgmlIntegerDotProducts) {
  IsaScope scope("auto");
  uint64_t seed = 300;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                        GgmlType::IQ4_NL}) {
    const int64_t rows = 37, cols = 576, n_tokens = 3;
    auto w = make_weight(type, rows, cols, seed++);
    auto x = random_vec(static_cast<size_t>(n_tokens * cols), seed++);
    for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i % 2 == 0 ? 2.5 : -3.5) * (i == 0 ? 50.8f : 1.0f);
    std::vector<double> want(static_cast<size_t>(n_tokens * rows)), tol(want.size());
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double y = 0, mag = 0;
        for (int64_t b = 0; b < cols / 32; ++b) {
          const GgmlQ8Block xb = ggml_quantize_block(x.data() + t * cols + b * 32);
          int32_t qw[32];
          double dw, mw;
          weight_block_ints(w.view, r, b, qw, &dw, &mw);
          int64_t dot = 0, adot = 0;
          for (int i = 0; i < 32; ++i) {
            dot += static_cast<int64_t>(qw[i]) * xb.q[i];
            adot += std::abs(static_cast<int64_t>(qw[i]) * xb.q[i]);
          }
          // ggml's q8_1 s only enters with a min; Q4_0/Q5_0 carry their offset in qw.
          y += dw * xb.d16 * static_cast<double>(dot) + mw * xb.s16;
          mag += std::fabs(dw * xb.d16) * static_cast<double>(adot) + std::fabs(mw * xb.s16);
        }
        want[t * rows + r] = y;
        tol[t * rows + r] = 1e-5 * mag + 1e-30;
      }
    }
    for (const auto& isa : testing::isas()) {
      ASSERT_TRUE(cpu::set_isa(isa.c_str()));
      std::vector<float> got(want.size());
      cpu::matmul(w.view, x.data(), n_tokens, got.data());
      std::vector<float> wantf(want.begin(), want.end());
      ASSERT_TRUE(WithinTol(got.data(), wantf.data(), tol.data(), got.size()))
          << ggml_type_info(type).name << " isa=" << cpu::isa_name();
    }
  }
}

// Every type x odd shape x token count, checked on every ISA path against one
// reference computation.
TEST(Matmul, MatchesReferenceOverOddShapes) {
  const auto isas = testing::isas();
  IsaScope scope("auto");
  uint64_t seed = 1;
  for (GgmlType type : kAllTypes) {
    // K-quants multiply a q8_K quantization of x (one scale per 256 values);
    // test_kquant.cc checks them against ref with that tolerance.
    if (ggml_type_info(type).block_size == 256) continue;
    for (int64_t cols : cols_for(type)) {
      for (int64_t rows : {1, 3, 17, 31, 33, 255, 257}) {
        for (int64_t n_tokens : {1, 2, 5, 7}) {
          if (rows > 100 && n_tokens > 1 && n_tokens != 5) continue;   // keep the test fast
          if (rows * cols * n_tokens > 700000) continue;
          ASSERT_TRUE(testing::MatchesRefOnEveryIsa(type, rows, cols, n_tokens, &seed, isas, tolerances));
        }
      }
    }
  }
}

// The canonical float sequence of the integer path (matmul_avx2.cc's header,
// the same on AVX-512), transcribed in scalar code: x quantized per block of 32
// as quantize_act does (d = amax / 127, q = round-half-even(x * 127 / amax),
// d16 = f16(d), s = f16(d * sum q) for Q4_1 / Q5_1), the block's exact integer
// sum S_b of w * q (Q4_0 / Q5_0 with their -8 / -16 offsets), and per output
//   P_k = fma(float(S_b), d_w * d16, P_k) [Q4_1 / Q5_1: P_k = fma(m_w, s, P_k)],
//   k = b mod 4, y = (P_0 + P_2) + (P_1 + P_3).
float canonical_q32(GgmlType type, const uint8_t* row, const float* x, int64_t cols) {
  const auto& info = ggml_type_info(type);
  float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(xb[c]));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t q[32], sum = 0;
    for (int c = 0; c < 32; ++c) {
      q[c] = static_cast<int32_t>(std::nearbyint(xb[c] * id));
      sum += q[c];
    }
    const float d16 = fp16_to_fp32(fp32_to_fp16(d));
    const uint8_t* blk = row + b * info.type_size;
    uint16_t dh, mh = 0;
    std::memcpy(&dh, blk, 2);
    const bool has_min = type == GgmlType::Q4_1 || type == GgmlType::Q5_1;
    if (has_min) std::memcpy(&mh, blk + 2, 2);
    int32_t w[32];
    if (type == GgmlType::Q8_0) {
      for (int c = 0; c < 32; ++c) w[c] = static_cast<int8_t>(blk[2 + c]);
    } else {
      const bool five = type == GgmlType::Q5_0 || type == GgmlType::Q5_1;
      const size_t qs = (has_min ? 4 : 2) + (five ? 4 : 0);
      uint32_t qh = 0;
      if (five) std::memcpy(&qh, blk + (has_min ? 4 : 2), 4);
      const int32_t off = type == GgmlType::Q4_0 ? 8 : type == GgmlType::Q5_0 ? 16 : 0;
      for (int c = 0; c < 16; ++c) {
        w[c] = (blk[qs + c] & 0x0F) | static_cast<int32_t>(((qh >> c) & 1u) << 4);
        w[c + 16] = (blk[qs + c] >> 4) | static_cast<int32_t>(((qh >> (c + 16)) & 1u) << 4);
        w[c] -= off;
        w[c + 16] -= off;
      }
    }
    int32_t s_b = 0;
    for (int c = 0; c < 32; ++c) s_b += w[c] * q[c];
    const float dd = fp16_to_fp32(dh) * d16;
    float& acc = p[b % 4];
    acc = std::fma(static_cast<float>(s_b), dd, acc);
    if (has_min) acc = std::fma(fp16_to_fp32(mh), fp16_to_fp32(fp32_to_fp16(d * static_cast<float>(sum))), acc);
  }
  return (p[0] + p[2]) + (p[1] + p[3]);
}

// Every Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 output is exactly the canonical
// sequence above on every ISA the machine has, for token counts that take the
// direct tiles and the panels, odd row counts and every tail of blocks: so the
// paths agree with each other and the ISAs with each other, bit for bit.
TEST(Matmul, Q32OutputsAreTheCanonicalSequence) {
  const auto isas = testing::isas();
  uint64_t seed = 4242;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0}) {
    for (int64_t cols : {32, 96, 160, 256, 576}) {
      const int64_t rows = 37;
      auto w = make_weight(type, rows, cols, seed++);
      for (int64_t n : {1, 3, 7, 8, 19}) {
        const auto x = random_vec(static_cast<size_t>(n * cols), seed++, 3.0);
        std::vector<float> want(static_cast<size_t>(n * rows));
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r)
            want[t * rows + r] = canonical_q32(type, static_cast<const uint8_t*>(w.view.data) + r * w.view.row_bytes,
                                               x.data() + t * cols, cols);
        for (const auto& isa : isas) {
          IsaScope scope(isa);
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            std::vector<float> got(want.size(), -1.0f);
            cpu::matmul(w.view, x.data(), n, got.data());
            ASSERT_TRUE(BitwiseEqual(got.data(), want.data(), want.size()))
                << ggml_type_info(type).name << " cols=" << cols << " n=" << n << " isa=" << isa << " threads=" << threads;
          }
        }
      }
    }
  }
  set_num_threads(1);
}

class MatmulTest : public ::testing::TestWithParam<std::string> {};

// The decode-packed copies (kernels::pack_weight; AVX-512 only) against the
// scalar reference with the same tolerance, direct and staged token counts.
TEST(Matmul, PackedMatchesReference) {
  IsaScope scope("avx2");
  if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "packed weights are read by the AVX-512 path only";
  uint64_t seed = 9000;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0}) {
    for (int64_t rows : {1, 7, 37}) {
      for (int64_t cols : cols_for(type)) {
        auto w = make_weight(type, rows, cols, seed++);
        AlignedBuffer<uint8_t> buf(packed_weight_bytes(w.view));
        ASSERT_GT(buf.size(), 0u);
        pack_weight(w.view, buf.data());
        WeightView pw = w.view;
        pw.packed = buf.data();
        for (int64_t n : {1, 3, 13}) {
          const auto x = random_vec(static_cast<size_t>(n * cols), seed++);
          std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size(), -1.0f);
          ref::matmul(w.view, x.data(), n, want.data());
          cpu::matmul(pw, x.data(), n, got.data());
          const auto tol = tolerances(w.view, x, n);
          ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
              << ggml_type_info(type).name << " rows=" << rows << " cols=" << cols << " n=" << n;
        }
      }
    }
  }
}

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

// y[t, :] of one token is bitwise the same alone, inside batches of 2..64
// tokens at random offsets among random other tokens, and with 1 or 2 threads.
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
      for (int64_t n : {1, 2, 3, 5, 7, 17, 33, 64}) {  // every K-quant tile width (1..8) appears
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
  for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::Q2_K, GgmlType::Q3_K,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    ASSERT_TRUE(testing::ThreadCountInvariant(type, 193, ggml_type_info(type).block_size == 256 ? 1536 : 576, 45));
  }
}

// matmul_multi (one pool launch, each thread a static share of every matrix)
// gives bitwise what separate matmul calls give, for mixed types and row counts
// that do not split evenly, at decode sizes (the fused path) and beyond.
TEST_P(MatmulTest, MultiEqualsSeparateCalls) {
  IsaScope scope(GetParam());
  const int64_t cols = 512;
  struct Spec {
    GgmlType type;
    int64_t rows;
  };
  const Spec specs[] = {{GgmlType::Q4_K, 131}, {GgmlType::Q6_K, 37}, {GgmlType::Q4_0, 64}, {GgmlType::F16, 17}};
  std::vector<testing::RandomWeight> ws;
  uint64_t seed = 77;
  for (const Spec& sp : specs) ws.push_back(make_weight(sp.type, sp.rows, cols, seed++));
  std::vector<const WeightView*> views;
  for (const auto& w : ws) views.push_back(&w.view);
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t n : {1, 2, 4, 9}) {
      const auto x = random_vec(static_cast<size_t>(n * cols), seed++);
      std::vector<std::vector<float>> want(ws.size()), got(ws.size());
      std::vector<float*> ys;
      for (size_t i = 0; i < ws.size(); ++i) {
        want[i].assign(static_cast<size_t>(n * ws[i].view.rows), -1.0f);
        got[i].assign(want[i].size(), -2.0f);
        cpu::matmul(ws[i].view, x.data(), n, want[i].data());
        ys.push_back(got[i].data());
      }
      cpu::matmul_multi(views.data(), static_cast<int>(views.size()), x.data(), n, ys.data());
      for (size_t i = 0; i < ws.size(); ++i)
        ASSERT_TRUE(BitwiseEqual(got[i].data(), want[i].data(), want[i].size()))
            << "matrix " << i << " n_tokens=" << n << " threads=" << threads << " isa=" << cpu::isa_name();
    }
  }
  set_num_threads(2);
}

INSTANTIATE_TEST_SUITE_P(Isa, MatmulTest, ::testing::ValuesIn(testing::isas()), testing::IsaParamName);

}  // namespace
}  // namespace pagoda::kernels
