// rmsnorm, rope: cpu vs ref over odd sizes, plus hand-computed values for the
// references themselves; the shared ops (kv_write, get_rows, gather_rows, adds,
// silu_mul) against direct formulas; the backend tables.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "base/ggml_quant.h"
#include "kernels/api.h"
#include "kernels/backend.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h: make_weight, random_vec, IsaScope, the matchers

const int64_t kSizes[] = {1, 3, 17, 31, 33, 255, 257, 576};

TEST(RmsNorm, CpuMatchesRef) {
  uint64_t seed = 1;
  for (int64_t n : kSizes) {
    const int64_t t = 3;
    const auto x = random_vec(static_cast<size_t>(t * n), seed++, 2.0);
    const auto w = random_vec(static_cast<size_t>(n), seed++);
    std::vector<float> want(x.size()), got(x.size());
    ref::rmsnorm(x.data(), w.data(), 1e-5f, t, n, want.data());
    cpu::rmsnorm(x.data(), w.data(), 1e-5f, t, n, got.data());
    // float sum of squares (n terms) + 3 roundings per output: relative (n + 8) * 2^-24.
    std::vector<double> tol(x.size());
    for (size_t i = 0; i < tol.size(); ++i) tol[i] = std::fabs(want[i]) * (n + 8) * 0x1.0p-24 + 1e-30;
    ASSERT_TRUE(WithinTol(got.data(), want.data(), tol.data(), got.size())) << "n=" << n;
  }
}

TEST(RmsNorm, RefKnownValue) {
  const float x[2] = {3.0f, 4.0f}, w[2] = {1.0f, 2.0f};
  float y[2];
  ref::rmsnorm(x, w, 0.0f, 1, 2, y);
  const float rms = std::sqrt(12.5f);
  EXPECT_FLOAT_EQ(y[0], 3.0f / rms);
  EXPECT_FLOAT_EQ(y[1], 8.0f / rms);
}

