// The K-quant integer matmul paths (Q2_K..Q6_K, IQ4_XS x q8_K activations) of
// cpu::matmul: the q8_K quantizer bit for bit against ggml's
// quantize_row_q8_K_ref (hand-computed bytes and a scalar emulation), the
// integer dot products against an exact emulation, cpu vs ref over odd shapes
// on both ISAs, and bitwise batch invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/fp16.h"
#include "base/rng.h"
#include "base/ggml_quant.h"
#include "kernels/api.h"
#include "kernels/cpu/kquant.h"
#include "kernels/kernel_test_util.h"
#include "kernels/kpack_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h: make_weight, random_vec, IsaScope, the matchers

const GgmlType kKTypes[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS};

// Byte offsets of a super-block's f16 d and dmin (-1: the type has no dmin).
int d_offset(GgmlType t) {
  return t == GgmlType::Q6_K ? 208 : t == GgmlType::Q3_K ? 108 : t == GgmlType::Q2_K ? 80 : 0;
}
int dmin_offset(GgmlType t) {
  return t == GgmlType::Q6_K || t == GgmlType::Q3_K || t == GgmlType::IQ4_XS ? -1 : t == GgmlType::Q2_K ? 82 : 2;
}

// ---- ggml's quantize_row_q8_K_ref, written out in scalar code ------------------
struct Q8K {
  std::vector<int32_t> q;      // [cols]
  std::vector<int32_t> bsums;  // [cols / 16]
  std::vector<float> d;        // [cols / 256]
  std::vector<float> amax;     // [cols / 256]
};

Q8K ggml_q8k(const float* x, int64_t cols) {
  Q8K r;
  r.q.resize(static_cast<size_t>(cols));
  r.bsums.resize(static_cast<size_t>(cols / 16));
  for (int64_t b = 0; b < cols / 256; ++b) {
    const float* s = x + b * 256;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(s[j]) > amax) {
        amax = std::fabs(s[j]);
        max = s[j];
      }
    r.amax.push_back(amax);
    if (amax == 0.0f) {
      r.d.push_back(0.0f);
      continue;  // q and bsums stay 0
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
      const float p = iscale * s[j];  // rounded to f32 first, as ggml's nearest_int(iscale*x) sees it
      r.q[b * 256 + j] = std::min(127, static_cast<int32_t>(std::nearbyint(p)));  // half to even
    }
    for (int j = 0; j < 16; ++j) {
      int32_t sum = 0;
      for (int i = 0; i < 16; ++i) sum += r.q[b * 256 + 16 * j + i];
      r.bsums[b * 16 + j] = sum;
    }
    r.d.push_back(1.0f / iscale);
  }
  return r;
}

// Reads back one token's q8_K records written by cpu::detail::quantize_act_k.
Q8K read_records(const uint8_t* rec, int64_t cols) {
  Q8K r;
  for (int64_t b = 0; b < cols / 256; ++b, rec += cpu::detail::kActKBytes) {
    for (int j = 0; j < 256; ++j) r.q.push_back(static_cast<int8_t>(rec[j]));
    for (int j = 0; j < 16; ++j) {
      int16_t s;
      std::memcpy(&s, rec + cpu::detail::kActKBsums + 2 * j, 2);
      r.bsums.push_back(s);
    }
    float d;
    std::memcpy(&d, rec + cpu::detail::kActKD, 4);
    r.d.push_back(d);
  }
  return r;
}

Q8K quantize_with_kernel(const std::vector<float>& x) {
  const int64_t cols = static_cast<int64_t>(x.size());
  AlignedBuffer<uint8_t> buf;
  buf.resize(static_cast<size_t>(cols / 256) * cpu::detail::kActKBytes);
  cpu::detail::quantize_act_k(x.data(), 1, cols, buf.data());
  return read_records(buf.data(), cols);
}

