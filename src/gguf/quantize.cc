// Reference quantizers. The Q4_0 / Q4_1 / Q8_0 rounding (x + 8.5 truncated,
// roundf, the sign of the max-magnitude value) is ggml's, so files quantized
// here match files quantized by llama.cpp's reference path.
#include "gguf/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/fp16.h"

namespace pagoda::gguf {

namespace {

int nearest_int(float f) { return static_cast<int>(std::lrintf(f)); }

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  constexpr int qk = kQK4_0;
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f, max = 0.0f;  // max: the value of largest magnitude, with its sign
    for (int j = 0; j < qk; ++j) {
      const float v = x[i * qk + j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = x[i * qk + j] * id;
      const float x1 = x[i * qk + qk / 2 + j] * id;
      const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 8.5f)));
      const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  constexpr int qk = kQK4_1;
  for (int64_t i = 0; i < nb; ++i) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < qk; ++j) {
      const float v = x[i * qk + j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (x[i * qk + j] - min) * id;
      const float x1 = (x[i * qk + qk / 2 + j] - min) * id;
      const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 0.5f)));
      const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  constexpr int qk = kQK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[i * qk + j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(std::roundf(x[i * qk + j] * id));
  }
}

// Q4_K: per 32-element sub-block, value = d*sc*q - dmin*m with 6-bit sc, m and
// 4-bit q. One pass: sub-block range -> (scale, min), both quantized to 6 bits
// against the super-block maxima, then q rounded against the stored scales.
void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8], mins[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = 0.0f, hi = -FLT_MAX;  // lo <= 0 so that the stored min is >= 0
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, x[32 * j + l]);
        hi = std::max(hi, x[32 * j + l]);
      }
      scales[j] = (hi - lo) / 15.0f;
      mins[j] = -lo;
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].dmin = fp32_to_fp16(dmin);
    const float d_stored = fp16_to_fp32(y[i].d), dmin_stored = fp16_to_fp32(y[i].dmin);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(std::clamp(d_stored > 0 ? nearest_int(scales[j] / d_stored) : 0, 0, 63));
      lm[j] = static_cast<uint8_t>(std::clamp(dmin_stored > 0 ? nearest_int(mins[j] / dmin_stored) : 0, 0, 63));
    }
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    for (int j = 0; j < 8; ++j) {
      if (j < 4) {
        y[i].scales[j] = ls[j];
        y[i].scales[j + 4] = lm[j];
      } else {
        y[i].scales[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
        y[i].scales[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
        y[i].scales[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
      }
    }
    uint8_t L[kQK_K];
    for (int j = 0; j < 8; ++j) {
      const float dl = d_stored * ls[j], ml = dmin_stored * lm[j];
      for (int l = 0; l < 32; ++l) {
        const int q = dl > 0 ? nearest_int((x[32 * j + l] + ml) / dl) : 0;
        L[32 * j + l] = static_cast<uint8_t>(std::clamp(q, 0, 15));
      }
    }
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
  }
}

// Q6_K: per 16-element sub-block, value = d*sc*(q-32) with signed 8-bit sc and
// 6-bit q. The value of largest magnitude maps to q-32 = -32, as in ggml.
void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0, max = 0;
      for (int l = 0; l < 16; ++l) {
        const float v = x[16 * j + l];
        if (std::fabs(v) > amax) {
          amax = std::fabs(v);
          max = v;
        }
      }
      scales[j] = max / -32.0f;
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(y[i].ql, 0, sizeof y[i].ql);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    if (max_abs_scale == 0) {
      std::memset(y[i].scales, 0, sizeof y[i].scales);
      y[i].d = fp32_to_fp16(0.0f);
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y[i].d = fp32_to_fp16(1.0f / iscale);
    const float d = fp16_to_fp32(y[i].d);
    uint8_t L[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int sc = std::clamp(nearest_int(iscale * scales[j]), -128, 127);
      y[i].scales[j] = static_cast<int8_t>(sc);
      const float dl = d * sc;
      for (int l = 0; l < 16; ++l) {
        const int q = dl != 0 ? nearest_int(x[16 * j + l] / dl) : 0;
        L[16 * j + l] = static_cast<uint8_t>(std::clamp(q, -32, 31) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
  }
}

}  // namespace

bool quantize_supported(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  if (!quantize_supported(type) || n < 0) return false;
  const int64_t bs = ggml_type_info(type).block_size;
  if (n % bs != 0) return false;
  const int64_t nb = n / bs;
  switch (type) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return true;
    case GgmlType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return true;
    }
    case GgmlType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return true;
    }
    case GgmlType::Q8_0: quant_q8_0(src, static_cast<BlockQ8_0*>(dst), nb); return true;
    case GgmlType::Q4_0: quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb); return true;
    case GgmlType::Q4_1: quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb); return true;
    case GgmlType::Q4_K: quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb); return true;
    case GgmlType::Q6_K: quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb); return true;
    default: return false;
  }
}

}  // namespace pagoda::gguf
