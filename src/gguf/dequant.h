// Whole-tensor dequantization over the one scalar dequantizer (base/ggml_quant.h).
#pragma once
#include <cstdint>

#include "base/ggml_quant.h"
#include "base/status.h"
#include "gguf/gguf.h"

namespace pagoda::gguf {

// Rows [row_begin, row_begin + n_rows) of a tensor viewed as
// [dims[1]*dims[2]*dims[3] rows, dims[0] columns]; dst gets n_rows * dims[0] floats.
Status dequantize_rows(const TensorInfo& t, int64_t row_begin, int64_t n_rows, float* dst);

// Rows of a tensor = n_elements / dims[0] (0 for an empty tensor).
int64_t tensor_rows(const TensorInfo& t);

}  // namespace pagoda::gguf
