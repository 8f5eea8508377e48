// Scalar dequantizers, one per ggml block layout (see base/ggml_types.h). The
// arithmetic and its order follow ggml's dequantize_row_* so results match bit
// for bit (no FMA contraction is relied upon).
#include "gguf/dequant.h"

#include <cinttypes>
#include <cstring>

#include "base/fp16.h"

namespace pagoda::gguf {

namespace {

void dequant_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * kQK4_0 + j] = x0 * d;
      y[i * kQK4_0 + j + kQK4_0 / 2] = x1 * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float m = fp16_to_fp32(x[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[i * kQK4_1 + j] = x0 * d + m;
      y[i * kQK4_1 + j + kQK4_1 / 2] = x1 * d + m;
    }
  }
}

// qh bit j is the fifth bit of element j (elements 0..31 of the block).
void dequant_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
      const int32_t x0 = ((x[i].qs[j] & 0x0F) | xh0) - 16;
      const int32_t x1 = ((x[i].qs[j] >> 4) | xh1) - 16;
      y[i * kQK5_0 + j] = x0 * d;
      y[i * kQK5_0 + j + kQK5_0 / 2] = x1 * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float m = fp16_to_fp32(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
      const int x0 = (x[i].qs[j] & 0x0F) | xh0;
      const int x1 = (x[i].qs[j] >> 4) | xh1;
      y[i * kQK5_1 + j] = x0 * d + m;
      y[i * kQK5_1 + j + kQK5_1 / 2] = x1 * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = x[i].qs[j] * d;
  }
}

// 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed into 12 bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

void dequant_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = fp16_to_fp32(x[i].d);
    const float min = fp16_to_fp32(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < kQK_K; j += 64) {
      scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    const float d = fp16_to_fp32(x[i].d);
    const float min = fp16_to_fp32(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQK_K; j += 64) {
      scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

bool dequantize_supported(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0: case GgmlType::Q4_1:
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  if (!dequantize_supported(type) || n < 0) return false;
  const int64_t bs = ggml_type_info(type).block_size;
  if (n % bs != 0) return false;
  const int64_t nb = n / bs;
  switch (type) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return true;
    case GgmlType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return true;
    }
    case GgmlType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return true;
    }
    case GgmlType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb); return true;
    case GgmlType::Q4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb); return true;
    case GgmlType::Q5_0: dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb); return true;
    case GgmlType::Q5_1: dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb); return true;
    case GgmlType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb); return true;
    case GgmlType::Q4_K: dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb); return true;
    case GgmlType::Q5_K: dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb); return true;
    case GgmlType::Q6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb); return true;
    default: return false;
  }
}

int64_t tensor_rows(const TensorInfo& t) {
  if (t.dims.empty() || t.dims[0] == 0) return 0;
  return static_cast<int64_t>(t.n_elements / t.dims[0]);
}

Status dequantize_rows(const TensorInfo& t, int64_t row_begin, int64_t n_rows, float* dst) {
  const int64_t rows = tensor_rows(t);
  if (row_begin < 0 || n_rows < 0 || row_begin > rows || n_rows > rows - row_begin)
    return errorf("tensor %s: rows [%" PRId64 ", %" PRId64 ") out of range (%" PRId64 " rows)", t.name.c_str(),
                  row_begin, row_begin + n_rows, rows);
  if (!dequantize_supported(t.type))
    return errorf("tensor %s: cannot dequantize type %s", t.name.c_str(), ggml_type_info(t.type).name);
  if (n_rows == 0) return Status::Ok();
  const int64_t cols = static_cast<int64_t>(t.dims[0]);
  const size_t row_bytes = ggml_row_bytes(t.type, static_cast<size_t>(cols));
  for (int64_t r = 0; r < n_rows; ++r) {
    dequantize_row(t.type, t.data + static_cast<size_t>(row_begin + r) * row_bytes, dst + r * cols, cols);
  }
  return Status::Ok();
}

}  // namespace pagoda::gguf