// Hand-computed bytes for one block: the first value of largest |x| is
// x[1] = -2 (x[4] = +2 comes later), so iscale = -127 / -2 = 63.5 and
// d = 1 / 63.5 = 0x1.020408p-6. 1.0 * 63.5 = 63.5 is a tie and rounds to the
// even 64. A second block with max = -127/64 has iscale = 64 exactly:
// 2.5 -> 2 and 3.5 -> 4 (half to even), -2.5 -> -2. A third block is all zero.
TEST(KQuant, QuantizerKnownBytes) {
  std::vector<float> x(768, 0.0f);
  x[0] = 1.0f;     // 63.5 -> 64
  x[1] = -2.0f;    // -127
  x[2] = 0.5f;     // 31.75 -> 32
  x[3] = -1.0f;    // -63.5 -> -64
  x[4] = 2.0f;     // 127
  x[5] = -0.25f;   // -15.875 -> -16
  x[17] = 0.75f;   // 47.625 -> 48
  x[255] = 0.125f; // 7.9375 -> 8
  x[256 + 0] = -1.984375f;         // max = -127/64 -> -127 * ... = -127
  x[256 + 1] = 2.5f / 64.0f;       // 2.5 -> 2
  x[256 + 2] = 3.5f / 64.0f;       // 3.5 -> 4
  x[256 + 3] = -2.5f / 64.0f;      // -2.5 -> -2
  x[256 + 16] = 1.0f;              // 64
  const Q8K got = quantize_with_kernel(x);
  const int32_t want_q0[] = {64, -127, 32, -64, 127, -16};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(got.q[j], want_q0[j]) << "index " << j;
  EXPECT_EQ(got.q[17], 48);
  EXPECT_EQ(got.q[255], 8);
  EXPECT_EQ(got.q[6], 0);
  EXPECT_EQ(got.bsums[0], 64 - 127 + 32 - 64 + 127 - 16);
  EXPECT_EQ(got.bsums[1], 48);
  EXPECT_EQ(got.bsums[15], 8);
  EXPECT_EQ(got.d[0], 0x1.020408p-6f);
  EXPECT_EQ(got.q[256], -127);
  EXPECT_EQ(got.q[257], 2);
  EXPECT_EQ(got.q[258], 4);
  EXPECT_EQ(got.q[259], -2);
  EXPECT_EQ(got.q[272], 64);
  EXPECT_EQ(got.bsums[16], -127 + 2 + 4 - 2);
  EXPECT_EQ(got.bsums[17], 64);
  EXPECT_EQ(got.d[1], 0x1.0p-6f);
  for (int j = 512; j < 768; ++j) ASSERT_EQ(got.q[j], 0);
  for (int j = 32; j < 48; ++j) EXPECT_EQ(got.bsums[j], 0);
  EXPECT_EQ(got.d[2], 0.0f);
}

// Random rows (with repeated extremes of both signs, ties and zeros) quantize
// bit for bit like the scalar emulation of ggml's reference.
TEST(KQuant, QuantizerMatchesGgmlRef) {
  Rng rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t cols = 256 * (1 + trial % 3);
    auto x = random_vec(static_cast<size_t>(cols), 1000 + trial, trial % 2 == 0 ? 1.0 : 1e-3);
    if (trial % 4 == 1) {  // the largest |x| twice, opposite signs
      const int64_t a = rng.uniform_int(0, cols - 1), b = rng.uniform_int(0, cols - 1);
      x[a] = 9.0f;
      x[b] = -9.0f;
    }
    if (trial % 5 == 2) {  // exact ties: max = -127/64 makes iscale = 64
      for (int64_t c = 0; c < cols; ++c) x[c] = static_cast<float>(rng.uniform_int(-200, 200)) * 0.5f / 64.0f;
      for (int64_t b = 0; b < cols / 256; ++b) x[b * 256 + 7] = -1.984375f;
    }
    if (trial % 7 == 3) std::fill(x.begin(), x.begin() + 256, 0.0f);
    const Q8K want = ggml_q8k(x.data(), cols);
    const Q8K got = quantize_with_kernel(x);
    ASSERT_EQ(got.q, want.q) << "trial " << trial;
    ASSERT_EQ(got.bsums, want.bsums) << "trial " << trial;
    for (size_t b = 0; b < want.d.size(); ++b)
      ASSERT_TRUE(testing::bits_equal(got.d[b], want.d[b])) << "trial " << trial << " block " << b;
  }
}

// ---- Weights as integers ------------------------------------------------------------
// For each value c of row r: sq[c] = scale * quant (Q6_K: scale * (quant - 32), Q3_K:
// (scale - 32) * (quant - 4), IQ4_XS: (scale - 32) * codebook[quant]) and mn[c] = the
// sub-block's min (Q2_K/Q4_K/Q5_K; 0 for Q3_K/Q6_K/IQ4_XS), read through ref's
// dequantizer with the block's d/dmin patched to 1/0 and 0/1. dw, dmin: [nb].
struct IntRow {
  std::vector<int32_t> sq, mn;
  std::vector<double> dw, dmin;
};

