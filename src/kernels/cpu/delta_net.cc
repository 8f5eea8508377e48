// cpu::gated_delta_net (api.h): the shared prologue, then each v-head's rows on
// the thread pool, AVX-512 or AVX2 by the dispatcher's ISA. Row j of a head keeps
// its S floats in L1 across the step's tokens; every row is its own fixed
// sequence of operations, so no split changes a bit.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/api.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/delta_net.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels {

namespace cpu::detail {

// Rows j0 .. j0 + R - 1 of the head, interleaved: four independent FMA chains
// and one load of k and q for all of them. Each row's own operations are those
// of R = 1 in the same order, so the grouping changes no bit.
template <int R>
void rows_avx2(const DeltaHead& p, int64_t j0) {
  const int64_t S = p.S;
  float* r[R];
  for (int u = 0; u < R; ++u) {
    r[u] = p.rows[j0 + u];
    if (p.fresh) std::memset(r[u], 0, static_cast<size_t>(S) * sizeof(float));
  }
  for (int64_t t = 0; t < p.T; ++t) {
    const float* q = p.qn + t * p.qk_stride;
    const float* k = p.kn + t * p.qk_stride;
    const __m256 eg = _mm256_set1_ps(p.eg[t * p.g_stride]);
    __m256 acc[R];
    for (int u = 0; u < R; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t i = 0; i < S; i += 8) {
      const __m256 ki = _mm256_loadu_ps(k + i);
      for (int u = 0; u < R; ++u) {
        const __m256 ri = _mm256_mul_ps(_mm256_loadu_ps(r[u] + i), eg);
        _mm256_storeu_ps(r[u] + i, ri);
        acc[u] = _mm256_fmadd_ps(ri, ki, acc[u]);
      }
    }
    const float beta = p.b[t * p.g_stride];
    __m256 dv[R], o[R];
    for (int u = 0; u < R; ++u) {
      dv[u] = _mm256_set1_ps((p.v[t * p.ld_v + j0 + u] - hsum8(acc[u])) * beta);
      o[u] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < S; i += 8) {
      const __m256 ki = _mm256_loadu_ps(k + i), qi = _mm256_loadu_ps(q + i);
      for (int u = 0; u < R; ++u) {
        const __m256 ri = _mm256_fmadd_ps(ki, dv[u], _mm256_loadu_ps(r[u] + i));
        _mm256_storeu_ps(r[u] + i, ri);
        o[u] = _mm256_fmadd_ps(ri, qi, o[u]);
      }
    }
    for (int u = 0; u < R; ++u) p.out[t * p.ld_out + j0 + u] = hsum8(o[u]) * p.scale;
  }
}

void delta_head_avx2(const DeltaHead& p) {
  int64_t j = 0;
  for (; j + 4 <= p.S; j += 4) rows_avx2<4>(p, j);
  for (; j < p.S; ++j) rows_avx2<1>(p, j);
}

}  // namespace cpu::detail

namespace cpu {

void gated_delta_net(const GatedDeltaNetArgs& a) {
  using namespace cpu::detail;
  const int64_t S = a.S, Hk = a.H_k, Hv = a.H_v, T = a.n_tokens;
  const bool avx512 = isa() == Isa::kAvx512 && S % 16 == 0;
  if (!avx512 && S % 8 != 0) {  // no vector shape for these heads: the scalar oracle
    ref::gated_delta_net(a);
    return;
  }
  thread_local std::vector<float> qn, kn, g, b;
  qn.resize(static_cast<size_t>(T * Hk * S));
  kn.resize(qn.size());
  g.resize(static_cast<size_t>(T * Hv));
  b.resize(g.size());
  kernels::detail::gated_delta_net_prologue(a, qn.data(), kn.data(), g.data(), b.data());
  for (float& x : g) x = std::exp(x);  // exp(g), as the scalar oracle computes it
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  // Plain pointers: the pool's threads must not name this thread's thread_locals.
  const float *qp = qn.data(), *kp = kn.data(), *gp = g.data(), *bp = b.data();
  const auto head = [&](int64_t h) {
    const int64_t hk = h % Hk;
    const DeltaHead p{.qn = qp + hk * S, .kn = kp + hk * S, .qk_stride = Hk * S,
                      .eg = gp + h, .b = bp + h, .g_stride = Hv,
                      .v = a.qkv + 2 * Hk * S + h * S, .ld_v = a.ld, .rows = a.state + h * S,
                      .out = a.out + h * S, .ld_out = Hv * S, .T = T, .S = S, .scale = scale, .fresh = a.fresh};
    if (avx512) delta_head_avx512(p);
    else delta_head_avx2(p);
  };
  // One pool launch over the heads when there is enough work (S x S x T per head).
  if (Hv > 1 && S * S * T >= 8192) {
    kernels::parallel_for(Hv, head);
  } else {
    for (int64_t h = 0; h < Hv; ++h) head(h);
  }
}

}  // namespace cpu

}  // namespace pagoda::kernels
