// Tiled prefill attention (issue 39): the AVX2 kernel's query-blocked page
// step (kernels/cpu/attention_tile.h) against the scalar reference for every
// KV type, head size, GQA ratio, window, chunk size and depth; each output row
// of a prefill chunk bitwise equal to the same token decoded alone; and the
// AVX2 outputs pinned by a hash taken on the token-by-token kernel before it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/hash.h"
#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h

// Sequences with kv length lens[s] whose last fresh[s] tokens are the step's
// queries, over a pool whose pages are shuffled. K/V/Q are random; `with`
// builds another case from the same logical K/V (a prefix of one sequence).
struct Case {
  int32_t n_heads, n_kv, hd, bs;
  KvTypes types;
  std::vector<int32_t> lens, fresh;
  std::vector<float> k_all, v_all, q;  // [keys, n_kv * hd] logical order; [tokens, n_heads * hd]
  std::vector<int32_t> q_indptr, kv_indptr, indices, last, positions;
  std::vector<uint8_t> kpool, vpool;
  KvLayerView kv;
  BatchView batch;

  int64_t row() const { return static_cast<int64_t>(n_kv) * hd; }
  int64_t width() const { return static_cast<int64_t>(n_heads) * hd; }

  void build(uint64_t seed) {
    int32_t pages_total = 0;
    for (int32_t len : lens) pages_total += (len + bs - 1) / bs;
    std::vector<int32_t> physical(static_cast<size_t>(pages_total));
    std::iota(physical.begin(), physical.end(), 0);
    Rng rng(seed);
    for (int32_t i = pages_total - 1; i > 0; --i) std::swap(physical[i], physical[rng.uniform_int(0, i)]);
    kv = KvLayerView{nullptr, nullptr, types.k, bs, n_kv, hd, kv_row_bytes(types.k, row()), 0, types.v,
                     kv_row_bytes(types.v, row())};
    kpool.assign(static_cast<size_t>(pages_total) * bs * kv.row_bytes, 0);
    vpool.assign(static_cast<size_t>(pages_total) * bs * kv.v_row_bytes, 0);
    kv.k = kpool.data();
    kv.v = vpool.data();
    q_indptr = {0};
    kv_indptr = {0};
    indices.clear();
    last.clear();
    positions.clear();
    int32_t page = 0;
    int64_t key = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      const int32_t len = lens[s], pages = (len + bs - 1) / bs;
      std::vector<int64_t> slots;
      for (int32_t j = 0; j < len; ++j) slots.push_back(static_cast<int64_t>(physical[page + j / bs]) * bs + j % bs);
      kv_write(kv, k_all.data() + key * row(), v_all.data() + key * row(), slots.data(), len);
      key += len;
      for (int32_t p = 0; p < pages; ++p) indices.push_back(physical[page + p]);
      page += pages;
      kv_indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(len - (pages - 1) * bs);
      for (int32_t i = 0; i < fresh[s]; ++i) positions.push_back(len - fresh[s] + i);
      q_indptr.push_back(q_indptr.back() + fresh[s]);
    }
    batch = BatchView{};
    batch.n_tokens = q_indptr.back();
    batch.n_seqs = static_cast<int32_t>(lens.size());
    batch.positions = positions.data();
    batch.q_indptr = q_indptr.data();
    batch.kv_indptr = kv_indptr.data();
    batch.kv_indices = indices.data();
    batch.kv_last_page_len = last.data();
  }

  static Case make(int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t block, KvTypes t,
                   std::vector<int32_t> lens, std::vector<int32_t> fresh, uint64_t seed) {
    Case c{heads, kv_heads, head_dim, block, t, std::move(lens), std::move(fresh), {}, {}, {}, {}, {}, {}, {}, {},
           {}, {}, {}, {}};
    int64_t keys = 0, toks = 0;
    for (size_t i = 0; i < c.lens.size(); ++i) {
      keys += c.lens[i];
      toks += c.fresh[i];
    }
    c.k_all = random_vec(static_cast<size_t>(keys * c.row()), seed + 1);
    c.v_all = random_vec(static_cast<size_t>(keys * c.row()), seed + 2);
    c.q = random_vec(static_cast<size_t>(toks * c.width()), seed + 3);
    c.build(seed);
    return c;
  }

  // Token `tok` (of sequence 0, the first) decoded alone: its sequence's
  // keys up to its position, its query as a one-token batch.
  Case alone(int32_t tok, uint64_t seed) const { return part(tok, tok + 1, seed); }

  // Tokens [lo, hi) of sequence 0 (the first) as a chunk of their own: the
  // sequence's keys up to the last one's position, their queries.
  Case part(int32_t lo, int32_t hi, uint64_t seed) const {
    const int32_t pos = positions[static_cast<size_t>(hi - 1)];
    Case c{n_heads, n_kv, hd, bs, types, {pos + 1}, {hi - lo}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    c.k_all.assign(k_all.begin(), k_all.begin() + (pos + 1) * row());
    c.v_all.assign(v_all.begin(), v_all.begin() + (pos + 1) * row());
    c.q.assign(q.begin() + lo * width(), q.begin() + hi * width());
    c.build(seed);
    return c;
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }
  std::vector<float> run_cpu(int32_t window) const {
    std::vector<float> out(q.size(), -7.0f);
    cpu::paged_attention(q.data(), kv, batch, n_heads, scale(), out.data(), window);
    return out;
  }
  std::vector<float> run_ref(int32_t window) const {
    std::vector<float> out(q.size(), -7.0f);
    ref::paged_attention(q.data(), kv, batch, n_heads, scale(), out.data(), window);
    return out;
  }
  // CpuMatchesRef's bound (test_attention.cc) for the longest sequence here.
  std::vector<double> tol() const {
    double vmax = 0;
    for (float v : v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
    const int32_t n = *std::max_element(lens.begin(), lens.end());
    return std::vector<double>(q.size(), (n + 16) * 0x1.0p-22 * vmax * 4);
  }
};

struct Shape {
  int32_t n_heads, n_kv, hd;
};
// GQA groups of 1, 2, 3, 4, 5 (a block of 4 rows then 1), 8; every head size the
// blocked kernel specializes, and 12 (the generic path).
const Shape kShapes[] = {{4, 4, 64}, {8, 4, 64}, {6, 2, 32}, {16, 4, 64}, {10, 2, 16},
                         {8, 1, 128}, {4, 1, 256}, {8, 4, 8}, {16, 8, 12}};

// Prefill chunks of 1 to 40 tokens at depths 0 to 150 (several pages, chunk
// starting mid-page), a decode token and a short sequence in the same batch.
TEST(TiledAttention, MatchesRefEveryTypeShapeWindowChunkDepth) {
  IsaScope scope("avx2");
  uint64_t seed = 3900;
  for (const Shape& sh : kShapes) {
    for (KvDtype dt : kAllKvDtypes) {
      const int32_t bs = (seed % 2) ? 16 : 7;
      auto c = Case::make(sh.n_heads, sh.n_kv, sh.hd, bs, KvTypes(dt), {190, 40, 151, 3}, {40, 40, 1, 2}, seed++);
      const auto tol = c.tol();
      for (int32_t w : {0, 23}) {
        const auto got = c.run_cpu(w), want = c.run_ref(w);
        ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
            << "heads=" << sh.n_heads << "/" << sh.n_kv << " hd=" << sh.hd << " " << kv_dtype_name(dt)
            << " bs=" << bs << " window=" << w;
      }
    }
  }
  // Mixed K/V types take the same path.
  auto c = Case::make(16, 4, 64, 16, KvTypes(KvDtype::Q8_0, KvDtype::Q4_0), {150}, {33}, 3999);
  const auto got = c.run_cpu(0), want = c.run_ref(0);
  const auto tol = c.tol();
  ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()));
}