IntRow int_row(const WeightView& w, int64_t r) {
  const auto& info = ggml_type_info(w.type);
  const int64_t nb = w.cols / 256;
  IntRow out;
  out.sq.resize(static_cast<size_t>(w.cols));
  out.mn.assign(static_cast<size_t>(w.cols), 0);
  float v[256];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = static_cast<const uint8_t*>(w.data) + r * w.row_bytes + b * info.type_size;
    std::vector<uint8_t> copy(blk, blk + info.type_size);
    const int doff = d_offset(w.type), moff = dmin_offset(w.type);
    uint16_t h;
    std::memcpy(&h, blk + doff, 2);
    out.dw.push_back(fp16_to_fp32(h));
    testing::put_f16(copy.data() + doff, 1.0f);
    if (moff >= 0) {
      std::memcpy(&h, blk + moff, 2);
      out.dmin.push_back(fp16_to_fp32(h));
      testing::put_f16(copy.data() + moff, 0.0f);
    } else {
      out.dmin.push_back(0.0);
    }
    dequantize_row(w.type, copy.data(), v, 256);
    for (int i = 0; i < 256; ++i) out.sq[b * 256 + i] = static_cast<int32_t>(v[i]);
    if (moff >= 0) {
      testing::put_f16(copy.data() + doff, 0.0f);
      testing::put_f16(copy.data() + moff, 1.0f);
      dequantize_row(w.type, copy.data(), v, 256);
      for (int i = 0; i < 256; ++i) out.mn[b * 256 + i] = static_cast<int32_t>(-v[i]);
    }
  }
  return out;
}

// cpu::matmul of a K-quant weight equals ggml's integer formula up to float
// summation: y = sum_b d_w * d_x * sum(sq * q_x) - dmin_w * d_x * sum(mn * q_x).
// The kernel's float error: exact int32 sums, one product d_w * d_x and one
// fma per block (AVX2: 8 lanes and 3 adds at the end): within (nb + 8) * 2^-22
// of the sum of the terms' magnitudes. A wrong quant, scale, min or activation byte is off
// by whole integer units times d_w * d_x, far beyond that.
TEST(KQuant, MatchesIntegerFormula) {
  if (const char* e = std::getenv("PAGODA_KQUANT_FALLBACK"); e != nullptr && std::strcmp(e, "1") == 0)
    GTEST_SKIP() << "PAGODA_KQUANT_FALLBACK=1: K-quants multiply f32 activations, not the integer formula";
  const auto isas = testing::isas();
  IsaScope scope("auto");
  uint64_t seed = 500;
  for (GgmlType type : kKTypes) {
    for (int64_t cols : {256, 768, 2304}) {
      const int64_t rows = 21, n_tokens = 5;
      auto w = make_weight(type, rows, cols, seed++);
      const auto x = random_vec(static_cast<size_t>(n_tokens * cols), seed++);
      const int64_t nb = cols / 256;
      std::vector<float> want(static_cast<size_t>(n_tokens * rows));
      std::vector<double> tol(want.size());
      for (int64_t r = 0; r < rows; ++r) {
        const IntRow ir = int_row(w.view, r);
        for (int64_t t = 0; t < n_tokens; ++t) {
          const Q8K q = ggml_q8k(x.data() + t * cols, cols);
          double y = 0, mag = 0;
          for (int64_t b = 0; b < nb; ++b) {
            int64_t dot = 0, adot = 0, mdot = 0, amdot = 0;
            for (int64_t c = b * 256; c < b * 256 + 256; ++c) {
              dot += static_cast<int64_t>(ir.sq[c]) * q.q[c];
              adot += std::abs(static_cast<int64_t>(ir.sq[c]) * q.q[c]);
              mdot += static_cast<int64_t>(ir.mn[c]) * q.q[c];
              amdot += std::abs(static_cast<int64_t>(ir.mn[c]) * q.q[c]);
            }
            const double dx = q.d[b];
            y += ir.dw[b] * dx * static_cast<double>(dot) - ir.dmin[b] * dx * static_cast<double>(mdot);
            mag += std::fabs(ir.dw[b] * dx) * static_cast<double>(adot) +
                   std::fabs(ir.dmin[b] * dx) * static_cast<double>(amdot);
          }
          want[t * rows + r] = static_cast<float>(y);
          tol[t * rows + r] = static_cast<double>(nb + 8) * 0x1.0p-22 * mag + std::fabs(y) * 0x1.0p-24 + 1e-30;
        }
      }
      for (const auto& isa : isas) {
        ASSERT_TRUE(cpu::set_isa(isa.c_str()));
        std::vector<float> got(want.size());
        cpu::matmul(w.view, x.data(), n_tokens, got.data());
        ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
            << ggml_type_info(type).name << " cols=" << cols << " isa=" << cpu::isa_name();
      }
    }
  }
}

