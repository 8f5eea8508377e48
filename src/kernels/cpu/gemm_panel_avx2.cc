// The many-token GEMM of the AVX2 path (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0).
//
// Why a second kernel: the direct tiles of matmul_avx2.cc hold one row's group
// in a vector (lanes = columns of two blocks) and must fold every token's lane
// sums into block sums (three hadds per 4 rows) before each float step, and
// each token reloads the whole activation record per row. Here a vector holds
// 8 ROWS (lane i = row i, its 4 bytes = 4 columns of one block), so maddubs
// against the token's 4 activation bytes broadcast to every lane leaves each
// row's partial sums in its own lane: per block and token, 8 maddubs (Q4: summed
// in int16, |sum| <= 8 * 2 * 15 * 127 < 2^15; Q5: two sums of 4; Q8_0: sign
// trick and one madd each), one madd, then cvt, mul and one fma (Q4_1 / Q5_1:
// two) for 8 outputs; a weight vector serves kTokens tokens.
//
// Panels: a chunk's rows are restaged (once per call and chunk, for every token
// tile) from the GGUF rows into 8-row panels; per block b of the row, a panel
// record (kPanelRec bytes) holds
//   W[j]  32 bytes each, j = 0..7: lane i = row i's values at columns 4j..4j+3
//         of block b (u8 0..15 / 0..31 as stored; Q8_0: s8)
//   wd    8 f32: lane i = row i's d of block b
//   wm    8 f32: row i's m (Q4_1 / Q5_1; zero otherwise)
// Rows past the matrix are zero blocks (d = 0), whose lanes are not stored.
//
// Batch invariance: every output goes through the canonical sequence written
// at the top of matmul_avx2.cc (P_k per block index mod 4, then (P_0 + P_2) +
// (P_1 + P_3)) with the same exact integer block sums and the same float
// operands, so it is bitwise what the direct tiles give, whatever the token
// count, tile or thread.
#include "kernels/cpu/gemm_panel_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/ggml_quant.h"
#include "kernels/cpu/bytes_avx2.h"
#include "kernels/cpu/thread_pool.h"

namespace pagoda::kernels::cpu::detail {
namespace {

// The activation records this kernel quantizes and reads (cpu_internal.h): 2
// blocks of 32 per record, as matmul_avx2.cc's kG.
constexpr int kG = 2;
constexpr size_t kRec = 64 * kG;
constexpr int kPanelRows = 8;
constexpr int kTokens = 2;  // tokens per register tile: 4 P_k per token live in registers
constexpr size_t kPanelRec = 8 * 32 + 64;
// Below this many multiply-adds a fork/join costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

struct Blk {
  size_t bytes, qs, qh;  // block bytes, offset of the quants, of the high bits (0: none)
  bool min;              // has an m after d
};
constexpr Blk blk_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {18, 2, 0, false};
    case GgmlType::Q4_1: return {20, 4, 0, true};
    case GgmlType::Q5_0: return {22, 6, 2, false};
    case GgmlType::Q5_1: return {24, 8, 4, true};
    default: return {34, 2, 0, false};  // Q8_0
  }
}

alignas(64) const uint8_t kZeroBlock[64] = {};

// A block's 32 values in natural order (u8 as stored; Q8_0 s8).
template <GgmlType kType>
inline __m256i block_values(const uint8_t* b) {
  constexpr Blk L = blk_of(kType);
  if constexpr (kType == GgmlType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + L.qs));
  } else {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + L.qs));
    const __m128i nib = _mm_set1_epi8(0x0F);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), nib), _mm_and_si128(q, nib));
    if constexpr (L.qh != 0) v = _mm256_or_si256(v, _mm256_and_si256(bits_to_bytes(load_u32(b + L.qh)), _mm256_set1_epi8(0x10)));
    return v;
  }
}