TEST(Rope, RefKnownValues) {
  // One head of 4 dims, position 1, base 100: theta_0 = 1, theta_1 = 100^(-1/2) = 0.1.
  float x[4] = {1, 0, 1, 0};
  const int32_t pos = 1;
  ref::rope(x, &pos, 1, 1, 4, 4, 100.0f, /*neox=*/false);
  EXPECT_FLOAT_EQ(x[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(x[1], static_cast<float>(std::sin(1.0)));
  EXPECT_FLOAT_EQ(x[2], static_cast<float>(std::cos(0.1)));
  EXPECT_FLOAT_EQ(x[3], static_cast<float>(std::sin(0.1)));
  // NeoX pairs (0, 2) and (1, 3).
  float y[4] = {1, 1, 0, 0};
  ref::rope(y, &pos, 1, 1, 4, 4, 100.0f, /*neox=*/true);
  EXPECT_FLOAT_EQ(y[0], static_cast<float>(std::cos(1.0)));
  EXPECT_FLOAT_EQ(y[2], static_cast<float>(std::sin(1.0)));
  EXPECT_FLOAT_EQ(y[1], static_cast<float>(std::cos(0.1)));
  EXPECT_FLOAT_EQ(y[3], static_cast<float>(std::sin(0.1)));
  // Position 0 is the identity; dims past rope_dim are untouched.
  float z[6] = {1, 2, 3, 4, 5, 6};
  const int32_t p0 = 0;
  ref::rope(z, &p0, 1, 1, 6, 4, 100.0f, false);
  EXPECT_EQ(z[0], 1.0f);
  EXPECT_EQ(z[3], 4.0f);
  float u[6] = {1, 2, 3, 4, 5, 6};
  ref::rope(u, &pos, 1, 1, 6, 4, 100.0f, false);
  EXPECT_EQ(u[4], 5.0f);
  EXPECT_EQ(u[5], 6.0f);
}

TEST(Rope, CpuBitwiseEqualsRef) {
  for (bool neox : {false, true}) {
    for (int32_t head_dim : {8, 64, 128}) {
      for (int32_t rope_dim : {head_dim, head_dim / 2}) {
        const int64_t t = 5;
        const int32_t heads = 3;
        std::vector<int32_t> pos{0, 1, 7, 100, 4095};
        auto a = random_vec(static_cast<size_t>(t * heads * head_dim), 9);
        auto b = a;
        ref::rope(a.data(), pos.data(), t, heads, head_dim, rope_dim, 100000.0f, neox);
        cpu::rope(b.data(), pos.data(), t, heads, head_dim, rope_dim, 100000.0f, neox);
        ASSERT_TRUE(BitwiseEqual(b.data(), a.data(), a.size())) << "neox=" << neox << " hd=" << head_dim;
      }
    }
  }
}

// cpu::rope reuses the cos/sin tables of its last two (positions, parameters)
// sets: the same positions array with new contents, three bases taking turns
// (more than it keeps), other frequency factors behind the same pointer and a
// shorter batch must each give ref's result, bitwise.
TEST(Rope, ReusedTablesFollowPositionsAndParameters) {
  const int32_t heads = 2, hd = 16;
  std::vector<int32_t> pos{3, 9, 27};
  std::vector<float> factors(hd / 2, 1.0f);
  const auto x = random_vec(static_cast<size_t>(3 * heads * hd), 21);
  for (int rep = 0; rep < 4; ++rep) {
    for (float base : {10000.0f, 500000.0f, 1000000.0f}) {
      for (int64_t t : {int64_t{3}, int64_t{2}}) {
        RopeScaling sc;
        sc.freq_factors = rep % 2 ? factors.data() : nullptr;
        auto a = x, b = x;
        ref::rope(a.data(), pos.data(), t, heads, hd, hd, base, false, sc);
        cpu::rope(b.data(), pos.data(), t, heads, hd, hd, base, false, sc);
        ASSERT_TRUE(BitwiseEqual(b.data(), a.data(), static_cast<size_t>(t * heads * hd)))
            << "rep " << rep << " base " << base << " t " << t;
      }
    }
    pos[1] += 1;                    // same array, new contents
    factors[rep % (hd / 2)] = 1.5f + static_cast<float>(rep);  // same pointer, new values
  }
}

TEST(Elementwise, SiluMulAndAdd) {
  for (int64_t n : kSizes) {
    auto g = random_vec(static_cast<size_t>(n), 11, 4.0);
    const auto u = random_vec(static_cast<size_t>(n), 12);
    auto g0 = g;
    silu_mul(g.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = g0[i] / (1.0 + std::exp(-static_cast<double>(g0[i]))) * u[i];
      ASSERT_NEAR(g[i], want, std::fabs(want) * 1e-6 + 1e-30) << "n=" << n << " i=" << i;
    }
    auto a = random_vec(static_cast<size_t>(n), 13);
    const auto a0 = a;
    add_inplace(a.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], a0[i] + u[i]);
  }
}

// Every KV type as K, each with another type as V (llama.cpp's -ctk / -ctv):
// rows are the scalar codec's bytes (ggml's quantize_row_*_ref), each in its
// own pool with its own row size, padding skipped, and read back within half a
// quantization step.
TEST(KvWrite, StoresEncodedRowsSkipsPaddingAndRoundTrips) {
  const int32_t n_kv = 2, hd = 64, slots = 40;
  const int64_t n = n_kv * hd;
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,    GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::IQ4_NL, GgmlType::Q5_0, GgmlType::Q5_1};  // kAllKvDtypes' formats
  static_assert(std::size(types) == std::size(kAllKvDtypes));
  for (size_t ki = 0; ki < std::size(kAllKvDtypes); ++ki) {
    const size_t vi = (ki + 4) % std::size(kAllKvDtypes);  // V: another type (same-type pairs: the engine tests)
    const KvDtype dt = kAllKvDtypes[ki], vdt = kAllKvDtypes[vi];
    const GgmlType type = types[ki], vtype = types[vi];
    const size_t rb = kv_row_bytes(dt, n), vrb = kv_row_bytes(vdt, n);
    ASSERT_EQ(rb, ggml_row_bytes(type, static_cast<size_t>(n)));
    ASSERT_EQ(vrb, ggml_row_bytes(vtype, static_cast<size_t>(n)));
    std::vector<uint8_t> kb(rb * slots, 0xAB), vb(vrb * slots, 0xAB);
    const KvLayerView kv{kb.data(), vb.data(), dt, 16, n_kv, hd, rb, 0, vdt, vrb};
    const int64_t t = 5;
    const auto k = random_vec(static_cast<size_t>(t * n), 21), v = random_vec(static_cast<size_t>(t * n), 22);
    const int64_t slot_mapping[t] = {3, 17, -1, 39, 0};  // -1: padding token, not stored
    kv_write(kv, k.data(), v.data(), slot_mapping, t);
    std::vector<uint8_t> want(std::max(rb, vrb));
    for (int64_t i = 0; i < t; ++i) {
      if (slot_mapping[i] < 0) continue;
      const auto slot = static_cast<size_t>(slot_mapping[i]);
      ASSERT_TRUE(quantize_row(type, k.data() + i * n, want.data(), n));
      ASSERT_EQ(std::memcmp(kb.data() + slot * rb, want.data(), rb), 0) << kv_dtype_name(dt) << " token " << i;
      ASSERT_TRUE(quantize_row(vtype, v.data() + i * n, want.data(), n));
      ASSERT_EQ(std::memcmp(vb.data() + slot * vrb, want.data(), vrb), 0) << kv_dtype_name(vdt) << " token " << i;
    }
    std::vector<float> back(static_cast<size_t>(n));
    for (const bool is_v : {false, true}) {
      const KvDtype d = is_v ? vdt : dt;
      kv_read_row(d, (is_v ? vb.data() + 17 * vrb : kb.data() + 17 * rb), n, back.data());
      const auto& src = is_v ? v : k;
      for (int64_t i = 0; i < n; ++i) {
        const float want_v = src[static_cast<size_t>(n + i)];
        // f32 exact; f16 / bf16 half an ulp (2^-11 / 2^-8 relative); q8_0 half a
        // step (amax/254); the 4/5-bit types half a step of their levels (amax
        // 5 here: q4_0 amax/16, q4_1 range/30, q5_0 amax/32, q5_1 range/62), iq4_nl
        // the widest gap of its codebook (24 of 127) / 2 around the fitted scale.
        double tol = 0;
        switch (d) {
          case KvDtype::F32: tol = 0; break;
          case KvDtype::F16: tol = std::fabs(want_v) * 0x1.0p-11 + 1e-7; break;
          case KvDtype::BF16: tol = std::fabs(want_v) * 0x1.0p-8; break;
          case KvDtype::Q8_0: tol = 5.0 / 254.0 * 1.001; break;
          case KvDtype::Q4_0: tol = 5.0 / 16.0 * 1.001; break;
          case KvDtype::Q4_1: tol = 10.0 / 30.0 * 1.001; break;
          case KvDtype::Q5_0: tol = 5.0 / 32.0 * 1.001; break;
          case KvDtype::Q5_1: tol = 10.0 / 62.0 * 1.001; break;
          case KvDtype::IQ4_NL: tol = 5.0 * 0.15; break;
        }
        ASSERT_NEAR(back[i], want_v, tol) << kv_dtype_name(d) << " i=" << i;
      }
    }
    for (int s = 0; s < slots; ++s) {
      if (s == 3 || s == 17 || s == 39 || s == 0) continue;
      ASSERT_EQ(kb[s * rb], 0xAB) << "slot " << s << " was not written by any token";
      ASSERT_EQ(vb[s * vrb], 0xAB) << "slot " << s << " was not written by any token";
    }
  }
}

