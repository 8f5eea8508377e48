// K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) x q8_K matmul for AVX-512 (BW + VNNI), whole
// row chunks of kKChunkRows = 16 rows at a time (KTileSet::chunk).
//
// Canonical float sequence (every path below, every n_tokens, tile, thread
// count and row position): for output y[t, r] and each super-block b in order,
//   S1 = sum over sub-blocks k of scale_k * dot(q_w, q_x)_k     (int32, exact)
//   S2 = sum over sub-blocks k of min_k * bsum_k(q_x)           (int32, exact)
//   Q2_K/Q4_K/Q5_K: acc = fma(float(S1), d_w * d_x, acc);
//                   acc = fnmadd(float(S2), dmin_w * d_x, acc)
//   Q3_K/Q6_K: S2 = sum_k scale_k * bsum_k, S1 -= 4 * S2 (Q3_K) or 32 * S2
//              (Q6_K), the offset of the stored quants;
//              acc = fma(float(S1), d_w * d_x, acc)
//   IQ4_XS: as Q3_K/Q6_K with the codebook values stored + 128 (u8) and
//              S1 -= 128 * S2, S2 = sum over groups k of scale_k * bsum_k
// with acc = +0 before super-block 0 and y = acc (no horizontal float sum).
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
// int32 bounds: Q4_K |S1| <= 8 * 63 * (32 * 15 * 127) < 2^25, Q5_K
// (quants < 32) < 2^26, S2 <= 8 * 63 * 32 * 127 < 2^21; Q6_K |sum_k sc_k *
// dot_k| <= 16 * 128 * (16 * 63 * 127) < 2^28 and 32 |S2| <= 32 * 16 * 128 *
// 16 * 127 < 2^28; Q2_K |S1| <= 16 * 15 * 16 * 3 * 127 < 2^24, S2 <= 16 * 15 *
// 16 * 127 < 2^19; Q3_K |S1| <= 16 * 32 * 16 * 7 * 127 < 2^23, 4 |S2| <= 4 *
// 16 * 32 * 16 * 127 < 2^22; IQ4_XS |S1| <= 8 * 32 * 32 * 241 * 127 < 2^28 and
// 128 |S2| <= 128 * 8 * 32 * 32 * 127 < 2^28. The 16-value halves in the reduce tree and the maddubs pair
// sums (<= 2 * 63 * 127) stay far inside their types too.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <utility>

#include "base/check.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/kquant.h"

namespace pagoda::kernels::cpu::detail {
namespace {

#include "kernels/cpu/kquant_prelude.inc"

// Calls with at least this many tokens take the repacked GEMM path.
constexpr int64_t kGemmMinTokens = 4;
// Tokens per GEMM register tile.
constexpr int kGemmT = 8;

inline __m512i load512(const uint8_t* p) { return _mm512_loadu_si512(p); }

// [a, b] as one 512-bit vector (a in the low half).
inline __m512i join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

// Index vectors for vpermw: row j, int16 lane l = step * j + l / group.
struct SpreadIdx {
  alignas(64) int16_t v[4][32];
};
constexpr SpreadIdx make_spread(int step, int group) {
  SpreadIdx s{};
  for (int j = 0; j < 4; ++j)
    for (int l = 0; l < 32; ++l) s.v[j][l] = static_cast<int16_t>(step * j + l / group);
  return s;
}
constexpr SpreadIdx kK4Spread = make_spread(2, 16);  // sub-blocks of 32 values
constexpr SpreadIdx kK6Spread = make_spread(4, 8);   // sub-blocks of 16 values

// int16 lane l of the result = lane idx[l] of v (16 int16 lanes).
inline __m512i spread16(__m256i v, const int16_t* idx) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(idx), _mm512_castsi256_si512(v));
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- Decoded super-blocks (natural order) ------------------------------------------
// Q4_K / Q5_K: q[j] = values 64j..64j+63 as u8 (sub-blocks 2j, 2j+1); sc[j] =
// int16 lanes 0..15 scale 2j, lanes 16..31 scale 2j+1; mins = int16 lanes 2k,
// 2k+1 hold min k.
struct K4Block {
  __m512i q[4];
  __m512i sc[4];
  __m256i mins;
};

inline void k4_scales(const uint8_t* blk, K4Block* w) {
  const __m128i sm = unpack_k4_scales(blk + 4);
  const __m256i s16 = _mm256_cvtepu8_epi16(sm);
  for (int j = 0; j < 4; ++j) w->sc[j] = spread16(s16, kK4Spread.v[j]);
  w->mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
}

// Common to the five formats: kBytes (block size), kSub (sub-blocks per
// super-block), kDOff (offset of f16 d), kMins (Q2_K/Q4_K/Q5_K: f16 dmin at
// kMOff and a mins term), kOffShift (Q3_K/Q6_K: quants stored as q + 2^shift),
// values(blk, q) (the 256 quants in natural order as u8), decode(blk, Block*),
// ints(Block, x record) (16 int32 lanes: with mins lanes 0..7 sum to S1 and
// 8..15 to S2; without, all 16 lanes sum to S1).
struct Q4K {
  using Block = K4Block;
  static constexpr size_t kBytes = 144, kDOff = 0, kMOff = 2;
  static constexpr int kSub = 8, kOffShift = 0;
  static constexpr bool kMins = true;
  static inline void values(const uint8_t* blk, __m512i* q) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(blk + 16 + 32 * j);
      q[j] = join(_mm256_and_si256(bits, nib), _mm256_and_si256(_mm256_srli_epi16(bits, 4), nib));
    }
  }
  static inline void decode(const uint8_t* blk, K4Block* w) {
    k4_scales(blk, w);
    values(blk, w->q);
  }
  static inline __m512i ints(const K4Block& w, const uint8_t* xr);
};

