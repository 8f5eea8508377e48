// The ops both backends share (api.h, "Ops both backends share"): KV row
// encoding and decoding, embedding lookup, row gathers, exact adds and the
// Walsh-Hadamard rotation of the K/V rows below 8 bits.
// Scalar code: each is memory-bound or exact, so one version serves ref and cpu.
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "base/ggml_quant.h"
#include "kernels/api.h"

namespace pagoda::kernels {

float gelu_of_f16(uint16_t h) {
  // ggml_gelu_f32 in float, with the one fused multiply-add GCC makes of it at
  // -march=native: every f16 value in (-10, 10) gives ggml_table_gelu_f16's bits
  // (checked against libggml-cpu's table, all 37,376 of them; in double, 269
  // differ by one f16 step, all where 1 + tanh cancels).
  const float x = fp16_to_fp32(h);
  const float g = 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * std::fma(0.044715f * x, x, 1.0f)));
  return fp16_to_fp32(fp32_to_fp16(g));
}

bool matmul_supports(GgmlType type) {
  // Every type the scalar dequantizer reads: ref multiplies dequantized rows and
  // cpu falls back to them for anything without a packed kernel.
  return dequantize_supported(type);
}

namespace {

// The ggml format of one KV row of each dtype: rows are encoded and decoded by
// the one scalar codec (base/ggml_quant.h); the quantized types as ggml's
// quantize_row_*_ref (e.g. q8_0: per 32 values d = amax / 127 stored as f16,
// q = roundf(x / d)) and dequantize_row_* (n % 32 == 0).
GgmlType kv_row_type(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::F32: return GgmlType::F32;
    case KvDtype::F16: return GgmlType::F16;
    case KvDtype::BF16: return GgmlType::BF16;
    case KvDtype::Q8_0: return GgmlType::Q8_0;
    case KvDtype::Q4_0: return GgmlType::Q4_0;
    case KvDtype::Q4_1: return GgmlType::Q4_1;
    case KvDtype::IQ4_NL: return GgmlType::IQ4_NL;
    case KvDtype::Q5_0: return GgmlType::Q5_0;
    case KvDtype::Q5_1: return GgmlType::Q5_1;
  }
  PAGODA_CHECK_MSG(false, "KV dtype %u", static_cast<unsigned>(dtype));
  return GgmlType::F32;
}

// f32 -> one KV row in dtype. out: kv_row_bytes(dtype, n) bytes
void kv_encode_row(KvDtype dtype, const float* x, int64_t n, uint8_t* out) {
  PAGODA_CHECK(quantize_row(kv_row_type(dtype), x, out, n));
}

}  // namespace

void kv_read_row(KvDtype dtype, const uint8_t* row, int64_t n, float* out) {
  PAGODA_CHECK(dequantize_row(kv_row_type(dtype), row, out, n));
}

void kv_write(const KvLayerView& kv, const float* k, const float* v, const int64_t* slot_mapping,
              int64_t n_tokens) {
  const int64_t n = static_cast<int64_t>(kv.n_kv_heads) * kv.head_dim;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;  // padding token: nothing to store
    kv_encode_row(kv.dtype, k + t * n, n, kv.k + slot * kv.row_bytes);
    kv_encode_row(kv.v_dtype, v + t * n, n, kv.v + slot * kv.v_row_bytes);
  }
}

void get_rows(const WeightView& table, const int32_t* ids, int64_t n_ids, float* out) {
  const auto* base = static_cast<const uint8_t*>(table.data);
  for (int64_t i = 0; i < n_ids; ++i) {
    PAGODA_CHECK(dequantize_row(table.type, base + static_cast<size_t>(ids[i]) * table.row_bytes,
                                out + i * table.cols, table.cols));
  }
}

void gather_rows(const float* x, int64_t n, const int32_t* rows, int64_t n_rows, float* out) {
  for (int64_t i = 0; i < n_rows; ++i) std::memcpy(out + i * n, x + rows[i] * n, sizeof(float) * static_cast<size_t>(n));
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void add_rows(float* x, const float* bias, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r) add_inplace(x + r * n, bias, n);
}

void mul_scalar(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
  // ggml_sigmoid's formula, then ggml_mul (qwen35's attention output gate).
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void hadamard_rotate(float* x, int64_t n, int32_t block) {
  PAGODA_CHECK(block >= 1 && (block & (block - 1)) == 0 && n % block == 0);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  for (float* b = x; b < x + n; b += block) {
    // Butterflies of span h = 1, 2, 4, ...: (a, c) -> (a + c, a - c); the result is
    // sum_j (-1)^popcount(i & j) x_j (Sylvester order).
    for (int32_t h = 1; h < block; h *= 2) {
      for (int32_t i = 0; i < block; i += 2 * h) {
        for (int32_t j = i; j < i + h; ++j) {
          const float a = b[j], c = b[j + h];
          b[j] = a + c;
          b[j + h] = a - c;
        }
      }
    }
    for (int32_t i = 0; i < block; ++i) b[i] *= scale;
  }
}

}  // namespace pagoda::kernels
