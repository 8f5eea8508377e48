// AVX2 + FMA matmul (baseline x86-64-v3, runs everywhere pagoda runs).
// Same structure and batch-invariance argument as matmul_avx512.cc, with
// 8-lane vectors and records of 2 blocks; integer dots via maddubs/madd.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "base/ggml_quant.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels::cpu::detail {
namespace {

constexpr int kG = 2;
constexpr size_t kRec = 64 * kG;
constexpr int kR = 4;
constexpr int kT = 4;
constexpr int kQT = kT;  // tokens per integer tile
constexpr int64_t kChunkRows = 16;
constexpr int64_t kGemmChunkRows = kChunkRows;
// Tokens up to which groups are decoded in registers instead of packed per chunk.
constexpr int64_t kDirectMaxTokens = 2;
// How far ahead (in rows) the direct paths prefetch weights (DRAM latency).
constexpr size_t kPrefetchRows = 8;
// Below this many multiply-adds a fork/join costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// byte i of the result is 0xFF if bit i of m is set.
inline __m256i bits_to_bytes(uint32_t m) {
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                          0x0303030303030303);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), shuf);
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

template <GgmlType kType>
struct Layout;
template <> struct Layout<GgmlType::Q4_0> { static constexpr size_t kBB = 18, kQs = 2, kQh = 0; static constexpr bool kMin = false; static constexpr float kImplicit = -8.0f; };
template <> struct Layout<GgmlType::Q4_1> { static constexpr size_t kBB = 20, kQs = 4, kQh = 0; static constexpr bool kMin = true; static constexpr float kImplicit = 0.0f; };
template <> struct Layout<GgmlType::Q5_0> { static constexpr size_t kBB = 22, kQs = 6, kQh = 2; static constexpr bool kMin = false; static constexpr float kImplicit = -16.0f; };
template <> struct Layout<GgmlType::Q5_1> { static constexpr size_t kBB = 24, kQs = 8, kQh = 4; static constexpr bool kMin = true; static constexpr float kImplicit = 0.0f; };
template <> struct Layout<GgmlType::Q8_0> { static constexpr size_t kBB = 34, kQs = 2, kQh = 0; static constexpr bool kMin = false; static constexpr float kImplicit = 0.0f; };

// One decoded group (2 blocks) of one row: lo, hi (u8 0..31; s8 for q8_0), wd, wm.
struct WGroup {
  __m256i lo, hi;
  __m256 wd, wm;
};

alignas(64) const uint8_t kZeroBlock[64] = {};  // d = m = 0, all quants 0

template <GgmlType kType>
inline WGroup decode_group(const uint8_t* b0, const uint8_t* b1) {
  using L = Layout<kType>;
  const __m128 dm = _mm_cvtph_ps(_mm_setr_epi32(static_cast<int>(load_u32(b0)), static_cast<int>(load_u32(b1)), 0, 0));
  const __m256 dm8 = _mm256_castps128_ps256(dm);
  WGroup w;
  w.wd = _mm256_permutevar8x32_ps(dm8, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
  if constexpr (kType == GgmlType::Q8_0) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2));
    w.lo = _mm256_permute2x128_si256(a, b, 0x20);
    w.hi = _mm256_permute2x128_si256(a, b, 0x31);
    w.wm = _mm256_setzero_ps();
  } else {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b1 + L::kQs),
                                          reinterpret_cast<const __m128i*>(b0 + L::kQs));
    w.lo = _mm256_and_si256(v, nib);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    if constexpr (L::kQh != 0) {
      const uint32_t h0 = load_u32(b0 + L::kQh), h1 = load_u32(b1 + L::kQh);
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      w.lo = _mm256_or_si256(w.lo, _mm256_and_si256(bits_to_bytes((h0 & 0xFFFF) | (h1 << 16)), bit4));
      w.hi = _mm256_or_si256(w.hi, _mm256_and_si256(bits_to_bytes((h0 >> 16) | (h1 & 0xFFFF0000u)), bit4));
    }
    if constexpr (L::kMin) {
      w.wm = _mm256_permutevar8x32_ps(dm8, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
    } else {
      w.wm = _mm256_mul_ps(w.wd, _mm256_set1_ps(L::kImplicit));
    }
  }
  return w;
}

