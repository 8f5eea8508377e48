// GGUF v2/v3 reader. Layout (little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key, u32 value type, value)
//   n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset)
//   zero padding to general.alignment (default 32) | data section
// A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "base/checked_math.h"
#include "gguf/cursor.h"

namespace pagoda::gguf {

namespace {

constexpr uint64_t kDefaultAlignment = 32;

// Memory the parsed metadata may hold in Value objects (sizeof(Value) each, about
// 100 bytes, whatever the element's size in the file). A u8 array costs 1 file byte
// per element but a whole Value in memory, so bounding the element count alone let a
// 16 MB file allocate 1.6 GB. Real models need far less: a 256k vocabulary's tokens,
// scores and types plus 300k merges are about 1.1M Values (~110 MiB).
constexpr uint64_t kMaxMetadataValueBytes = uint64_t{192} << 20;

// Smallest number of bytes one value of type t occupies in the file.
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;   // u64 length
    case ValueType::ARRAY: return 12;   // u32 type + u64 count
  }
  return 1;
}

Error prefixed(const char* prefix_fmt, const std::string& a, const Error& e) {
  Error r = errorf(prefix_fmt, a.c_str());
  r.message += e.message;
  return r;
}

class Parser {
 public:
  Parser(const uint8_t* base, uint64_t size) : c_(base, size) {}
  Cursor& cursor() { return c_; }

  Status read_value_type(ValueType* out, const char* field) {
    const uint64_t at = c_.pos();
    uint32_t id = 0;
    PAGODA_TRY(c_.read(&id, field));
    if (!value_type_valid(id))
      return errorf("%s %u at offset %" PRIu64 " is not a GGUF value type (0..12)", field, id, at);
    *out = static_cast<ValueType>(id);
    return Status::Ok();
  }

  // One value of type t; depth counts enclosing arrays.
  Status read_value(ValueType t, Value* out, int depth) {
    out->type = t;
    switch (t) {
      case ValueType::UINT8: return read_int<uint8_t>(out);
      case ValueType::UINT16: return read_int<uint16_t>(out);
      case ValueType::UINT32: return read_int<uint32_t>(out);
      case ValueType::UINT64: return read_int<uint64_t>(out);
      case ValueType::INT8: return read_int<int8_t>(out);
      case ValueType::INT16: return read_int<int16_t>(out);
      case ValueType::INT32: return read_int<int32_t>(out);
      case ValueType::INT64: return read_int<int64_t>(out);
      case ValueType::BOOL: {
        uint8_t b = 0;
        PAGODA_TRY(c_.read(&b, "bool value"));
        out->u64 = b != 0;
        out->i64 = b != 0;
        return Status::Ok();
      }
      case ValueType::FLOAT32: {
        float f = 0;
        PAGODA_TRY(c_.read(&f, "float32 value"));
        out->f64 = f;
        return Status::Ok();
      }
      case ValueType::FLOAT64: return c_.read(&out->f64, "float64 value");
      case ValueType::STRING: return c_.read_string(&out->str, "string value");
      case ValueType::ARRAY: return read_array(out, depth);
    }
    return errorf("value type %u is not a GGUF value type", static_cast<uint32_t>(t));
  }

 private:
  template <typename T>
  Status read_int(Value* out) {
    T v{};
    PAGODA_TRY(c_.read(&v, value_type_name(out->type)));
    out->set_integer(v);
    return Status::Ok();
  }

