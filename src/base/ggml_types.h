// GGML tensor types and their quantized block layouts (the on-disk formats of
// GGUF). Pure data definitions shared by gguf/ (dequantize reference) and
// kernels/ (compute directly on blocks). Layouts match ggml-common.h byte for byte.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pagoda {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
};

constexpr int kQK4_0 = 32, kQK4_1 = 32, kQK5_0 = 32, kQK5_1 = 32, kQK8_0 = 32, kQK_K = 256, kKScaleSize = 12;

struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK4_0 / 2]; };                 // 18 bytes
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK4_1 / 2]; };              // 20 bytes
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK5_0 / 2]; };  // 22 bytes
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK5_1 / 2]; };  // 24 bytes
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK8_0]; };                      // 34 bytes
// Q2_K: 16 sub-blocks of 16 values, value = d * (sc & 15) * q - dmin * (sc >> 4),
// q in 0..3: value v of the super-block is bits 2j..2j+1 of qs[32n + l] with
// v = 128n + 32j + l (n < 2, j < 4, l < 32); its sub-block is v / 16.
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d, dmin; };  // 84
// Q3_K: 16 sub-blocks of 16 values, value = d * (sc - 32) * (q - 4), q in 0..7:
// the low two bits as Q2_K's qs, the third bit is bit v / 32 of hmask[v % 32];
// sc is 6 bits (low nibbles: scales[0..7] low / high nibble for sub-blocks
// 0..7 / 8..15; high two bits: bits 2(j/4) of scales[8 + j % 4]).
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[kKScaleSize]; uint16_t d; };  // 110
// IQ4_NL / IQ4_XS: 4-bit indices into kIq4NlValues (a non-linear codebook):
// byte j of 16 holds element j (low nibble) and element j + 16 (high nibble)
// of a 32-value group. IQ4_NL: value = d * table[q]. IQ4_XS: 8 groups per
// super-block, value = d * (ls - 32) * table[q] with the 6-bit ls of group g in
// nibble g % 2 of scales_l[g / 2] (low 4 bits) and bits 2g..2g+1 of scales_h.
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };  // 18 bytes
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };  // 136
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[kKScaleSize]; uint8_t qs[kQK_K / 2]; };  // 144
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[kKScaleSize]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };  // 176
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };  // 210

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ2_K) == 84 &&
              sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136 &&
              sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "block layouts must match ggml");

struct GgmlTypeInfo {
  const char* name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
  bool supported;       // pagoda can read / dequantize it
};

// Info for a type id; returns nullptr for an unknown id.
inline const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  static const GgmlTypeInfo kF32{"F32", 1, 4, true}, kF16{"F16", 1, 2, true}, kQ40{"Q4_0", 32, 18, true},
      kQ41{"Q4_1", 32, 20, true}, kQ50{"Q5_0", 32, 22, true}, kQ51{"Q5_1", 32, 24, true},
      kQ80{"Q8_0", 32, 34, true}, kQ81{"Q8_1", 32, 36, false}, kQ2K{"Q2_K", 256, 84, true},
      kQ3K{"Q3_K", 256, 110, true}, kQ4K{"Q4_K", 256, 144, true}, kQ5K{"Q5_K", 256, 176, true},
      kQ6K{"Q6_K", 256, 210, true}, kQ8K{"Q8_K", 256, 292, false}, kIQ4NL{"IQ4_NL", 32, 18, true},
      kIQ4XS{"IQ4_XS", 256, 136, true}, kBF16{"BF16", 1, 2, true};
  switch (id) {
    case 0: return &kF32; case 1: return &kF16; case 2: return &kQ40; case 3: return &kQ41;
    case 6: return &kQ50; case 7: return &kQ51; case 8: return &kQ80; case 9: return &kQ81;
    case 10: return &kQ2K; case 11: return &kQ3K; case 12: return &kQ4K; case 13: return &kQ5K;
    case 14: return &kQ6K; case 15: return &kQ8K; case 20: return &kIQ4NL; case 23: return &kIQ4XS;
    case 30: return &kBF16;
    default: return nullptr;
  }
}
inline const GgmlTypeInfo& ggml_type_info(GgmlType t) { return *ggml_type_info(static_cast<uint32_t>(t)); }

// Bytes of one row of n elements (n must be a multiple of the block size).
inline size_t ggml_row_bytes(GgmlType t, size_t n) {
  const auto& i = ggml_type_info(t);
  return n / i.block_size * i.type_size;
}

}  // namespace pagoda
