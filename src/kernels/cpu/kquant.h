// Internal to kernels/cpu: integer matmul paths for the K-quant weight types
// (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: super-blocks of 256 values) against
// 8-bit activations.
//
// Activations are quantized once per call to ggml's q8_K format, one record
// per 256 values of a token row (kActKBytes, 64-byte aligned):
//   [0, 256)    int8  q[256]      q = nearest_int(x * (-127 / max)), max = the
//                                 first value of largest |x| (signed)
//   [256, 288)  int16 bsums[16]   sum of q over each 16 values
//   [288, 292)  float d           1 / (-127 / max)  (f32, not rounded to f16)
//   [292, 320)  zero padding
// Every output y[t, r] is then, for each super-block b in order, one integer
// dot product (exact) turned into float by a fixed sequence of float ops that
// depends only on row r and token t (AVX2: kquant_avx2.cc, 8 lanes and a
// horizontal sum; AVX-512: kquant_avx512.cc, one scalar sequence per output):
// the batch invariance contract of kernels/api.h holds for any n_tokens, tile,
// thread count or row position.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/api.h"

namespace pagoda::kernels::cpu::detail {

constexpr size_t kActKBytes = 320;
constexpr size_t kActKBsums = 256;
constexpr size_t kActKD = 288;

// True for the weight types the K-quant integer path handles.
inline bool is_kquant_type(GgmlType t) {
  return t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K || t == GgmlType::Q5_K ||
         t == GgmlType::Q6_K || t == GgmlType::IQ4_XS;
}

// Quantizes x [n_tokens, cols] (cols % 256 == 0) to q8_K records, bit for bit
// as ggml's quantize_row_q8_K_ref for finite inputs (the x86 quantize_row_q8_K
// calls the ref): same argmax (first index of the largest |x|), iscale =
// -127 / max, q = round-half-even(f32(iscale * x)) (ggml's nearest_int of the
// unfused product), d = 1 / iscale, bsums per 16. An all-zero block gets
// d = 0, q = 0 and bsums = 0 (ggml leaves its bsums unset there).
// out: [n_tokens, cols / 256, kActKBytes], 64-byte aligned.
void quantize_act_k(const float* x, int64_t n_tokens, int64_t cols, uint8_t* out);

// One tile: R weight rows (R = KTileSet::rows[T - 1]) against T tokens' q8_K
// records, nb super-blocks each. prefetch: bytes ahead of each row pointer to
// prefetch (0: none). out: [T, R]
using KTileFn = void (*)(const uint8_t* const* rows, const uint8_t* const* x, int64_t nb, size_t prefetch,
                         float* out);
constexpr int kKTileMaxT = 8;
constexpr int kKTileMaxR = 4;
// A whole row chunk at once: nr <= kKChunkRows rows starting at w0 (row_bytes
// apart) against all n_tokens token records (act: [n_tokens, nb, kActKBytes]).
// y: row 0 of the chunk for token 0; y[t * ldy + i] receives row i, token t.
constexpr int64_t kKChunkRows = 16;
using KChunkFn = void (*)(const uint8_t* w0, size_t row_bytes, int64_t nr, const uint8_t* act, int64_t n_tokens,
                          int64_t nb, float* y, int64_t ldy);
// The load-time packed copy (WeightView::packed, issue 22): chunk c of
// kKChunkRows rows is nb * packed_sb_bytes bytes at c * nb * packed_sb_bytes.
// KPackFn writes one chunk (rows nr..15 repeat row nr - 1) from the GGUF rows;
// KPackedChunkFn is KChunkFn reading that chunk instead (bitwise the same y).
using KPackFn = void (*)(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* dst);
using KPackedChunkFn = void (*)(const uint8_t* pk, int64_t nr, const uint8_t* act, int64_t n_tokens, int64_t nb,
                                float* y, int64_t ldy);
struct KTileSet {
  int max_t = 0;                  // tokens per tile, at most kKTileMaxT
  int rows[kKTileMaxT] = {};      // R for T = 1..max_t tokens (each at most kKTileMaxR)
  KTileFn fn[kKTileMaxT] = {};    // the tile for T = 1..max_t tokens
  KChunkFn chunk = nullptr;       // if set, the driver hands it whole row chunks instead of tiles
  KPackFn pack = nullptr;               // if set, the type has a load-time packed layout
  KPackedChunkFn packed_chunk = nullptr;
  size_t packed_sb_bytes = 0;           // bytes per super-block of a 16-row chunk
};
// Bytes of w's packed copy for the AVX-512 kernels (0: not packed).
size_t kpacked_bytes(const WeightView& w);

// The tiles of each ISA for a K-quant weight type (static tables).
const KTileSet& ktiles_avx2(GgmlType t);
const KTileSet& ktiles_avx512(GgmlType t);

// y = W x for a K-quant W: quantizes x once, then threads split chunks of rows
// and each chunk walks the tokens in tiles of up to max_t. x: [n_tokens, w.cols],
// y: [n_tokens, w.rows]. Precondition: is_kquant_type(w.type), w.cols % 256 == 0.
void matmul_kquant(const WeightView& w, const float* x, int64_t n_tokens, float* y, const KTileSet& tiles);

}  // namespace pagoda::kernels::cpu::detail