// v[i] = row i's 8 dwords -> v[j] = dword j of the 8 rows (lane i = row i).
inline void transpose8(__m256i (&v)[8]) {
  __m256i t[8], u[8];
  for (int h = 0; h < 8; h += 4) {
    t[h + 0] = _mm256_unpacklo_epi32(v[h + 0], v[h + 1]);
    t[h + 1] = _mm256_unpackhi_epi32(v[h + 0], v[h + 1]);
    t[h + 2] = _mm256_unpacklo_epi32(v[h + 2], v[h + 3]);
    t[h + 3] = _mm256_unpackhi_epi32(v[h + 2], v[h + 3]);
    u[h + 0] = _mm256_unpacklo_epi64(t[h + 0], t[h + 2]);
    u[h + 1] = _mm256_unpackhi_epi64(t[h + 0], t[h + 2]);
    u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
    u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
    v[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
  }
}

// Panel p (rows 8p..8p+7) of w, all nb blocks, into out (nb records).
template <GgmlType kType>
void stage_panel(const WeightView& w, int64_t p, int64_t nb, uint8_t* out) {
  constexpr Blk L = blk_of(kType);
  const uint8_t* rows[kPanelRows];
  for (int i = 0; i < kPanelRows; ++i) {
    const int64_t r = p * kPanelRows + i;
    rows[i] = r < w.rows ? static_cast<const uint8_t*>(w.data) + r * w.row_bytes : nullptr;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) blk[i] = rows[i] != nullptr ? rows[i] + static_cast<size_t>(b) * L.bytes : kZeroBlock;
    __m256i v[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) v[i] = block_values<kType>(blk[i]);
    transpose8(v);
    uint8_t* rec = out + static_cast<size_t>(b) * kPanelRec;
    for (int j = 0; j < 8; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(rec + 32 * j), v[j]);
    alignas(16) uint16_t dh[8], mh[8];
    for (int i = 0; i < kPanelRows; ++i) {
      dh[i] = load_u16(blk[i]);
      mh[i] = L.min ? load_u16(blk[i] + 2) : 0;
    }
    _mm256_store_ps(reinterpret_cast<float*>(rec + 256), _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh))));
    _mm256_store_ps(reinterpret_cast<float*>(rec + 288), _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mh))));
  }
}

inline __m256i bcast_u32(const uint8_t* p) { return _mm256_set1_epi32(static_cast<int>(load_u32(p))); }

// Block b = 4q + k of a panel for T tokens: acc[t][k] = P_k of token t, as the
// direct tiles compute it. xo: the block's pair's record in an activation row;
// half: 16 * (k & 1), the block's place in that record.
template <GgmlType kType, int T, int k>
inline void panel_block(const uint8_t* rec, const uint8_t* const* x, size_t xo, __m256 (&acc)[T][4]) {
  constexpr Blk L = blk_of(kType);
  constexpr size_t half = 16 * (k & 1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  // offset of columns 4j..4j+3 of the block: the record's quants lo (values 0..15), then hi (16..31)
  const auto xcol = [xo](int j) { return xo + (j < 4 ? half + 4 * j : 32 + half + 4 * (j - 4)); };
  const auto wj = [rec](int j) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + 32 * j)); };
  __m256i s[T];
  if constexpr (kType == GgmlType::Q8_0) {  // |w| times x with w's sign: each pair fits int16
    for (int t = 0; t < T; ++t) s[t] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i wv = wj(j), wa = _mm256_abs_epi8(wv);
      for (int t = 0; t < T; ++t) {
        const __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(bcast_u32(x[t] + xcol(j)), wv));
        s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p, ones16));
      }
    }
  } else {
    // int16 sums of kRun maddubs, each then widened by one madd: Q4 all 8
    // (8 * 2 * 15 * 127 < 2^15), Q5 two runs of 4 (4 * 2 * 31 * 127 < 2^15).
    constexpr int kRun = L.qh != 0 ? 4 : 8;
    for (int t = 0; t < T; ++t) s[t] = _mm256_setzero_si256();
    for (int j0 = 0; j0 < 8; j0 += kRun) {
      __m256i s16[T];
      for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
      for (int j = j0; j < j0 + kRun; ++j) {
        const __m256i wv = wj(j);
        for (int t = 0; t < T; ++t) s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(wv, bcast_u32(x[t] + xcol(j))));
      }
      for (int t = 0; t < T; ++t) s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(s16[t], ones16));
    }
  }
  const __m256 wd = _mm256_load_ps(reinterpret_cast<const float*>(rec + 256));
  for (int t = 0; t < T; ++t) {
    const uint8_t* xr = x[t] + xo;
    if constexpr (kType == GgmlType::Q4_0 || kType == GgmlType::Q5_0) {  // + (-8 or -16) * sum(q)
      s[t] = _mm256_add_epi32(s[t], bcast_u32(xr + 96 + half));
    }
    const __m256 dd = _mm256_mul_ps(wd, _mm256_broadcast_ss(reinterpret_cast<const float*>(xr + 64 + half)));
    acc[t][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), dd, acc[t][k]);
    if constexpr (L.min) {  // m * s_x
      const __m256 wm = _mm256_load_ps(reinterpret_cast<const float*>(rec + 288));
      acc[t][k] = _mm256_fmadd_ps(wm, _mm256_broadcast_ss(reinterpret_cast<const float*>(xr + 96 + half)), acc[t][k]);
    }
  }
}

// Lanes [0, n) of an AVX2 mask (n in [0, 8]).
inline __m256i lane_mask(int64_t n) {
  alignas(32) static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - n));
}