// ---- cpu vs ref ---------------------------------------------------------------------
// Tolerance against ref::matmul (f32 dequantized weights, f32 x, double sums):
// * x is replaced by q * d_x per 256 values: |x - q d_x| <= |d_x| (1/2 + 127 * 2^-24)
//   + |x| 2^-24 <= amax * (1/254 + 2^-20) (d_x = 1/iscale ~ amax/127), and each
//   weight value is at most W = |d_w sc q| + |dmin_w m| in magnitude;
// * ref's dequantized weight rounds 2-3 times (<= 2^-22 W) and the kernel's float
//   sequence adds <= (nb + 8) 2^-22 of the terms W |q_x d_x|: both covered by
//   1e-5 * sum W (|x| + amax/127).
std::vector<double> ref_tolerances(const WeightView& w, const std::vector<float>& x, int64_t n_tokens) {
  const double per_amax = 1.0001 / 254.0 + 0x1.0p-20;
  const int64_t nb = w.cols / 256;
  std::vector<Q8K> qx;
  for (int64_t t = 0; t < n_tokens; ++t) qx.push_back(ggml_q8k(x.data() + t * w.cols, w.cols));
  std::vector<double> tol(static_cast<size_t>(n_tokens * w.rows));
  std::vector<double> wabs(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    const IntRow ir = int_row(w, r);
    for (int64_t c = 0; c < w.cols; ++c)
      wabs[c] = std::fabs(ir.dw[c / 256] * ir.sq[c]) + std::fabs(ir.dmin[c / 256] * ir.mn[c]);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x.data() + t * w.cols;
      double bound = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const double amax = qx[t].amax[b];
        double wsum = 0, wx = 0;
        for (int64_t c = b * 256; c < b * 256 + 256; ++c) {
          wsum += wabs[c];
          wx += wabs[c] * (std::fabs(static_cast<double>(xt[c])) + amax / 127.0);
        }
        bound += amax * per_amax * wsum + 1e-5 * wx;
      }
      tol[t * w.rows + r] = bound + 1e-30;
    }
  }
  return tol;
}

// The brief's grid: every K type x rows x cols x token count, on every ISA.
TEST(KQuant, MatchesReferenceOverOddShapes) {
  const auto isas = testing::isas();
  IsaScope scope("auto");
  uint64_t seed = 1;
  for (GgmlType type : kKTypes) {
    for (int64_t cols : {256, 512, 768, 2304}) {
      for (int64_t rows : {1, 3, 17, 31, 33, 255, 257}) {
        for (int64_t n_tokens : {1, 2, 3, 4, 5, 17, 64}) {
          ASSERT_TRUE(testing::MatchesRefOnEveryIsa(type, rows, cols, n_tokens, &seed, isas, ref_tolerances));
        }
      }
    }
  }
}

class KQuantIsa : public ::testing::TestWithParam<std::string> {};