// The quantized KV rows are ggml's quantize_row_*_ref bytes: a 64-value row (two
// blocks, the second of smaller values) against bytes computed by a line-by-line
// float32 transcription of ggml-quants.c's reference quantizers (numpy; q8_0:
// roundf; q4/q5: truncation of x * id + 8.5 / 16.5 / 0.5; iq4_nl: ntry -1, the
// least-squares scale of the nearest codebook entries, weights x^2).
TEST(KvWrite, QuantizedRowsAreGgmlReferenceBytes) {
  std::vector<float> x(64);
  for (int j = 0; j < 64; ++j) {
    x[j] = static_cast<float>((j * 37 + 11) % 61 - 30) / 8.0f;
    if (j >= 32) x[j] *= 0.3f;
  }
  const struct {
    KvDtype dt;
    const char* hex;
  } cases[] = {
      {KvDtype::Q8_0,
       "8f27b04ce7811eb855ef8926c15df8922fc966009a37d16e08a33fda7711ab48e27f62201ab153ea8123ba5cf38a2cc365fc9335cb6d049b3"
       "dd4760da446dd7f16ad4fe6"},
      {KvDtype::Q4_0, "8037e38d26b05af39d27c16af49e37d16bf55a305af38d27c05af49e27c16bf49e38d16b"},
      {KvDtype::Q4_1, "003880c3e38c26b059e38d27b15af49d37c16af4a4305abc49e38c26b05ae38d27c15af49d37c16b"},
      {KvDtype::Q5_0, "8033524a6badd60a3d70a4e71b4e81b5f82c5f92c6f95a2ca594d65a93e61a3d80a4f72c4e91c6f83d6fa2d7"},
      {KvDtype::Q5_1, "be3380c3524a6badc6093c60a3d71a4d71b4e82b5e82c5f97e2c5abca594d65a93d60a3d70a4e71b4e81b5f82c5f92c6"},
      {KvDtype::IQ4_NL, "a327f28d16c04af39e26d05bf39e27d15cf478204af28e16d04bf39e27d05bf3ae28d16c"},
  };
  for (const auto& c : cases) {
    const size_t rb = kv_row_bytes(c.dt, 64);
    std::string want;
    for (size_t i = 0; i + 1 < std::strlen(c.hex); i += 2)
      want.push_back(static_cast<char>(std::stoi(std::string(c.hex + i, 2), nullptr, 16)));
    ASSERT_EQ(want.size(), rb) << kv_dtype_name(c.dt);
    std::vector<uint8_t> kb(rb), vb(rb);
    // K of this type, V of the same type: both rows are the reference bytes.
    const KvLayerView kv{kb.data(), vb.data(), c.dt, 1, 1, 64, rb, 0, c.dt, rb};
    const int64_t slot = 0;
    kv_write(kv, x.data(), x.data(), &slot, 1);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(kb.data()), rb), want) << kv_dtype_name(c.dt) << " K";
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(vb.data()), rb), want) << kv_dtype_name(c.dt) << " V";
  }
}

