// paged_attention: cpu vs ref for every KV dtype (and K/V pair) and head size, bitwise
// invariance to physical block placement / batch composition / thread count,
// and q8_0 KV vs f32 KV within a derived tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <vector>

#include "base/hash.h"
#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h: make_weight, random_vec, IsaScope, the matchers

// A ragged batch over a paged KV pool, built from per-sequence (kv length, new
// tokens). physical[logical page] maps every sequence's pages to block ids.
struct Scenario {
  Scenario(int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t block, KvDtype dt, std::vector<int32_t> lens,
           std::vector<int32_t> fresh)
      : n_heads(heads), n_kv(kv_heads), hd(head_dim), bs(block), dtype(dt), vdtype(dt), kv_lens(std::move(lens)),
        n_new(std::move(fresh)) {}
  int32_t n_heads, n_kv, hd, bs;
  KvDtype dtype, vdtype;  // K's and V's types (the same unless a test sets vdtype)
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
    kv = KvLayerView{nullptr, nullptr, dtype, bs, n_kv, hd, kv_row_bytes(dtype, row), 0, vdtype,
                     kv_row_bytes(vdtype, row)};
    kpool.assign(static_cast<size_t>(pages_total) * bs * kv.row_bytes, 0);
    vpool.assign(static_cast<size_t>(pages_total) * bs * kv.v_row_bytes, 0);
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
    return make(n_heads, n_kv, hd, bs, KvTypes(dt), std::move(lens), std::move(n_new), seed);
  }
  static Scenario make(int32_t n_heads, int32_t n_kv, int32_t hd, int32_t bs, KvTypes dt,
                       std::vector<int32_t> lens, std::vector<int32_t> n_new, uint64_t seed) {
    Scenario s(n_heads, n_kv, hd, bs, dt.k, std::move(lens), std::move(n_new));
    s.vdtype = dt.v;
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

  std::vector<float> run_cpu(int32_t window = 0) const {
    std::vector<float> out(q.size(), -7.0f);
    cpu::paged_attention(q.data(), kv, batch, n_heads, 1.0f / std::sqrt(static_cast<float>(hd)), out.data(), window);
    return out;
  }
  std::vector<float> run_ref(int32_t window = 0) const {
    std::vector<float> out(q.size(), -7.0f);
    ref::paged_attention(q.data(), kv, batch, n_heads, 1.0f / std::sqrt(static_cast<float>(hd)), out.data(), window);
    return out;
  }
};

struct Shape {
  int32_t n_heads, n_kv, hd;
};
const Shape kShapes[] = {{8, 4, 8}, {9, 3, 64}, {4, 1, 128}, {2, 2, 64}, {8, 8, 12}};  // 12: generic path
// Every KV type (base/kv_dtype.h), K and V the same; mixed pairs: MixedKvTypesMatchRef.
const auto& kDtypes = kAllKvDtypes;

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

