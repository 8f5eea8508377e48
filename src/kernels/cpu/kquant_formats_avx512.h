// The K-quant formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) of the AVX-512 (BW + VNNI)
// matmul (kquant_avx512.cc): each super-block decoded to natural order, its
// integer sums, and the one float step every path ends in.
//
// Canonical float sequence (every path, every n_tokens, tile, thread
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
// How the kernels compute S1 and S2: kquant_avx512.cc; the weight layouts of its
// GEMM tile: kquant_layouts_avx512.h.
// int32 bounds: Q4_K |S1| <= 8 * 63 * (32 * 15 * 127) < 2^25, Q5_K
// (quants < 32) < 2^26, S2 <= 8 * 63 * 32 * 127 < 2^21; Q6_K |sum_k sc_k *
// dot_k| <= 16 * 128 * (16 * 63 * 127) < 2^28 and 32 |S2| <= 32 * 16 * 128 *
// 16 * 127 < 2^28; Q2_K |S1| <= 16 * 15 * 16 * 3 * 127 < 2^24, S2 <= 16 * 15 *
// 16 * 127 < 2^19; Q3_K |S1| <= 16 * 32 * 16 * 7 * 127 < 2^23, 4 |S2| <= 4 *
// 16 * 32 * 16 * 127 < 2^22; IQ4_XS |S1| <= 8 * 32 * 32 * 241 * 127 < 2^28 and
// 128 |S2| <= 128 * 8 * 32 * 32 * 127 < 2^28. The 16-value halves in the reduce tree and the maddubs pair
// sums (<= 2 * 63 * 127) stay far inside their types too.
// Include only from files compiled with the AVX-512 flags (kernels/CMakeLists.txt).
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/ggml_types.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/kquant.h"

namespace pagoda::kernels::cpu::detail::kquant512 {

#include "kernels/cpu/kquant_prelude.inc"

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

inline void prefetch_block(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) prefetch_stream(p + o);
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

}  // namespace pagoda::kernels::cpu::detail::kquant512
