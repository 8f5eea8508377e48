// Qwen3.5's recurrent ops (api.h), scalar: ref::ssm_conv_silu (both backends),
// the shared prologue of the gated delta rule, and ref::gated_delta_net, the
// oracle the SIMD cpu::gated_delta_net is tested against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/api.h"

namespace pagoda::kernels {

namespace ref {

void ssm_conv_silu(const float* x, int64_t n_tokens, int64_t C, const float* weight, int32_t K, float* const* state,
                   int32_t row_floats, bool fresh, float* y, const float* bias) {
  const int64_t d = K - 1;  // state rows (time steps)
  const int64_t flat = d * C;
  // The old state, contiguous ([d, C]; zeros when fresh): the padded input
  // [prev; x] is then read by row pointers, one pass over the channels per tap
  // (each channel's sum still from 0 in k order: the same bits as per channel).
  thread_local std::vector<float> prev, sum;
  prev.assign(static_cast<size_t>(flat), 0.0f);
  if (!fresh) {
    for (int64_t f = 0; f < flat; f += row_floats)
      std::memcpy(prev.data() + f, state[f / row_floats], static_cast<size_t>(std::min<int64_t>(row_floats, flat - f)) * sizeof(float));
  }
  const auto row = [&](int64_t i) {  // time index i of [prev; x]
    return i < d ? prev.data() + i * C : x + (i - d) * C;
  };
  sum.resize(static_cast<size_t>(C));
  float* acc = sum.data();
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::fill(acc, acc + C, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float* v = row(t + k);
      for (int64_t c = 0; c < C; ++c) acc[c] += v[c] * weight[c * K + k];
    }
    float* yt = y + t * C;
    for (int64_t c = 0; c < C; ++c) {
      float s = acc[c];
      if (bias) s += bias[c];
      yt[c] = s / (1.0f + std::exp(-s));
    }
  }
  // The next state: the last d rows of [prev; x], written back flat across the rows.
  for (int64_t j = 0; j < d; ++j) {
    const float* src = row(n_tokens + j);
    for (int64_t c = 0; c < C; c += row_floats) {
      const int64_t f = j * C + c;  // C % row_floats == 0: a row never straddles two time steps
      std::memcpy(state[f / row_floats], src + c, static_cast<size_t>(std::min<int64_t>(row_floats, C - c)) * sizeof(float));
    }
  }
}

}  // namespace ref

namespace detail {

void gated_delta_net_prologue(const GatedDeltaNetArgs& a, float* qn, float* kn, float* g, float* b) {
  const int64_t S = a.S, Hk = a.H_k, Hv = a.H_v;
  const float post = 1.0f / std::sqrt(static_cast<float>(S));
  const float eps = a.eps / static_cast<float>(S);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* row = a.qkv + t * a.ld;
    for (int64_t part = 0; part < 2; ++part) {  // q, then k
      for (int64_t h = 0; h < Hk; ++h) {
        const float* src = row + (part * Hk + h) * S;
        float* dst = (part == 0 ? qn : kn) + (t * Hk + h) * S;
        // ggml_rms_norm (a double sum, a float scale), then ggml_scale.
        double sum = 0.0;
        for (int64_t i = 0; i < S; ++i) sum += static_cast<double>(src[i] * src[i]);
        const float mean = static_cast<float>(sum / static_cast<double>(S));
        const float scale = 1.0f / std::sqrt(mean + eps);
        for (int64_t i = 0; i < S; ++i) dst[i] = (src[i] * scale) * post;
      }
    }
    for (int64_t h = 0; h < Hv; ++h) {
      const float x = a.alpha[t * a.ld_ab + h] + a.dt_bias[h];
      const float sp = x > 20.0f ? x : std::log(1.0f + std::exp(x));  // ggml's softplus
      g[t * Hv + h] = sp * a.ssm_a[h];
      b[t * Hv + h] = 1.0f / (1.0f + std::exp(-a.beta[t * a.ld_ab + h]));
    }
  }
}

}  // namespace detail

namespace ref {

void gated_delta_net(const GatedDeltaNetArgs& a) {
  const int64_t S = a.S, Hk = a.H_k, Hv = a.H_v, T = a.n_tokens;
  thread_local std::vector<float> qn, kn, g, b;
  qn.resize(static_cast<size_t>(T * Hk * S));
  kn.resize(qn.size());
  g.resize(static_cast<size_t>(T * Hv));
  b.resize(g.size());
  detail::gated_delta_net_prologue(a, qn.data(), kn.data(), g.data(), b.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(S));
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t hk = h % Hk;
    for (int64_t j = 0; j < S; ++j) {
      float* r = a.state[h * S + j];
      if (a.fresh) std::memset(r, 0, static_cast<size_t>(S) * sizeof(float));
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qn.data() + (t * Hk + hk) * S;
        const float* k = kn.data() + (t * Hk + hk) * S;
        const float v = a.qkv[t * a.ld + 2 * Hk * S + h * S + j];
        const float eg = std::exp(g[static_cast<size_t>(t * Hv + h)]);
        float sk = 0.0f;
        for (int64_t i = 0; i < S; ++i) {
          r[i] *= eg;
          sk += r[i] * k[i];
        }
        const float d = (v - sk) * b[static_cast<size_t>(t * Hv + h)];
        float o = 0.0f;
        for (int64_t i = 0; i < S; ++i) {
          r[i] += k[i] * d;
          o += r[i] * q[i];
        }
        a.out[t * Hv * S + h * S + j] = o * scale;
      }
    }
  }
}

}  // namespace ref

}  // namespace pagoda::kernels