// One sequence's decode token with one KV head (gemma3's shape: 4 query heads
// on 1 KV head, head_dim 256): fewer (tile, KV head) items than threads, so
// the query heads are split across items. Every thread count gives bitwise the
// output of one thread, within the ref tolerance of CpuMatchesRef.
TEST(PagedAttention, OneKvHeadDecodeSplitsQueryHeadsBitwise) {
  const int threads = num_threads();
  for (KvDtype dt : {KvDtype::F32, KvDtype::F16}) {
    auto s = Scenario::make(4, 1, 256, 16, dt, {45}, {1}, 500);
    set_num_threads(1);
    const auto one = s.run_cpu();
    for (int t : {2, 3, 4}) {
      set_num_threads(t);
      const auto got = s.run_cpu();
      ASSERT_TRUE(BitwiseEqual(one.data(), got.data(), one.size())) << t << " threads, " << kv_dtype_name(dt);
    }
    const auto want = s.run_ref();
    double vmax = 0;
    for (float v : s.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
    std::vector<double> tol(want.size(), (45 + 16) * 0x1.0p-22 * vmax * 4);
    ASSERT_TRUE(WithinTol(one.data(), want.data(), tol.data(), one.size())) << kv_dtype_name(dt);
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
  q8.dtype = q8.vdtype = KvDtype::Q8_0;
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

// K and V of different types (llama.cpp's -ctk / -ctv): every pair of the nine
// types against ref, on head sizes whose slices are whole 32-value blocks (64,
// 128) and one whose slices cut blocks (8: four heads per block), decode and
// prefill, pages of 16 and 5; each output bitwise the same with 2 threads and
// with the blocks shuffled. Mixed pairs always take the AVX2 path (also on
// AVX-512 machines: attention.cc's dispatch), which both ISA settings check.
// The attention kernels a machine can run: AVX2's tile, and on AVX-512 both the
// AVX-512 kernel and the tile (cpu::set_attention; "auto" picks one by processor).
struct IsaKernel {
  const char* isa;
  const char* attention;
  bool set() const { return cpu::set_isa(isa) && cpu::set_attention(attention); }
  std::string name() const { return std::string(isa) + "/" + attention; }
};
const IsaKernel kIsaKernels[] = {{"avx2", "tile"}, {"avx512-vnni", "avx512"}, {"avx512-vnni", "tile"}};

TEST(PagedAttention, MixedKvTypesMatchRef) {
  const Shape shapes[] = {{9, 3, 64}, {4, 1, 128}, {8, 4, 8}};
  uint64_t seed = 4000;
  for (const IsaKernel& ik : kIsaKernels) {
    IsaScope scope("avx2");
    if (!ik.set()) continue;  // no AVX-512 on this machine
    const std::string isa = ik.name();
    for (const Shape& sh : shapes) {
      for (KvDtype kt : kAllKvDtypes) {
        for (KvDtype vt : kAllKvDtypes) {
          const int32_t bs = seed % 2 == 0 ? 16 : 5;
          auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, bs, KvTypes(kt, vt), {37, 20, 1}, {1, 20, 1}, seed++);
          double vmax = 0;
          for (float v : s.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
          std::vector<double> tol(s.q.size(), (37 + 16) * 0x1.0p-22 * vmax * 4);
          const auto want = s.run_ref(), got = s.run_cpu();
          ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
              << isa << " hd=" << sh.hd << " K " << kv_dtype_name(kt) << " V " << kv_dtype_name(vt) << " bs=" << bs;
          set_num_threads(2);
          const auto two = s.run_cpu();
          set_num_threads(1);
          s.build(/*shuffle_blocks=*/true, seed);
          const auto shuffled = s.run_cpu();
          ASSERT_TRUE(BitwiseEqual(two.data(), got.data(), got.size()) &&
                      BitwiseEqual(shuffled.data(), got.data(), got.size()))
              << isa << " hd=" << sh.hd << " K " << kv_dtype_name(kt) << " V " << kv_dtype_name(vt);
        }
      }
    }
  }
}

// A token that sees one key gets exactly that key's V row (weight exp(0) = 1,
// sum 1; equal as floats, -0 becoming +0): the CPU kernel's decoded V (AVX2: whole blocks in registers, cut
// blocks through the scalar dequantizer) is bitwise ggml's dequantize_row_* of
// the stored bytes, for every type, head slices on and off block boundaries.
TEST(PagedAttention, OneKeyOutputIsTheDequantizedVRow) {
  for (const IsaKernel& ik : kIsaKernels) {
    IsaScope scope("avx2");
    if (!ik.set()) continue;  // no AVX-512 on this machine
    for (const Shape& sh : {Shape{4, 2, 64}, Shape{8, 4, 8}, Shape{4, 1, 256}}) {
      for (KvDtype vt : kAllKvDtypes) {
        // K q4_0 (a mixed pair: the tile unless V is q4_0 too), and K = V (the
        // AVX-512 kernel under avx512-vnni/avx512, for the head sizes it takes).
        for (KvDtype kt : {KvDtype::Q4_0, vt}) {
          auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, 16, KvTypes(kt, vt), {1}, {1}, 4500);
          const auto got = s.run_cpu();
          const int64_t row = static_cast<int64_t>(sh.n_kv) * sh.hd;
          std::vector<float> v(static_cast<size_t>(row));
          kv_read_row(vt, s.vpool.data(), row, v.data());  // slot 0: the sequence's one key
          for (int32_t h = 0; h < sh.n_heads; ++h) {
            const int32_t kvh = h / (sh.n_heads / sh.n_kv);
            for (int32_t d = 0; d < sh.hd; ++d)  // == : the output adds p * v to +0, so a -0 comes out +0
              ASSERT_EQ(got[h * sh.hd + d], v[kvh * sh.hd + d])
                  << ik.name() << " K " << kv_dtype_name(kt) << " V " << kv_dtype_name(vt) << " hd=" << sh.hd
                  << " head " << h;
          }
        }
      }
    }
  }
}

// Both ISAs' paths (AVX2 staged pages; AVX-512 token by token in chunks of up
// to 16 keys, attention_avx512.cc) against ref, on every head size the AVX-512
// path takes, query-head groups of 1..7 (7: a pass of 4 heads then one of 3),
// and pages of 5 (chunks = pages), 16, 32 and 48 keys (several chunks per
// page), with and without a window; and each path's output is bitwise the same
// with 1 or 2 threads and with the blocks shuffled.
TEST(PagedAttention, BothIsasMatchRefEveryChunking) {
  const Shape shapes[] = {{9, 3, 64}, {7, 1, 64}, {8, 4, 16}, {4, 2, 32}, {4, 1, 128}, {4, 1, 256}, {8, 8, 12}};
  uint64_t seed = 900;
  for (const IsaKernel& ik : kIsaKernels) {
    IsaScope scope("avx2");
    if (!ik.set()) continue;  // no AVX-512 on this machine
    const std::string isa = ik.name();
    for (const Shape& sh : shapes) {
      for (KvDtype dt : kDtypes) {
        for (int32_t bs : {5, 16, 32, 48}) {
          auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, bs, dt, {37, 20, 97, 1}, {1, 20, 9, 1}, seed++);
          double vmax = 0;
          for (float v : s.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
          std::vector<double> tol(s.q.size(), (97 + 16) * 0x1.0p-22 * vmax * 4);
          for (int32_t w : {0, 19}) {
            const auto want = s.run_ref(w), got = s.run_cpu(w);
            ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
                << isa << " hd=" << sh.hd << " heads=" << sh.n_heads << "/" << sh.n_kv << " "
                << kv_dtype_name(dt) << " bs=" << bs << " window=" << w;
          }
          set_num_threads(2);
          const auto two = s.run_cpu();
          set_num_threads(1);
          s.build(/*shuffle_blocks=*/true, seed);
          const auto shuffled = s.run_cpu();
          ASSERT_TRUE(BitwiseEqual(two.data(), shuffled.data(), two.size()))
              << isa << " hd=" << sh.hd << " " << kv_dtype_name(dt) << " bs=" << bs;
        }
      }
    }
  }
}

// Sliding window (gemma3's local layers): a token at position p sees keys
// p - W < j <= p. cpu matches ref, including windows that start mid-page, span
// several pages, or cover the whole sequence (then equal to no window, bitwise).
TEST(PagedAttentionWindow, CpuMatchesRefAndFullWindowIsNoWindow) {
  uint64_t seed = 700;
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({4, 1, 256});  // gemma3's head size
  for (const Shape& sh : shapes) {
    for (KvDtype dt : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0}) {
      for (int32_t bs : {16, 5}) {
        auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, bs, dt, {37, 20, 50, 1}, {1, 20, 9, 1}, seed++);
        for (int32_t w : {1, 7, 16, 33}) {
          const auto want = s.run_ref(w), got = s.run_cpu(w);
          double vmax = 0;
          for (float v : s.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
          std::vector<double> tol(want.size(), (50 + 16) * 0x1.0p-22 * vmax * 4);
          ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size()))
              << "hd=" << sh.hd << " " << kv_dtype_name(dt) << " bs=" << bs << " window=" << w;
        }
        const auto full = s.run_cpu(0), wide = s.run_cpu(50);
        ASSERT_TRUE(BitwiseEqual(full.data(), wide.data(), full.size())) << "hd=" << sh.hd << " bs=" << bs;
        const auto rfull = s.run_ref(0), rwide = s.run_ref(50);
        ASSERT_TRUE(BitwiseEqual(rfull.data(), rwide.data(), rfull.size()));
      }
    }
  }
}

