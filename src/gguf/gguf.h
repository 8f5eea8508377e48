// GGUF v2/v3 reader over mmap. Every count, length, offset and size read from the
// file is checked (base/checked_math.h) against the bytes left; a malformed file
// yields an Error naming the field and the numbers, never a crash or a huge
// allocation. Thread-safety: a GgufFile is immutable after open(); share freely.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/ggml_types.h"
#include "base/status.h"

namespace pagoda::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// A metadata value. Arrays may nest (ARRAY of ARRAY).
struct Value {
  ValueType type = ValueType::UINT8;
  // Scalars: integers widened into i64/u64, floats into f64, bool into u64.
  int64_t i64 = 0;
  uint64_t u64 = 0;
  double f64 = 0;
  std::string str;
  ValueType elem_type = ValueType::UINT8;  // for ARRAY
  std::vector<Value> arr;                  // for ARRAY

  bool is_int() const;           // any integer type or bool
  int64_t as_int() const;        // valid if is_int()
  double as_float() const;       // ints or floats
  bool is_float() const;         // FLOAT32 or FLOAT64
  bool is_number() const { return is_int() || is_float(); }

  // Stores an integer of any GGUF width: i64 and u64 both hold it (each the
  // other's bits), so a value read as the other signedness keeps its bits.
  template <typename T>
  void set_integer(T v) {
    static_assert(std::is_integral_v<T>);
    if constexpr (std::is_signed_v<T>) {
      i64 = v;
      u64 = static_cast<uint64_t>(i64);
    } else {
      u64 = v;
      i64 = static_cast<int64_t>(u64);
    }
  }
};

// "uint32", "string", "array", ...; "?" for an unknown id.
const char* value_type_name(ValueType t);
// True for the 13 type ids GGUF defines.
bool value_type_valid(uint32_t id);

// Value builders (used by the writer and tests).
Value make_u8(uint8_t v);
Value make_i8(int8_t v);
Value make_u16(uint16_t v);
Value make_i16(int16_t v);
Value make_u32(uint32_t v);
Value make_i32(int32_t v);
Value make_u64(uint64_t v);
Value make_i64(int64_t v);
Value make_f32(float v);
Value make_f64(double v);
Value make_bool(bool v);
Value make_string(std::string v);
// Every element must have type elem_type (checked by the writer).
Value make_array(ValueType elem_type, std::vector<Value> elems);
Value make_string_array(const std::vector<std::string>& v);
Value make_f32_array(const std::vector<float>& v);
Value make_i32_array(const std::vector<int32_t>& v);

// Short human-readable rendering; arrays show at most max_items elements.
std::string format_value(const Value& v, size_t max_items = 8);

// Parser limits (a file beyond them is rejected with an error naming the limit).
constexpr int kMaxArrayDepth = 4;                          // ARRAY of ARRAY of ... levels
constexpr uint64_t kMaxMetadataArrayElements = 1ull << 24; // summed over the whole file
constexpr uint32_t kMaxDims = 4;

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;    // ggml order: dims[0] is the contiguous (row) length
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;           // relative to data section start
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr; // points into the mapping
};

class GgufFile {
 public:
  // Open and validate. Never aborts on bad input.
  static Expected<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parse from memory (the buffer must outlive the GgufFile). Used by tests and fuzzers.
  static Expected<std::unique_ptr<GgufFile>> from_memory(const uint8_t* data, size_t size);
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }
  const std::string& path() const { return path_; }
  // True when opened from a file (a read-only private mmap), false for from_memory.
  bool mapped() const { return mapped_; }

  const std::map<std::string, Value>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  // Typed getters: error if missing or of the wrong type.
  Expected<std::string> get_string(const std::string& key) const;
  Expected<int64_t> get_int(const std::string& key) const;
  Expected<double> get_float(const std::string& key) const;
  // With default when missing (error only on wrong type is folded into default).
  int64_t get_int_or(const std::string& key, int64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;
  // Arrays (error if missing, not an array, or an element of the wrong type).
  Expected<std::vector<std::string>> get_string_array(const std::string& key) const;
  Expected<std::vector<int64_t>> get_int_array(const std::string& key) const;
  Expected<std::vector<float>> get_float_array(const std::string& key) const;
  // general.architecture, or "" when missing.
  std::string architecture() const { return get_string_or("general.architecture", ""); }
  // Bytes from data_offset() to the end of the file (0 if the file ends earlier).
  uint64_t data_size() const { return data_size_; }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t data_size_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace pagoda::gguf
