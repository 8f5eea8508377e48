// Internal to kernels/cpu (AVX-512 files only): the 16 x 16 transpose of 32-bit
// lanes, shared by the K-quant packers (kquant_pack_avx512.cc) and the prefill
// attention tile's transposed K (attention_tile_avx512.cc; floats go through it as
// their bits: a transpose moves lanes and never changes one).
#pragma once
#include <immintrin.h>

namespace pagoda::kernels::cpu::detail {

// In place: m[r] lane c -> m[c] lane r (16 x 16 int32).
inline void transpose16x16_epi32(__m512i* m) {
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

}  // namespace pagoda::kernels::cpu::detail