// Window 1: each token attends to itself only, so the output is its own V row.
// Window 3 at position p: exactly the softmax over keys p-2, p-1, p (checked
// against a sequence holding only those three keys, positions shifted: scores do
// not depend on positions).
TEST(PagedAttentionWindow, MasksExactlyTheKeysOutsideTheWindow) {
  auto s = Scenario::make(4, 2, 16, 4, KvDtype::F32, {11}, {11}, 900);
  const auto w1 = s.run_ref(1);
  for (int32_t t = 0; t < 11; ++t)
    for (int32_t h = 0; h < 4; ++h)
      for (int32_t d = 0; d < 16; ++d)
        ASSERT_FLOAT_EQ(w1[(t * 4 + h) * 16 + d], s.v_all[(t * 2 + h / 2) * 16 + d]) << t << " " << h;
  const auto w3 = s.run_ref(3);
  Scenario three(4, 2, 16, 4, KvDtype::F32, {3}, {1});
  three.k_all.assign(s.k_all.begin() + 8 * 32, s.k_all.end());
  three.v_all.assign(s.v_all.begin() + 8 * 32, s.v_all.end());
  three.q.assign(s.q.begin() + 10 * 64, s.q.end());
  three.build(false, 1);
  const auto want = three.run_ref();
  for (int32_t i = 0; i < 64; ++i) ASSERT_FLOAT_EQ(w3[10 * 64 + i], want[i]) << i;
  EXPECT_FALSE(BitwiseEqual(w3.data() + 640, s.run_ref(0).data() + 640, 64));
}

