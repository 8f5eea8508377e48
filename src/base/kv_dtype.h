// The element types of the engine's KV cache, shared by kernels/ (how a row is
// stored and read), kv/sizing (bytes per token and block), runtime/ (the
// storage), engine/ and cli/ (flags). K and V may have different types
// (KvTypes; llama.cpp's -ctk / -ctv). GPU planning dtypes that pagoda does not
// store (fp8, int8) exist only as kv/sizing descriptors, built from names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda {

// The quantized types are ggml's block formats (base/ggml_types.h), written by
// ggml's reference quantizers (base/ggml_quant.h) and read by its dequantizers.
// The values are stable: the KV tiers key entries by them (engine/kv_tiers.cc).
enum class KvDtype : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 3, Q4_0 = 4, Q4_1 = 5, IQ4_NL = 6, Q5_0 = 7, Q5_1 = 8 };

inline constexpr KvDtype kAllKvDtypes[] = {KvDtype::F32,  KvDtype::F16,  KvDtype::BF16,   KvDtype::Q8_0, KvDtype::Q4_0,
                                           KvDtype::Q4_1, KvDtype::IQ4_NL, KvDtype::Q5_0, KvDtype::Q5_1};

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1" (llama.cpp's names).
inline const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::F32: return "f32";
    case KvDtype::F16: return "f16";
    case KvDtype::BF16: return "bf16";
    case KvDtype::Q8_0: return "q8_0";
    case KvDtype::Q4_0: return "q4_0";
    case KvDtype::Q4_1: return "q4_1";
    case KvDtype::IQ4_NL: return "iq4_nl";
    case KvDtype::Q5_0: return "q5_0";
    case KvDtype::Q5_1: return "q5_1";
  }
  return "?";
}

// The names, for error messages: "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1".
inline const char* kv_dtype_names() { return "f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"; }

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
// ceil(n / block_elems) * block_bytes bytes (q8_0: an f16 scale + 32 int8;
// q4_0 / iq4_nl: f16 d + 16 bytes of nibbles; q4_1: + f16 m; q5_0: f16 d,
// 4 bytes of fifth bits, 16 of nibbles; q5_1: + f16 m).
inline bool kv_dtype_is_quantized(KvDtype t) {
  return t != KvDtype::F32 && t != KvDtype::F16 && t != KvDtype::BF16;
}
inline int32_t kv_dtype_block_elems(KvDtype t) { return kv_dtype_is_quantized(t) ? 32 : 1; }
inline int32_t kv_dtype_block_bytes(KvDtype t) {
  switch (t) {
    case KvDtype::F32: return 4;
    case KvDtype::F16:
    case KvDtype::BF16: return 2;
    case KvDtype::Q8_0: return 34;
    case KvDtype::Q4_0:
    case KvDtype::IQ4_NL: return 18;
    case KvDtype::Q4_1: return 20;
    case KvDtype::Q5_0: return 22;
    case KvDtype::Q5_1: return 24;
  }
  return 0;
}

// Hadamard rotation of the rows below 8 bits (issue 39, as llama.cpp's
// attn_rot_k / attn_rot_v): when K's type is one of q4_0, q4_1, iq4_nl, q5_0,
// q5_1, Q and K are multiplied by an orthonormal Walsh-Hadamard matrix per
// block of each head after RoPE (scores unchanged, outliers spread over the
// block before it is quantized); when V's is, V before it is stored and the
// attention output after (the matrix is its own inverse). f32, f16, bf16 and
// q8_0 rows are not rotated (llama.cpp rotates q8_0 too; pagoda keeps its
// q8_0 outputs bitwise as before). K's block: the largest power of two >= 64
// dividing head_dim; V's: 64; 0 (no rotation) when head_dim % 64 != 0.
inline bool kv_dtype_rotated(KvDtype t) {
  return t == KvDtype::Q4_0 || t == KvDtype::Q4_1 || t == KvDtype::IQ4_NL || t == KvDtype::Q5_0 ||
         t == KvDtype::Q5_1;
}
inline int32_t kv_rot_block_k(KvDtype t, int32_t head_dim) {
  if (!kv_dtype_rotated(t) || head_dim <= 0 || head_dim % 64 != 0) return 0;
  int32_t b = 64;
  while (head_dim % (2 * b) == 0) b *= 2;
  return b;
}
inline int32_t kv_rot_block_v(KvDtype t, int32_t head_dim) {
  return kv_dtype_rotated(t) && head_dim > 0 && head_dim % 64 == 0 ? 64 : 0;
}

// Bytes of one token's K (or V) row of n elements. The quantized types quantize
// the whole row in blocks of 32, so the kernels need n to be a multiple of 32
// (the engine and the storage refuse other shapes); the formula rounds up like
// kv/sizing does.
inline size_t kv_row_bytes(KvDtype t, int64_t n) {
  const int64_t be = kv_dtype_block_elems(t);
  return static_cast<size_t>((n + be - 1) / be) * static_cast<size_t>(kv_dtype_block_bytes(t));
}

// The K and the V type of a cache. One KvDtype converts to both (so
// `cfg.kv_dtype = KvDtype::Q8_0` sets K and V).
struct KvTypes {
  KvDtype k = KvDtype::F16;
  KvDtype v = KvDtype::F16;
  constexpr KvTypes() = default;
  constexpr KvTypes(KvDtype both) : k(both), v(both) {}  // NOLINT(google-explicit-constructor)
  constexpr KvTypes(KvDtype k_type, KvDtype v_type) : k(k_type), v(v_type) {}
  constexpr bool same() const { return k == v; }
  constexpr bool operator==(const KvTypes&) const = default;
};

// "q8_0" when K and V share the type, else "q8_0/q4_0" (K/V).
inline std::string kv_types_name(KvTypes t) {
  std::string s = kv_dtype_name(t.k);
  if (!t.same()) s += std::string("/") + kv_dtype_name(t.v);
  return s;
}

}  // namespace pagoda