// The invariance contract: every row of a prefill chunk (tokens blocked with
// the tile's other tokens and heads) is bitwise the row a decode step of the
// same token computes alone, for every KV type, with and without a window, at
// 1 and 2 threads.
TEST(TiledAttention, EachChunkRowEqualsItsDecodeBitwise) {
  IsaScope scope("avx2");
  const Shape shapes[] = {{16, 4, 64}, {6, 2, 32}, {4, 4, 64}, {8, 1, 128}, {16, 8, 12}};
  uint64_t seed = 3950;
  for (const Shape& sh : shapes) {
    for (KvDtype dt : kAllKvDtypes) {
      auto c = Case::make(sh.n_heads, sh.n_kv, sh.hd, 16, KvTypes(dt), {83}, {21}, seed++);  // depth 62
      for (int32_t w : {0, 29}) {
        set_num_threads(2);
        const auto two = c.run_cpu(w);
        set_num_threads(1);
        const auto one = c.run_cpu(w);
        ASSERT_TRUE(BitwiseEqual(one.data(), two.data(), one.size())) << "1 vs 2 threads " << kv_dtype_name(dt);
        for (int32_t t = 0; t < 21; ++t) {
          const auto solo = c.alone(t, seed * 31 + t).run_cpu(w);
          ASSERT_TRUE(BitwiseEqual(solo.data(), one.data() + t * c.width(), static_cast<size_t>(c.width())))
              << "hd=" << sh.hd << " heads=" << sh.n_heads << "/" << sh.n_kv << " " << kv_dtype_name(dt)
              << " token " << t << " window=" << w;
        }
      }
    }
  }
}

