// The Hadamard rotation of K/V rows below 8 bits (issue 39, base/kv_dtype.h):
// hadamard_rotate is llama.cpp's Sylvester matrix scaled to be orthonormal, its
// own inverse, block by block; which types and block sizes rotate; and why it
// exists: on rows with outlier channels, 4/5-bit attention with the rotation is
// 1.7-3x closer to the f32 attention than without it (q4_1 the least).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/kv_dtype.h"
#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h: random_vec

// H x / sqrt(n) by the definition, in double: H[i][j] = (-1)^popcount(i & j).
std::vector<double> hadamard_by_definition(const float* x, int32_t n) {
  std::vector<double> y(static_cast<size_t>(n), 0.0);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < n; ++j) y[i] += (std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0 : 1.0) * x[j];
    y[i] /= std::sqrt(static_cast<double>(n));
  }
  return y;
}

TEST(HadamardRotate, MatchesTheMatrixBlockByBlock) {
  for (int32_t block : {1, 2, 8, 64, 128, 256}) {
    SCOPED_TRACE(block);
    const int64_t n = 3 * static_cast<int64_t>(block);
    const std::vector<float> x = random_vec(static_cast<size_t>(n), 11 + block);
    std::vector<float> y = x;
    hadamard_rotate(y.data(), n, block);
    for (int64_t b = 0; b < n; b += block) {  // each block on its own: no mixing across blocks
      const std::vector<double> want = hadamard_by_definition(x.data() + b, block);
      for (int32_t i = 0; i < block; ++i) ASSERT_NEAR(y[b + i], want[i], 2e-5) << "block at " << b << ", i " << i;
    }
  }
}

TEST(HadamardRotate, OrthonormalAndSelfInverse) {
  for (int32_t block : {64, 128, 256}) {
    SCOPED_TRACE(block);
    const std::vector<float> a = random_vec(static_cast<size_t>(block), 3), b = random_vec(static_cast<size_t>(block), 4);
    std::vector<float> ra = a, rb = b;
    hadamard_rotate(ra.data(), block, block);
    hadamard_rotate(rb.data(), block, block);
    double dot = 0, rdot = 0, norm = 0, rnorm = 0;
    for (int32_t i = 0; i < block; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      rdot += static_cast<double>(ra[i]) * rb[i];
      norm += static_cast<double>(a[i]) * a[i];
      rnorm += static_cast<double>(ra[i]) * ra[i];
    }
    EXPECT_NEAR(rdot, dot, 1e-4 * block);  // inner products (attention scores) are kept
    EXPECT_NEAR(rnorm, norm, 1e-4 * block);
    EXPECT_GT(std::abs(ra[0] - a[0]) + std::abs(ra[1] - a[1]), 1e-3);  // it does move the vector
    hadamard_rotate(ra.data(), block, block);  // H H = I
    for (int32_t i = 0; i < block; ++i) ASSERT_NEAR(ra[i], a[i], 1e-5) << i;
  }
  // Powers of four: the scale is exact, so a one-hot vector maps to +-1/sqrt(n) exactly.
  std::vector<float> e(64, 0.0f);
  e[5] = 1.0f;
  hadamard_rotate(e.data(), 64, 64);
  for (int32_t i = 0; i < 64; ++i) EXPECT_EQ(std::abs(e[i]), 0.125f) << i;
  EXPECT_EQ(e[0], 0.125f);
  EXPECT_EQ(e[1], -0.125f);  // popcount(1 & 5) = 1
  EXPECT_EQ(e[4], -0.125f);  // popcount(4 & 5) = 1
  EXPECT_EQ(e[5], 0.125f);   // popcount(5 & 5) = 2
}

TEST(KvRotation, TypesAndBlockSizes) {
  for (KvDtype d : kAllKvDtypes) {
    const bool want = d == KvDtype::Q4_0 || d == KvDtype::Q4_1 || d == KvDtype::IQ4_NL || d == KvDtype::Q5_0 ||
                      d == KvDtype::Q5_1;
    EXPECT_EQ(kv_dtype_rotated(d), want) << kv_dtype_name(d);  // f32, f16, bf16, q8_0: rows as before
    EXPECT_EQ(kv_rot_block_k(d, 64), want ? 64 : 0) << kv_dtype_name(d);
    EXPECT_EQ(kv_rot_block_v(d, 256), want ? 64 : 0) << kv_dtype_name(d);
  }
  // K: the largest power of two >= 64 dividing head_dim; V: 64; none unless head_dim % 64 == 0.
  EXPECT_EQ(kv_rot_block_k(KvDtype::Q4_0, 128), 128);
  EXPECT_EQ(kv_rot_block_k(KvDtype::Q4_0, 256), 256);
  EXPECT_EQ(kv_rot_block_k(KvDtype::Q4_0, 192), 64);
  EXPECT_EQ(kv_rot_block_k(KvDtype::Q4_0, 320), 64);
  EXPECT_EQ(kv_rot_block_v(KvDtype::Q4_0, 128), 64);
  for (int32_t hd : {8, 32, 48, 96, 80}) {
    EXPECT_EQ(kv_rot_block_k(KvDtype::Q4_0, hd), 0) << hd;
    EXPECT_EQ(kv_rot_block_v(KvDtype::Q4_0, hd), 0) << hd;
  }
}

