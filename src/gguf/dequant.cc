#include "gguf/dequant.h"

#include <cinttypes>

namespace pagoda::gguf {

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
  const int64_t cols = static_cast<int64_t>(t.dims[0]);
  if (cols % ggml_type_info(t.type).block_size != 0)
    return errorf("tensor %s: row length %" PRId64 " is not a multiple of the %s block size", t.name.c_str(), cols,
                  ggml_type_info(t.type).name);
  if (n_rows == 0) return Status::Ok();
  const size_t row_bytes = ggml_row_bytes(t.type, static_cast<size_t>(cols));
  for (int64_t r = 0; r < n_rows; ++r) {
    dequantize_row(t.type, t.data + static_cast<size_t>(row_begin + r) * row_bytes, dst + r * cols, cols);
  }
  return Status::Ok();
}

}  // namespace pagoda::gguf