struct Q5K {
  using Block = K4Block;
  static constexpr size_t kBytes = 176, kDOff = 0, kMOff = 2;
  static constexpr int kSub = 8, kOffShift = 0;
  static constexpr bool kMins = true;
  static inline void values(const uint8_t* blk, __m512i* q) {
    const __m256i nib = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i hb = load256(blk + 16);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(blk + 48 + 32 * j);
      const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4);
      const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4);
      q[j] = join(_mm256_or_si256(_mm256_and_si256(bits, nib), h0),
                  _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), nib), h1));
    }
  }
  static inline void decode(const uint8_t* blk, K4Block* w) {
    k4_scales(blk, w);
    values(blk, w->q);
  }
  static inline __m512i ints(const K4Block& w, const uint8_t* xr);
};

// 16 int32 partial sums of sum_j dpwssd(sc[j], maddubs(q[j], x values 64j..64j+63)):
// the scaled sub-block dots of one super-block (Q2_K..Q6_K; exact).
inline __m512i scaled_dots(const __m512i* q, const __m512i* sc, const uint8_t* xr) {
  __m512i isum = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j)
    isum = _mm512_dpwssd_epi32(isum, sc[j], _mm512_maddubs_epi16(q[j], load512(xr + 64 * j)));
  return isum;
}

// Formats with mins (Q2_K, Q4_K, Q5_K): lanes 0..7 sum to S1 (the two halves of
// isum added), lanes 8..15 to S2 = sum of the int16 mins x the bsums.
inline __m512i with_mins(__m512i isum, __m256i mins, const uint8_t* xr) {
  const __m256i msum = _mm256_madd_epi16(mins, load256(xr + kActKBsums));
  const __m256i s1 = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
  return join(s1, msum);
}

inline __m512i k4_ints(const K4Block& w, const uint8_t* xr) { return with_mins(scaled_dots(w.q, w.sc, xr), w.mins, xr); }

// Q6_K: q[k] = values 64k..64k+63 as u8 0..63; sc[k] = int16 lanes 8i..8i+7
// hold scale 4k+i; sc16 = the 16 scales as int16.
struct K6Block {
  __m512i q[4];
  __m512i sc[4];
  __m256i sc16;
};

struct Q6K {
  using Block = K6Block;
  static constexpr size_t kBytes = 210, kDOff = 208, kMOff = 0;
  static constexpr int kSub = 16, kOffShift = 5;
  static constexpr bool kMins = false;
  static inline void values(const uint8_t* blk, __m512i* q) {
    const __m512i nib = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m512i l = load512(blk + 64 * h);
      const __m256i hb = load256(blk + 128 + 32 * h);
      // low half: bits 0-1 of qh (values 0..31), high half: bits 2-3 (values 32..63)
      const __m512i hx = join(hb, _mm256_srli_epi16(hb, 2));
      const __m512i h_lo = _mm512_slli_epi16(_mm512_and_si512(hx, two), 4);
      const __m512i h_hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hx, 4), two), 4);
      q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, nib), h_lo);
      q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), nib), h_hi);
    }
  }
  static inline void decode(const uint8_t* blk, K6Block* w) {
    values(blk, w->q);
    w->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    for (int k = 0; k < 4; ++k) w->sc[k] = spread16(w->sc16, kK6Spread.v[k]);
  }
  static inline __m512i ints(const K6Block& w, const uint8_t* xr);
};

// Q6_K (kShift 5), Q3_K (kShift 2): quants stored as q + 2^kShift.
template <int kShift>
inline __m512i k6_ints(const K6Block& w, const uint8_t* xr) {
  const __m512i isum = scaled_dots(w.q, w.sc, xr);
  // sum (q - 2^s) * x * sc = sum q * x * sc - 2^s * sum_j sc_j * bsum_j
  const __m256i off = _mm256_madd_epi16(w.sc16, load256(xr + kActKBsums));
  return _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(off, kShift)));
}

inline __m512i Q4K::ints(const K4Block& w, const uint8_t* xr) { return k4_ints(w, xr); }
inline __m512i Q5K::ints(const K4Block& w, const uint8_t* xr) { return k4_ints(w, xr); }
inline __m512i Q6K::ints(const K6Block& w, const uint8_t* xr) { return k6_ints<kOffShift>(w, xr); }

// ---- Q2_K / Q3_K: 16 sub-blocks of 16 values, as Q6_K --------------------------
// Values 64j..64j+63 (u8 0..3): value 32k + l is bits 2(k % 4).. of qs[32 (k / 4) + l].
inline __m512i k2_values(const uint8_t* qs, int j) {
  const __m256i bits = load256(qs + 32 * (j / 2)), three = _mm256_set1_epi8(3);
  return join(_mm256_and_si256(_mm256_srli_epi16(bits, 4 * (j % 2)), three),
              _mm256_and_si256(_mm256_srli_epi16(bits, 4 * (j % 2) + 2), three));
}