// One panel for T tokens: 4 accumulators P_k per token, blocks in order.
template <GgmlType kType, int T>
void panel_kernel(const uint8_t* panel, const uint8_t* const* x, int64_t nb, float* const* out, int nrows) {
  __m256 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < 4; ++k) acc[t][k] = _mm256_setzero_ps();
  const int64_t full = nb / 4;
  for (int64_t q = 0; q < full; ++q) {
    const uint8_t* rec = panel + static_cast<size_t>(4 * q) * kPanelRec;
    const size_t xo = static_cast<size_t>(2 * q) * kRec;
    panel_block<kType, T, 0>(rec, x, xo, acc);
    panel_block<kType, T, 1>(rec + kPanelRec, x, xo, acc);
    panel_block<kType, T, 2>(rec + 2 * kPanelRec, x, xo + kRec, acc);
    panel_block<kType, T, 3>(rec + 3 * kPanelRec, x, xo + kRec, acc);
  }
  if (const int64_t rest = nb - 4 * full; rest > 0) {
    const uint8_t* rec = panel + static_cast<size_t>(4 * full) * kPanelRec;
    const size_t xo = static_cast<size_t>(2 * full) * kRec;
    panel_block<kType, T, 0>(rec, x, xo, acc);
    if (rest > 1) panel_block<kType, T, 1>(rec + kPanelRec, x, xo, acc);
    if (rest > 2) panel_block<kType, T, 2>(rec + 2 * kPanelRec, x, xo + kRec, acc);
  }
  for (int t = 0; t < T; ++t) {
    const __m256 y = _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][2]), _mm256_add_ps(acc[t][1], acc[t][3]));
    if (nrows == kPanelRows) {
      _mm256_storeu_ps(out[t], y);
    } else {
      _mm256_maskstore_ps(out[t], lane_mask(nrows), y);
    }
  }
}

}  // namespace

template <GgmlType kType>
void matmul_panels_avx2(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  const int64_t ng = act_groups(w.cols, kG), nb = w.cols / 32;
  const size_t xrow = static_cast<size_t>(ng) * kRec;
  uint8_t* act = scratch(0, static_cast<size_t>(n_tokens) * xrow);
  quantize_act(x, n_tokens, w.cols, kG, act_mode_for(kType, /*avx512=*/false, /*direct=*/false), act);
  const int64_t n_panels = (w.rows + kPanelRows - 1) / kPanelRows;
  const int nth = threads();
  const size_t panel_bytes = static_cast<size_t>(nb) * kPanelRec;
  // A chunk's panels stay in L2 while every token tile passes over them.
  int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>((128u << 10) / panel_bytes));
  per_chunk = std::min(per_chunk, std::max<int64_t>(1, n_panels / (8 * nth)));
  const int64_t n_chunks = (n_panels + per_chunk - 1) / per_chunk;
  const bool big = w.rows * w.cols * n_tokens >= kMinParallelMacs;
  parallel_for(n_chunks, big ? nth : 1, [=, &w](int64_t ch) {
    const int64_t p0 = ch * per_chunk, np = std::min(per_chunk, n_panels - p0);
    uint8_t* st = scratch(1, static_cast<size_t>(np) * panel_bytes);
    for (int64_t i = 0; i < np; ++i) stage_panel<kType>(w, p0 + i, nb, st + static_cast<size_t>(i) * panel_bytes);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kTokens, n_tokens - t0));
      const uint8_t* xp[kTokens];
      for (int t = 0; t < nt; ++t) xp[t] = act + static_cast<size_t>(t0 + t) * xrow;
      for (int64_t i = 0; i < np; ++i) {
        const int64_t row0 = (p0 + i) * kPanelRows;
        const int nr = static_cast<int>(std::min<int64_t>(kPanelRows, w.rows - row0));
        float* op[kTokens];
        for (int t = 0; t < nt; ++t) op[t] = y + (t0 + t) * w.rows + row0;
        const uint8_t* pn = st + static_cast<size_t>(i) * panel_bytes;
        if (nt == kTokens) {
          panel_kernel<kType, kTokens>(pn, xp, nb, op, nr);
        } else {
          panel_kernel<kType, 1>(pn, xp, nb, op, nr);
        }
      }
    }
  });
}

template void matmul_panels_avx2<GgmlType::Q4_0>(const WeightView&, const float*, int64_t, float*);
template void matmul_panels_avx2<GgmlType::Q4_1>(const WeightView&, const float*, int64_t, float*);
template void matmul_panels_avx2<GgmlType::Q5_0>(const WeightView&, const float*, int64_t, float*);
template void matmul_panels_avx2<GgmlType::Q5_1>(const WeightView&, const float*, int64_t, float*);
template void matmul_panels_avx2<GgmlType::Q8_0>(const WeightView&, const float*, int64_t, float*);

}  // namespace pagoda::kernels::cpu::detail