// Batch invariance holds with a window: a token alone equals the same token in a
// ragged batch (other sequences, other positions), bitwise, with 1 or 2 threads.
TEST(PagedAttentionWindow, TokenAloneEqualsTokenInBatchBitwise) {
  const int threads = num_threads();
  for (KvDtype dt : {KvDtype::F32, KvDtype::F16}) {
    auto batch = Scenario::make(4, 1, 64, 16, dt, {40, 61, 17}, {5, 7, 17}, 950);
    set_num_threads(2);
    const auto all2 = batch.run_cpu(21);
    set_num_threads(1);
    const auto all1 = batch.run_cpu(21);
    ASSERT_TRUE(BitwiseEqual(all1.data(), all2.data(), all1.size()));
    const int32_t tok = batch.q_indptr[1] + 3;  // position 57: window keys 37..57, from mid-page 2
    Scenario alone(4, 1, 64, 16, dt, {58}, {1});
    const int64_t row = 64;
    alone.k_all.assign(batch.k_all.begin() + 40 * row, batch.k_all.begin() + (40 + 58) * row);
    alone.v_all.assign(batch.v_all.begin() + 40 * row, batch.v_all.begin() + (40 + 58) * row);
    alone.q.assign(batch.q.begin() + tok * 4 * 64, batch.q.begin() + (tok + 1) * 4 * 64);
    alone.build(true, 78);
    const auto one = alone.run_cpu(21);
    ASSERT_TRUE(BitwiseEqual(one.data(), all1.data() + tok * 4 * 64, 4 * 64)) << kv_dtype_name(dt);
  }
  set_num_threads(threads);
}