// Q2_K: the K6Block layout (q, sc = the 4-bit scales) with sc16 = the 16 4-bit mins.
struct Q2K {
  using Block = K6Block;
  static constexpr size_t kBytes = 84, kDOff = 80, kMOff = 82;
  static constexpr int kSub = 16, kOffShift = 0;
  static constexpr bool kMins = true;
  static inline void values(const uint8_t* blk, __m512i* q) {
    for (int j = 0; j < 4; ++j) q[j] = k2_values(blk + 16, j);
  }
  static inline void decode(const uint8_t* blk, K6Block* w) {
    values(blk, w->q);
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)), nib = _mm_set1_epi8(0x0F);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, nib));
    for (int k = 0; k < 4; ++k) w->sc[k] = spread16(sc16, kK6Spread.v[k]);
    w->sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), nib));
  }
  static inline __m512i ints(const K6Block& w, const uint8_t* xr) {
    return with_mins(scaled_dots(w.q, w.sc, xr), w.sc16, xr);
  }
};

// IQ4_XS: 8 groups of 32; q[j] = the codebook values + 128 (u8 1..241) of
// values 64j..64j+63 (groups 2j, 2j+1); sc[j] = int32 lanes 0..7 scale 2j - 32,
// lanes 8..15 scale 2j+1 - 32; sc16 = int16 lanes 2k, 2k+1 hold scale k - 32.
// vpdpbusd (u8 x s8, 4 products into int32, no saturation) takes the u8
// values directly; the +128 comes back out through the bsums.
using KIBlock = K6Block;  // the same three fields, with the meanings above

struct IQ4XS {
  using Block = KIBlock;
  static constexpr size_t kBytes = 136, kDOff = 0, kMOff = 0;
  static constexpr int kSub = 8, kOffShift = 7;
  static constexpr bool kMins = false;
  static inline void values(const uint8_t* blk, __m512i* q) {
    // the codebook + 128 as u8 (pshufb table in every 128-bit lane)
    const __m256i table = _mm256_xor_si256(iq4_table256(), _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {  // bytes 16g..16g+15: group g, low nibbles first
      const __m256i bits = load256(blk + 8 + 32 * j);
      const __m256i lo = _mm256_and_si256(bits, nib), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), nib);
      q[j] = join(_mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20)),
                  _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31)));
    }
  }
  static inline void decode(const uint8_t* blk, KIBlock* w) {
    values(blk, w->q);
    const __m256i s32 = _mm256_cvtepi8_epi32(unpack_iq4xs_scales(blk));  // scale k - 32 in int32 lane k
    for (int j = 0; j < 4; ++j)
      w->sc[j] = _mm512_permutexvar_epi32(
          _mm512_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1,
                            2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1),
          _mm512_castsi256_si512(s32));
    // (scale, scale) int16 pairs: madd with the bsums gives scale_k * (bsum_2k + bsum_2k+1)
    w->sc16 = _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s32, 16));
  }
  static inline __m512i ints(const KIBlock& w, const uint8_t* xr) {
    __m512i isum = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j)
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(w.sc[j], _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.q[j],
                                                                                    load512(xr + 64 * j))));
    // sum (u - 128) * x * sc = sum u * x * sc - 128 * sum_k sc_k * bsum_k
    const __m256i off = _mm256_madd_epi16(w.sc16, load256(xr + kActKBsums));
    return _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(off, kOffShift)));
  }
};

// Q3_K: q = low two bits | (bit v / 32 of hmask[v % 32]) << 2, u8 0..7 = value + 4.
struct Q3K {
  using Block = K6Block;
  static constexpr size_t kBytes = 110, kDOff = 108, kMOff = 0;
  static constexpr int kSub = 16, kOffShift = 2;
  static constexpr bool kMins = false;
  static inline void values(const uint8_t* blk, __m512i* q) {
    const __m256i hb = load256(blk), one = _mm256_set1_epi8(1);
    const auto hi = [&](int k) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, k), one), 2); };
    for (int j = 0; j < 4; ++j) q[j] = _mm512_or_si512(k2_values(blk + 32, j), join(hi(2 * j), hi(2 * j + 1)));
  }
  static inline void decode(const uint8_t* blk, K6Block* w) {
    values(blk, w->q);
    w->sc16 = _mm256_cvtepi8_epi16(unpack_q3_scales(blk + 96));
    for (int k = 0; k < 4; ++k) w->sc[k] = spread16(w->sc16, kK6Spread.v[k]);
  }
  static inline __m512i ints(const K6Block& w, const uint8_t* xr) { return k6_ints<kOffShift>(w, xr); }
};

// The float step of one super-block for 16 rows (lanes) of one token.
template <class Fmt>
inline __m512 float_step(__m512 acc, __m512i s1, __m512i s2, __m512 d16, __m512 m16, float dx) {
  const __m512 vdx = _mm512_set1_ps(dx);
  if constexpr (Fmt::kMins) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d16, vdx), acc);
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(s2), _mm512_mul_ps(m16, vdx), acc);
  } else {
    (void)m16;
    s1 = _mm512_sub_epi32(s1, _mm512_slli_epi32(s2, Fmt::kOffShift));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(d16, vdx), acc);
  }
}

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