template <GgmlType kType>
inline WGroup decode_row_group(const uint8_t* row, int64_t nb, int64_t g) {
  constexpr size_t bb = Layout<kType>::kBB;
  const uint8_t* b0 = row + g * kG * bb;
  return decode_group<kType>(b0, g * kG + 1 < nb ? b0 + bb : kZeroBlock);
}

inline void store_group(const WGroup& w, uint8_t* rec) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(rec), w.lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(rec + 32), w.hi);
  _mm256_store_ps(reinterpret_cast<float*>(rec + 64), w.wd);
  _mm256_store_ps(reinterpret_cast<float*>(rec + 96), w.wm);
}

inline WGroup load_group(const uint8_t* rec) {
  return {_mm256_load_si256(reinterpret_cast<const __m256i*>(rec)),
          _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + 32)),
          _mm256_load_ps(reinterpret_cast<const float*>(rec + 64)),
          _mm256_load_ps(reinterpret_cast<const float*>(rec + 96))};
}

// The one op sequence every output goes through, per group.
template <bool kQ8>
inline __m256 group_dot(__m256 acc, const WGroup& w, const uint8_t* xt) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i xlo = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt));
  const __m256i xhi = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 32));
  __m256i is;
  if constexpr (kQ8) {
    const __m256i plo = _mm256_maddubs_epi16(_mm256_abs_epi8(w.lo), _mm256_sign_epi8(xlo, w.lo));
    const __m256i phi = _mm256_maddubs_epi16(_mm256_abs_epi8(w.hi), _mm256_sign_epi8(xhi, w.hi));
    is = _mm256_add_epi32(_mm256_madd_epi16(plo, ones16), _mm256_madd_epi16(phi, ones16));
  } else {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, xlo), _mm256_maddubs_epi16(w.hi, xhi));
    is = _mm256_madd_epi16(p, ones16);
  }
  // d_w * d_x first, then one fma per lane: ggml's per-block order.
  const __m256 dd = _mm256_mul_ps(w.wd, _mm256_load_ps(reinterpret_cast<const float*>(xt + 64)));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dd, acc);
  if constexpr (!kQ8) acc = _mm256_fmadd_ps(w.wm, _mm256_load_ps(reinterpret_cast<const float*>(xt + 96)), acc);
  return acc;
}

// The micro-kernel loop shared by the packed and the direct kernels: T tokens
// times kR rows, group by group; load(r, g) gives row r's weight group g.
template <int T, bool kQ8, class LoadGroup>
inline void qkernel_rows(LoadGroup load, const uint8_t* const* x, int64_t ng, float* out) {
  __m256 acc[kR][T];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const size_t o = static_cast<size_t>(g) * kRec;
    for (int r = 0; r < kR; ++r) {
      const WGroup wg = load(r, g);
      for (int t = 0; t < T; ++t) acc[r][t] = group_dot<kQ8>(acc[r][t], wg, x[t] + o);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) out[t * kR + r] = hsum8(acc[r][t]);
}

template <GgmlType kType, int T>
void qkernel(const uint8_t* const* w, const uint8_t* const* x, int64_t ng, float* out) {
  qkernel_rows<T, kType == GgmlType::Q8_0>([w](int r, int64_t g) { return load_group(w[r] + static_cast<size_t>(g) * kRec); }, x, ng, out);
}

// Direct (few tokens): decode each group in registers and use it at once.
template <GgmlType kType, int T>
void qkernel_direct(const uint8_t* const* rows, int64_t nb, const uint8_t* const* x, int64_t ng, size_t prefetch,
                    float* out) {
  constexpr bool kQ8 = kType == GgmlType::Q8_0;
  constexpr size_t kGroupBytes = Layout<kType>::kBB * kG;
  qkernel_rows<T, kQ8>(
      [rows, nb, prefetch](int r, int64_t g) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + prefetch + g * kGroupBytes), _MM_HINT_T0);
        return decode_row_group<kType>(rows[r], nb, g);
      },
      x, ng, out);
}


// Lanes [0, n) of an AVX2 mask: all ones, then zeros (n in [0, 8]).
inline __m256i lane_mask(int64_t n) {
  alignas(32) static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - n));
}

