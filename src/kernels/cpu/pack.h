// The decode-packed weight layout (issue 22): a copy of a Q4_0 / Q4_1 / Q5_0 /
// Q5_1 / Q8_0 matrix made once at model load (kernels::pack_weight) and read by
// the AVX-512 matmul (matmul_avx512.cc) instead of the GGUF rows. It holds
// exactly the bytes of the original (the same quants, high bits and f16
// scales, nothing expanded), in the order the kernel consumes them, so that
// every load is one aligned 64-byte vector and a tile of kPackRows rows is one
// sequential stream:
//
//   tile t = rows 4t..4t+3 (rows past the end are zero), tile_bytes apart;
//   inside a tile, for each group g of 4 blocks (128 columns; the last group
//   zero padded), the group's quant bytes at g * pack_group_bytes:
//     quants  at + r * qb: Q4_0/Q4_1/Q5_0/Q5_1: the 4 blocks' 16 nibble bytes
//             (qb = 64); Q8_0: the 4 blocks' bytes 0..15 then their bytes
//             16..31, each stored as q + 128 (u8, qb = 128)
//     qh      at + 4 * qb (Q5_0/Q5_1 only, 64 bytes): row r's 16 bytes at 16r:
//             the u64 mask of its values 0..15 (bits 16b..16b+15 = block b's
//             qh bits 0..15), then the u64 mask of its values 16..31 (block b's
//             qh bits 16..31): the kernel's two byte masks, read as they are
//     scales  at scales_off + g * sb: 16 f16 d, lane 4r + b = row r, block b
//             (sb = 32); Q4_1/Q5_1 then 16 f16 m in the same order (sb = 64)
//
// The AVX-512 kernel decodes a packed group to exactly the registers it decodes
// from the GGUF rows (same values, same lanes), so packed and unpacked weights
// give bitwise the same outputs and batch invariance is untouched.
#pragma once
#include <cstddef>
#include <cstdint>

#include "base/ggml_types.h"

namespace pagoda::kernels::cpu::detail {

constexpr int kPackRows = 4;    // rows per tile (the AVX-512 kernel's kR)
constexpr int kPackBlocks = 4;  // blocks of 32 per group (the AVX-512 kernel's kG)

constexpr bool is_packable_type(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::Q8_0;
}
constexpr bool pack_has_qh(GgmlType t) { return t == GgmlType::Q5_0 || t == GgmlType::Q5_1; }
constexpr bool pack_has_min(GgmlType t) { return t == GgmlType::Q4_1 || t == GgmlType::Q5_1; }
constexpr size_t pack_quant_bytes(GgmlType t) { return t == GgmlType::Q8_0 ? 128 : 64; }
constexpr size_t pack_qh_bytes(GgmlType t) { return pack_has_qh(t) ? 64 : 0; }  // per group, 4 rows
// Quant (+ qh) bytes of one group of a tile: a multiple of 64.
constexpr size_t pack_group_bytes(GgmlType t) { return kPackRows * pack_quant_bytes(t) + pack_qh_bytes(t); }
constexpr size_t pack_scale_bytes(GgmlType t) { return pack_has_min(t) ? 64 : 32; }

struct PackLayout {
  int64_t ng = 0;          // groups of kPackBlocks blocks per row
  int64_t tiles = 0;       // ceil(rows / kPackRows)
  size_t scales_off = 0;   // offset of the scales inside a tile
  size_t tile_bytes = 0;   // multiple of 64
  size_t total() const { return static_cast<size_t>(tiles) * tile_bytes; }
};

inline PackLayout pack_layout(GgmlType t, int64_t rows, int64_t cols) {
  PackLayout l;
  l.ng = (cols / 32 + kPackBlocks - 1) / kPackBlocks;
  l.tiles = (rows + kPackRows - 1) / kPackRows;
  l.scales_off = static_cast<size_t>(l.ng) * pack_group_bytes(t);
  l.tile_bytes = (l.scales_off + static_cast<size_t>(l.ng) * pack_scale_bytes(t) + 63) / 64 * 64;
  return l;
}

}  // namespace pagoda::kernels::cpu::detail
