// One v-head of cpu::gated_delta_net with 16-lane vectors (cpu/delta_net.h).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/delta_net.h"

namespace pagoda::kernels::cpu::detail {

void delta_head_avx512(const DeltaHead& p) {
  const int64_t S = p.S;
  for (int64_t j = 0; j < S; ++j) {
    float* r = p.rows[j];
    if (p.fresh) std::memset(r, 0, static_cast<size_t>(S) * sizeof(float));
    for (int64_t t = 0; t < p.T; ++t) {
      const float* q = p.qn + t * p.qk_stride;
      const float* k = p.kn + t * p.qk_stride;
      const __m512 eg = _mm512_set1_ps(p.eg[t * p.g_stride]);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < S; i += 16) {
        const __m512 ri = _mm512_mul_ps(_mm512_loadu_ps(r + i), eg);
        _mm512_storeu_ps(r + i, ri);
        acc = _mm512_fmadd_ps(ri, _mm512_loadu_ps(k + i), acc);
      }
      const float d = (p.v[t * p.ld_v + j] - _mm512_reduce_add_ps(acc)) * p.b[t * p.g_stride];
      const __m512 dv = _mm512_set1_ps(d);
      __m512 o = _mm512_setzero_ps();
      for (int64_t i = 0; i < S; i += 16) {
        const __m512 ri = _mm512_fmadd_ps(_mm512_loadu_ps(k + i), dv, _mm512_loadu_ps(r + i));
        _mm512_storeu_ps(r + i, ri);
        o = _mm512_fmadd_ps(ri, _mm512_loadu_ps(q + i), o);
      }
      p.out[t * p.ld_out + j] = _mm512_reduce_add_ps(o) * p.scale;
    }
  }
}

}  // namespace pagoda::kernels::cpu::detail
