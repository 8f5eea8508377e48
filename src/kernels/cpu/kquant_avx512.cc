// K-quant (Q4_K, Q5_K, Q6_K) x q8_K matmul tiles for AVX-512 (BW + VNNI).
// Same per-super-block op sequence as kquant_avx2.cc with 16-lane vectors:
// each 512-bit weight vector holds 64 consecutive values (natural order, like
// the q8_K activations), p16 = maddubs(q_w, q_x) and vpdpwssd adds scale * p16
// into the int32 sum; the float part is one fma per super-block (plus one for
// the Q4_K/Q5_K mins).
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "base/check.h"
#include "kernels/cpu/kquant.h"

namespace pagoda::kernels::cpu::detail {
namespace {

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

inline float hsum16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- Q4_K / Q5_K -------------------------------------------------------------
// q[j] = values 64j..64j+63 (sub-blocks 2j, 2j+1); sc[j] = int16 lanes 0..15
// scale 2j, lanes 16..31 scale 2j+1; mins = int16 lanes 2k, 2k+1 hold min k.
struct K4Block {
  __m512i q[4];
  __m512i sc[4];
  __m256i mins;
  __m512 d, dmin;  // f16 d and dmin in every lane
};

inline void k4_scales(const uint8_t* blk, K4Block* w) {
  const __m128i sm = unpack_k4_scales(blk + 4);
  const __m256i s16 = _mm256_cvtepu8_epi16(sm);
  for (int j = 0; j < 4; ++j) w->sc[j] = spread16(s16, kK4Spread.v[j]);
  w->mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
  w->d = _mm512_set1_ps(load_f16(blk));
  w->dmin = _mm512_set1_ps(load_f16(blk + 2));
}

struct Q4K {
  static constexpr size_t kBytes = 144;
  static inline void decode(const uint8_t* blk, K4Block* w) {
    k4_scales(blk, w);
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(blk + 16 + 32 * j);
      w->q[j] = join(_mm256_and_si256(bits, nib), _mm256_and_si256(_mm256_srli_epi16(bits, 4), nib));
    }
  }
};

struct Q5K {
  static constexpr size_t kBytes = 176;
  static inline void decode(const uint8_t* blk, K4Block* w) {
    k4_scales(blk, w);
    const __m256i nib = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i hb = load256(blk + 16);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(blk + 48 + 32 * j);
      const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4);
      const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4);
      w->q[j] = join(_mm256_or_si256(_mm256_and_si256(bits, nib), h0),
                     _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), nib), h1));
    }
  }
};

inline __m512 k4_dot(__m512 acc, const K4Block& w, const uint8_t* xr) {
  __m512i isum = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j)
    isum = _mm512_dpwssd_epi32(isum, w.sc[j], _mm512_maddubs_epi16(w.q[j], load512(xr + 64 * j)));
  const __m256i msum = _mm256_madd_epi16(w.mins, load256(xr + kActKBsums));
  // d_w * d_x per lane: the same f32 product in every lane as a scalar multiply.
  float dxs;
  std::memcpy(&dxs, xr + kActKD, 4);
  const __m512 dx = _mm512_set1_ps(dxs);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(w.d, dx), acc);
  return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(msum)), _mm512_mul_ps(w.dmin, dx), acc);
}

// ---- Q6_K --------------------------------------------------------------------
// q[k] = values 64k..64k+63 as u8 0..63; sc[k] = int16 lanes 8i..8i+7 hold
// scale 4k+i; sc16 = the 16 scales as int16.
struct K6Block {
  __m512i q[4];
  __m512i sc[4];
  __m256i sc16;
  __m512 d;  // f16 d in every lane
};

struct Q6K {
  static constexpr size_t kBytes = 210;
  static inline void decode(const uint8_t* blk, K6Block* w) {
    const __m512i nib = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m512i l = load512(blk + 64 * h);
      const __m256i hb = load256(blk + 128 + 32 * h);
      // low half: bits 0-1 of qh (values 0..31), high half: bits 2-3 (values 32..63)
      const __m512i hx = join(hb, _mm256_srli_epi16(hb, 2));
      const __m512i h_lo = _mm512_slli_epi16(_mm512_and_si512(hx, two), 4);
      const __m512i h_hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hx, 4), two), 4);
      w->q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, nib), h_lo);
      w->q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), nib), h_hi);
    }
    w->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    for (int k = 0; k < 4; ++k) w->sc[k] = spread16(w->sc16, kK6Spread.v[k]);
    w->d = _mm512_set1_ps(load_f16(blk + 208));
  }
};

inline __m512 k6_dot(__m512 acc, const K6Block& w, const uint8_t* xr) {
  __m512i isum = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k)
    isum = _mm512_dpwssd_epi32(isum, w.sc[k], _mm512_maddubs_epi16(w.q[k], load512(xr + 64 * k)));
  const __m256i off = _mm256_madd_epi16(w.sc16, load256(xr + kActKBsums));
  isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
  // d_w * d_x per lane: the same f32 product in every lane as a scalar multiply.
  float dxs;
  std::memcpy(&dxs, xr + kActKD, 4);
  const __m512 dx = _mm512_set1_ps(dxs);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(w.d, dx), acc);
}

using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline float vhsum(Vec v) { return hsum16(v); }
constexpr int kWideTokens = 8;  // 2 rows x 8 tokens: 16 accumulators plus a decoded block in 32 zmm

#include "kernels/cpu/kquant_tiles.inc"

}  // namespace

const KTileSet& ktiles_avx512(GgmlType t) { return tiles_of(t); }

}  // namespace pagoda::kernels::cpu::detail
