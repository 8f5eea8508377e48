// The packers of the AVX-512 K-quant weight layouts (kquant_layouts_avx512.h):
// pack_rows, the per-call repack of 16 GGUF rows, and kp_pack, the load-time packed
// copy (KTileSet::pack), 16 rows transposed at a time.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/kquant_formats_avx512.h"
#include "kernels/cpu/kquant_layouts_avx512.h"
#include "kernels/cpu/transpose_avx512.h"

namespace pagoda::kernels::cpu::detail::kquant512 {
namespace {

// Stores the 16-row granule vectors of one half (values 128h..128h+127) of
// a Q4_K super-block from the rows' raw quant bytes: dword i of the 64 bytes
// at qs + 64h holds values 64c + 4(i % 8) .. +3 in its low nibbles and
// 64c + 32 + 4(i % 8) .. +3 in its high nibbles, c = 2h + i / 8.
inline void pack_q4_half(const uint8_t* const* blk, int h, uint8_t* q) {
  __m512i m[16];
  for (int r = 0; r < 16; ++r) m[r] = load512(blk[r] + 16 + 64 * h);
  transpose16x16_epi32(m);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int i = 0; i < 16; ++i) {
    const int c = 2 * h + i / 8, g = 16 * c + i % 8;
    _mm512_store_si512(q + 64 * g, _mm512_and_si512(m[i], nib));
    _mm512_store_si512(q + 64 * (g + 8), _mm512_and_si512(_mm512_srli_epi16(m[i], 4), nib));
  }
}

// The same for a whole Q6_K super-block: dword i of ql half h (bytes 64h + 4i)
// holds values 128h + 4i.. (granule 32h + i) in its low nibbles and
// 128h + 64 + 4i.. (granule 32h + 16 + i) in its high nibbles; their two high
// bits sit in qh dword 8h + i % 8 at bit 0 / 4 (i < 8) or 2 / 6 (i >= 8).
inline void pack_q6(const uint8_t* const* blk, uint8_t* q) {
  __m512i hq[16];
  for (int r = 0; r < 16; ++r) hq[r] = load512(blk[r] + 128);
  transpose16x16_epi32(hq);
  const __m512i nib = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    __m512i m[16];
    for (int r = 0; r < 16; ++r) m[r] = load512(blk[r] + 64 * h);
    transpose16x16_epi32(m);
    for (int i = 0; i < 16; ++i) {
      const __m512i qh = hq[8 * h + i % 8];
      const int sh = i < 8 ? 0 : 2;
      const __m512i hlo = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, sh), two), 4);
      const __m512i hhi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, sh + 4), two), 4);
      _mm512_store_si512(q + 64 * (32 * h + i), _mm512_or_si512(_mm512_and_si512(m[i], nib), hlo));
      _mm512_store_si512(q + 64 * (32 * h + 16 + i),
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(m[i], 4), nib), hhi));
    }
  }
}

}  // namespace

template <class Fmt>
void KPack<Fmt>::pack_rows(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* pk) {
  alignas(64) uint8_t vals[16][256];
  alignas(64) int32_t ridx[16];
  for (int r = 0; r < 16; ++r) ridx[r] = static_cast<int32_t>(std::min<int64_t>(r, nr - 1) * static_cast<int64_t>(row_bytes));
  const __m512i vidx = _mm512_load_si512(ridx);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = pk + static_cast<size_t>(b) * kSbBytes<Fmt>;
    const uint8_t* b0 = w0 + static_cast<size_t>(b) * Fmt::kBytes;  // row 0's block
    const uint8_t* blk[16];
    for (int r = 0; r < 16; ++r) blk[r] = b0 + ridx[r];
    const auto gather = [&](size_t off) { return _mm512_i32gather_epi32(vidx, b0 + off, 1); };
    write_meta<Fmt>(gather, p + kPackQ);
    if constexpr (std::is_same_v<Fmt, Q4K>) {
      pack_q4_half(blk, 0, p);
      pack_q4_half(blk, 1, p);
    } else if constexpr (std::is_same_v<Fmt, Q6K>) {
      pack_q6(blk, p);
    } else {
      for (int r = 0; r < 16; ++r) {
        __m512i q[4];
        Fmt::values(blk[r], q);
        for (int j = 0; j < 4; ++j) _mm512_store_si512(vals[r] + 64 * j, q[j]);
      }
      for (int j = 0; j < 4; ++j) {
        __m512i m[16];
        for (int r = 0; r < 16; ++r) m[r] = _mm512_load_si512(vals[r] + 64 * j);
        transpose16x16_epi32(m);
        for (int i = 0; i < 16; ++i) _mm512_store_si512(p + 64 * (16 * j + i), m[i]);
      }
    }
  }
}

template <class Fmt>
void KPack<Fmt>::kp_pack(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* dst) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = dst + static_cast<size_t>(b) * kKpBytes<Fmt>;
    const uint8_t* blk[16];
    for (int r = 0; r < 16; ++r)
      blk[r] = w0 + static_cast<size_t>(std::min<int64_t>(r, nr - 1)) * row_bytes + static_cast<size_t>(b) * Fmt::kBytes;
    __m512i m[16];
    for (const int off : KpFmt<Fmt>::kHdr) {
      for (int r = 0; r < 16; ++r) m[r] = _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk[r] + off))));
      transpose16x16_epi32(m);
      _mm512_store_si512(p, m[0]);
      p += 64;
    }
    for (const auto& seg : KpFmt<Fmt>::kSeg) {
      for (int r = 0; r < 16; ++r) m[r] = load512(blk[r] + seg[0]);  // stays inside the block (static_assert below)
      transpose16x16_epi32(m);
      for (int i = 0; i < seg[1]; ++i, p += 64) _mm512_store_si512(p, m[i]);
    }
  }
}
static_assert(80 + 64 <= Q4K::kBytes && 112 + 64 <= Q5K::kBytes && 128 + 64 <= Q6K::kBytes);
static_assert(16 + 64 <= Q2K::kBytes && 32 + 64 <= Q3K::kBytes && 72 + 64 <= IQ4XS::kBytes);
static_assert(80 + 4 <= Q2K::kBytes && 106 + 4 <= Q3K::kBytes);  // the last header dwords too

// The six formats' packers, for kquant_avx512.cc (chunk_fn, chunk_set).
template struct KPack<Q2K>;
template struct KPack<Q3K>;
template struct KPack<Q4K>;
template struct KPack<Q5K>;
template struct KPack<Q6K>;
template struct KPack<IQ4XS>;

}  // namespace pagoda::kernels::cpu::detail::kquant512