inline void prefetch_block(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
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

// ==== The two weight layouts of the GEMM tile (gemm_tile, below) ====================
// Both are rebuilt to the same registers, so every output keeps this file's one
// float sequence:
// * the per-call repack: 16 rows repacked row-interleaved, once per call
//   (pack_rows, RepackedSrc), for GGUF rows;
// * the load-time packed copy (issue 22): kernels::pack_weight's chunks of 16
//   rows transposed super-block by super-block (kp_pack, KpSrc).

// ---- GEMM: 16 rows repacked row-interleaved ----------------------------------------
// Packed super-block of 16 rows (kSbBytes<Fmt> bytes, 64-byte aligned parts):
//   [0, 4096)    q: granule g (values 4g..4g+3) of the 16 rows at g*64, row r's
//                4 bytes (u8 quants) at g*64 + 4r
//   kSub x 64    sc: scale of sub-block k for row r at k*64 + 4r: int32, or
//                for Q4_K (kHalves) the int16 pair (scale, scale)
//   8 x 64       mp: Q4_K/Q5_K (min_m, min_m), IQ4_XS (sc_m, sc_m), Q2_K (min_2m, min_2m+1), Q3_K/Q6_K
//                (sc_2m, sc_2m+1) as int16 pairs, m = 0..7 (vpdpwssd with the bsum pair m)
//   64, 64       d, dmin of the 16 rows as f32 (Q3_K/Q6_K: dmin unused)
constexpr size_t kPackQ = 4096;
// Q4_K only: a 16-value half of a sub-block has |dot| <= 16 * 15 * 127 < 2^15,
// so the two halves' dots fit int16 and one vpdpwssd with (scale, scale)
// pairs replaces vpmulld + vpaddd. (Q5_K's halves reach 16 * 31 * 127.)
template <class Fmt>
constexpr bool kHalves = std::is_same_v<Fmt, Q4K>;
// The scale part ("meta", after the quants) on its own: sc at 0, mp at
// kMetaMp, d and dmin at kMetaD (write_meta writes it; the load-time packed
// layout below rebuilds it per super-block from the rows' raw header dwords).
template <class Fmt>
constexpr size_t kMetaMp = 64 * Fmt::kSub;
template <class Fmt>
constexpr size_t kMetaD = kMetaMp<Fmt> + 512;
template <class Fmt>
constexpr size_t kMetaBytes = kMetaD<Fmt> + 128;
template <class Fmt>
constexpr size_t kSbBytes = kPackQ + kMetaBytes<Fmt>;

// In place: m[r] lane c -> m[c] lane r (16 x 16 int32).
inline void transpose16(__m512i* m) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]);
  }
  // m[4i + c], 128-bit lane q: rows 4i..4i+3 of column 4q + c
  for (int i = 0; i < 4; ++i) {
    m[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    m[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    m[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    m[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_shuffle_i32x4(m[c], m[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(m[c], m[4 + c], 0xEE);
    const __m512i u2 = _mm512_shuffle_i32x4(m[8 + c], m[12 + c], 0x44);
    const __m512i u3 = _mm512_shuffle_i32x4(m[8 + c], m[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) m[i] = t[i];
}

// Stores the 16-row granule vectors of one half (values 128h..128h+127) of
// a Q4_K super-block from the rows' raw quant bytes: dword i of the 64 bytes
// at qs + 64h holds values 64c + 4(i % 8) .. +3 in its low nibbles and
// 64c + 32 + 4(i % 8) .. +3 in its high nibbles, c = 2h + i / 8.
inline void pack_q4_half(const uint8_t* const* blk, int h, uint8_t* q) {
  __m512i m[16];
  for (int r = 0; r < 16; ++r) m[r] = load512(blk[r] + 16 + 64 * h);
  transpose16(m);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int i = 0; i < 16; ++i) {
    const int c = 2 * h + i / 8, g = 16 * c + i % 8;
    _mm512_store_si512(q + 64 * g, _mm512_and_si512(m[i], nib));
    _mm512_store_si512(q + 64 * (g + 8), _mm512_and_si512(_mm512_srli_epi16(m[i], 4), nib));
  }
}

// The same for a whole Q6_K super-block: dword i of ql half h (bytes 64h + 4i)
// holds values 128h + 4i.. (granule 32h + i) in its low nibbles and
// 128h + 64 + 4i.. (granule 32h + 16 + i) in its high nibbles; their two high
// bits sit in qh dword 8h + i % 8 at bit 0 / 4 (i < 8) or 2 / 6 (i >= 8).
inline void pack_q6(const uint8_t* const* blk, uint8_t* q) {
  __m512i hq[16];
  for (int r = 0; r < 16; ++r) hq[r] = load512(blk[r] + 128);
  transpose16(hq);
  const __m512i nib = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    __m512i m[16];
    for (int r = 0; r < 16; ++r) m[r] = load512(blk[r] + 64 * h);
    transpose16(m);
    for (int i = 0; i < 16; ++i) {
      const __m512i qh = hq[8 * h + i % 8];
      const int sh = i < 8 ? 0 : 2;
      const __m512i hlo = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, sh), two), 4);
      const __m512i hhi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, sh + 4), two), 4);
      _mm512_store_si512(q + 64 * (32 * h + i), _mm512_or_si512(_mm512_and_si512(m[i], nib), hlo));
      _mm512_store_si512(q + 64 * (32 * h + 16 + i),
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(m[i], 4), nib), hhi));
    }
  }
}