// Attention of the last n_q of n_keys tokens of one sequence (block size 16),
// K/V stored as `types`; with rotate, as model/blocks.cc does it: Q and K rotated
// (K's block), V rotated before the store and the output after (V's block).
std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                             int32_t n_heads, int32_t n_kv, int32_t hd, int32_t n_keys, int32_t n_q, KvTypes types,
                             bool rotate) {
  constexpr int32_t bs = 16;
  const int64_t row = static_cast<int64_t>(n_kv) * hd, qrow = static_cast<int64_t>(n_heads) * hd;
  const int32_t pages = (n_keys + bs - 1) / bs;
  std::vector<float> qr = q, kr = k, vr = v;
  const int32_t rk = rotate ? kv_rot_block_k(types.k, hd) : 0, rv = rotate ? kv_rot_block_v(types.v, hd) : 0;
  if (rk > 0) {
    hadamard_rotate(qr.data(), static_cast<int64_t>(qr.size()), rk);
    hadamard_rotate(kr.data(), static_cast<int64_t>(kr.size()), rk);
  }
  if (rv > 0) hadamard_rotate(vr.data(), static_cast<int64_t>(vr.size()), rv);
  KvLayerView kv{nullptr, nullptr, types.k, bs, n_kv, hd, kv_row_bytes(types.k, row), 0, types.v,
                 kv_row_bytes(types.v, row)};
  std::vector<uint8_t> kpool(static_cast<size_t>(pages) * bs * kv.row_bytes), vpool(static_cast<size_t>(pages) * bs * kv.v_row_bytes);
  kv.k = kpool.data();
  kv.v = vpool.data();
  std::vector<int64_t> slots(static_cast<size_t>(n_keys));
  for (int32_t j = 0; j < n_keys; ++j) slots[j] = j;
  kv_write(kv, kr.data(), vr.data(), slots.data(), n_keys);
  std::vector<int32_t> q_indptr = {0, n_q}, kv_indptr = {0, pages}, indices, last = {n_keys - (pages - 1) * bs}, positions;
  for (int32_t p = 0; p < pages; ++p) indices.push_back(p);
  for (int32_t i = 0; i < n_q; ++i) positions.push_back(n_keys - n_q + i);
  BatchView batch;
  batch.n_tokens = n_q;
  batch.n_seqs = 1;
  batch.positions = positions.data();
  batch.q_indptr = q_indptr.data();
  batch.kv_indptr = kv_indptr.data();
  batch.kv_indices = indices.data();
  batch.kv_last_page_len = last.data();
  std::vector<float> out(static_cast<size_t>(n_q * qrow));
  ref::paged_attention(qr.data(), kv, batch, n_heads, 1.0f / std::sqrt(static_cast<float>(hd)), out.data(), 0);
  if (rv > 0) hadamard_rotate(out.data(), static_cast<int64_t>(out.size()), rv);
  return out;
}

double rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

TEST(KvRotation, QuantizedAttentionWithOutlierChannelsIsCloserToF32) {
  constexpr int32_t n_heads = 4, n_kv = 2, hd = 64, n_keys = 48, n_q = 8;
  const int64_t row = n_kv * hd;
  std::vector<float> k = random_vec(static_cast<size_t>(n_keys * row), 21), v = random_vec(static_cast<size_t>(n_keys * row), 22);
  std::vector<float> q = random_vec(static_cast<size_t>(n_q * n_heads * hd), 23);
  // Outlier channels, as real K rows have after RoPE (a few channels of every
  // head 10-20x the rest): each 32-value block's scale is set by its outlier.
  for (int32_t t = 0; t < n_keys; ++t) {
    for (int32_t h = 0; h < n_kv; ++h) {
      k[t * row + h * hd + 3] += 24.0f;
      k[t * row + h * hd + 40] -= 18.0f;
      v[t * row + h * hd + 9] += 16.0f;
      v[t * row + h * hd + 50] += 12.0f;
    }
  }
  const std::vector<float> want = attention(q, k, v, n_heads, n_kv, hd, n_keys, n_q, KvTypes(KvDtype::F32), false);
  for (KvTypes t : {KvTypes(KvDtype::Q4_0), KvTypes(KvDtype::IQ4_NL), KvTypes(KvDtype::Q4_1), KvTypes(KvDtype::Q5_0),
                    KvTypes(KvDtype::Q8_0, KvDtype::Q4_0)}) {
    SCOPED_TRACE(std::string(kv_dtype_name(t.k)) + "/" + kv_dtype_name(t.v));
    const double plain = rms_diff(attention(q, k, v, n_heads, n_kv, hd, n_keys, n_q, t, false), want);
    const double rotated = rms_diff(attention(q, k, v, n_heads, n_kv, hd, n_keys, n_q, t, true), want);
    EXPECT_GT(plain, 0.0);
    EXPECT_LT(rotated, 0.75 * plain) << "unrotated " << plain << ", rotated " << rotated;
    std::printf("%s/%s: rms error vs f32 attention: unrotated %.5f, rotated %.5f\n", kv_dtype_name(t.k),
                kv_dtype_name(t.v), plain, rotated);
  }
}

}  // namespace
}  // namespace pagoda::kernels
