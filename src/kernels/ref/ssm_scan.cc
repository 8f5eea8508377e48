// Mamba-2's selective scan (api.h): the shared scalar prologue (softplus of dt,
// the per-head decay) and ref::ssm_scan, the oracle cpu::ssm_scan is tested
// against. The row update is ggml_ssm_scan's scalar tail, in its order.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/api.h"

namespace pagoda::kernels {

namespace detail {

void ssm_scan_prologue(const Mamba2ScanArgs& a, float* dt_sp, float* dA) {
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t h = 0; h < a.H; ++h) {
      const float v = a.dt[t * a.ld_dt + h] + a.dt_bias[h];
      const float sp = v > 20.0f ? v : std::log(1.0f + std::exp(v));  // ggml's softplus
      dt_sp[t * a.H + h] = sp;
      dA[t * a.H + h] = std::exp(sp * a.A[h]);
    }
  }
}

}  // namespace detail

namespace ref {

void ssm_scan(const Mamba2ScanArgs& a) {
  const int64_t T = a.n_tokens, H = a.H, P = a.P, N = a.N, heads_per_group = a.H / a.G;
  thread_local std::vector<float> dt_sp, dA;
  dt_sp.resize(static_cast<size_t>(T * H));
  dA.resize(dt_sp.size());
  detail::ssm_scan_prologue(a, dt_sp.data(), dA.data());
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / heads_per_group;
    for (int64_t i = 0; i < P; ++i) {
      float* r = a.state[h * P + i];
      if (a.fresh) std::memset(r, 0, static_cast<size_t>(N) * sizeof(float));
      for (int64_t t = 0; t < T; ++t) {
        const float sp = dt_sp[static_cast<size_t>(t * H + h)], da = dA[static_cast<size_t>(t * H + h)];
        const float x = a.x[t * a.ld_x + h * P + i];
        const float x_dt = x * sp;
        const float* B = a.B + t * a.ld_bc + g * N;
        const float* C = a.C + t * a.ld_bc + g * N;
        float sum = 0.0f;
        for (int64_t n = 0; n < N; ++n) {
          const float s = r[n] * da + B[n] * x_dt;
          sum += s * C[n];
          r[n] = s;
        }
        a.out[t * a.ld_out + h * P + i] = sum + x * a.D[h];
      }
    }
  }
}

}  // namespace ref

}  // namespace pagoda::kernels