TEST(KvWrite, Q8_0RoundsHalfAwayFromZeroLikeGgml) {
  // amax = 127 -> d = 1: 2.5 -> 3 and -2.5 -> -3 (roundf), not 2 / -2 (nearest even).
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  std::vector<uint8_t> row(34), vrow(34);
  KvLayerView kv{row.data(), vrow.data(), KvDtype::Q8_0, 1, 1, 32, 34, 0, KvDtype::Q8_0, 34};
  const int64_t slot = 0;
  kv_write(kv, x.data(), x.data(), &slot, 1);
  BlockQ8_0 b;
  std::memcpy(&b, row.data(), 34);
  EXPECT_EQ(fp16_to_fp32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 3);
  EXPECT_EQ(b.qs[2], -3);
  EXPECT_EQ(b.qs[3], 1);
}

TEST(SharedOps, GetRowsGatherRowsAddRows) {
  // get_rows: rows 2, 0, 2 of a Q8_0 table equal the rows dequantized alone.
  const int64_t rows = 3, cols = 64;
  const auto w = testing::make_weight(GgmlType::Q8_0, rows, cols, 5);
  const int32_t ids[] = {2, 0, 2};
  std::vector<float> got(3 * cols), want(cols);
  get_rows(w.view, ids, 3, got.data());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(dequantize_row(GgmlType::Q8_0, w.bytes.data() + ids[i] * w.view.row_bytes, want.data(), cols));
    ASSERT_TRUE(BitwiseEqual(got.data() + i * cols, want.data(), cols)) << "row " << i;
  }
  // gather_rows: out[i] = x[rows[i]].
  const auto x = random_vec(4 * 5, 31);
  const int32_t pick[] = {3, 1};
  float out[2 * 5];
  gather_rows(x.data(), 5, pick, 2, out);
  ASSERT_TRUE(BitwiseEqual(out, x.data() + 15, 5));
  ASSERT_TRUE(BitwiseEqual(out + 5, x.data() + 5, 5));
  // add_rows: every row gets the same bias, in float.
  auto y = random_vec(3 * 7, 32);
  const auto y0 = y, bias = random_vec(7, 33);
  add_rows(y.data(), bias.data(), 3, 7);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 7; ++i) ASSERT_EQ(y[r * 7 + i], y0[r * 7 + i] + bias[i]) << r << "," << i;
}

