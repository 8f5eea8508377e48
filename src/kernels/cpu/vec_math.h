// Internal to kernels/cpu: AVX2 math helpers with a fixed op sequence (so the
// result of a lane depends only on that lane's input).
#pragma once
#include <immintrin.h>

namespace pagoda::kernels::cpu::detail {

// e^x, ~2 ulp on [-87, 88]; exactly 0 below -87.3 (also for -inf); saturates at e^88.37.
inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 v = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), v);
  v = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), v);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(v, v), _mm256_add_ps(v, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}

inline float exp1(float x) { return _mm256_cvtss_f32(exp8(_mm256_set1_ps(x))); }

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace pagoda::kernels::cpu::detail