  Status read_array(Value* out, int depth) {
    if (depth + 1 > kMaxArrayDepth)
      return errorf("array nesting depth %d exceeds the limit of %d", depth + 1, kMaxArrayDepth);
    PAGODA_TRY(read_value_type(&out->elem_type, "array element type"));
    uint64_t n = 0;
    // Checked against the bytes left before anything is reserved.
    PAGODA_TRY(c_.read_count(&n, min_value_bytes(out->elem_type), "array length"));
    uint64_t total = 0;
    if (!checked_add(array_elements_, n, &total) || total > kMaxMetadataArrayElements)
      return errorf("array length %" PRIu64 " brings the metadata to more than %" PRIu64
                    " array elements (the parser's limit)", n, kMaxMetadataArrayElements);
    array_elements_ = total;
    // Charged at their in-memory size before anything is allocated.
    uint64_t bytes = 0;
    if (!checked_mul(n, uint64_t{sizeof(Value)}, &bytes) || !checked_add(value_bytes_, bytes, &value_bytes_) ||
        value_bytes_ > kMaxMetadataValueBytes)
      return errorf("array length %" PRIu64 " brings the parsed metadata to more than %" PRIu64
                    " MiB of values (%zu bytes each in memory; the parser's limit)",
                    n, kMaxMetadataValueBytes >> 20, sizeof(Value));
    out->arr.resize(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) {
      Status st = read_value(out->elem_type, &out->arr[i], depth + 1);
      if (!st.ok()) return errorf("array element %" PRIu64 " of %" PRIu64 ": %s", i, n, st.message().c_str());
    }
    return Status::Ok();
  }

  Cursor c_;
  uint64_t array_elements_ = 0;
  uint64_t value_bytes_ = 0;  // sizeof(Value) x array elements so far
};

}  // namespace

Expected<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errorf("cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return errorf("cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return errorf("'%s' is not a regular file", path.c_str());
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 24) {
    ::close(fd);
    return errorf("'%s': file is %zu bytes, too small for a GGUF header (24 bytes)", path.c_str(), size);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return errorf("cannot mmap '%s' (%zu bytes): %s", path.c_str(), size, std::strerror(e));

  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  Status s = f->parse();
  if (!s.ok()) return errorf("%s: %s", path.c_str(), s.message().c_str());
  return f;
}

Expected<std::unique_ptr<GgufFile>> GgufFile::from_memory(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = "<memory>";
  f->base_ = data;
  f->size_ = data ? size : 0;
  Status s = f->parse();
  if (!s.ok()) return s.error();
  return f;
}

