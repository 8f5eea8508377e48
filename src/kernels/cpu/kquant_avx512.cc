// K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) x q8_K matmul for AVX-512 (BW + VNNI), whole
// row chunks of kKChunkRows = 16 rows at a time (KTileSet::chunk).
//
// The formats, their integer sums S1 / S2 and the canonical float sequence every
// path below ends in: kquant_formats_avx512.h. The weight layouts of the GEMM
// tile: kquant_layouts_avx512.h.
// Because S1 and S2 are exact integers, how they are computed does not matter:
// * few tokens (n_tokens < kGemmMinTokens, decode): each row's block is decoded
//   to natural order (64 values per zmm) and maddubs/vpdpwssd give 16 int32
//   partial sums per (row, token); 16 rows' partials are then reduced at once
//   by a transpose-add tree to the exact S1/S2 of the 16 rows, and the float
//   step runs on 16 lanes = 16 rows;
// * more tokens (GEMM): the 16 rows are repacked once per call into a
//   row-interleaved layout (a zmm holds 4 consecutive values of each of the 16
//   rows, as u8) and vpdpbusd against 4 broadcast activation bytes adds a
//   4-value dot product for 16 rows at once; per sub-block the 16 int32 dots
//   are scaled (vpmulld) into S1, the mins term is vpdpwssd of (min, min)
//   pairs with bsum pairs. Lanes = rows again, so the float step is the same.
// Rows beyond the end of a short chunk compute duplicates / zeros that are
// never stored.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "base/check.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/kquant.h"
#include "kernels/cpu/kquant_formats_avx512.h"
#include "kernels/cpu/kquant_layouts_avx512.h"

