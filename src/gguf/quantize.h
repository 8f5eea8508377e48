// Reference quantizers from f32 into ggml block formats. F16, BF16, Q8_0, Q4_0
// and Q4_1 reproduce ggml's quantize_row_*_ref byte for byte; Q4_K and Q6_K
// are simple (one pass, no iterative scale search) but produce valid blocks.
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/ggml_types.h"

namespace pagoda::gguf {

// True for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.
bool quantize_supported(GgmlType type);

// Precondition: n is a multiple of the type's block size; dst has room for
// ggml_row_bytes(type, n) bytes. Returns false (writing nothing) for an
// unsupported type or a bad n.
bool quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace pagoda::gguf
