// paged_attention: cpu vs ref for every KV dtype and head size, bitwise
// invariance to physical block placement / batch composition / thread count,
// and q8_0 KV vs f32 KV within a derived tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using testing::BitwiseEqual;
using testing::random_vec;
using testing::WithinTol;

// A ragged batch over a paged KV pool, built from per-sequence (kv length, new
// tokens). physical[logical page] maps every sequence's pages to block ids.
struct Scenario {
  Scenario(int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t block, KvDtype dt, std::vector<int32_t> lens,
           std::vector<int32_t> fresh)
      : n_heads(heads), n_kv(kv_heads), hd(head_dim), bs(block), dtype(dt), kv_lens(std::move(lens)),
        n_new(std::move(fresh)) {}
  int32_t n_heads, n_kv, hd, bs;
  KvDtype dtype;
  std::vector<int32_t> kv_lens, n_new;
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, indices, last, positions;
  std::vector<uint8_t> kpool, vpool;
  std::vector<float> q;  // [n_tokens, n_heads, hd]
  std::vector<float> k_all, v_all;  // [total logical keys, n_kv * hd] (logical order, all seqs)
  KvLayerView kv;
  BatchView batch;

  void build(bool shuffle_blocks, uint64_t seed) {
    Rng rng(seed);
    int32_t pages_total = 0;
    for (int32_t len : kv_lens) pages_total += (len + bs - 1) / bs;
    std::vector<int32_t> physical(static_cast<size_t>(pages_total));
    std::iota(physical.begin(), physical.end(), 0);
    if (shuffle_blocks) {
      Rng srng(seed ^ 0x5555);
      for (int32_t i = pages_total - 1; i > 0; --i) std::swap(physical[i], physical[srng.uniform_int(0, i)]);
    }
    const int64_t row = static_cast<int64_t>(n_kv) * hd;
    kv = KvLayerView{nullptr, nullptr, dtype, bs, n_kv, hd, kv_row_bytes(dtype, row)};
    kpool.assign(static_cast<size_t>(pages_total) * bs * kv.row_bytes, 0);
    vpool.assign(kpool.size(), 0);
    kv.k = kpool.data();
    kv.v = vpool.data();
    int32_t page = 0;
    int64_t key = 0;
    q_indptr = {0};
    kv_indptr = {0};
    indices.clear();
    last.clear();
    positions.clear();
    for (size_t s = 0; s < kv_lens.size(); ++s) {
      const int32_t len = kv_lens[s], pages = (len + bs - 1) / bs;
      std::vector<int64_t> slots;
      for (int32_t j = 0; j < len; ++j) slots.push_back(static_cast<int64_t>(physical[page + j / bs]) * bs + j % bs);
      kv_write(kv, k_all.data() + key * row, v_all.data() + key * row, slots.data(), len);
      key += len;
      for (int32_t p = 0; p < pages; ++p) indices.push_back(physical[page + p]);
      page += pages;
      kv_indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(len - (pages - 1) * bs);
      for (int32_t i = 0; i < n_new[s]; ++i) positions.push_back(len - n_new[s] + i);
      q_indptr.push_back(q_indptr.back() + n_new[s]);
    }
    batch = BatchView{};
    batch.n_tokens = q_indptr.back();
    batch.n_seqs = static_cast<int32_t>(kv_lens.size());
    batch.positions = positions.data();
    batch.q_indptr = q_indptr.data();
    batch.kv_indptr = kv_indptr.data();
    batch.kv_indices = indices.data();
    batch.kv_last_page_len = last.data();
    (void)rng;
  }

