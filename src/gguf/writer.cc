#include "gguf/writer.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/checked_math.h"

namespace pagoda::gguf {

namespace {

constexpr uint64_t kDefaultAlignment = 32;

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

Status put_value(std::vector<uint8_t>& out, const Value& v, int depth) {
  switch (v.type) {
    case ValueType::UINT8: put<uint8_t>(out, static_cast<uint8_t>(v.u64)); break;
    case ValueType::INT8: put<int8_t>(out, static_cast<int8_t>(v.i64)); break;
    case ValueType::UINT16: put<uint16_t>(out, static_cast<uint16_t>(v.u64)); break;
    case ValueType::INT16: put<int16_t>(out, static_cast<int16_t>(v.i64)); break;
    case ValueType::UINT32: put<uint32_t>(out, static_cast<uint32_t>(v.u64)); break;
    case ValueType::INT32: put<int32_t>(out, static_cast<int32_t>(v.i64)); break;
    case ValueType::UINT64: put<uint64_t>(out, v.u64); break;
    case ValueType::INT64: put<int64_t>(out, v.i64); break;
    case ValueType::FLOAT32: put<float>(out, static_cast<float>(v.f64)); break;
    case ValueType::FLOAT64: put<double>(out, v.f64); break;
    case ValueType::BOOL: put<uint8_t>(out, v.u64 ? 1 : 0); break;
    case ValueType::STRING: put_string(out, v.str); break;
    case ValueType::ARRAY: {
      if (depth + 1 > kMaxArrayDepth) return errorf("array nesting deeper than %d", kMaxArrayDepth);
      if (!value_type_valid(static_cast<uint32_t>(v.elem_type)))
        return errorf("array element type %u is not a GGUF value type", static_cast<uint32_t>(v.elem_type));
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.arr.size());
      for (size_t i = 0; i < v.arr.size(); ++i) {
        if (v.arr[i].type != v.elem_type)
          return errorf("array of %s has element %zu of type %s", value_type_name(v.elem_type), i,
                        value_type_name(v.arr[i].type));
        PAGODA_TRY(put_value(out, v.arr[i], depth + 1));
      }
      break;
    }
    default:
      return errorf("value type %u is not a GGUF value type", static_cast<uint32_t>(v.type));
  }
  return Status::Ok();
}

}  // namespace

uint64_t tensor_bytes(const std::vector<uint64_t>& dims, GgmlType type) {
  const GgmlTypeInfo* ti = ggml_type_info(static_cast<uint32_t>(type));
  if (!ti || dims.empty() || dims[0] % ti->block_size != 0) return 0;
  uint64_t n = dims[0] / ti->block_size * ti->type_size;
  for (size_t d = 1; d < dims.size(); ++d)
    if (!checked_mul(n, dims[d], &n)) return 0;
  return n;
}

void GgufWriter::set(const std::string& key, Value v) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

uint64_t GgufWriter::alignment() const {
  for (const auto& kv : kv_)
    if (kv.first == "general.alignment" && kv.second.is_int() && kv.second.as_int() > 0)
      return static_cast<uint64_t>(kv.second.as_int());
  return kDefaultAlignment;
}

Status GgufWriter::check_tensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type,
                                uint64_t* n_bytes) const {
  if (dims.empty() || dims.size() > kMaxDims)
    return errorf("tensor %s: %zu dims, expected 1..%u", name.c_str(), dims.size(), kMaxDims);
  const GgmlTypeInfo* ti = ggml_type_info(static_cast<uint32_t>(type));
  if (!ti || !ti->supported) return errorf("tensor %s: unsupported type id %u", name.c_str(), static_cast<uint32_t>(type));
  if (dims[0] % ti->block_size != 0)
    return errorf("tensor %s: row length %" PRIu64 " is not a multiple of the %s block size %u", name.c_str(),
                  dims[0], ti->name, ti->block_size);
  uint64_t n_el = 1;
  for (uint64_t d : dims)
    if (!checked_mul(n_el, d, &n_el) || n_el > static_cast<uint64_t>(INT64_MAX))
      return errorf("tensor %s: element count overflows", name.c_str());
  for (const Tensor& t : tensors_)
    if (t.name == name) return errorf("tensor %s added twice", name.c_str());
  *n_bytes = tensor_bytes(dims, type);
  return Status::Ok();
}

