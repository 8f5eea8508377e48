// Scalar reference dequantization of ggml tensor rows (the oracle the fast
// kernels are tested against). Semantics follow ggml's dequantize_row_* exactly.
#pragma once
#include <cstdint>

#include "base/ggml_types.h"
#include "base/status.h"
#include "gguf/gguf.h"

namespace pagoda::gguf {

// True for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
bool dequantize_supported(GgmlType type);

// Precondition: n is a multiple of the type's block size and src holds
// ggml_row_bytes(type, n) bytes. dst receives n floats.
// Returns false (writing nothing) for an unsupported type or a bad n.
bool dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Rows [row_begin, row_begin + n_rows) of a tensor viewed as
// [dims[1]*dims[2]*dims[3] rows, dims[0] columns]; dst gets n_rows * dims[0] floats.
Status dequantize_rows(const TensorInfo& t, int64_t row_begin, int64_t n_rows, float* dst);

// Rows of a tensor = n_elements / dims[0] (0 for an empty tensor).
int64_t tensor_rows(const TensorInfo& t);

}  // namespace pagoda::gguf