GgufFile::~GgufFile() {
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

Status GgufFile::parse() {
  Parser p(base_, size_);
  Cursor& c = p.cursor();

  // ---- header
  if (size_ < 4) return errorf("file is %zu bytes, too small for the GGUF magic", size_);
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    return errorf("bad magic %02x %02x %02x %02x (expected \"GGUF\" = 47 47 55 46): not a GGUF file", base_[0],
                  base_[1], base_[2], base_[3]);
  }
  uint32_t magic = 0;
  PAGODA_TRY(c.read(&magic, "magic"));
  PAGODA_TRY(c.read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1) return make_error("GGUF version 1 is not supported (only versions 2 and 3)");
    if ((version_ & 0xffff) == 0 && (version_ >> 16) != 0)
      return errorf("GGUF version %u is not supported: this looks like a big-endian file (only little-endian "
                    "versions 2 and 3 are supported)", version_);
    return errorf("GGUF version %u is not supported (only versions 2 and 3)", version_);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  // A tensor info is at least 8 (name) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes;
  // a metadata pair at least 8 (key) + 4 (type) + 1 (value).
  PAGODA_TRY(c.read(&n_tensors, "tensor count"));
  PAGODA_TRY(c.read(&n_kv, "metadata count"));
  {
    uint64_t need = 0, kv_need = 0;
    if (!checked_mul(n_tensors, 32, &need) || !checked_mul(n_kv, 13, &kv_need) ||
        !checked_add(need, kv_need, &need) || need > c.left()) {
      return errorf("tensor count %" PRIu64 " and metadata count %" PRIu64
                    " need at least 32 and 13 bytes each but only %" PRIu64 " bytes follow the header",
                    n_tensors, n_kv, c.left());
    }
  }

  // ---- metadata
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    Status st = c.read_string(&key, "metadata key");
    if (!st.ok()) return errorf("metadata pair %" PRIu64 " of %" PRIu64 ": %s", i, n_kv, st.message().c_str());
    if (kv_.count(key)) return errorf("metadata key '%s' appears twice (pair %" PRIu64 ")", key.c_str(), i);
    Value v;
    ValueType t{};
    st = p.read_value_type(&t, "value type");
    if (st.ok()) st = p.read_value(t, &v, 0);
    if (!st.ok()) return prefixed("metadata key '%s': ", key, st.error());
    kv_.emplace(std::move(key), std::move(v));
  }

  // ---- alignment
  alignment_ = kDefaultAlignment;
  if (const Value* a = find("general.alignment")) {
    if (!a->is_int() || a->type == ValueType::BOOL)
      return errorf("general.alignment has type %s, expected uint32", value_type_name(a->type));
    const int64_t v = a->as_int();
    if (v <= 0 || v > (int64_t{1} << 30) || (v & (v - 1)) != 0)
      return errorf("general.alignment %" PRId64 " is not a power of two in 1..2^30", v);
    alignment_ = static_cast<uint64_t>(v);
  }

  // ---- tensor infos
  tensors_.resize(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo& t = tensors_[i];
    Status st = c.read_string(&t.name, "tensor name");
    if (!st.ok()) return errorf("tensor info %" PRIu64 " of %" PRIu64 ": %s", i, n_tensors, st.message().c_str());
    const std::string& name = t.name;
    if (tensor_index_.count(name)) return errorf("tensor '%s' appears twice (info %" PRIu64 ")", name.c_str(), i);
    tensor_index_.emplace(name, static_cast<size_t>(i));

    uint32_t n_dims = 0;
    st = c.read(&n_dims, "n_dims");
    if (!st.ok()) return prefixed("tensor '%s': ", name, st.error());
    if (n_dims < 1 || n_dims > kMaxDims)
      return errorf("tensor '%s': n_dims %u is out of range 1..%u", name.c_str(), n_dims, kMaxDims);
    t.dims.resize(n_dims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      st = c.read(&t.dims[d], "dimension");
      if (!st.ok()) return prefixed("tensor '%s': ", name, st.error());
      if (t.dims[d] > static_cast<uint64_t>(INT64_MAX))
        return errorf("tensor '%s': dimension %u = %" PRIu64 " exceeds 2^63-1", name.c_str(), d, t.dims[d]);
      if (!checked_mul(n_elements, t.dims[d], &n_elements) || n_elements > static_cast<uint64_t>(INT64_MAX))
        return errorf("tensor '%s': element count overflows at dimension %u (= %" PRIu64 ")", name.c_str(), d,
                      t.dims[d]);
    }
    uint32_t type_id = 0;
    st = c.read(&type_id, "tensor type");
    if (!st.ok()) return prefixed("tensor '%s': ", name, st.error());
    const GgmlTypeInfo* ti = ggml_type_info(type_id);
    if (!ti) return errorf("tensor '%s': unknown ggml type id %u", name.c_str(), type_id);
    if (!ti->supported)
      return errorf("tensor '%s': ggml type %s (id %u) is not supported", name.c_str(), ti->name, type_id);
    t.type = static_cast<GgmlType>(type_id);
    if (t.dims[0] % ti->block_size != 0)
      return errorf("tensor '%s': row length %" PRIu64 " is not a multiple of the %s block size %u", name.c_str(),
                    t.dims[0], ti->name, ti->block_size);
    uint64_t n_bytes = t.dims[0] / ti->block_size * ti->type_size;  // one row; cannot overflow
    for (uint32_t d = 1; d < n_dims; ++d) {
      if (!checked_mul(n_bytes, t.dims[d], &n_bytes))
        return errorf("tensor '%s': byte size overflows at dimension %u (= %" PRIu64 ")", name.c_str(), d,
                      t.dims[d]);
    }
    t.n_elements = n_elements;
    t.n_bytes = n_bytes;
    st = c.read(&t.offset, "tensor data offset");
    if (!st.ok()) return prefixed("tensor '%s': ", name, st.error());
    if (t.offset % alignment_ != 0)
      return errorf("tensor '%s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, name.c_str(),
                    t.offset, alignment_);
  }

  // ---- data section
  if (!checked_add(c.pos(), alignment_ - 1, &data_offset_))
    return make_error("data section offset overflows");
  data_offset_ = data_offset_ / alignment_ * alignment_;
  data_size_ = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (TensorInfo& t : tensors_) {
    if (!fits_within(t.offset, t.n_bytes, data_size_))
      return errorf("tensor %s: offset %" PRIu64 " + size %" PRIu64 " runs past end of data (%" PRIu64 " bytes)",
                    t.name.c_str(), t.offset, t.n_bytes, data_size_);
    t.data = base_ + data_offset_ + t.offset;
  }
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->n_bytes < b->n_bytes;
  });
  // Sorted by offset, a tensor overlaps an earlier one iff it starts before the
  // furthest end seen so far.
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* b : by_offset) {
    if (b->n_bytes == 0) continue;
    if (furthest && furthest->offset + furthest->n_bytes > b->offset) {
      return errorf("tensor %s (offset %" PRIu64 ", size %" PRIu64 ") overlaps tensor %s (offset %" PRIu64 ")",
                    furthest->name.c_str(), furthest->offset, furthest->n_bytes, b->name.c_str(), b->offset);
    }
    if (!furthest || b->offset + b->n_bytes > furthest->offset + furthest->n_bytes) furthest = b;
  }
  return Status::Ok();
}

