// libFuzzer target: the GGUF reader on arbitrary bytes. Any input must either
// be rejected with an error or yield tensors whose bytes all lie inside the
// buffer (ASan checks every read below), and metadata that can be walked.
#include <cstddef>
#include <cstdint>

#include "gguf/dequant.h"
#include "gguf/gguf.h"

namespace {

size_t walk(const pagoda::gguf::Value& v) {
  size_t n = v.str.size() + 1;
  for (const auto& e : v.arr) n += walk(e);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = pagoda::gguf::GgufFile::from_memory(data, size);
  if (!f.ok()) return 0;
  const auto& g = **f;
  volatile size_t sink = 0;
  for (const auto& [k, v] : g.metadata()) sink = sink + k.size() + walk(v);
  (void)g.get_string_or("general.architecture", "");
  (void)g.get_string_array("tokenizer.ggml.tokens");
  for (const auto& t : g.tensors()) {
    uint8_t acc = 0;
    for (uint64_t i = 0; i < t.n_bytes; ++i) acc ^= t.data[i];
    sink = sink + acc;
    // Dequantize the first row of small tensors (exercises the block readers).
    if (!t.dims.empty() && t.dims[0] > 0 && t.dims[0] <= 4096 && t.n_elements > 0) {
      float row[4096];
      (void)pagoda::gguf::dequantize_rows(t, 0, 1, row);
    }
  }
  (void)sink;
  return 0;
}
