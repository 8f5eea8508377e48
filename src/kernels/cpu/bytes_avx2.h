// A byte-mask helper shared by the AVX2 matmul translation units (matmul_avx2.cc,
// gemm_panel_avx2.cc), both built with the baseline (x86-64-v3) flags.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace pagoda::kernels::cpu::detail {

// byte i of the result is 0xFF if bit i of m is set.
inline __m256i bits_to_bytes(uint32_t m) {
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                          0x0303030303030303);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), shuf);
  const __m256i sel = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

}  // namespace pagoda::kernels::cpu::detail
