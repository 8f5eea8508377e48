// cpu::ssm_scan (api.h): the shared prologue, then each head's rows on the
// thread pool, AVX-512 or AVX2 by the dispatcher's ISA. A row keeps its N
// floats in L1 across the step's tokens; every row is its own fixed sequence
// of operations (B and C loaded once per token for R rows at a time), so no
// split changes a bit.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/api.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/ssm_scan.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels {

namespace cpu::detail {

// Rows i0 .. i0 + R - 1 of the head, interleaved: R independent chains sharing
// the loads of B and C. Each row's own operations are those of R = 1 in the same
// order, so the grouping changes no bit.
template <int R>
void scan_rows_avx2(const ScanHead& p, int64_t i0) {
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
    const __m256 da = _mm256_set1_ps(p.dA[t * p.stride_h]);
    float x[R];
    __m256 xdt[R], acc[R];
    for (int u = 0; u < R; ++u) {
      x[u] = p.x[t * p.ld_x + i0 + u];
      xdt[u] = _mm256_set1_ps(x[u] * sp);
      acc[u] = _mm256_setzero_ps();
    }
    for (int64_t n = 0; n < N; n += 8) {
      const __m256 b = _mm256_loadu_ps(B + n), c = _mm256_loadu_ps(C + n);
      for (int u = 0; u < R; ++u) {
        const __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(r[u] + n), da, _mm256_mul_ps(b, xdt[u]));
        _mm256_storeu_ps(r[u] + n, s);
        acc[u] = _mm256_fmadd_ps(s, c, acc[u]);
      }
    }
    for (int u = 0; u < R; ++u) p.out[t * p.ld_out + i0 + u] = hsum8(acc[u]) + x[u] * p.D;
  }
}

void scan_head_avx2(const ScanHead& p) {
  int64_t i = 0;
  for (; i + 4 <= p.P; i += 4) scan_rows_avx2<4>(p, i);
  for (; i < p.P; ++i) scan_rows_avx2<1>(p, i);
}

}  // namespace cpu::detail

namespace cpu {

void ssm_scan(const Mamba2ScanArgs& a) {
  using namespace cpu::detail;
  const int64_t T = a.n_tokens, H = a.H, P = a.P, N = a.N, heads_per_group = a.H / a.G;
  const bool avx512 = isa() == Isa::kAvx512 && N % 16 == 0;
  if (!avx512 && N % 8 != 0) {  // no vector shape for these rows: the scalar oracle
    ref::ssm_scan(a);
    return;
  }
  thread_local std::vector<float> dt_sp, dA;
  dt_sp.resize(static_cast<size_t>(T * H));
  dA.resize(dt_sp.size());
  kernels::detail::ssm_scan_prologue(a, dt_sp.data(), dA.data());
  // Plain pointers: the pool's threads must not name this thread's thread_locals.
  const float *sp = dt_sp.data(), *da = dA.data();
  const auto head = [&](int64_t h) {
    const int64_t g = h / heads_per_group;
    const ScanHead p{.x = a.x + h * P, .ld_x = a.ld_x, .B = a.B + g * N, .C = a.C + g * N, .ld_bc = a.ld_bc,
                     .dt_sp = sp + h, .dA = da + h, .stride_h = H, .D = a.D[h], .rows = a.state + h * P,
                     .out = a.out + h * P, .ld_out = a.ld_out, .T = T, .P = P, .N = N, .fresh = a.fresh};
    if (avx512) scan_head_avx512(p);
    else scan_head_avx2(p);
  };
  // One pool launch over the heads when there is enough work (P x N x T per head).
  if (H > 1 && P * N * T >= 8192) {
    kernels::parallel_for(H, head);
  } else {
    for (int64_t h = 0; h < H; ++h) head(h);
  }
}

}  // namespace cpu

}  // namespace pagoda::kernels
