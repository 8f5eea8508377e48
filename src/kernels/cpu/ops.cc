// Elementwise and normalization kernels (baseline AVX2; the same code runs
// whatever ISA matmul picked). Each row is reduced in a fixed lane order.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/fp16.h"
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

namespace {

// The cos and sin tables of one rope call (per token, per rotary pair), kept
// for the next calls with the same positions and parameters: a decode step's
// q and k of every layer share them (gemma3 alternates two bases), so the
// double trig runs once per step instead of twice per layer. The values are
// computed by the same code either way: results are bitwise unchanged.
struct RopeTable {
  // Key: everything the values depend on.
  std::vector<int32_t> positions;
  std::vector<float> freq_factors;  // empty: none
  int32_t rope_dim = 0;
  float theta_base = 0, freq_scale = 0, attn_factor = 0, ext_factor = 0, yarn_low = 0, yarn_high = 0;
  bool valid = false;
  // Values: [n_tokens, half] each.
  std::vector<double> cs, sn;

  bool matches(const int32_t* pos, int64_t n_tokens, int32_t rd, float base, const RopeScaling& s) const {
    if (!valid || rd != rope_dim || base != theta_base || s.freq_scale != freq_scale ||
        s.attn_factor != attn_factor || s.ext_factor != ext_factor || s.yarn_low != yarn_low ||
        s.yarn_high != yarn_high || static_cast<int64_t>(positions.size()) != n_tokens ||
        (s.freq_factors == nullptr) != freq_factors.empty())
      return false;
    if (!std::equal(positions.begin(), positions.end(), pos)) return false;
    return s.freq_factors == nullptr || std::equal(freq_factors.begin(), freq_factors.end(), s.freq_factors);
  }

  void fill(const int32_t* pos, int64_t n_tokens, int32_t rd, float base, const RopeScaling& s) {
    const int32_t half = rd / 2;
    positions.assign(pos, pos + n_tokens);
    if (s.freq_factors) {
      freq_factors.assign(s.freq_factors, s.freq_factors + half);
    } else {
      freq_factors.clear();
    }
    rope_dim = rd;
    theta_base = base;
    freq_scale = s.freq_scale;
    attn_factor = s.attn_factor;
    ext_factor = s.ext_factor;
    yarn_low = s.yarn_low;
    yarn_high = s.yarn_high;
    cs.resize(static_cast<size_t>(n_tokens * half));
    sn.resize(static_cast<size_t>(n_tokens * half));
    inv.resize(static_cast<size_t>(half));
    for (int32_t i = 0; i < half; ++i) inv[i] = std::pow(static_cast<double>(base), -2.0 * i / rd);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int32_t i = 0; i < half; ++i) {
        double theta = pos[t] * inv[i];  // the op order of ref::rope
        if (s.freq_factors) theta /= s.freq_factors[i];
        const double mscale = rope_yarn(theta, i, s);
        cs[t * half + i] = std::cos(theta) * mscale;
        sn[t * half + i] = std::sin(theta) * mscale;
      }
    }
    valid = true;
  }

  std::vector<double> inv;  // scratch: inverse frequencies
};

// The tables of the last two parameter sets seen on this thread (gemma3's
// local and global layers alternate), most recent first. Per thread and grown
// once, so a step allocates nothing after the first.
const RopeTable& rope_table(const int32_t* pos, int64_t n_tokens, int32_t rd, float base, const RopeScaling& s) {
  thread_local RopeTable tables[2];
  thread_local int last = 0;
  for (int j : {last, 1 - last}) {
    if (tables[j].matches(pos, n_tokens, rd, base, s)) {
      last = j;
      return tables[j];
    }
  }
  last = 1 - last;  // replace the older one
  tables[last].fill(pos, n_tokens, rd, base, s);
  return tables[last];
}

}  // namespace

void rope(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          int32_t rope_dim, float theta_base, bool neox, const RopeScaling& scaling) {
  // Same arithmetic as ref::rope (double trig and rotation); the angles of a
  // token are computed once for all heads (and reused across calls, see
  // RopeTable): results are bitwise equal to ref.
  const int32_t half = rope_dim / 2;
  const RopeTable& tab = rope_table(positions, n_tokens, rope_dim, theta_base, scaling);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double* cs = tab.cs.data() + t * half;
    const double* sn = tab.sn.data() + t * half;
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
  // ref::gelu_mul through a table of gelu_of_f16 for every f16 value (256 KiB,
  // built once): F16C rounds 8 values to f16 (nearest even, as fp32_to_fp16),
  // a gather reads their GELU; bitwise equal to ref.
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = gelu_of_f16(static_cast<uint16_t>(h));
    return t;
  }();
  const float* tab = table.data();
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256 g = _mm256_i32gather_ps(tab, h, 4);
    g = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LE_OQ), g);       // x <= -10: 0
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));    // x >= 10: x
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float x = gate[i];
    const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : tab[fp32_to_fp16(x)];
    gate[i] = g * up[i];
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