Status GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type,
                              const void* data, size_t n_bytes) {
  uint64_t want = 0;
  PAGODA_TRY(check_tensor(name, dims, type, &want));
  if (want != n_bytes)
    return errorf("tensor %s: %zu bytes given, its dims and type need %" PRIu64, name.c_str(), n_bytes, want);
  Tensor t{name, dims, type, want, {}, {}};
  const auto* p = static_cast<const uint8_t*>(data);
  if (n_bytes) t.owned.assign(p, p + n_bytes);
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& dims, GgmlType type,
                              TensorProducer producer) {
  uint64_t want = 0;
  PAGODA_TRY(check_tensor(name, dims, type, &want));
  tensors_.push_back(Tensor{name, dims, type, want, {}, std::move(producer)});
  return Status::Ok();
}

Status GgufWriter::write(const ByteSink& sink) const {
  const uint64_t align = alignment();
  for (const auto& kv : kv_) {
    if (kv.first == "general.alignment" &&
        (kv.second.type != ValueType::UINT32 || kv.second.u64 == 0 || (kv.second.u64 & (kv.second.u64 - 1)) != 0))
      return make_error("general.alignment must be a uint32 power of two");
  }
  // ---- header, metadata, tensor infos
  std::vector<uint8_t> head;
  put_bytes(head, "GGUF", 4);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_.size());
  for (const auto& [key, v] : kv_) {
    put_string(head, key);
    put<uint32_t>(head, static_cast<uint32_t>(v.type));
    Status st = put_value(head, v, 0);
    if (!st.ok()) return errorf("metadata key '%s': %s", key.c_str(), st.message().c_str());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put<uint64_t>(head, d);
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset += align_up(t.n_bytes, align);
  }
  head.resize(align_up(head.size(), align), 0);
  PAGODA_TRY(sink(head.data(), head.size()));

  // ---- tensor data, each padded to the alignment
  const std::vector<uint8_t> zeros(align, 0);
  for (const Tensor& t : tensors_) {
    if (t.producer) {
      uint64_t written = 0;
      ByteSink counting = [&](const void* p, size_t n) -> Status {
        if (n > t.n_bytes - written)
          return errorf("tensor %s: producer wrote more than its %" PRIu64 " bytes", t.name.c_str(), t.n_bytes);
        written += n;
        return sink(p, n);
      };
      PAGODA_TRY(t.producer(counting));
      if (written != t.n_bytes)
        return errorf("tensor %s: producer wrote %" PRIu64 " bytes, expected %" PRIu64, t.name.c_str(), written,
                      t.n_bytes);
    } else if (t.n_bytes) {
      PAGODA_TRY(sink(t.owned.data(), t.owned.size()));
    }
    const uint64_t pad = align_up(t.n_bytes, align) - t.n_bytes;
    if (pad) PAGODA_TRY(sink(zeros.data(), pad));
  }
  return Status::Ok();
}

Expected<std::vector<uint8_t>> GgufWriter::write_to_memory() const {
  std::vector<uint8_t> out;
  Status st = write([&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
    return Status::Ok();
  });
  if (!st.ok()) return st.error();
  return out;
}

Status GgufWriter::write_file(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f) return errorf("cannot create '%s': %s", tmp.c_str(), std::strerror(errno));
  std::vector<char> buf(1 << 20);
  std::setvbuf(f.get(), buf.data(), _IOFBF, buf.size());
  Status st = write([&](const void* p, size_t n) -> Status {
    if (n && std::fwrite(p, 1, n, f.get()) != n) return errorf("write to '%s' failed: %s", tmp.c_str(), std::strerror(errno));
    return Status::Ok();
  });
  const int close_rc = std::fclose(f.release());
  if (st.ok() && close_rc != 0) st = errorf("closing '%s' failed: %s", tmp.c_str(), std::strerror(errno));
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    st = errorf("cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), std::strerror(errno));
  if (!st.ok()) std::remove(tmp.c_str());
  return st;
}

}  // namespace pagoda::gguf
