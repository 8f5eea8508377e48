// AVX2 + FMA matmul (baseline x86-64-v3, runs everywhere pagoda runs).
// Same structure as matmul_avx512.cc, with 8-lane vectors and records of 2
// blocks; integer dots via maddubs/madd.
//
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0: the canonical float sequence is the AVX-512
// one, so both ISAs give every output bitwise the same value. For output
// y[t, r] and each block b of the row in order, with S_b the exact integer
// sum(w * q) of the block (Q4_0 / Q5_0: sum((w - 8) * q), sum((w - 16) * q),
// as ggml's integer dot, through the activation record's correction) and
// k = b mod 4:
//   P_k = fma(float(S_b), d_w * d_x, P_k)        [Q4_1 / Q5_1: then
//   P_k = fma(m_w, s_x, P_k), s_x = f16(d_x * sum q), ggml's q8_1 s]
// from P_k = +0, and y = (P_0 + P_2) + (P_1 + P_3). Every path below (the
// direct tiles of 4 rows here, the staged records, the 8-row panels of
// gemm_panel_avx2.cc) computes exactly that, whatever the token count, tile or
// thread. Tests: Matmul.Q32OutputsAreTheCanonicalSequence (a scalar
// transcription of the above), Isa/MatmulTest.BatchInvariantBitwise.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "base/ggml_quant.h"
#include "kernels/cpu/bytes_avx2.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/gemm_panel_avx2.h"
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
// Tokens up to which groups are decoded in registers instead of staged per
// chunk; from kPanelMinTokens on the panels take over (matmul_q32_t), so the
// staged records are not used by matmul_avx2 (they stay correct: same sequence).
constexpr int64_t kDirectMaxTokens = kPanelMinTokensAvx2 - 1;
// How far ahead (in rows) the direct paths prefetch weights (DRAM latency).
constexpr size_t kPrefetchRows = 8;
// Below this many multiply-adds a fork/join costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
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
    } else {  // Q4_0 / Q5_0: the -8 / -16 offset is in the block's exact integer sum
      w.wm = _mm256_setzero_ps();
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

// The exact integer lane sums of one row's group for one token: lanes 0..3
// partial sums of block 0, lanes 4..7 of block 1 (their sum is the block's
// sum(w * q); the Q4_0 / Q5_0 correction is added per block after the fold).
template <bool kQ8>
inline __m256i group_isum(const WGroup& w, const uint8_t* xt) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i xlo = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt));
  const __m256i xhi = _mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 32));
  if constexpr (kQ8) {
    const __m256i plo = _mm256_maddubs_epi16(_mm256_abs_epi8(w.lo), _mm256_sign_epi8(xlo, w.lo));
    const __m256i phi = _mm256_maddubs_epi16(_mm256_abs_epi8(w.hi), _mm256_sign_epi8(xhi, w.hi));
    return _mm256_add_epi32(_mm256_madd_epi16(plo, ones16), _mm256_madd_epi16(phi, ones16));
  } else {  // u8 0..31 times s8: each pair |sum| <= 2 * 31 * 127, two of them fit int16
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, xlo), _mm256_maddubs_epi16(w.hi, xhi));
    return _mm256_madd_epi16(p, ones16);
  }
}

// Lane 4k + r of wd (wm) of a 4-row tile = row r's d (m) of block k of the
// group: each row's own vectors hold its block k's value in lanes 4k..4k+3, so
// row r's comes in with a blend on lanes r and 4 + r.
constexpr int kRowLanes[kR] = {0x11, 0x22, 0x44, 0x88};