  static Scenario make(int32_t n_heads, int32_t n_kv, int32_t hd, int32_t bs, KvDtype dt,
                       std::vector<int32_t> lens, std::vector<int32_t> n_new, uint64_t seed) {
    Scenario s(n_heads, n_kv, hd, bs, dt, std::move(lens), std::move(n_new));
    int64_t keys = 0, toks = 0;
    for (size_t i = 0; i < s.kv_lens.size(); ++i) {
      keys += s.kv_lens[i];
      toks += s.n_new[i];
    }
    s.k_all = random_vec(static_cast<size_t>(keys * n_kv * hd), seed + 1);
    s.v_all = random_vec(static_cast<size_t>(keys * n_kv * hd), seed + 2);
    s.q = random_vec(static_cast<size_t>(toks * n_heads * hd), seed + 3);
    s.build(false, seed);
    return s;
  }

  std::vector<float> run_cpu() const {
    std::vector<float> out(q.size(), -7.0f);
    cpu::paged_attention(q.data(), kv, batch, n_heads, 1.0f / std::sqrt(static_cast<float>(hd)), out.data());
    return out;
  }
  std::vector<float> run_ref() const {
    std::vector<float> out(q.size(), -7.0f);
    ref::paged_attention(q.data(), kv, batch, n_heads, 1.0f / std::sqrt(static_cast<float>(hd)), out.data());
    return out;
  }
};

struct Shape {
  int32_t n_heads, n_kv, hd;
};
const Shape kShapes[] = {{8, 4, 8}, {9, 3, 64}, {4, 1, 128}, {2, 2, 64}, {8, 8, 12}};  // 12: generic path
const KvDtype kDtypes[] = {KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::Q8_0};

TEST(PagedAttention, RefKnownValues) {
  // One sequence, one head of 8 dims, 2 keys: k0 . q = 0, k1 . q = ln(3) / scale
  // -> weights 1/4, 3/4. The first token (position 0) sees only key 0.
  Scenario s(1, 1, 8, 16, KvDtype::F32, {2}, {2});
  s.k_all.assign(16, 0.0f);
  s.v_all.assign(16, 0.0f);
  s.q.assign(16, 0.0f);
  const float scale = 1.0f / std::sqrt(8.0f);
  s.k_all[8] = std::log(3.0f) / scale;
  s.q[8] = 1.0f;  // token 1's query
  s.q[0] = 1.0f;
  s.v_all[0] = 4.0f;   // v0 = (4, 0, ...)
  s.v_all[9] = 8.0f;   // v1 = (0, 8, ...)
  s.build(false, 1);
  const auto out = s.run_ref();
  EXPECT_FLOAT_EQ(out[0], 4.0f);
  EXPECT_FLOAT_EQ(out[1], 0.0f);
  EXPECT_FLOAT_EQ(out[8], 1.0f);  // 1/4 * 4
  EXPECT_FLOAT_EQ(out[9], 6.0f);  // 3/4 * 8
}

TEST(PagedAttention, CpuMatchesRef) {
  uint64_t seed = 10;
  for (const Shape& sh : kShapes) {
    for (KvDtype dt : kDtypes) {
      for (int32_t bs : {16, 5}) {
        // decode (1 new token), prefill chunk (all new), partial prefill, 1-key sequence
        auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, bs, dt, {37, 20, 50, 1}, {1, 20, 9, 1}, seed++);
        const auto want = s.run_ref(), got = s.run_cpu();
        // Output is a convex combination of V rows: float rounding of scores, exp
        // (a few ulp) and the running sums over n keys gives <= (n + 16) * 2^-22 * max|v|.
        double vmax = 0;
        for (float v : s.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
        std::vector<double> tol(want.size(), (50 + 16) * 0x1.0p-22 * vmax * 4);
        ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
            << "heads=" << sh.n_heads << " kv=" << sh.n_kv << " hd=" << sh.hd << " " << kv_dtype_name(dt)
            << " bs=" << bs;
      }
    }
  }
}