// Writes the meta part (kMetaBytes<Fmt>) of 16 rows' super-block from their
// header dwords: gather(off) returns the 16 rows' dwords at byte offset off of
// the block (lane r = row r).
template <class Fmt, class Gather>
inline void write_meta(Gather gather, uint8_t* meta) {
  const __m512i byte = _mm512_set1_epi32(0xFF);
  (void)byte;
  // sc_k = byte k % 4 of words[k / 4]; mp_m = (min_m or scale pair) as int16 pairs
  __m512i words[4];
  if constexpr (std::is_same_v<Fmt, IQ4XS>) {  // f16 d | scales_h << 16, then scales_l
    const __m512i dh = gather(0), sl = gather(4);
    _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh)));
    _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_setzero_ps());
    const __m512i sh = _mm512_srli_epi32(dh, 16), four = _mm512_set1_epi32(0xF), three = _mm512_set1_epi32(3);
    for (int k = 0; k < 8; ++k) {  // int32 scale k - 32 (gemm_tile multiplies it), (sc, sc) int16 pairs in mp
      const __m512i sc = _mm512_sub_epi32(
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * k), four),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * k), three), 4)),
          _mm512_set1_epi32(32));
      _mm512_store_si512(meta + 64 * k, sc);
      _mm512_store_si512(meta + kMetaMp<Fmt> + 64 * k,
                         _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc, 16)));
    }
  } else if constexpr (Fmt::kSub == 8) {  // Q4_K, Q5_K
    const __m512i dd = gather(0);  // f16 d | f16 dmin << 16
    _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    // unpack_k4_scales on 16 rows at once
    const __m512i a = gather(4), bb = gather(8), c = gather(12);
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), m4 = _mm512_set1_epi32(0x0F0F0F0F),
                  m2 = _mm512_set1_epi32(0x03030303);
    words[0] = _mm512_and_si512(a, m6);
    words[1] = _mm512_or_si512(_mm512_and_si512(c, m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), m2), 4));
    words[2] = _mm512_and_si512(bb, m6);
    words[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bb, 6), m2), 4));
    for (int k = 0; k < 8; ++k) {
      const __m512i sck = _mm512_and_si512(_mm512_srli_epi32(words[k / 4], 8 * (k % 4)), byte);
      // Q4_K: (scale, scale) int16 pairs for vpdpwssd (see gemm_tile); Q5_K: int32 scale
      _mm512_store_si512(meta + 64 * k,
                         kHalves<Fmt> ? _mm512_or_si512(sck, _mm512_slli_epi32(sck, 16)) : sck);
      const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(words[2 + k / 4], 8 * (k % 4)), byte);
      _mm512_store_si512(meta + kMetaMp<Fmt> + 64 * k, _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16)));
    }
  } else {  // 16 sub-blocks: words = the 16 scales as int8, pw = the bytes paired into mp
    __m512i pw[4];
    if constexpr (Fmt::kMins) {  // Q2_K: scale | min << 4 in bytes 0..15, f16 d, dmin at 80
      const __m512i dd = gather(80);
      _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
      _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
      const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = gather(4 * j);
        words[j] = _mm512_and_si512(raw, m4);
        pw[j] = _mm512_and_si512(_mm512_srli_epi32(raw, 4), m4);
      }
    } else {
      // f16 d at kDOff (read as the high half of the dword 2 bytes before: stays inside the block)
      const __m512i dd = _mm512_srli_epi32(gather(Fmt::kDOff - 2), 16);
      _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
      _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_setzero_ps());
      if constexpr (std::is_same_v<Fmt, Q3K>) {  // unpack_q3_scales on 16 rows at once
        const __m512i a = gather(96), bb = gather(100), c = gather(104);
        const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F), m2 = _mm512_set1_epi32(0x03030303);
        const auto hi2 = [&](int sh) { return _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(c, sh), m2), 4); };
        words[0] = _mm512_or_si512(_mm512_and_si512(a, m4), hi2(0));
        words[1] = _mm512_or_si512(_mm512_and_si512(bb, m4), hi2(2));
        words[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a, 4), m4), hi2(4));
        words[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bb, 4), m4), hi2(6));
        for (int j = 0; j < 4; ++j) words[j] = _mm512_sub_epi8(words[j], _mm512_set1_epi8(32));
      } else {
        for (int j = 0; j < 4; ++j) words[j] = gather(192 + 4 * j);
      }
      for (int j = 0; j < 4; ++j) pw[j] = words[j];
    }
    for (int k = 0; k < 16; ++k)  // int8 scale k, sign-extended
      _mm512_store_si512(meta + 64 * k,
                         _mm512_srai_epi32(_mm512_slli_epi32(words[k / 4], 24 - 8 * (k % 4)), 24));
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int m = 0; m < 8; ++m) {  // (pw_2m, pw_2m+1) as int16: bytes 2m%4, 2m%4+1 of pw[m / 2]
      const __m512i w = _mm512_srli_epi32(pw[m / 2], 16 * (m % 2));  // the pair in the low 16 bits
      const __m512i s0 = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(w, 24), 24), lo16);
      const __m512i s1 = _mm512_slli_epi32(_mm512_srai_epi32(_mm512_slli_epi32(w, 16), 24), 16);
      _mm512_store_si512(meta + kMetaMp<Fmt> + 64 * m, _mm512_or_si512(s0, s1));
    }
  }
}