TEST(Backend, TablesCallTheirOwnKernels) {
  const Backend& c = backend(BackendKind::Cpu);
  const Backend& r = backend(BackendKind::Ref);
  EXPECT_STREQ(c.name, "cpu");
  EXPECT_STREQ(r.name, "ref");
  EXPECT_EQ(c.matmul, &cpu::matmul);
  EXPECT_EQ(c.rmsnorm, &cpu::rmsnorm);
  EXPECT_EQ(c.rope, &cpu::rope);
  EXPECT_EQ(c.paged_attention, &cpu::paged_attention);
  EXPECT_EQ(r.matmul, &ref::matmul);
  EXPECT_EQ(r.rmsnorm, &ref::rmsnorm);
  EXPECT_EQ(r.rope, &ref::rope);
  EXPECT_EQ(r.paged_attention, &ref::paged_attention);
  EXPECT_EQ(c.gelu_mul, &cpu::gelu_mul);
  EXPECT_EQ(r.gelu_mul, &ref::gelu_mul);
  EXPECT_EQ(c.mul_scalar, r.mul_scalar);
  // Every slot is filled in both tables (a null would crash a forward).
  for (const Backend* b : {&c, &r}) {
    EXPECT_TRUE(b->kv_write && b->get_rows && b->gather_rows && b->add && b->add_rows && b->silu_mul) << b->name;
  }
}

// Rope scaling (llama 3.x factors, linear freq_scale, LongRoPE attn_factor):
// cpu equals ref bitwise, and ref rotates by p * base^(-2i/d) / f_i * s, scaled.
TEST(Rope, ScalingCpuBitwiseEqualsRefAndKnownValue) {
  const std::vector<float> factors = {1.0f, 2.5f, 8.0f, 32.0f};
  const RopeScaling sc{.freq_factors = factors.data(), .freq_scale = 0.25f, .attn_factor = 1.2f};
  for (bool neox : {false, true}) {
    std::vector<int32_t> pos{0, 3, 1000, 70000};
    auto a = random_vec(4 * 2 * 8, 21);
    auto b = a;
    ref::rope(a.data(), pos.data(), 4, 2, 8, 8, 500000.0f, neox, sc);
    cpu::rope(b.data(), pos.data(), 4, 2, 8, 8, 500000.0f, neox, sc);
    ASSERT_TRUE(BitwiseEqual(b.data(), a.data(), a.size())) << neox;
  }
  // Pair i = 2 of one head (neox: dims 2 and 6), position 1000.
  std::vector<float> x(8, 0.0f);
  x[2] = 1.0f;
  const int32_t p = 1000;
  ref::rope(x.data(), &p, 1, 1, 8, 8, 10000.0f, true, sc);
  const double theta = 1000 * std::pow(10000.0, -4.0 / 8) / 8.0 * 0.25;
  EXPECT_FLOAT_EQ(x[2], static_cast<float>(std::cos(theta) * 1.2));
  EXPECT_FLOAT_EQ(x[6], static_cast<float>(std::sin(theta) * 1.2));
  EXPECT_EQ(x[0], 0.0f);
}

