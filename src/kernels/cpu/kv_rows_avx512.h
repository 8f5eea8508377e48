// Internal to kernels/cpu (attention_head_run_avx512.h): a K/V head slice of every
// cache type, read 16 values at a time into an AVX-512 register as f32.
//
// Each value is bitwise what the scalar dequantizer (base/ggml_quant.cc, ggml's
// dequantize_row_*) gives it: f16/bf16/f32 convert exactly; q8_0 is q * d; the
// 4/5-bit types are (q - offset) * d, q * d + m (the _1 types, a multiply then
// an add, never fused) or d * codebook[q] (iq4_nl), q an int converted exactly.
// A quantized slice starts on a block (head_dim a multiple of 32): vector i is
// block i / 2, its low (i even: values 0-15) or high (i odd: 16-31) half, which
// in the 4/5-bit layouts are the low and the high nibbles of the 16 bytes qs.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/fp16.h"
#include "base/ggml_types.h"
#include "kernels/api.h"

namespace pagoda::kernels::cpu::detail {

template <KvDtype DT>
struct KvRows {
  static constexpr bool kBlock = DT != KvDtype::F32 && DT != KvDtype::F16 && DT != KvDtype::BF16;
  static constexpr size_t kBlockBytes = DT == KvDtype::F32   ? 4
                                        : DT == KvDtype::Q8_0 ? 34
                                        : DT == KvDtype::Q4_0 || DT == KvDtype::IQ4_NL ? 18
                                        : DT == KvDtype::Q4_1 ? 20
                                        : DT == KvDtype::Q5_0 ? 22
                                        : DT == KvDtype::Q5_1 ? 24
                                                              : 2;

  // Bytes of n values (n a multiple of 32 for the block types).
  static constexpr size_t bytes(int64_t n) {
    return kBlock ? static_cast<size_t>(n / 32) * kBlockBytes : static_cast<size_t>(n) * kBlockBytes;
  }

  // The f16 at p as f32: the F16C conversion, exact as fp16_to_fp32 (base/fp16.h)
  // for every value but NaN payloads, in 2 instructions instead of 15 (it runs
  // once per 16 values read: q4_0 decode attention at depth 4096 read 6.6 GB/s
  // with the scalar one, Intel Xeon model 167).
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }

  // Values 16 i .. 16 i + 15 of the slice at p.
  static __m512 load16(const uint8_t* p, int i) {
    if constexpr (DT == KvDtype::F32) {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16 * i);
    } else if constexpr (DT == KvDtype::F16) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i)));
    } else if constexpr (DT == KvDtype::BF16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      const uint8_t* b = p + static_cast<size_t>(i / 2) * kBlockBytes;
      const __m512 d = _mm512_set1_ps(half(b));
      if constexpr (DT == KvDtype::Q8_0) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * (i & 1)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
      } else {
        constexpr bool kMin = DT == KvDtype::Q4_1 || DT == KvDtype::Q5_1;
        constexpr bool kHigh = DT == KvDtype::Q5_0 || DT == KvDtype::Q5_1;
        constexpr int32_t kOffset = DT == KvDtype::Q4_0 ? 8 : DT == KvDtype::Q5_0 ? 16 : 0;
        constexpr int kQs = 2 + (kMin ? 2 : 0) + (kHigh ? 4 : 0);  // byte offset of the nibbles
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
        if constexpr (!kHigh) {
          // 4-bit values through a table of their floats (vpermps reads only an
          // index's low 4 bits, so the bytes need no mask: the high nibble is
          // shifted down, the low one taken as it is), then * d (+ m): the same
          // floats as converting the integer, two operations fewer a vector.
          __m512i q = _mm512_cvtepu8_epi32(raw);
          if (i & 1) q = _mm512_srli_epi32(q, 4);
          const __m512i codes = DT == KvDtype::IQ4_NL
                                    ? _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)))
                                    : _mm512_sub_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                       _mm512_set1_epi32(kOffset));
          const __m512 table = _mm512_cvtepi32_ps(codes);  // constant: the compiler hoists it
          const __m512 v = _mm512_mul_ps(_mm512_permutexvar_ps(q, table), d);
          if constexpr (kMin) return _mm512_add_ps(v, _mm512_set1_ps(half(b + 2)));
          return v;
        } else {  // 5-bit values: the nibble, its fifth bit from qh
          const __m128i nib = _mm_and_si128((i & 1) ? _mm_srli_epi16(raw, 4) : raw, _mm_set1_epi8(0x0F));
          __m512i q = _mm512_cvtepu8_epi32(nib);
          uint32_t qh;
          std::memcpy(&qh, b + (kMin ? 4 : 2), 4);
          const auto bits = static_cast<__mmask16>(qh >> (16 * (i & 1)));
          q = _mm512_mask_or_epi32(q, bits, q, _mm512_set1_epi32(16));
          if constexpr (kOffset != 0) q = _mm512_sub_epi32(q, _mm512_set1_epi32(kOffset));
          __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
          if constexpr (kMin) v = _mm512_add_ps(v, _mm512_set1_ps(half(b + 2)));
          return v;
        }
      }
    }
  }
};

}  // namespace pagoda::kernels::cpu::detail