TEST(PagedAttention, ShuffledBlocksAreBitwiseEqual) {
  uint64_t seed = 100;
  for (const Shape& sh : kShapes) {
    for (KvDtype dt : kDtypes) {
      auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, 16, dt, {70, 33, 16}, {3, 33, 1}, seed++);
      const auto contiguous = s.run_cpu();
      s.build(/*shuffle_blocks=*/true, seed);
      std::vector<int32_t> identity(s.indices.size());
      std::iota(identity.begin(), identity.end(), 0);
      ASSERT_NE(s.indices, identity) << "shuffle expected to move blocks";
      const auto shuffled = s.run_cpu();
      ASSERT_TRUE(BitwiseEqual(shuffled.data(), contiguous.data(), contiguous.size()))
          << "hd=" << sh.hd << " " << kv_dtype_name(dt);
    }
  }
}

// A token's output is the same alone (a decode step of its own sequence) as
// inside a ragged batch with other sequences, with 1 or 2 threads.
TEST(PagedAttention, TokenAloneEqualsTokenInBatchBitwise) {
  const int threads = num_threads();
  for (KvDtype dt : kDtypes) {
    auto batch = Scenario::make(9, 3, 64, 16, dt, {40, 61, 17}, {5, 7, 17}, 300);
    set_num_threads(2);
    const auto all2 = batch.run_cpu();
    set_num_threads(1);
    const auto all1 = batch.run_cpu();
    ASSERT_TRUE(BitwiseEqual(all1.data(), all2.data(), all1.size())) << "1 vs 2 threads";
    // Sequence 1's token at position 57 (index 3 of its 7 new tokens), alone:
    // same K/V prefix (58 keys), a 1-token batch.
    const int32_t tok = batch.q_indptr[1] + 3;
    ASSERT_EQ(batch.positions[tok], 57);
    Scenario alone(9, 3, 64, 16, dt, {58}, {1});
    const int64_t row = 3 * 64;
    alone.k_all.assign(batch.k_all.begin() + 40 * row, batch.k_all.begin() + (40 + 58) * row);
    alone.v_all.assign(batch.v_all.begin() + 40 * row, batch.v_all.begin() + (40 + 58) * row);
    alone.q.assign(batch.q.begin() + tok * 9 * 64, batch.q.begin() + (tok + 1) * 9 * 64);
    alone.build(true, 77);
    const auto one = alone.run_cpu();
    ASSERT_TRUE(BitwiseEqual(one.data(), all1.data() + tok * 9 * 64, 9 * 64)) << kv_dtype_name(dt);
  }
  set_num_threads(threads);
}

// q8_0 KV against f32 KV. Per key, q8_0 moves each k by <= amax_k / 254, so a
// score moves by ds <= scale * |q|_1 * max|k| / 254; softmax weights then
// change by at most a factor e^(2 ds), and V adds <= max|v| / 254:
// |out_q8 - out_f32| <= (e^(2 ds) - 1) * max|v| + max|v| / 254.
TEST(PagedAttention, Q8KvCloseToF32Kv) {
  auto f = Scenario::make(9, 3, 64, 16, KvDtype::F32, {80, 30}, {4, 30}, 500);
  auto q8 = f;
  q8.dtype = KvDtype::Q8_0;
  q8.build(false, 500);
  const auto a = f.run_cpu(), b = q8.run_cpu();
  double kmax = 0, vmax = 0;
  for (float v : f.k_all) kmax = std::max(kmax, std::fabs(static_cast<double>(v)));
  for (float v : f.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
  const double scale = 1.0 / 8.0;
  std::vector<double> tol(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t head = i / 64;
    double q1 = 0;
    for (size_t d = 0; d < 64; ++d) q1 += std::fabs(f.q[head * 64 + d]);
    const double ds = scale * q1 * kmax / 254.0;
    tol[i] = (std::exp(2 * ds) - 1) * vmax + vmax / 254.0 + 1e-6;
  }
  ASSERT_TRUE(WithinTol(b.data(), a.data(), tol.data(), a.size()));
  // ...and q8_0 is not silently storing f32: the outputs do differ.
  EXPECT_FALSE(BitwiseEqual(a.data(), b.data(), a.size()));
}

}  // namespace
}  // namespace pagoda::kernels