// gelu_mul (tanh GELU, GeGLU) as llama.cpp's ggml table: cpu equals ref
// bitwise (tails, both ends, every f16 code's neighbourhood); ref is the double
// formula of x rounded to f16, rounded to f16 (so within 2^-10 relative of the
// formula at x); 0 at or below -10, x at or above 10.
TEST(Elementwise, GeluMulCpuMatchesRefAndFormula) {
  const auto gelu = [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); };
  for (int64_t n : kSizes) {
    auto g = random_vec(static_cast<size_t>(n), 31, 12.0);
    const auto u = random_vec(static_cast<size_t>(n), 32);
    auto gc = g;
    auto gr = g;
    ref::gelu_mul(gr.data(), u.data(), n);
    cpu::gelu_mul(gc.data(), u.data(), n);
    ASSERT_TRUE(BitwiseEqual(gc.data(), gr.data(), static_cast<size_t>(n))) << n;
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      const double want = x <= -10 ? 0.0 : x >= 10 ? x : gelu(x);
      ASSERT_NEAR(gr[i], want * u[i], (1e-7 + std::ldexp(std::fabs(want) + std::fabs(x), -10)) * std::fabs(u[i])) << i;
    }
  }
  // ggml_table_gelu_f16 entries (read from the reference llama.cpp build's libggml-cpu):
  // 1, 2.5, 6.8, -6.8 and four where 1 + tanh cancels (0xbfff = -1.999: only
  // ggml's fused multiply-add gives 0xa9d3).
  const uint16_t ggml_table[][2] = {{0xbfff, 0xa9d3}, {0xc007, 0xa9a9}, {0xc264, 0x97c8}, {0xc305, 0x90dc},
                                    {0x3c00, 0x3abb}, {0x4100, 0x40f8}, {0x48d0, 0x48d0}, {0xc8d0, 0x8000}};
  for (const auto& e : ggml_table) EXPECT_EQ(fp32_to_fp16(gelu_of_f16(e[0])), e[1]) << e[0];
  // Every f16 code in (-10, 10) (as f32 inputs, 8 at a time and in the tail) through both.
  std::vector<float> all, ones;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = fp16_to_fp32(static_cast<uint16_t>(h));
    if (x > -10.0f && x < 10.0f) all.push_back(x);
  }
  all.push_back(std::nextafter(10.0f, 0.0f));
  all.push_back(std::nextafter(-10.0f, 0.0f));
  ones.assign(all.size(), 1.0f);
  auto ac = all, ar = all;
  cpu::gelu_mul(ac.data(), ones.data(), static_cast<int64_t>(ac.size()));
  ref::gelu_mul(ar.data(), ones.data(), static_cast<int64_t>(ar.size()));
  ASSERT_TRUE(BitwiseEqual(ac.data(), ar.data(), ac.size()));
  float big[6] = {-20.0f, -10.0f, 0.0f, 10.0f, 20.0f, -0.0f};
  const float ones6[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  cpu::gelu_mul(big, ones6, 6);
  EXPECT_EQ(big[0], 0.0f);
  EXPECT_EQ(big[1], 0.0f);
  EXPECT_EQ(big[2], 0.0f);
  EXPECT_EQ(big[3], 10.0f);
  EXPECT_EQ(big[4], 20.0f);
  EXPECT_EQ(big[5], 0.0f);
  float s[5] = {1, 2, 3, 4, 5};
  mul_scalar(s, 0.5f, 5);
  EXPECT_EQ(s[4], 2.5f);
}

}  // namespace
}  // namespace pagoda::kernels