// Decode of many sequences (SmolLM2's 32-stream shape, scaled down): with at
// least two tiles per thread an AVX-512 item is a whole token (every KV head)
// and reads the next sequence's rows ahead (attention.cc). Each decode token is
// bitwise the same as alone (one item per KV head, nothing read ahead), at 1 to
// 4 threads, with and without a window, blocks shuffled, both ISAs, and a
// prefill chunk in the middle of the batch; and within the ref tolerance.
TEST(PagedAttention, ManySequencesDecodeEqualsEachTokenAloneBitwise) {
  const std::vector<int32_t> lens{1, 17, 40, 64, 100, 3, 60, 33, 16, 15, 80, 47, 129};
  std::vector<int32_t> fresh(lens.size(), 1);
  fresh[6] = 20;  // a prefill chunk between decode tokens
  uint64_t seed = 1200;
  for (const IsaKernel& ik : kIsaKernels) {
    IsaScope scope("avx2");
    if (!ik.set()) continue;  // no AVX-512 on this machine
    const std::string isa = ik.name();
    for (KvDtype dt : kDtypes) {
      auto batch = Scenario::make(9, 3, 64, 16, dt, lens, fresh, seed++);
      batch.build(/*shuffle_blocks=*/true, seed);
      double vmax = 0;
      for (float v : batch.v_all) vmax = std::max(vmax, std::fabs(static_cast<double>(v)));
      std::vector<double> tol(batch.q.size(), (129 + 16) * 0x1.0p-22 * vmax * 4);
      for (int32_t w : {0, 21}) {
        set_num_threads(1);
        const auto one = batch.run_cpu(w);
        const auto want = batch.run_ref(w);
        ASSERT_TRUE(WithinTol(one.data(), want.data(), tol.data(), one.size())) << isa << " " << kv_dtype_name(dt);
        for (int t : {2, 3, 4}) {
          set_num_threads(t);
          const auto got = batch.run_cpu(w);
          ASSERT_TRUE(BitwiseEqual(one.data(), got.data(), one.size()))
              << isa << " " << t << " threads, " << kv_dtype_name(dt) << " window=" << w;
        }
        set_num_threads(1);
        const int64_t row = 3 * 64, width = 9 * 64;
        int64_t key0 = 0;
        for (size_t sq = 0; sq < lens.size(); key0 += lens[sq], ++sq) {
          if (fresh[sq] != 1) continue;
          const int32_t tok = batch.q_indptr[sq];
          Scenario alone(9, 3, 64, 16, dt, {lens[sq]}, {1});
          alone.k_all.assign(batch.k_all.begin() + key0 * row, batch.k_all.begin() + (key0 + lens[sq]) * row);
          alone.v_all.assign(batch.v_all.begin() + key0 * row, batch.v_all.begin() + (key0 + lens[sq]) * row);
          alone.q.assign(batch.q.begin() + tok * width, batch.q.begin() + (tok + 1) * width);
          alone.build(true, seed + sq);
          const auto solo = alone.run_cpu(w);
          ASSERT_TRUE(BitwiseEqual(solo.data(), one.data() + tok * width, width))
              << isa << " " << kv_dtype_name(dt) << " seq " << sq << " window=" << w;
        }
      }
    }
  }
}