namespace pagoda::kernels::cpu::detail::kquant512 {
namespace {

// Calls with at least this many tokens take the repacked GEMM path.
constexpr int64_t kGemmMinTokens = 4;
// Tokens per GEMM register tile.
constexpr int kGemmT = 8;

// ---- Few tokens: per-row decode, 16-row transpose-add reduction --------------------
// v[r]: 16 int32 lanes of row r. Returns a = per-row sums of lanes 0..7 and
// b = per-row sums of lanes 8..15 (lane r = row r). Integer adds: exact.
inline void reduce16(const int32_t (*v)[16], __m512i* a, __m512i* b) {
  __m512i l1[8], l2[4];
  for (int p = 0; p < 8; ++p) {
    const __m512i x = _mm512_load_si512(v[2 * p]), y = _mm512_load_si512(v[2 * p + 1]);
    // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
    l1[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
  }
  for (int p = 0; p < 4; ++p)  // per 128-bit lane q: element j = the 4 lanes of row 4p + j in q, summed
    l2[p] = _mm512_add_epi32(_mm512_unpacklo_epi64(l1[2 * p], l1[2 * p + 1]),
                             _mm512_unpackhi_epi64(l1[2 * p], l1[2 * p + 1]));
  // [rows 0-3 a, rows 0-3 b, rows 4-7 a, rows 4-7 b] and the same for rows 8-15
  const __m512i x01 = _mm512_add_epi32(_mm512_shuffle_i64x2(l2[0], l2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i64x2(l2[0], l2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i x23 = _mm512_add_epi32(_mm512_shuffle_i64x2(l2[2], l2[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i64x2(l2[2], l2[3], _MM_SHUFFLE(3, 1, 3, 1)));
  *a = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(2, 0, 2, 0));
  *b = _mm512_shuffle_i64x2(x01, x23, _MM_SHUFFLE(3, 1, 3, 1));
}

template <class Fmt, int T>
void small_chunk(const uint8_t* w0, size_t row_bytes, int64_t nr, const uint8_t* act, int64_t nb, float* y,
                 int64_t ldy) {
  const size_t xrow = static_cast<size_t>(nb) * kActKBytes;
  // The same block of the row one chunk ahead: the pool hands each thread a
  // contiguous range of chunks, so that is this thread's next chunk. (Prefetches
  // past the matrix are harmless: they never fault.)
  const size_t prefetch = static_cast<size_t>(kKChunkRows) * row_bytes;
  alignas(64) int32_t v[T][16][16] = {};  // rows >= nr stay 0
  alignas(32) uint16_t dh[16] = {}, mh[16] = {};
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const size_t wo = static_cast<size_t>(b) * Fmt::kBytes, xo = static_cast<size_t>(b) * kActKBytes;
    for (int64_t r = 0; r < nr; ++r) {
      const uint8_t* blk = w0 + static_cast<size_t>(r) * row_bytes + wo;
      prefetch_block(blk + prefetch, Fmt::kBytes);
      typename Fmt::Block w;
      Fmt::decode(blk, &w);
      dh[r] = load_u16(blk + Fmt::kDOff);
      if constexpr (Fmt::kMins) mh[r] = load_u16(blk + Fmt::kMOff);
      for (int t = 0; t < T; ++t)
        _mm512_store_si512(v[t][r], Fmt::ints(w, act + static_cast<size_t>(t) * xrow + xo));
    }
    const __m512 d16 = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dh)));
    const __m512 m16 = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(mh)));
    for (int t = 0; t < T; ++t) {
      __m512i a, c;
      reduce16(v[t], &a, &c);
      const float dx = load_f32(act + static_cast<size_t>(t) * xrow + xo + kActKD);
      if constexpr (Fmt::kMins) {
        acc[t] = float_step<Fmt>(acc[t], a, c, d16, m16, dx);
      } else {  // all 16 lanes belong to S1 (the -4 / -32 offset is already folded in)
        acc[t] = float_step<Fmt>(acc[t], _mm512_add_epi32(a, c), _mm512_setzero_si512(), d16, m16, dx);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1u);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

inline __m512i bcast32(const uint8_t* p) { return _mm512_set1_epi32(static_cast<int>(load_u32(p))); }

// T tokens (records x0 + t * xrow) x the 16 rows of src; y[t * ldy + r] for the rows in mask.
template <class Fmt, int T, class Src>
void gemm_tile(Src src, int64_t nb, const uint8_t* x0, size_t xrow, float* y, int64_t ldy, __mmask16 mask) {
  constexpr int kG = 64 / Fmt::kSub;  // granules per sub-block
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* meta = src.meta(b);
    const uint8_t* xb = x0 + static_cast<size_t>(b) * kActKBytes;
    __m512i s1[T];
    for (int t = 0; t < T; ++t) s1[t] = _mm512_setzero_si512();
    const auto sub_block = [&](int k) __attribute__((always_inline)) {
      __m512i w[kG];
      src.granules(k, w);
      const __m512i sc = _mm512_load_si512(meta + 64 * k);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const uint8_t* xa = xb + static_cast<size_t>(t) * xrow + 4 * kG * k;
        if constexpr (kHalves<Fmt>) {
          __m512i h0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast32(xa));
          __m512i h1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[kG / 2], bcast32(xa + 2 * kG));
#pragma GCC unroll 8
          for (int g = 1; g < kG / 2; ++g) {
            h0 = _mm512_dpbusd_epi32(h0, w[g], bcast32(xa + 4 * g));
            h1 = _mm512_dpbusd_epi32(h1, w[kG / 2 + g], bcast32(xa + 2 * kG + 4 * g));
          }
          // int16 pairs (h0, h1): scale * h0 + scale * h1, exact
          const __m512i hh = _mm512_mask_mov_epi16(h0, 0xAAAAAAAAu, _mm512_slli_epi32(h1, 16));
          s1[t] = _mm512_dpwssd_epi32(s1[t], hh, sc);
        } else {
          __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast32(xa));
#pragma GCC unroll 8
          for (int g = 1; g < kG; ++g) is = _mm512_dpbusd_epi32(is, w[g], bcast32(xa + 4 * g));
          s1[t] = _mm512_add_epi32(s1[t], _mm512_mullo_epi32(is, sc));
        }
      }
    };
    // KpSrc unpacks with shifts that depend on k: unrolled, they are immediates.
    // The repacked source keeps the loop (a fully unrolled 8-token super-block
    // is ~1700 instructions, more than the op cache holds).
    if constexpr (Src::kUnrollK) {
#pragma GCC unroll 16
      for (int k = 0; k < Fmt::kSub; ++k) sub_block(k);
    } else {
      for (int k = 0; k < Fmt::kSub; ++k) sub_block(k);
    }
    const __m512 d16 = _mm512_load_ps(meta + kMetaD<Fmt>), m16 = _mm512_load_ps(meta + kMetaD<Fmt> + 64);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const uint8_t* xr = xb + static_cast<size_t>(t) * xrow;
      __m512i s2 = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m)
        s2 = _mm512_dpwssd_epi32(s2, _mm512_load_si512(meta + kMetaMp<Fmt> + 64 * m), bcast32(xr + kActKBsums + 4 * m));
      acc[t] = float_step<Fmt>(acc[t], s1[t], s2, d16, m16, load_f32(xr + kActKD));
    }
  }
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

template <class Fmt, class Src, int... Ts>
void gemm_tile_n(int nt, const Src& src, int64_t nb, const uint8_t* x0, size_t xrow, float* y, int64_t ldy,
                 __mmask16 mask, std::integer_sequence<int, Ts...>) {
  ((nt == Ts + 1 ? gemm_tile<Fmt, Ts + 1>(src, nb, x0, xrow, y, ldy, mask) : void()), ...);
}