// Chunks longer than a query tile (64 tokens): several tiles, the last one
// partial, each page step in blocks of 4 rows with key-major scores
// (attention_tile.h scores4t/softmax4t/pv4t) and blocks of 2 and 1 where a
// group leaves a remainder. For each KV type the tiled path serves, GQA
// groups of 4, 3 and 1, with and without a window: within tolerance of the
// scalar reference; batched with a decode token and a short chunk, bitwise the
// chunk alone; split into two chunks (split off a tile boundary), bitwise the
// whole; and sampled rows (first, tile edges, last) bitwise their decode.
TEST(TiledAttention, LongChunksAreTheRefAndInvariantBitwise) {
  IsaScope scope("avx2");
  const Shape shapes[] = {{16, 4, 64}, {6, 2, 32}, {4, 4, 64}};
  uint64_t seed = 3970;
  for (const Shape& sh : shapes) {
    for (KvDtype dt : kAllKvDtypes) {
      // Sequence 0: 130 cached keys (8 pages and a partial one) then a 150-token
      // chunk; sequence 1 decodes one token, sequence 2 prefills 5.
      auto c = Case::make(sh.n_heads, sh.n_kv, sh.hd, 16, KvTypes(dt), {280, 45, 9}, {150, 1, 5}, seed++);
      const auto tol = c.tol();
      const size_t w0 = static_cast<size_t>(c.width());
      for (int32_t w : {0, 37}) {
        set_num_threads(2);
        const auto got = c.run_cpu(w), want = c.run_ref(w);
        ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
            << "heads=" << sh.n_heads << "/" << sh.n_kv << " " << kv_dtype_name(dt) << " window=" << w;
        const auto solo = c.part(0, 150, seed * 7).run_cpu(w);
        ASSERT_TRUE(BitwiseEqual(solo.data(), got.data(), solo.size())) << "batched vs alone " << kv_dtype_name(dt);
        set_num_threads(1);
        const auto a = c.part(0, 77, seed * 11).run_cpu(w), b = c.part(77, 150, seed * 13).run_cpu(w);
        ASSERT_TRUE(BitwiseEqual(a.data(), got.data(), a.size())) << "first chunk " << kv_dtype_name(dt);
        ASSERT_TRUE(BitwiseEqual(b.data(), got.data() + 77 * w0, b.size())) << "second chunk " << kv_dtype_name(dt);
        for (int32_t t : {0, 63, 64, 127, 128, 149}) {
          const auto one = c.alone(t, seed * 31 + t).run_cpu(w);
          ASSERT_TRUE(BitwiseEqual(one.data(), got.data() + t * w0, w0))
              << "heads=" << sh.n_heads << "/" << sh.n_kv << " " << kv_dtype_name(dt) << " token " << t
              << " window=" << w;
        }
      }
    }
  }
}

// The AVX2 outputs, pinned: prefill chunks of several tiles over a few pages
// of cache and decode tokens, every KV type, every head size, GQA groups of 1
// to 5, with and without a window. The hash was taken on the token-by-token
// kernel before the query-blocked one replaced its inner loops; it holds: each
// (token, head) keeps its op sequence, and the golden and pinned model hashes
// with it. A kernel change that moves any bit changes this hash.
TEST(TiledAttention, Avx2OutputsArePinned) {
  IsaScope scope("avx2");
  const Shape shapes[] = {{9, 3, 64}, {7, 1, 64}, {8, 4, 16}, {4, 2, 32}, {8, 2, 128},
                          {4, 1, 256}, {8, 8, 8}, {16, 8, 12}, {10, 2, 64}};
  uint64_t h = 0, seed = 7300;
  for (const Shape& sh : shapes) {
    for (KvDtype dt : kAllKvDtypes) {
      for (int32_t bs : {5, 16, 48}) {
        auto c = Case::make(sh.n_heads, sh.n_kv, sh.hd, bs, KvTypes(dt), {37, 61, 97, 1}, {1, 29, 17, 1}, seed++);
        for (int32_t w : {0, 19}) {
          const auto out = c.run_cpu(w);
          h = xxh3_64(out.data(), out.size() * sizeof(float), h);
        }
      }
    }
  }
  EXPECT_EQ(h, 0x6e4aedd3008baa99ull) << std::hex << "hash 0x" << h;
}

}  // namespace
}  // namespace pagoda::kernels