// Decode of fewer sequences than threads x KV heads: an AVX-512 item then takes
// a run of KV heads and walks them span by span (attend_token_avx512 with
// n_kv > 1; 1 thread: all 8 heads, 2: 4, 4: 2, 8: one head per item as
// before). Every split gives bitwise the one-head-per-item output, for shapes
// with a partial query-head batch (6 heads per KV head), page sizes below, at
// and above the 64-key span, and a sliding window that starts mid-span. With
// at least 2 sequences per thread an item is a whole token (every KV head, the
// next sequence's rows read ahead): 2 sequences on 1 thread, 5 on 1 and 2.
TEST(PagedAttention, KvHeadRunsEqualOneHeadPerItemBitwise) {
  const int threads = num_threads();
  ASSERT_TRUE(cpu::set_attention("avx512"));  // the AVX-512 kernel's KV-head runs (the tile where the ISA is AVX2)
  struct Case {
    int32_t heads, kv, bs;
  };
  uint64_t seed = 4100;
  for (const Case c : {Case{32, 8, 16}, Case{48, 8, 8}, Case{16, 4, 32}, Case{8, 8, 128}}) {
    for (KvTypes dt : {KvTypes(KvDtype::F32), KvTypes(KvDtype::F16), KvTypes(KvDtype::BF16), KvTypes(KvDtype::Q8_0),
                       KvTypes(KvDtype::Q4_0), KvTypes(KvDtype::Q5_1), KvTypes(KvDtype::Q8_0, KvDtype::Q4_0)}) {
      for (const std::vector<int32_t>& lens :
           {std::vector<int32_t>{300}, std::vector<int32_t>{97, 200}, std::vector<int32_t>{97, 200, 33, 150, 64}}) {
        std::vector<int32_t> fresh(lens.size(), 1);
        auto s = Scenario::make(c.heads, c.kv, 64, c.bs, dt, lens, fresh, seed++);
        s.build(/*shuffle_blocks=*/true, seed);
        for (int32_t w : {0, 77}) {
          set_num_threads(8);
          const auto want = s.run_cpu(w);
          for (int t : {1, 2, 4}) {
            set_num_threads(t);
            const auto got = s.run_cpu(w);
            ASSERT_TRUE(BitwiseEqual(want.data(), got.data(), want.size()))
                << c.heads << "/" << c.kv << " heads, bs " << c.bs << ", " << kv_dtype_name(dt.k) << "/"
                << kv_dtype_name(dt.v) << ", "
                << lens.size() << " seqs, " << t << " threads, window " << w;
          }
        }
      }
    }
  }
  set_num_threads(threads);
  cpu::set_attention("auto");
}

// KV cache groups: a window group's table has the null block before the
// window of the step's first token. paged_attention (cpu and ref) must start at
// the page of the first key in the window and never read those entries: here
// they point at a page of NaN bytes, and the outputs are bitwise those of the
// full table.
TEST(PagedAttentionWindow, NeverReadsThePagesBeforeTheWindow) {
  const int32_t window = 21, bs = 8;
  for (KvDtype dt : {KvDtype::F32, KvDtype::F16}) {
    auto s = Scenario::make(4, 1, 64, bs, dt, {40, 61, 17}, {5, 7, 17}, 951);
    const auto full_cpu = s.run_cpu(window), full_ref = s.run_ref(window);
    const size_t page_bytes = static_cast<size_t>(bs) * s.kv.row_bytes;
    const auto poison = static_cast<int32_t>(s.kpool.size() / page_bytes);  // one more page, all 0xFF (NaN)
    s.kpool.resize(s.kpool.size() + page_bytes, 0xFF);
    s.vpool.resize(s.vpool.size() + page_bytes, 0xFF);
    s.kv.k = s.kpool.data();
    s.kv.v = s.vpool.data();
    int32_t replaced = 0;
    for (int32_t q = 0; q < s.batch.n_seqs; ++q) {
      const int32_t first_key = std::max(0, s.positions[static_cast<size_t>(s.q_indptr[q])] - window + 1);
      for (int32_t p = 0; p < first_key / bs; ++p, ++replaced) s.indices[static_cast<size_t>(s.kv_indptr[q] + p)] = poison;
    }
    EXPECT_EQ(replaced, 1 + 4);  // seq 0: first key 15, page 0 goes; seq 1: first key 34, pages 0..3
    const auto cpu_out = s.run_cpu(window), ref_out = s.run_ref(window);
    EXPECT_TRUE(BitwiseEqual(cpu_out.data(), full_cpu.data(), cpu_out.size())) << kv_dtype_name(dt);
    EXPECT_TRUE(BitwiseEqual(ref_out.data(), full_ref.data(), ref_out.size())) << kv_dtype_name(dt);
  }
}