// Packs rows 0..nr-1 (row nr-1 repeated up to 16) of nb super-blocks. pk: [nb, kSbBytes<Fmt>]
// Precondition: 15 * row_bytes < 2^31 (gather offsets are int32).
template <class Fmt>
void pack_rows(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* pk) {
  alignas(64) uint8_t vals[16][256];
  alignas(64) int32_t ridx[16];
  for (int r = 0; r < 16; ++r) ridx[r] = static_cast<int32_t>(std::min<int64_t>(r, nr - 1) * static_cast<int64_t>(row_bytes));
  const __m512i vidx = _mm512_load_si512(ridx);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = pk + static_cast<size_t>(b) * kSbBytes<Fmt>;
    const uint8_t* b0 = w0 + static_cast<size_t>(b) * Fmt::kBytes;  // row 0's block
    const uint8_t* blk[16];
    for (int r = 0; r < 16; ++r) blk[r] = b0 + ridx[r];
    const auto gather = [&](size_t off) { return _mm512_i32gather_epi32(vidx, b0 + off, 1); };
    write_meta<Fmt>(gather, p + kPackQ);
    if constexpr (std::is_same_v<Fmt, Q4K>) {
      pack_q4_half(blk, 0, p);
      pack_q4_half(blk, 1, p);
    } else if constexpr (std::is_same_v<Fmt, Q6K>) {
      pack_q6(blk, p);
    } else {
      for (int r = 0; r < 16; ++r) {
        __m512i q[4];
        Fmt::values(blk[r], q);
        for (int j = 0; j < 4; ++j) _mm512_store_si512(vals[r] + 64 * j, q[j]);
      }
      for (int j = 0; j < 4; ++j) {
        __m512i m[16];
        for (int r = 0; r < 16; ++r) m[r] = _mm512_load_si512(vals[r] + 64 * j);
        transpose16(m);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(p + 64 * (16 * j + i), m[i]);
      }
    }
  }
}

inline __m512i bcast32(const uint8_t* p) { return _mm512_set1_epi32(static_cast<int>(load_u32(p))); }

// Weight source of gemm_tile over the per-call repacked super-blocks above.
template <class Fmt>
struct RepackedSrc {
  static constexpr int kG = 64 / Fmt::kSub;  // granules per sub-block
  static constexpr bool kUnrollK = false;
  const uint8_t* pk;
  const uint8_t* p = nullptr;
  // Super-block b's meta part (called once per super-block, in order).
  const uint8_t* meta(int64_t b) {
    p = pk + static_cast<size_t>(b) * kSbBytes<Fmt>;
    return p + kPackQ;
  }
  // The kG granule vectors (u8 quants of the 16 rows) of sub-block k.
  void granules(int k, __m512i* w) const {
#pragma GCC unroll 8
    for (int g = 0; g < kG; ++g) w[g] = _mm512_load_si512(p + 64 * (kG * k + g));
  }
};