// One group of a 4-row tile for T tokens (the canonical sequence above): acc[t]
// holds P_0 (lanes 0..3, rows 0..3) and P_1 (4..7) for an even group, P_2 and
// P_3 for an odd one. load(r) gives row r's decoded group; each row's integer
// lane sums are folded pairwise into block sums as soon as both rows are in
// (lane 4k + r = row r's block k sum: exact integers, so the order of the adds
// does not matter), which keeps few registers live.
template <GgmlType kType, int T, class LoadRow>
inline void group_step(LoadRow load, const uint8_t* const* x, size_t o, __m256 (&acc)[T]) {
  constexpr bool kQ8 = kType == GgmlType::Q8_0;
  __m256i h01[T], h23[T];
  __m256 wd, wm;
  {
    const WGroup w0 = load(0), w1 = load(1);
    for (int t = 0; t < T; ++t) h01[t] = _mm256_hadd_epi32(group_isum<kQ8>(w0, x[t] + o), group_isum<kQ8>(w1, x[t] + o));
    wd = _mm256_blend_ps(w0.wd, w1.wd, kRowLanes[1]);
    wm = _mm256_blend_ps(w0.wm, w1.wm, kRowLanes[1]);
  }
  {
    const WGroup w2 = load(2), w3 = load(3);
    for (int t = 0; t < T; ++t) h23[t] = _mm256_hadd_epi32(group_isum<kQ8>(w2, x[t] + o), group_isum<kQ8>(w3, x[t] + o));
    wd = _mm256_blend_ps(_mm256_blend_ps(wd, w2.wd, kRowLanes[2]), w3.wd, kRowLanes[3]);
    wm = _mm256_blend_ps(_mm256_blend_ps(wm, w2.wm, kRowLanes[2]), w3.wm, kRowLanes[3]);
  }
  for (int t = 0; t < T; ++t) {
    const uint8_t* xt = x[t] + o;
    __m256i bs = _mm256_hadd_epi32(h01[t], h23[t]);
    if constexpr (Layout<kType>::kImplicit != 0.0f) {  // + (-8 or -16) * sum(q), record lane 4k
      bs = _mm256_add_epi32(bs, _mm256_shuffle_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(xt + 96)), 0));
    }
    // d_w * d_x first, then one fma per lane: ggml's per-block order.
    const __m256 dd = _mm256_mul_ps(wd, _mm256_load_ps(reinterpret_cast<const float*>(xt + 64)));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bs), dd, acc[t]);
    if constexpr (Layout<kType>::kMin) {  // s_x sits in lane 4k: spread it over 4k..4k+3
      acc[t] = _mm256_fmadd_ps(wm, _mm256_permute_ps(_mm256_load_ps(reinterpret_cast<const float*>(xt + 96)), 0), acc[t]);
    }
  }
}

// The micro-kernel loop shared by the staged and the direct kernels: kR rows
// times T tokens, group by group; load(r, g) gives row r's decoded group g.
// out[t * kR + r] = (P_0 + P_2) + (P_1 + P_3).
template <GgmlType kType, int T, class LoadGroup>
inline void qkernel_rows(LoadGroup load, const uint8_t* const* x, int64_t ng, float* out) {
  __m256 even[T], odd[T];
  for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 2 <= ng; g += 2) {
    group_step<kType, T>([&](int r) { return load(r, g); }, x, static_cast<size_t>(g) * kRec, even);
    group_step<kType, T>([&](int r) { return load(r, g + 1); }, x, static_cast<size_t>(g + 1) * kRec, odd);
  }
  if (g < ng) group_step<kType, T>([&](int r) { return load(r, g); }, x, static_cast<size_t>(g) * kRec, even);
  for (int t = 0; t < T; ++t) {
    const __m256 h = _mm256_add_ps(even[t], odd[t]);  // P_0 + P_2 | P_1 + P_3
    _mm_storeu_ps(out + t * kR, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
}

template <GgmlType kType, int T>
void qkernel(const uint8_t* const* w, const uint8_t* const* x, int64_t ng, float* out) {
  qkernel_rows<kType, T>([w](int r, int64_t g) { return load_group(w[r] + static_cast<size_t>(g) * kRec); }, x, ng, out);
}

// Direct (few tokens): decode each group in registers and use it at once.
template <GgmlType kType, int T>
void qkernel_direct(const uint8_t* const* rows, int64_t nb, const uint8_t* const* x, int64_t ng, size_t prefetch,
                    float* out) {
  constexpr size_t kGroupBytes = Layout<kType>::kBB * kG;
  qkernel_rows<kType, T>(
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
  // AVX2 ignores w.packed (see pack.h): many tokens go through the 8-row
  // panels restaged from the GGUF rows, fewer through the direct tiles.
  if (n_tokens >= kPanelMinTokensAvx2) {
    matmul_panels_avx2<kType>(w, x, n_tokens, y);
    return;
  }
  matmul_q32_rows<kType>(w, x, n_tokens, y);
}

}  // namespace

void matmul_avx2(const WeightView& w, const float* x, int64_t n_tokens, float* y) { matmul_isa(w, x, n_tokens, y); }

}  // namespace pagoda::kernels::cpu::detail