// The load-time packed copy (kernels::pack_weight: every K type on the
// AVX-512 path) against the scalar reference, few-token and GEMM paths.
// (test_kpack.cc: bitwise equal to the GGUF rows.)
TEST(KQuant, PackedCopyMatchesReference) {
  if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "K-quants are packed for the AVX-512 path only";
  IsaScope scope("avx512-vnni");
  uint64_t seed = 900;
  for (GgmlType type : kKTypes) {
    for (int64_t rows : {3, 33}) {
      for (int64_t n_tokens : {1, 2, 5, 8, 17, 64}) {
        const int64_t cols = 768;
        const KPacked k = make_packed(type, rows, cols, seed++);
        ASSERT_GT(k.copy.size(), 0u);
        const auto x = random_vec(static_cast<size_t>(n_tokens * cols), seed++);
        std::vector<float> want(static_cast<size_t>(n_tokens * rows)), got(want.size(), -1.0f);
        ref::matmul(k.src.view, x.data(), n_tokens, want.data());  // the GGUF rows
        cpu::matmul(k.view, x.data(), n_tokens, got.data());       // the packed copy
        const auto tol = ref_tolerances(k.src.view, x, n_tokens);
        ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
            << ggml_type_info(type).name << " rows=" << rows << " n_tokens=" << n_tokens;
      }
    }
  }
}

// The tolerance above is not vacuous: other weights of the same kind fail it.
TEST_P(KQuantIsa, ToleranceCatchesAWrongRow) {
  IsaScope scope(GetParam());
  for (GgmlType type : kKTypes) {
    const int64_t cols = 2304, rows = 8;
    auto w = make_weight(type, rows, cols, 99);
    auto w2 = make_weight(type, rows, cols, 100);
    const auto x = random_vec(static_cast<size_t>(cols), 5);
    std::vector<float> want(rows), got(rows);
    ref::matmul(w.view, x.data(), 1, want.data());
    cpu::matmul(w2.view, x.data(), 1, got.data());
    const auto tol = ref_tolerances(w.view, x, 1);
    int caught = 0;
    for (int64_t r = 0; r < rows; ++r) caught += std::fabs(got[r] - want[r]) > tol[r];
    EXPECT_GE(caught, rows / 2) << ggml_type_info(type).name;
  }
}

// Batch and thread-count invariance of the K-quant paths: Matmul.BatchInvariantBitwise and
// Matmul.ThreadCountDoesNotChangeGemm (test_matmul.cc) cover every weight type, K-quants included
// (67 rows = 4 chunks of 16 + 3, n_tokens on both sides of the AVX-512 GEMM threshold of 4).

// Row position: the AVX-512 path works on chunks of 16 rows (the few-token path
// reduces 16 rows at once, the GEMM path repacks 16 rows interleaved) and pads the
// last chunk. A row's outputs must not depend on where the chunk boundaries fall
// nor on n_tokens: views of the same matrix starting at rows 0, 5, 16, 21 (so each
// row lands at several chunk positions, in full and in short chunks) give bitwise
// the same y as the first token alone, for token counts below and above the GEMM
// threshold.
TEST_P(KQuantIsa, RowPositionAndTokenCountInvariantBitwise) {
  IsaScope scope(GetParam());
  uint64_t seed = 7000;
  for (GgmlType type : kKTypes) {
    const int64_t rows = 16 * 3 + 5, cols = 768;
    auto w = make_weight(type, rows, cols, seed++);
    const auto x = random_vec(static_cast<size_t>(20 * cols), seed++, 2.0);
    std::vector<float> alone(static_cast<size_t>(rows));
    cpu::matmul(w.view, x.data(), 1, alone.data());
    for (int64_t first : {0, 5, 16, 21}) {
      WeightView v = w.view;
      v.data = static_cast<const uint8_t*>(w.view.data) + first * w.view.row_bytes;
      v.rows = rows - first;
      for (int64_t n : {1, 2, 3, 4, 9, 20}) {
        std::vector<float> y(static_cast<size_t>(n * v.rows));
        cpu::matmul(v, x.data(), n, y.data());
        ASSERT_TRUE(BitwiseEqual(y.data(), alone.data() + first, v.rows))
            << ggml_type_info(type).name << " first=" << first << " n_tokens=" << n << " isa=" << cpu::isa_name();
        // the other tokens against their own single-token results
        std::vector<float> single(static_cast<size_t>(v.rows));
        for (int64_t t = 1; t < n; t += 3) {
          cpu::matmul(v, x.data() + t * cols, 1, single.data());
          ASSERT_TRUE(BitwiseEqual(y.data() + t * v.rows, single.data(), v.rows))
              << ggml_type_info(type).name << " first=" << first << " n_tokens=" << n << " token=" << t;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, KQuantIsa, ::testing::ValuesIn(testing::isas()), testing::IsaParamName);

}  // namespace
}  // namespace pagoda::kernels