// ---- Load-time packed layout (issue 22) -------------------------------------------
// kernels::pack_weight packs a K-quant matrix (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_XS) once at load into
// chunks of 16 rows (kKChunkRows; the last chunk repeats its last row), each
// chunk nb super-blocks of kKpBytes<Fmt> bytes, front to back. A super-block
// holds the same bits as the 16 rows' GGUF blocks, transposed so that every
// load is one aligned 64-byte vector with row r in dword lane r:
//   hdr   KpFmt<Fmt>::kHdr dwords of each row's block header (Q4_K/Q5_K: f16
//         d|dmin and the 12 scale bytes; Q6_K: the 16 int8 scales and f16 d;
//         Q2_K: the 16 scale|min bytes and f16 d|dmin; Q3_K: the 12 scale
//         bytes and f16 d (its dword overlaps the last scale dword by 2
//         bytes); IQ4_XS: f16 d|scales_h and scales_l), one vector per dword;
//         write_meta rebuilds the meta part from them
//   q     the quant bytes as 64-byte row slices transposed 16 x 16 dwords:
//         Q4_K/Q5_K qs: vector 8j + g = qs bytes 32j + 4g.. (low nibbles:
//         values 64j + 4g.., high: + 32); Q5_K then qh bytes 4g.. (g < 8);
//         Q6_K ql: vector 16h + i = bytes 64h + 4i.., then qh: vector 32 + i =
//         qh bytes 4i..; Q2_K qs: vector i = qs bytes 4i.. (2-bit field f:
//         values 128 (i / 8) + 32 f + 4 (i % 8)..); Q3_K hmask (vector i =
//         bytes 4i.., bit f: values 32 f + 4i..) then qs as Q2_K; IQ4_XS qs:
//         vector i = qs bytes 4i.. (low nibbles: values 32 (i / 4) + 4 (i % 4)..,
//         high: + 16)
// Sizes: Q4_K 2304 = 16 x 144, Q5_K 2816 = 16 x 176, Q2_K 1344 = 16 x 84 and
// IQ4_XS 2176 = 16 x 136 (exactly the rows' bytes); Q6_K 3392 = 16 x 210 + 32
// and Q3_K 1792 = 16 x 110 + 32 (the 2 bytes of f16 d padded to a dword: +1.8%
// for Q3_K). Nothing is expanded: the scales are unpacked per super-block as
// the kernel reads it (KpSrc::meta), the quants per sub-block. The integer sums
// S1 and S2 are exact whichever layout they come from and the float step is
// float_step, so the packed path gives bitwise the outputs of the unpacked one.
template <class Fmt>
struct KpFmt;
template <>
struct KpFmt<Q4K> {
  static constexpr int kHdr[] = {0, 4, 8, 12};
  static constexpr int kSeg[][2] = {{16, 16}, {80, 16}};  // (byte offset, dwords) of each transposed slice
};
template <>
struct KpFmt<Q5K> {
  static constexpr int kHdr[] = {0, 4, 8, 12};
  static constexpr int kSeg[][2] = {{48, 16}, {112, 16}, {16, 8}};
};
template <>
struct KpFmt<Q6K> {
  static constexpr int kHdr[] = {206, 192, 196, 200, 204};
  static constexpr int kSeg[][2] = {{0, 16}, {64, 16}, {128, 16}};
};
template <>
struct KpFmt<Q2K> {
  static constexpr int kHdr[] = {0, 4, 8, 12, 80};  // scale | min << 4 bytes, f16 d | dmin
  static constexpr int kSeg[][2] = {{16, 16}};
};
template <>
struct KpFmt<Q3K> {
  static constexpr int kHdr[] = {96, 100, 104, 106};  // packed scales, then f16 d in the high half
  static constexpr int kSeg[][2] = {{0, 8}, {32, 16}};  // hmask, qs
};
template <>
struct KpFmt<IQ4XS> {
  static constexpr int kHdr[] = {0, 4};  // f16 d | scales_h, scales_l
  static constexpr int kSeg[][2] = {{8, 16}, {72, 16}};
};
template <class Fmt>
constexpr int kp_vectors() {
  int n = static_cast<int>(std::size(KpFmt<Fmt>::kHdr));
  for (const auto& seg : KpFmt<Fmt>::kSeg) n += seg[1];
  return n;
}
template <class Fmt>
constexpr size_t kKpBytes = 64 * static_cast<size_t>(kp_vectors<Fmt>());
template <class Fmt>
constexpr size_t kKpQ = 64 * std::size(KpFmt<Fmt>::kHdr);  // offset of the quant vectors
template <class Fmt>
constexpr int kp_slot(int off) {
  for (int i = 0; i < static_cast<int>(std::size(KpFmt<Fmt>::kHdr)); ++i)
    if (KpFmt<Fmt>::kHdr[i] == off) return i;
  return -1;
}
static_assert(kKpBytes<Q4K> == 16 * Q4K::kBytes && kKpBytes<Q5K> == 16 * Q5K::kBytes);
static_assert(kKpBytes<Q6K> == 16 * Q6K::kBytes + 32);
static_assert(kKpBytes<Q2K> == 16 * Q2K::kBytes && kKpBytes<IQ4XS> == 16 * IQ4XS::kBytes);
static_assert(kKpBytes<Q3K> == 16 * Q3K::kBytes + 32);

// Packs rows 0..nr-1 (row nr-1 repeated up to 16) of nb super-blocks into dst
// ([nb, kKpBytes<Fmt>], 64-byte aligned).
template <class Fmt>
void kp_pack(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* dst) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = dst + static_cast<size_t>(b) * kKpBytes<Fmt>;
    const uint8_t* blk[16];
    for (int r = 0; r < 16; ++r)
      blk[r] = w0 + static_cast<size_t>(std::min<int64_t>(r, nr - 1)) * row_bytes + static_cast<size_t>(b) * Fmt::kBytes;
    __m512i m[16];
    for (const int off : KpFmt<Fmt>::kHdr) {
      for (int r = 0; r < 16; ++r) m[r] = _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk[r] + off))));
      transpose16(m);
      _mm512_store_si512(p, m[0]);
      p += 64;
    }
    for (const auto& seg : KpFmt<Fmt>::kSeg) {
      for (int r = 0; r < 16; ++r) m[r] = load512(blk[r] + seg[0]);  // stays inside the block (static_assert below)
      transpose16(m);
      for (int i = 0; i < seg[1]; ++i, p += 64) _mm512_store_si512(p, m[i]);
    }
  }
}
static_assert(80 + 64 <= Q4K::kBytes && 112 + 64 <= Q5K::kBytes && 128 + 64 <= Q6K::kBytes);
static_assert(16 + 64 <= Q2K::kBytes && 32 + 64 <= Q3K::kBytes && 72 + 64 <= IQ4XS::kBytes);
static_assert(80 + 4 <= Q2K::kBytes && 106 + 4 <= Q3K::kBytes);  // the last header dwords too

