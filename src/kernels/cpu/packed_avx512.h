// Small AVX-512 helpers shared by the AVX-512 matmul translation units
// (matmul_avx512.cc, gemm_panel_avx512.cc). Include only from files compiled
// with the AVX-512 flags (kernels/CMakeLists.txt): these inline functions use
// AVX-512 instructions, and another copy must never be picked for an AVX2 caller.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace pagoda::kernels::cpu::detail {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A packed group's 16 f16 scales at p (lane 4r + b = row r, block b; pack.h) as
// f32, permuted by idx.
inline __m512 packed_scales(const uint8_t* p, __m512i idx) {
  return _mm512_permutexvar_ps(idx, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))));
}

}  // namespace pagoda::kernels::cpu::detail