// All tokens in tiles of up to kGemmT over one 16-row source.
template <class Fmt, class Src>
void gemm_chunk(const Src& src, int64_t nr, const uint8_t* act, int64_t n_tokens, int64_t nb, float* y, int64_t ldy) {
  const size_t xrow = static_cast<size_t>(nb) * kActKBytes;
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1u);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kGemmT) {
    const int nt = static_cast<int>(std::min<int64_t>(kGemmT, n_tokens - t0));
    gemm_tile_n<Fmt>(nt, src, nb, act + static_cast<size_t>(t0) * xrow, xrow, y + t0 * ldy, ldy, mask,
                     std::make_integer_sequence<int, kGemmT>());
  }
}

template <class Fmt>
void chunk_fn(const uint8_t* w0, size_t row_bytes, int64_t nr, const uint8_t* act, int64_t n_tokens, int64_t nb,
              float* y, int64_t ldy) {
  static_assert(kGemmMinTokens <= 4, "the few-token path has tiles of 1..3 tokens");
  if (n_tokens < kGemmMinTokens) {
    switch (n_tokens) {
      case 1: small_chunk<Fmt, 1>(w0, row_bytes, nr, act, nb, y, ldy); break;
      case 2: small_chunk<Fmt, 2>(w0, row_bytes, nr, act, nb, y, ldy); break;
      default: small_chunk<Fmt, 3>(w0, row_bytes, nr, act, nb, y, ldy); break;
    }
    return;
  }
  uint8_t* pk = scratch(1, static_cast<size_t>(nb) * kSbBytes<Fmt>);
  KPack<Fmt>::pack_rows(w0, row_bytes, nr, nb, pk);
  gemm_chunk<Fmt>(RepackedSrc<Fmt>{pk}, nr, act, n_tokens, nb, y, ldy);
}

// How far ahead (bytes) the few-token packed path prefetches its stream (the
// pool hands each thread a contiguous range of chunks, so the stream runs on
// into the thread's next chunk; prefetches past the end never fault).
constexpr size_t kKpPrefetch = 4096;

// Few tokens read the packed chunk directly; more than one token tile first
// expand it (once per call and chunk) to the per-call layout, so that the
// nibbles and scales are unpacked once, not once per tile.
template <class Fmt>
void kp_chunk_fn(const uint8_t* pk, int64_t nr, const uint8_t* act, int64_t n_tokens, int64_t nb, float* y,
                 int64_t ldy) {
  KpSrc<Fmt> src(pk, n_tokens < kGemmMinTokens ? kKpPrefetch : 0);
  if (n_tokens <= kGemmT) {
    gemm_chunk<Fmt>(src, nr, act, n_tokens, nb, y, ldy);
    return;
  }
  uint8_t* ex = scratch(1, static_cast<size_t>(nb) * kSbBytes<Fmt>);
  for (int64_t b = 0; b < nb; ++b) src.expand(b, ex + static_cast<size_t>(b) * kSbBytes<Fmt>);
  gemm_chunk<Fmt>(RepackedSrc<Fmt>{ex}, nr, act, n_tokens, nb, y, ldy);
}

template <class Fmt>
KTileSet chunk_set() {
  KTileSet s;
  s.chunk = chunk_fn<Fmt>;
  s.packed_chunk = kp_chunk_fn<Fmt>;
  s.pack = KPack<Fmt>::kp_pack;
  s.packed_sb_bytes = kKpBytes<Fmt>;
  return s;
}

}  // namespace
}  // namespace pagoda::kernels::cpu::detail::kquant512

namespace pagoda::kernels::cpu::detail {

const KTileSet& ktiles_avx512(GgmlType t) {
  using namespace kquant512;  // the formats and chunk_set
  static const KTileSet q2 = chunk_set<Q2K>(), q3 = chunk_set<Q3K>(), q4 = chunk_set<Q4K>(),
                        q5 = chunk_set<Q5K>(), q6 = chunk_set<Q6K>(), iq4xs = chunk_set<IQ4XS>();
  switch (t) {
    case GgmlType::IQ4_XS: return iq4xs;
    case GgmlType::Q2_K: return q2;
    case GgmlType::Q3_K: return q3;
    case GgmlType::Q4_K: return q4;
    case GgmlType::Q5_K: return q5;
    case GgmlType::Q6_K: return q6;
    default: PAGODA_CHECK_MSG(false, "not a K-quant type %u", static_cast<unsigned>(t));
  }
  return q4;
}

}  // namespace pagoda::kernels::cpu::detail
