// One head of cpu::ssm_scan with 16-lane vectors (cpu/ssm_scan.h).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/ssm_scan.h"

namespace pagoda::kernels::cpu::detail {

// Rows i0 .. i0 + R - 1 of the head, interleaved as scan_rows_avx2 (R chains
// sharing the loads of B and C; each row's operations those of R = 1).
template <int R>
void scan_rows_avx512(const ScanHead& p, int64_t i0) {
  const int64_t N = p.N;
  float* r[R];
  for (int u = 0; u < R; ++u) {
    r[u] = p.rows[i0 + u];
    if (p.fresh) std::memset(r[u], 0, static_cast<size_t>(N) * sizeof(float));
  }
  for (int64_t t = 0; t < p.T; ++t) {
    const float* B = p.B + t * p.ld_bc;
    const float* C = p.C + t * p.ld_bc;
    const float sp = p.dt_sp[t * p.stride_h];
    const __m512 da = _mm512_set1_ps(p.dA[t * p.stride_h]);
    float x[R];
    __m512 xdt[R], acc[R];
    for (int u = 0; u < R; ++u) {
      x[u] = p.x[t * p.ld_x + i0 + u];
      xdt[u] = _mm512_set1_ps(x[u] * sp);
      acc[u] = _mm512_setzero_ps();
    }
    for (int64_t n = 0; n < N; n += 16) {
      const __m512 b = _mm512_loadu_ps(B + n), c = _mm512_loadu_ps(C + n);
      for (int u = 0; u < R; ++u) {
        const __m512 s = _mm512_fmadd_ps(_mm512_loadu_ps(r[u] + n), da, _mm512_mul_ps(b, xdt[u]));
        _mm512_storeu_ps(r[u] + n, s);
        acc[u] = _mm512_fmadd_ps(s, c, acc[u]);
      }
    }
    for (int u = 0; u < R; ++u) p.out[t * p.ld_out + i0 + u] = _mm512_reduce_add_ps(acc[u]) + x[u] * p.D;
  }
}

void scan_head_avx512(const ScanHead& p) {
  int64_t i = 0;
  for (; i + 4 <= p.P; i += 4) scan_rows_avx512<4>(p, i);
  for (; i < p.P; ++i) scan_rows_avx512<1>(p, i);
}

}  // namespace pagoda::kernels::cpu::detail
