// Elementwise and normalization kernels (baseline AVX2; the same code runs
// whatever ISA matmul picked). Each row is reduced in a fixed lane order.
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "kernels/api.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels {

namespace cpu {

void rmsnorm(const float* x, const float* weight, float eps, int64_t n_tokens, int64_t n, float* y) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 v0 = _mm256_loadu_ps(xr + i), v1 = _mm256_loadu_ps(xr + i + 8);
      a0 = _mm256_fmadd_ps(v0, v0, a0);
      a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    float ss = detail::hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) ss = std::fma(xr[i], xr[i], ss);
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    const __m256 sv = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), sv), _mm256_loadu_ps(weight + i)));
    for (; i < n; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void rope(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          int32_t rope_dim, float theta_base, bool neox, const RopeScaling& scaling) {
  // Same arithmetic as ref::rope (double trig and rotation), with the angles of
  // a token computed once for all heads; results are bitwise equal to ref.
  const int32_t half = rope_dim / 2;
  // [3, half]: inverse frequencies, cos and sin of one token's angles. Per
  // thread and grown once, so a step allocates nothing.
  thread_local std::vector<double> buf;
  if (buf.size() < static_cast<size_t>(3 * half)) buf.resize(static_cast<size_t>(3 * half));
  double* inv = buf.data();
  double* cs = inv + half;
  double* sn = cs + half;
  for (int32_t i = 0; i < half; ++i) inv[i] = std::pow(static_cast<double>(theta_base), -2.0 * i / rope_dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int32_t i = 0; i < half; ++i) {
      double theta = positions[t] * inv[i];  // the op order of ref::rope
      if (scaling.freq_factors) theta /= scaling.freq_factors[i];
      const double mscale = rope_yarn(theta, i, scaling);
      cs[i] = std::cos(theta) * mscale;
      sn[i] = std::sin(theta) * mscale;
    }
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = static_cast<float>(x0 * cs[i] - x1 * sn[i]);
        v[b] = static_cast<float>(x0 * sn[i] + x1 * cs[i]);
      }
    }
  }
}

void gelu_mul(float* gate, const float* up, int64_t n) {
  // 0.5 x (1 + tanh(u)) == x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
  // the sigmoid form shares silu_mul's exp8 and needs no tanh.
  const __m256 one = _mm256_set1_ps(1.0f), k2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f),
               c = _mm256_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_mul_ps(x, _mm256_add_ps(one, _mm256_mul_ps(c, _mm256_mul_ps(x, x))));
    const __m256 g = _mm256_div_ps(x, _mm256_add_ps(one, detail::exp8(_mm256_mul_ps(k2, inner))));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float x = gate[i];
    const float inner = x * (1.0f + 0.044715f * (x * x));
    gate[i] = x / (1.0f + detail::exp1(-2.0f * 0.7978845608028654f * inner)) * up[i];
  }
}

}  // namespace cpu

void silu_mul(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, cpu::detail::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + cpu::detail::exp1(-gate[i])) * up[i];
}

}  // namespace pagoda::kernels