// One hash over the AVX-512 kernel's outputs: prefill and decode batches of
// every shape and K/V type pair given, pages of 5, 16 and 48 keys, with and
// without a window (Scenarios seeded from `seed` in that order).
uint64_t avx512_outputs_hash(const std::vector<Shape>& shapes, const std::vector<KvTypes>& types, uint64_t seed) {
  uint64_t h = 0;
  for (const Shape& sh : shapes) {
    for (const KvTypes& dt : types) {
      for (int32_t bs : {5, 16, 48}) {
        auto s = Scenario::make(sh.n_heads, sh.n_kv, sh.hd, bs, dt, {37, 20, 97, 1}, {1, 20, 9, 1}, seed++);
        for (int32_t w : {0, 19}) {
          const auto out = s.run_cpu(w);
          h = xxh3_64(out.data(), out.size() * sizeof(float), h);
        }
      }
    }
  }
  return h;
}

// The AVX-512 path's outputs, pinned: every head size it takes, three KV
// dtypes. Its op sequence per (token, head) is the batch-invariance contract
// (decode of a token = the same token inside a prefill), so a kernel change
// that moves any bit must be deliberate: the hash here changes with it.
// (Session 13 folded the score reduction tree in as keys come and gave exp its
// 16-lane form; the hash was taken before that change and held after it.)
TEST(PagedAttention, Avx512OutputsArePinned) {
  IsaScope scope("avx2");
  if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "no AVX-512 on this machine";
  ASSERT_TRUE(cpu::set_attention("avx512"));
  const uint64_t h = avx512_outputs_hash({{9, 3, 64}, {7, 1, 64}, {8, 4, 16}, {4, 2, 32}, {4, 1, 128}, {4, 1, 256}},
                                         {KvTypes(KvDtype::F32), KvTypes(KvDtype::F16), KvTypes(KvDtype::BF16)}, 4200);
  EXPECT_EQ(h, 0x7d9e8d0fa29203dfull) << std::hex << "hash 0x" << h;
}

// The same for the quantized K/V types and the mixed pairs the AVX-512 path
// takes (attend_token_avx512_supports; head sizes 32 and up): their values are
// decoded in registers, each bitwise the scalar dequantizer's
// (OneKeyOutputIsTheDequantizedVRow), so the hash pins the op sequence.
TEST(PagedAttention, Avx512QuantizedOutputsArePinned) {
  IsaScope scope("avx2");
  if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "no AVX-512 on this machine";
  ASSERT_TRUE(cpu::set_attention("avx512"));
  const uint64_t h = avx512_outputs_hash(
      {{9, 3, 64}, {7, 1, 64}, {4, 2, 32}, {4, 1, 128}, {4, 1, 256}},
      {KvTypes(KvDtype::Q8_0), KvTypes(KvDtype::Q4_0), KvTypes(KvDtype::Q4_1), KvTypes(KvDtype::IQ4_NL),
       KvTypes(KvDtype::Q5_0), KvTypes(KvDtype::Q5_1), KvTypes(KvDtype::F16, KvDtype::Q8_0),
       KvTypes(KvDtype::F16, KvDtype::Q4_0), KvTypes(KvDtype::Q8_0, KvDtype::Q4_0)},
      4300);
  EXPECT_EQ(h, 0x5f6111483ca8b31dull) << std::hex << "hash 0x" << h;
}

}  // namespace
}  // namespace pagoda::kernels
