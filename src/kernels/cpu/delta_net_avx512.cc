// One v-head of cpu::gated_delta_net with 16-lane vectors (cpu/delta_net.h).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/delta_net.h"

namespace pagoda::kernels::cpu::detail {

// Rows j0 .. j0 + R - 1 of the head, interleaved: four independent FMA chains
// and one load of k and q for all of them. Each row's own operations are those
// of R = 1 in the same order, so the grouping changes no bit.
template <int R>
void rows_avx512(const DeltaHead& p, int64_t j0) {
  const int64_t S = p.S;
  float* r[R];
  for (int u = 0; u < R; ++u) {
    r[u] = p.rows[j0 + u];
    if (p.fresh) std::memset(r[u], 0, static_cast<size_t>(S) * sizeof(float));
  }
  for (int64_t t = 0; t < p.T; ++t) {
    const float* q = p.qn + t * p.qk_stride;
    const float* k = p.kn + t * p.qk_stride;
    const __m512 eg = _mm512_set1_ps(p.eg[t * p.g_stride]);
    __m512 acc[R];
    for (int u = 0; u < R; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < S; i += 16) {
      const __m512 ki = _mm512_loadu_ps(k + i);
      for (int u = 0; u < R; ++u) {
        const __m512 ri = _mm512_mul_ps(_mm512_loadu_ps(r[u] + i), eg);
        _mm512_storeu_ps(r[u] + i, ri);
        acc[u] = _mm512_fmadd_ps(ri, ki, acc[u]);
      }
    }
    const float beta = p.b[t * p.g_stride];
    __m512 dv[R], o[R];
    for (int u = 0; u < R; ++u) {
      dv[u] = _mm512_set1_ps((p.v[t * p.ld_v + j0 + u] - _mm512_reduce_add_ps(acc[u])) * beta);
      o[u] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < S; i += 16) {
      const __m512 ki = _mm512_loadu_ps(k + i), qi = _mm512_loadu_ps(q + i);
      for (int u = 0; u < R; ++u) {
        const __m512 ri = _mm512_fmadd_ps(ki, dv[u], _mm512_loadu_ps(r[u] + i));
        _mm512_storeu_ps(r[u] + i, ri);
        o[u] = _mm512_fmadd_ps(ri, qi, o[u]);
      }
    }
    for (int u = 0; u < R; ++u) p.out[t * p.ld_out + j0 + u] = _mm512_reduce_add_ps(o[u]) * p.scale;
  }
}

void delta_head_avx512(const DeltaHead& p) {
  int64_t j = 0;
  for (; j + 4 <= p.S; j += 4) rows_avx512<4>(p, j);
  for (; j < p.S; ++j) rows_avx512<1>(p, j);
}

}  // namespace pagoda::kernels::cpu::detail