const Value* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
bool type_is_int(ValueType t) {
  Value v;
  v.type = t;
  return v.is_int();
}
bool type_is_number(ValueType t) {
  Value v;
  v.type = t;
  return v.is_number();
}
Error missing(const std::string& key) { return errorf("metadata key '%s' is missing", key.c_str()); }
Error wrong_type(const std::string& key, const Value& v, const char* want) {
  return errorf("metadata key '%s' has type %s, expected %s", key.c_str(), value_type_name(v.type), want);
}
}  // namespace

Expected<std::string> GgufFile::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (v->type != ValueType::STRING) return wrong_type(key, *v, "string");
  return v->str;
}

Expected<int64_t> GgufFile::get_int(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_int()) return wrong_type(key, *v, "an integer");
  return v->as_int();
}

Expected<double> GgufFile::get_float(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_number()) return wrong_type(key, *v, "a number");
  return v->as_float();
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t def) const {
  const Value* v = find(key);
  return v && v->is_int() ? v->as_int() : def;
}

double GgufFile::get_float_or(const std::string& key, double def) const {
  const Value* v = find(key);
  return v && v->is_number() ? v->as_float() : def;
}

std::string GgufFile::get_string_or(const std::string& key, const std::string& def) const {
  const Value* v = find(key);
  return v && v->type == ValueType::STRING ? v->str : def;
}

Expected<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING) return wrong_type(key, *v, "array of string");
  std::vector<std::string> out;
  out.reserve(v->arr.size());
  for (const Value& e : v->arr) out.push_back(e.str);
  return out;
}

Expected<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (v->type != ValueType::ARRAY || !type_is_int(v->elem_type)) return wrong_type(key, *v, "array of integer");
  std::vector<int64_t> out;
  out.reserve(v->arr.size());
  for (const Value& e : v->arr) out.push_back(e.as_int());
  return out;
}

Expected<std::vector<float>> GgufFile::get_float_array(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (v->type != ValueType::ARRAY || !type_is_number(v->elem_type))
    return wrong_type(key, *v, "array of number");
  std::vector<float> out;
  out.reserve(v->arr.size());
  for (const Value& e : v->arr) out.push_back(static_cast<float>(e.as_float()));
  return out;
}

}  // namespace pagoda::gguf
