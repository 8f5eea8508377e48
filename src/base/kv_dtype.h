// The one element type of the engine's KV cache, shared by kernels/ (how a row
// is stored and read), kv/sizing (bytes per token and block), runtime/ (the
// storage), engine/ and cli/ (flags). GPU planning dtypes that pagoda does not
// store (fp8, int8, q4) exist only as kv/sizing descriptors, built from names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagoda {

enum class KvDtype : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3 };

inline constexpr KvDtype kAllKvDtypes[] = {KvDtype::F32, KvDtype::F16, KvDtype::BF16, KvDtype::Q8_0};

// "f32", "f16", "bf16", "q8_0".
inline const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::F32: return "f32";
    case KvDtype::F16: return "f16";
    case KvDtype::BF16: return "bf16";
    case KvDtype::Q8_0: return "q8_0";
  }
  return "?";
}

// The inverse of kv_dtype_name (exact, lower case). False (out unchanged) otherwise.
inline bool kv_dtype_from_name(std::string_view s, KvDtype* out) {
  for (KvDtype d : kAllKvDtypes) {
    if (s == kv_dtype_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

// Elements per quantization block and its bytes: a row of n elements takes
// ceil(n / block_elems) * block_bytes bytes (q8_0: an f16 scale + 32 int8).
inline int32_t kv_dtype_block_elems(KvDtype t) { return t == KvDtype::Q8_0 ? 32 : 1; }
inline int32_t kv_dtype_block_bytes(KvDtype t) {
  switch (t) {
    case KvDtype::F32: return 4;
    case KvDtype::F16:
    case KvDtype::BF16: return 2;
    case KvDtype::Q8_0: return 34;
  }
  return 0;
}

// Bytes of one token's K (or V) row of n elements. q8_0 quantizes the whole row
// in blocks of 32, so the kernels need n to be a multiple of 32 (the engine and
// the storage refuse other shapes); the formula rounds up like kv/sizing does.
inline size_t kv_row_bytes(KvDtype t, int64_t n) {
  const int64_t be = kv_dtype_block_elems(t);
  return static_cast<size_t>((n + be - 1) / be) * static_cast<size_t>(kv_dtype_block_bytes(t));
}

}  // namespace pagoda
