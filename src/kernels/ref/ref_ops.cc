// Scalar reference kernels (the oracles cpu/ is tested against). Clarity over
// speed: every weight row is dequantized to f32 and reductions run in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "base/ggml_quant.h"
#include "kernels/api.h"

namespace pagoda::kernels::ref {

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  PAGODA_CHECK(matmul_supports(w.type));
  std::vector<float> row(static_cast<size_t>(w.cols));  // [cols]
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, row.data(), w.cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

void matmul_multi(const WeightView* const* ws, int n, const float* x, int64_t n_tokens, float* const* ys) {
  for (int i = 0; i < n; ++i) matmul(*ws[i], x, n_tokens, ys[i]);
}

void rmsnorm(const float* x, const float* weight, float eps, int64_t n_tokens, int64_t n, float* y) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[t * n + i]) * x[t * n + i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      y[t * n + i] = static_cast<float>(x[t * n + i] * scale * weight[i]);
  }
}

void rope(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          int32_t rope_dim, float theta_base, bool neox, const RopeScaling& scaling) {
  const int32_t half = rope_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int32_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        double theta = positions[t] * std::pow(static_cast<double>(theta_base), -2.0 * i / rope_dim);
        if (scaling.freq_factors) theta /= scaling.freq_factors[i];
        const double mscale = rope_yarn(theta, i, scaling);
        const double c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
        const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const double x0 = v[a], x1 = v[b];
        v[a] = static_cast<float>(x0 * c - x1 * s);
        v[b] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

void paged_attention(const float* q, const KvLayerView& kv, const BatchView& batch, int32_t n_heads,
                     float scale, float* out, int32_t window) {
  const int32_t hd = kv.head_dim, group = n_heads / kv.n_kv_heads;
  const int64_t n = static_cast<int64_t>(kv.n_kv_heads) * hd;
  std::vector<float> krow(static_cast<size_t>(n)), vrow(static_cast<size_t>(n));
  for (int32_t s = 0; s < batch.n_seqs; ++s) {
    const int64_t len = kv_len(batch, s, kv.block_size);
    const int32_t* pages = batch.kv_indices + batch.kv_indptr[s];
    for (int32_t t = batch.q_indptr[s]; t < batch.q_indptr[s + 1]; ++t) {
      const int64_t n_keys = std::min<int64_t>(len, static_cast<int64_t>(batch.positions[t]) + 1);
      // Sliding window: keys j with positions[t] - j >= window are masked out.
      const int64_t first = window > 0 ? std::max<int64_t>(0, static_cast<int64_t>(batch.positions[t]) - window + 1) : 0;
      for (int32_t h = 0; h < n_heads; ++h) {
        const float* qh = q + (static_cast<int64_t>(t) * n_heads + h) * hd;
        const int32_t kvh = h / group;
        std::vector<double> scores(static_cast<size_t>(n_keys), -INFINITY);  // masked keys: weight 0
        for (int64_t j = first; j < n_keys; ++j) {
          const int64_t slot = static_cast<int64_t>(pages[j / kv.block_size]) * kv.block_size + j % kv.block_size;
          kv_read_row(kv.dtype, kv.k + slot * kv.row_bytes, n, krow.data());
          double dot = 0;
          for (int32_t i = 0; i < hd; ++i) dot += static_cast<double>(qh[i]) * krow[kvh * hd + i];
          scores[j] = dot * scale;
        }
        double mx = -INFINITY, sum = 0;
        for (double sc : scores) mx = std::max(mx, sc);
        for (double& sc : scores) sum += sc = std::exp(sc - mx);
        std::vector<double> acc(static_cast<size_t>(hd), 0.0);
        for (int64_t j = first; j < n_keys; ++j) {
          const int64_t slot = static_cast<int64_t>(pages[j / kv.block_size]) * kv.block_size + j % kv.block_size;
          kv_read_row(kv.v_dtype, kv.v + slot * kv.v_row_bytes, n, vrow.data());
          for (int32_t i = 0; i < hd; ++i) acc[i] += scores[j] * vrow[kvh * hd + i];
        }
        float* o = out + (static_cast<int64_t>(t) * n_heads + h) * hd;
        for (int32_t i = 0; i < hd; ++i) o[i] = n_keys > first ? static_cast<float>(acc[i] / sum) : 0.0f;
      }
    }
  }
}

void gelu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float g = x <= -10.0f ? 0.0f : x >= 10.0f ? x : gelu_of_f16(fp32_to_fp16(x));
    gate[i] = g * up[i];
  }
}

}  // namespace pagoda::kernels::ref