// Weight source of gemm_tile over the load-time packed super-blocks: the meta
// part is rebuilt per super-block into buf (write_meta, as pack_rows does from
// the GGUF rows), the granules are unpacked from nibbles (+ high bits).
template <class Fmt>
struct KpSrc {
  static constexpr int kG = 64 / Fmt::kSub;
  static constexpr bool kUnrollK = true;
  KpSrc(const uint8_t* chunk, size_t ahead) : pk(chunk), prefetch(ahead) {}
  const uint8_t* pk;
  size_t prefetch;  // bytes ahead to prefetch (0: none)
  const uint8_t* q = nullptr;
  alignas(64) uint8_t buf[kMetaBytes<Fmt>];  // written by meta() before any read
  const uint8_t* meta(int64_t b) { return meta_to(b, buf); }
  const uint8_t* meta_to(int64_t b, uint8_t* out) {
    const uint8_t* p = pk + static_cast<size_t>(b) * kKpBytes<Fmt>;
    if (prefetch != 0) prefetch_block(p + prefetch, kKpBytes<Fmt>);
    write_meta<Fmt>([p](size_t off) { return _mm512_load_si512(p + 64 * kp_slot<Fmt>(static_cast<int>(off))); }, out);
    q = p + kKpQ<Fmt>;
    return out;
  }
  // Super-block b in the per-call layout of pack_rows (kSbBytes<Fmt> at out):
  // the same bits, so RepackedSrc over it gives the same integers.
  void expand(int64_t b, uint8_t* out) {
    meta_to(b, out + kPackQ);
    for (int k = 0; k < Fmt::kSub; ++k) {
      __m512i w[kG];
      granules(k, w);
      for (int g = 0; g < kG; ++g) _mm512_store_si512(out + 64 * (kG * k + g), w[g]);
    }
  }
  // Bit `from` of every byte of v moved to bit `to` (other bits: garbage).
  static __m512i move_bits(__m512i v, int from, int to) {
    return from < to ? _mm512_slli_epi16(v, to - from) : from > to ? _mm512_srli_epi16(v, from - to) : v;
  }
  void granules(int k, __m512i* w) const {
    // w = (nibble source & 0x0F) | high bits (already at bits 4.., the rest 0): one vpternlogd
    constexpr int kLowOrHigh = 0xEC;  // (A & C) | B for A, B, C = 0xF0, 0xCC, 0xAA
    const __m512i nib = _mm512_set1_epi8(0x0F);
    if constexpr (std::is_same_v<Fmt, Q6K>) {
      const __m512i m2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) {  // granule G = 4k + g: ql half G / 32, dword i, nibble (G % 32) / 16
        const int G = 4 * k + g, h = G / 32, i = G % 16, hi = (G % 32) / 16;
        const __m512i ql = _mm512_load_si512(q + 64 * (16 * h + i));
        const __m512i qh = _mm512_load_si512(q + 64 * (32 + 8 * h + i % 8));
        const __m512i hb = _mm512_and_si512(move_bits(qh, (i < 8 ? 0 : 2) + 4 * hi, 4), m2);
        w[g] = _mm512_ternarylogic_epi32(hi ? _mm512_srli_epi16(ql, 4) : ql, hb, nib, kLowOrHigh);
      }
    } else if constexpr (std::is_same_v<Fmt, Q2K> || std::is_same_v<Fmt, Q3K>) {
      // granule G = 4k + g (values 4G..): 2-bit field (G % 32) / 8 of qs dword 8 (G / 32) + G % 8;
      // Q3_K: its bit 2 is bit G / 8 of hmask dword G % 8 (vectors 0..7, qs from 8)
      constexpr int kQs = std::is_same_v<Fmt, Q3K> ? 8 : 0;
      const __m512i m2 = _mm512_set1_epi8(0x03), m4 = _mm512_set1_epi8(0x04);
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) {
        const int G = 4 * k + g;
        const __m512i v = move_bits(_mm512_load_si512(q + 64 * (kQs + 8 * (G / 32) + G % 8)), 2 * ((G % 32) / 8), 0);
        if constexpr (kQs != 0) {
          const __m512i hb = _mm512_and_si512(move_bits(_mm512_load_si512(q + 64 * (G % 8)), G / 8, 2), m4);
          w[g] = _mm512_ternarylogic_epi32(v, hb, m2, kLowOrHigh);
        } else {
          (void)m4;
          w[g] = _mm512_and_si512(v, m2);
        }
      }
      (void)nib;
    } else if constexpr (std::is_same_v<Fmt, IQ4XS>) {
      // granule g of group k: nibble g / 4 of qs dword 4k + g % 4, through the codebook + 128
      const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)), _mm_set1_epi8(static_cast<char>(0x80))));
#pragma GCC unroll 8
      for (int g = 0; g < kG; ++g) {
        const __m512i v = _mm512_load_si512(q + 64 * (4 * k + g % 4));
        w[g] = _mm512_shuffle_epi8(table, _mm512_and_si512(g < 4 ? v : _mm512_srli_epi16(v, 4), nib));
      }
    } else {  // Q4_K / Q5_K: sub-block k = 2j + h is nibble h of vectors 8j..8j+7
      const int j = k / 2, h = k % 2;
      const __m512i m1 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
      for (int g = 0; g < kG; ++g) {
        const __m512i v = _mm512_load_si512(q + 64 * (8 * j + g));
        if constexpr (std::is_same_v<Fmt, Q5K>) {  // bit k of qh bytes 4g.. is the value's bit 4
          const __m512i hb = _mm512_and_si512(move_bits(_mm512_load_si512(q + 64 * (32 + g)), k, 4), m1);
          w[g] = _mm512_ternarylogic_epi32(h ? _mm512_srli_epi16(v, 4) : v, hb, nib, kLowOrHigh);
        } else {
          (void)m1;
          w[g] = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, nib);
        }
      }
    }
  }
};

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
  pack_rows<Fmt>(w0, row_bytes, nr, nb, pk);
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
  s.pack = kp_pack<Fmt>;
  s.packed_sb_bytes = kKpBytes<Fmt>;
  return s;
}

}  // namespace

const KTileSet& ktiles_avx512(GgmlType t) {
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
