// Helpers shared by the kernel tests: random weights of every type, ISA
// selection, and comparisons that report the first differing index.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "base/ggml_types.h"
#include "base/rng.h"
#include "kernels/api.h"

namespace pagoda::kernels::testing {

// Random weight rows: random quant bytes (every bit pattern occurs) with sane
// f16 scales so no value is inf/NaN.
struct RandomWeight {
  std::vector<uint8_t> bytes;
  WeightView view;
};

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

inline RandomWeight make_weight(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  RandomWeight w;
  const size_t rb = ggml_row_bytes(type, static_cast<size_t>(cols));
  w.bytes.resize(rb * static_cast<size_t>(rows));
  for (auto& b : w.bytes) b = static_cast<uint8_t>(rng.next_u64());
  const auto scale = [&] { return static_cast<float>(0.002 + 0.02 * rng.uniform()); };
  const auto& info = ggml_type_info(type);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * rb;
    for (int64_t b = 0; b < cols / info.block_size; ++b) {
      uint8_t* blk = row + b * info.type_size;
      switch (type) {
        case GgmlType::F32: {
          const float v = static_cast<float>(rng.normal());
          std::memcpy(blk, &v, 4);
          break;
        }
        case GgmlType::F16: put_f16(blk, static_cast<float>(rng.normal())); break;
        case GgmlType::BF16: {
          const uint16_t h = fp32_to_bf16(static_cast<float>(rng.normal()));
          std::memcpy(blk, &h, 2);
          break;
        }
        case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: put_f16(blk, scale()); break;
        case GgmlType::Q4_1: case GgmlType::Q5_1:
          put_f16(blk, scale());
          put_f16(blk + 2, -8.0f * scale());
          break;
        case GgmlType::Q4_K: case GgmlType::Q5_K:
          put_f16(blk, scale() * 0.1f);
          put_f16(blk + 2, scale() * 0.1f);
          break;
        case GgmlType::Q6_K: put_f16(blk + 208, scale() * 0.05f); break;
        case GgmlType::Q2_K:
          put_f16(blk + 80, scale() * 0.5f);
          put_f16(blk + 82, scale() * 0.5f);
          break;
        case GgmlType::Q3_K: put_f16(blk + 108, scale() * 0.1f); break;
        case GgmlType::IQ4_NL: put_f16(blk, scale() * 0.1f); break;
        case GgmlType::IQ4_XS: put_f16(blk, scale() * 0.005f); break;
        default: ADD_FAILURE() << "no generator for type"; break;
      }
    }
  }
  w.view = WeightView{w.bytes.data(), type, rows, cols, rb};
  return w;
}

inline std::vector<float> random_vec(size_t n, uint64_t seed, double sd = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(sd * rng.normal());
  return v;
}

inline bool bits_equal(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Bitwise comparison; on failure names the first differing index and both values.
inline ::testing::AssertionResult BitwiseEqual(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!bits_equal(a[i], b[i]))
      return ::testing::AssertionFailure() << "first difference at index " << i << ": " << a[i] << " vs "
                                           << b[i] << " (hexfloat " << std::hexfloat << a[i] << " vs " << b[i]
                                           << std::defaultfloat << ")";
  return ::testing::AssertionSuccess();
}

// |got - want| <= tol[i] for every i (tol per element).
inline ::testing::AssertionResult WithinTol(const float* got, const float* want, const double* tol, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= tol[i]))
      return ::testing::AssertionFailure() << "first difference at index " << i << ": got " << got[i]
                                           << " want " << want[i] << " (err " << err << " > tol " << tol[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

// ISAs to cover on this machine ("avx2" always; "avx512-vnni" when supported).
inline std::vector<std::string> isas() {
  std::vector<std::string> v{"avx2"};
  if (cpu::set_isa("avx512-vnni")) v.push_back("avx512-vnni");
  cpu::set_isa("auto");
  return v;
}

// Runs ref::matmul once and cpu::matmul on every ISA in `isa_list` on one random
// weight of `type` and random activations; each output must lie within
// tol_fn(w, x, n_tokens) of ref's. Leaves the ISA on the last one tried.
template <class TolFn>
::testing::AssertionResult MatchesRefOnEveryIsa(GgmlType type, int64_t rows, int64_t cols, int64_t n_tokens,
                                                 uint64_t* seed, const std::vector<std::string>& isa_list,
                                                 TolFn tol_fn) {
  auto w = make_weight(type, rows, cols, (*seed)++);
  const auto x = random_vec(static_cast<size_t>(n_tokens * cols), (*seed)++);
  std::vector<float> want(static_cast<size_t>(n_tokens * rows));
  ref::matmul(w.view, x.data(), n_tokens, want.data());
  const std::vector<double> tol = tol_fn(w.view, x, n_tokens);
  for (const auto& isa : isa_list) {
    if (!cpu::set_isa(isa.c_str())) return ::testing::AssertionFailure() << "cannot select ISA " << isa;
    std::vector<float> got(want.size(), -1.0f);
    cpu::matmul(w.view, x.data(), n_tokens, got.data());
    auto r = WithinTol(got.data(), want.data(), tol.data(), got.size());
    if (!r) {
      return r << " " << ggml_type_info(type).name << " rows=" << rows << " cols=" << cols
               << " n_tokens=" << n_tokens << " isa=" << cpu::isa_name();
    }
  }
  return ::testing::AssertionSuccess();
}

// A GEMM of random data spanning many row chunks and token tiles, with 1 and with
// 2 threads: the outputs must be bitwise equal. Leaves 2 threads set.
inline ::testing::AssertionResult ThreadCountInvariant(GgmlType type, int64_t rows, int64_t cols, int64_t n) {
  auto w = make_weight(type, rows, cols, 7);
  const auto x = random_vec(static_cast<size_t>(n * cols), 8);
  std::vector<float> y1(static_cast<size_t>(n * rows)), y2(y1.size());
  set_num_threads(1);
  cpu::matmul(w.view, x.data(), n, y1.data());
  set_num_threads(2);
  cpu::matmul(w.view, x.data(), n, y2.data());
  auto r = BitwiseEqual(y1.data(), y2.data(), y1.size());
  if (!r) r << " " << ggml_type_info(type).name;
  return r;
}

// Test-name suffix for an ISA parameter ("avx512-vnni" -> "avx512_vnni").
inline std::string IsaParamName(const ::testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

// Restores the automatic ISA and thread count when a test ends.
struct IsaScope {
  // Tests run single-threaded unless they set otherwise: several test binaries
  // share the CI cores and OpenMP spin-waiting on an oversubscribed machine is slow.
  explicit IsaScope(const std::string& isa) : threads(num_threads()) {
    EXPECT_TRUE(cpu::set_isa(isa.c_str()));
    set_num_threads(1);
  }
  ~IsaScope() {
    cpu::set_isa("auto");
    cpu::set_attention("auto");
    set_num_threads(threads);
  }
  int threads;
};

// Every kernel test binary starts single-threaded (see IsaScope for why); the
// tests about thread counts set 2 explicitly.
struct SingleThreadEnv : ::testing::Environment {
  void SetUp() override { set_num_threads(1); }
};
inline ::testing::Environment* const kSingleThreadEnv =
    ::testing::AddGlobalTestEnvironment(new SingleThreadEnv);

}  // namespace pagoda::kernels::testing
