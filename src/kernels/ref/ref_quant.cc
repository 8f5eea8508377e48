// Scalar dequantizers for every weight type matmul accepts, plus the q8_0 row
// quantizer used by the KV cache. Written after ggml-quants.c (dequantize_row_*
// and quantize_row_q8_0_ref); kept deliberately simple.
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/api.h"
#include "kernels/quant_rows.h"

namespace pagoda::kernels {
namespace {

float h2f(uint16_t h) { return fp16_to_fp32(h); }

void deq_q4_0(const BlockQ4_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void deq_q4_1(const BlockQ4_1* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void deq_q5_0(const BlockQ5_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | h0) - 16) * d;
      y[j + 16] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void deq_q5_1(const BlockQ5_1* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) | h0) * d + m;
      y[j + 16] = static_cast<float>((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void deq_q8_0(const BlockQ8_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void deq_q4_k(const BlockQ4_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 4; ++j, q += 32) {
      uint8_t sc, m;
      detail::k_scale_min(2 * j, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      detail::k_scale_min(2 * j + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void deq_q5_k(const BlockQ5_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    unsigned u1 = 1, u2 = 2;
    for (int j = 0; j < 4; ++j, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      detail::k_scale_min(2 * j, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      detail::k_scale_min(2 * j + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void deq_q6_k(const BlockQ6_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

bool matmul_supports(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0:
    case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(GgmlType type, const void* row, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(row);
  switch (type) {
    case GgmlType::F32: std::memcpy(out, p, static_cast<size_t>(n) * 4); return;
    case GgmlType::F16: {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
      }
      return;
    }
    case GgmlType::BF16: {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_fp32(h);
      }
      return;
    }
    case GgmlType::Q4_0: deq_q4_0(reinterpret_cast<const BlockQ4_0*>(p), n / 32, out); return;
    case GgmlType::Q4_1: deq_q4_1(reinterpret_cast<const BlockQ4_1*>(p), n / 32, out); return;
    case GgmlType::Q5_0: deq_q5_0(reinterpret_cast<const BlockQ5_0*>(p), n / 32, out); return;
    case GgmlType::Q5_1: deq_q5_1(reinterpret_cast<const BlockQ5_1*>(p), n / 32, out); return;
    case GgmlType::Q8_0: deq_q8_0(reinterpret_cast<const BlockQ8_0*>(p), n / 32, out); return;
    case GgmlType::Q4_K: deq_q4_k(reinterpret_cast<const BlockQ4_K*>(p), n / 256, out); return;
    case GgmlType::Q5_K: deq_q5_k(reinterpret_cast<const BlockQ5_K*>(p), n / 256, out); return;
    case GgmlType::Q6_K: deq_q6_k(reinterpret_cast<const BlockQ6_K*>(p), n / 256, out); return;
    default: PAGODA_CHECK_MSG(false, "dequantize_row: unsupported type %u", static_cast<unsigned>(type));
  }
}

namespace detail {

void quantize_row_q8_0(const float* x, int64_t n, uint8_t* out) {
  auto* blocks = reinterpret_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / 32; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[32 * i + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(std::roundf(x[32 * i + j] * id));
    std::memcpy(&blocks[i], &b, sizeof b);
  }
}

void kv_encode_row(KvDtype dtype, const float* x, int64_t n, uint8_t* out) {
  switch (dtype) {
    case KvDtype::F32: std::memcpy(out, x, static_cast<size_t>(n) * 4); return;
    case KvDtype::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case KvDtype::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case KvDtype::Q8_0: quantize_row_q8_0(x, n, out); return;
  }
}

}  // namespace detail

void kv_read_row(KvDtype dtype, const uint8_t* row, int64_t n, float* out) {
  switch (dtype) {
    case KvDtype::F32: dequantize_row(GgmlType::F32, row, n, out); return;
    case KvDtype::F16: dequantize_row(GgmlType::F16, row, n, out); return;
    case KvDtype::BF16: dequantize_row(GgmlType::BF16, row, n, out); return;
    case KvDtype::Q8_0: dequantize_row(GgmlType::Q8_0, row, n, out); return;
  }
}

}  // namespace pagoda::kernels
