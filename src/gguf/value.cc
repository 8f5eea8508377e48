// Metadata Value helpers: type names, builders, accessors, formatting.
#include <cinttypes>
#include <cstdio>

#include "gguf/gguf.h"

namespace pagoda::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "?";
}

bool value_type_valid(uint32_t id) { return id <= static_cast<uint32_t>(ValueType::FLOAT64); }

bool Value::is_int() const {
  switch (type) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64:
    case ValueType::BOOL:
      return true;
    default:
      return false;
  }
}

bool Value::is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }

int64_t Value::as_int() const {
  switch (type) {
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      return i64;
    case ValueType::FLOAT32: case ValueType::FLOAT64:
      return static_cast<int64_t>(f64);
    default:
      return static_cast<int64_t>(u64);
  }
}

double Value::as_float() const {
  switch (type) {
    case ValueType::FLOAT32: case ValueType::FLOAT64: return f64;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      return static_cast<double>(i64);
    default: return static_cast<double>(u64);
  }
}

namespace {
template <typename T>
Value int_value(ValueType t, T v) {
  Value r;
  r.type = t;
  r.set_integer(v);
  return r;
}
Value float_value(ValueType t, double v) {
  Value r;
  r.type = t;
  r.f64 = v;
  return r;
}
}  // namespace

Value make_u8(uint8_t v) { return int_value(ValueType::UINT8, v); }
Value make_i8(int8_t v) { return int_value(ValueType::INT8, v); }
Value make_u16(uint16_t v) { return int_value(ValueType::UINT16, v); }
Value make_i16(int16_t v) { return int_value(ValueType::INT16, v); }
Value make_u32(uint32_t v) { return int_value(ValueType::UINT32, v); }
Value make_i32(int32_t v) { return int_value(ValueType::INT32, v); }
Value make_u64(uint64_t v) { return int_value(ValueType::UINT64, v); }
Value make_i64(int64_t v) { return int_value(ValueType::INT64, v); }
Value make_f32(float v) { return float_value(ValueType::FLOAT32, v); }
Value make_f64(double v) { return float_value(ValueType::FLOAT64, v); }
Value make_bool(bool v) { return int_value(ValueType::BOOL, v ? 1 : 0); }
Value make_string(std::string v) {
  Value r;
  r.type = ValueType::STRING;
  r.str = std::move(v);
  return r;
}
Value make_array(ValueType elem_type, std::vector<Value> elems) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem_type = elem_type;
  r.arr = std::move(elems);
  return r;
}
Value make_string_array(const std::vector<std::string>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (const auto& s : v) e.push_back(make_string(s));
  return make_array(ValueType::STRING, std::move(e));
}
Value make_f32_array(const std::vector<float>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (float f : v) e.push_back(make_f32(f));
  return make_array(ValueType::FLOAT32, std::move(e));
}
Value make_i32_array(const std::vector<int32_t>& v) {
  std::vector<Value> e;
  e.reserve(v.size());
  for (int32_t x : v) e.push_back(make_i32(x));
  return make_array(ValueType::INT32, std::move(e));
}

std::string format_value(const Value& v, size_t max_items) {
  char buf[64];
  switch (v.type) {
    case ValueType::BOOL: return v.u64 ? "true" : "false";
    case ValueType::STRING: {
      std::string s = "\"";
      for (char c : v.str.substr(0, 200)) {
        if (c == '\n') s += "\\n";
        else if (c == '"') s += "\\\"";
        else if (c == '\\') s += "\\\\";
        else s += c;
      }
      if (v.str.size() > 200) s += "...";
      return s + "\"";
    }
    case ValueType::FLOAT32: case ValueType::FLOAT64:
      std::snprintf(buf, sizeof buf, "%g", v.f64);
      return buf;
    case ValueType::ARRAY: {
      std::string s = "[";
      for (size_t i = 0; i < v.arr.size() && i < max_items; ++i) {
        if (i) s += ", ";
        s += format_value(v.arr[i], max_items);
      }
      if (v.arr.size() > max_items) {
        std::snprintf(buf, sizeof buf, ", ... (%zu %s)", v.arr.size(), value_type_name(v.elem_type));
        s += buf;
      }
      return s + "]";
    }
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      std::snprintf(buf, sizeof buf, "%" PRId64, v.i64);
      return buf;
    default:
      std::snprintf(buf, sizeof buf, "%" PRIu64, v.u64);
      return buf;
  }
}

}  // namespace pagoda::gguf
