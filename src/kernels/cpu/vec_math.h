// Internal to kernels/cpu: math helpers with a fixed op sequence (so the result
// of a lane depends only on that lane's input): AVX2 ones, and exp_lanes for
// any vector width.
#pragma once
#include <immintrin.h>

namespace pagoda::kernels::cpu::detail {

// e^x, ~2 ulp on [-87, 88]; exactly 0 below -87.3 (also for -inf); saturates at
// e^88.37. One op sequence for every vector width: O supplies the lane-wise ops
// of one width (Avx2Ops here, 8 lanes; attention_head_run_avx512.h's, 16), so each lane
// gets bitwise the same result whichever width computes it (the kernels build
// with -ffp-contract=off, so no multiply and add are fused behind our back).
//
// kNonPositive: for x <= 0 (or NaN) only, the same bits in fewer ops, except
// that the lanes x < kExpLow are left for the caller to zero (with its own
// mask in the same op): the clamp at 88.37 never acts there, and 2^fx * y is
// taken by O::mul_pow2 (AVX-512: vscalefps, one op for four), exact as the
// product is for fx in [-126, 0]. Softmax's exp(score - max) is such an x
// (attention_head_run_avx512.h).
constexpr float kExpLow = -87.3f;
template <class O, bool kNonPositive = false>
inline typename O::V exp_lanes(typename O::V x) {
  using V = typename O::V;
  const V lo = O::set1(kExpLow);
  V v = O::max(x, lo);
  if constexpr (!kNonPositive) v = O::min(v, O::set1(88.3762626647949f));
  const V fx = O::round(O::mul(v, O::set1(1.44269504088896341f)));
  v = O::fnmadd(fx, O::set1(0.693359375f), v);
  v = O::fnmadd(fx, O::set1(-2.12194440e-4f), v);
  V y = O::set1(1.9875691500e-4f);
  y = O::fmadd(y, v, O::set1(1.3981999507e-3f));
  y = O::fmadd(y, v, O::set1(8.3334519073e-3f));
  y = O::fmadd(y, v, O::set1(4.1665795894e-2f));
  y = O::fmadd(y, v, O::set1(1.6666665459e-1f));
  y = O::fmadd(y, v, O::set1(5.0000001201e-1f));
  y = O::fmadd(y, O::mul(v, v), O::add(v, O::set1(1.0f)));
  if constexpr (kNonPositive) {
    return O::mul_pow2(y, fx);  // lanes x < kExpLow: the caller zeroes them
  } else {
    y = O::mul(y, O::pow2(fx));
    return O::zero_below(x, lo, y);
  }
}

struct Avx2Ops {
  using V = __m256;
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-127, 128] (the exponent field).
  static V pow2(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // y, with the lanes where x < lo (ordered) set to +0.
  static V zero_below(V x, V lo, V y) { return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y); }
};

inline __m256 exp8(__m256 x) { return exp_lanes<Avx2Ops>(x); }

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
