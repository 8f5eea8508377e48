// GGUF v3 writer. Produces files llama.cpp loads: metadata in insertion order,
// tensor infos, zero padding to the alignment, then each tensor's bytes at an
// aligned offset equal to the running padded size (llama.cpp checks this).
// Tensor bytes may be streamed from a producer so a multi-GB model never sits
// in memory. Not thread-safe.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/ggml_types.h"
#include "base/status.h"
#include "gguf/gguf.h"

namespace pagoda::gguf {

// Receives a tensor's bytes in order, in chunks of any size.
using ByteSink = std::function<Status(const void* data, size_t n)>;
// Writes exactly the tensor's n_bytes into the sink.
using TensorProducer = std::function<Status(const ByteSink& sink)>;

class GgufWriter {
 public:
  GgufWriter() = default;

  // ---- metadata (insertion order kept; setting a key again replaces its value)
  void set(const std::string& key, Value v);
  void set_u8(const std::string& key, uint8_t v) { set(key, make_u8(v)); }
  void set_i8(const std::string& key, int8_t v) { set(key, make_i8(v)); }
  void set_u16(const std::string& key, uint16_t v) { set(key, make_u16(v)); }
  void set_i16(const std::string& key, int16_t v) { set(key, make_i16(v)); }
  void set_u32(const std::string& key, uint32_t v) { set(key, make_u32(v)); }
  void set_i32(const std::string& key, int32_t v) { set(key, make_i32(v)); }
  void set_u64(const std::string& key, uint64_t v) { set(key, make_u64(v)); }
  void set_i64(const std::string& key, int64_t v) { set(key, make_i64(v)); }
  void set_f32(const std::string& key, float v) { set(key, make_f32(v)); }
  void set_f64(const std::string& key, double v) { set(key, make_f64(v)); }
  void set_bool(const std::string& key, bool v) { set(key, make_bool(v)); }
  void set_string(const std::string& key, std::string v) { set(key, make_string(std::move(v))); }
  void set_string_array(const std::string& key, const std::vector<std::string>& v) { set(key, make_string_array(v)); }
  void set_f32_array(const std::string& key, const std::vector<float>& v) { set(key, make_f32_array(v)); }
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v) { set(key, make_i32_array(v)); }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }

  // ---- tensors, written in the order added.
  // dims in ggml order (dims[0] = row length, a multiple of the type's block
  // size), 1..4 of them. Errors: bad dims/type, duplicate name, size mismatch.
  // Copies the bytes (explicit owner; fine for tests and small models).
  Status add_tensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type, const void* data,
                    size_t n_bytes);
  // The producer is called during write_*() and must emit exactly the tensor's bytes.
  Status add_tensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type,
                    TensorProducer producer);
  size_t n_tensors() const { return tensors_.size(); }

  // general.alignment if set (uint32 power of two), else 32.
  uint64_t alignment() const;

  // Writes to path + ".tmp" then renames, so a failed write leaves no partial file.
  Status write_file(const std::string& path) const;
  Expected<std::vector<uint8_t>> write_to_memory() const;
  // Writes everything into a sink (the two above use it).
  Status write(const ByteSink& sink) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    GgmlType type;
    uint64_t n_bytes;
    std::vector<uint8_t> owned;  // when added by bytes
    TensorProducer producer;     // when streamed
  };
  Status check_tensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type,
                      uint64_t* n_bytes) const;

  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<Tensor> tensors_;
};

// Bytes of a tensor of these dims and type (0 if invalid: check with the writer).
uint64_t tensor_bytes(const std::vector<uint64_t>& dims, GgmlType type);

}  // namespace pagoda::gguf
