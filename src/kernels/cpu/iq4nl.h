// Internal to kernels/cpu: the integer matmul path for IQ4_NL weights (blocks of
// 32 4-bit indices into the 16-entry non-linear codebook kIq4NlValues, one f16 d)
// against q8_0 activations, as ggml pairs them (ggml_vec_dot_iq4_nl_q8_0).
//
// Activations: quantize_act (cpu_internal.h, mode kSigned), bit for bit ggml's
// quantize_row_q8_0. Per block the integer dot sum(codebook[idx] * q) is exact in
// int32; it becomes float by one product d_w * d_x and one fma per 32-bit lane
// (a lane holds 8 of the block's 32 products), then a fixed horizontal sum: every
// output y[t, r] goes through the same op sequence whatever the tile, token count,
// thread count or row position (the batch invariance contract of kernels/api.h).
//
// The codebook lookup is one byte shuffle per 16 indices (pshufb on the 16-byte
// table), as llama.cpp does:
//   AVX2 (iq4nl_avx2.cc): signed codebook values, |w| * (x with w's sign) by
//     maddubs (|pair| <= 2 * 127 * 127 < 2^15: no saturation), madd to int32.
//   AVX-512 VNNI (iq4nl_avx512.cc): codebook + 128 as u8 (1..241) times the s8
//     activations by vpdpbusd, starting from -128 * (the lane's sum of q), which
//     the driver's prepare step writes once per activation record: the lane sum is
//     then exactly sum(codebook * q).
// The scalar reference twin is ref::matmul (dequantized f32 rows, double sums).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/api.h"

namespace pagoda::kernels::cpu::detail {

// The per-ISA pieces the shared driver (iq4nl_avx2.cc) runs. Rows come in tiles
// of `rows` (row pointers, the last repeated past the chunk's end) and tokens in
// tiles of 1..max_t (activation record pointers); out[t * rows + r].
struct Iq4NlKernels {
  int g = 0;                   // blocks of 32 per activation record (quantize_act's G)
  size_t packed_bytes = 0;     // bytes of one packed group record of one row (64-aligned)
  int rows = 0;                // R
  int max_t = 0;               // tokens per tile, at most kIq4MaxT
  // Rewrites the n quantized activation records in place for the dot products
  // (nullptr: nothing to do).
  void (*prepare)(uint8_t* act, int64_t n) = nullptr;
  // Decodes the raw rows (nb blocks each) group by group in registers.
  // prefetch: bytes ahead of each row pointer to prefetch.
  void (*direct)(int nt, const uint8_t* const* rows, int64_t nb, const uint8_t* const* x, int64_t ng,
                 size_t prefetch, float* out) = nullptr;
  // One raw row (nb blocks) -> ng packed group records.
  void (*pack)(const uint8_t* row, int64_t nb, uint8_t* out) = nullptr;
  // R packed rows (ng records each).
  void (*packed)(int nt, const uint8_t* const* w, const uint8_t* const* x, int64_t ng, float* out) = nullptr;
};
constexpr size_t kIq4BlockBytes = 18;  // f16 d, 16 bytes of 4-bit indices
constexpr int kIq4MaxT = 4;
constexpr int kIq4MaxR = 4;

const Iq4NlKernels& iq4nl_kernels_avx2();
const Iq4NlKernels& iq4nl_kernels_avx512();

// y = W x for an IQ4_NL W on the current ISA: quantizes x once (q8_0), then
// threads split chunks of 16 rows; up to kIq4DirectMaxTokens tokens decode the
// weights in registers, more tokens decode each chunk once into packed records.
// x: [n_tokens, w.cols], y: [n_tokens, w.rows]. Precondition: w.type == IQ4_NL.
constexpr int64_t kIq4DirectMaxTokens = 4;
void matmul_iq4nl(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace pagoda::kernels::cpu::detail
