// Scalar codecs of the ggml block formats (layouts in base/ggml_types.h): the
// one dequantizer every module uses (embedding rows, the reference matmul, the
// cpu matmul's tail columns, KV reads, tensor dumps) and the reference
// quantizers (synthetic GGUF files, the q8_0 KV cache). Written after
// ggml-quants.c; the file is compiled without FP contraction, so results do not
// depend on the compiler fusing a*b+c.
#pragma once
#include <cstdint>

#include "base/ggml_types.h"

namespace pagoda {

// True for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS.
bool dequantize_supported(GgmlType type);

// src holds ggml_row_bytes(type, n) bytes; dst receives n floats, computed as
// ggml's dequantize_row_* does. Returns false (writing nothing) for an
// unsupported type, a negative n or n not a multiple of the type's block size.
bool dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// True for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_NL, IQ4_XS.
bool quantize_supported(GgmlType type);

// dst has room for ggml_row_bytes(type, n) bytes. F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1 and IQ4_NL reproduce ggml's quantize_row_*_ref byte for byte (Q5_1: ggml
// does not cap its levels at 31, which only a rounding overshoot could reach;
// IQ4_NL: its _ref path, ntry -1, one least-squares scale); Q2_K, Q3_K, Q4_K, Q6_K
// and IQ4_XS are simple (one pass, no iterative scale search) but produce
// valid blocks.
// Returns false (writing nothing) for an unsupported type or a bad n.
bool quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace pagoda