// The float micro-kernel loop shared by fkernel and hkernel_direct: T tokens
// times kR rows, 8 columns at a time, then a masked tail. load(r, c, n, tail)
// gives row r's weights at columns c..c+n as f32 (the rest zero); `tail` is
// std::true_type only in the tail, so each path compiles to its own loads.
template <int T, class LoadW>
inline void fkernel_rows(LoadW load, const float* const* x, int64_t k, float* out) {
  __m256 acc[kR][T];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    for (int r = 0; r < kR; ++r) {
      const __m256 wv = load(r, c, int64_t{8}, std::false_type{});
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[t] + c), acc[r][t]);
    }
  }
  if (c < k) {
    const __m256i m = lane_mask(k - c);
    for (int r = 0; r < kR; ++r) {
      const __m256 wv = load(r, c, k - c, std::true_type{});
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x[t] + c, m), acc[r][t]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) out[t * kR + r] = hsum8(acc[r][t]);
}

template <int T>
void fkernel(const float* const* w, const float* const* x, int64_t k, float* out) {
  fkernel_rows<T>(
      [w](int r, int64_t c, int64_t n, auto tail) {
        if constexpr (decltype(tail)::value) {
          return _mm256_maskload_ps(w[r] + c, lane_mask(n));
        } else {
          return _mm256_loadu_ps(w[r] + c);
        }
      },
      x, k, out);
}

void fkernel_n(int nt, const float* const* w, const float* const* x, int64_t k, float* out) {
  switch (nt) {
    case 1: fkernel<1>(w, x, k, out); break;
    case 2: fkernel<2>(w, x, k, out); break;
    case 3: fkernel<3>(w, x, k, out); break;
    default: fkernel<4>(w, x, k, out); break;
  }
}

// 8 weights at column c of a half-precision row as f32 (exact conversion);
// n < 8 reads only n values and zero-fills the rest.
template <GgmlType kType>
inline __m256 load_half8(const uint8_t* row, int64_t c, int64_t n) {
  __m128i h;
  if (n >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
  } else {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, row + 2 * c, static_cast<size_t>(n) * 2);
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  if constexpr (kType == GgmlType::F16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Direct F16/BF16 kernel for few tokens; same op sequence per output as fkernel.
template <GgmlType kType, int T>
void hkernel_direct(const uint8_t* const* w, const float* const* x, int64_t k, size_t prefetch, float* out) {
  fkernel_rows<T>(
      [w, prefetch](int r, int64_t c, int64_t n, auto tail) {
        if constexpr (!decltype(tail)::value) {
          if ((c & 31) == 0) _mm_prefetch(reinterpret_cast<const char*>(w[r] + prefetch + 2 * c), _MM_HINT_T0);
        }
        return load_half8<kType>(w[r], c, n);
      },
      x, k, out);
}

template <GgmlType kType>
void hkernel_direct_n(int nt, const uint8_t* const* w, const float* const* x, int64_t k, size_t prefetch,
                      float* out) {
  switch (nt) {
    case 1: hkernel_direct<kType, 1>(w, x, k, prefetch, out); break;
    case 2: hkernel_direct<kType, 2>(w, x, k, prefetch, out); break;
    case 3: hkernel_direct<kType, 3>(w, x, k, prefetch, out); break;
    default: hkernel_direct<kType, 4>(w, x, k, prefetch, out); break;
  }
}

void row_to_f32(const WeightView& w, int64_t r, float* out) {
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  const int64_t k = w.cols;
  int64_t c = 0;
  if (w.type == GgmlType::F16) {
    for (; c + 8 <= k; c += 8)
      _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c))));
  } else if (w.type == GgmlType::BF16) {
    for (; c + 8 <= k; c += 8) {
      const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c)));
      _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
    }
  }
  if (c < k) dequantize_row(w.type, src + ggml_row_bytes(w.type, static_cast<size_t>(c)), out + c, k - c);
}

constexpr bool kAvx512 = false;
constexpr int64_t kFloatLanes = 8;

// A decoded group is staged as it is (the AVX-512 file re-encodes Q8_0).
template <GgmlType kType>
inline const WGroup& staged(const WGroup& w) { return w; }

#include "kernels/cpu/matmul_driver.inc"

template <GgmlType kType>
void matmul_q32_t(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  matmul_q32_rows<kType>(w, x, n_tokens, y);  // AVX2 ignores w.packed (see pack.h)
}

}  // namespace

void matmul_avx2(const WeightView& w, const float* x, int64_t n_tokens, float* y) { matmul_isa(w, x, n_tokens, y); }

}  // namespace pagoda::kernels::cpu::detail
