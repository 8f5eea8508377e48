// The two weight layouts of the AVX-512 K-quant GEMM tile (gemm_tile,
// kquant_avx512.cc). Both are rebuilt to the same registers, so every output keeps
// the one float sequence of kquant_formats_avx512.h:
// * the per-call repack: 16 rows repacked row-interleaved, once per call
//   (pack_rows, RepackedSrc), for GGUF rows;
// * the load-time packed copy (issue 22): kernels::pack_weight's chunks of 16
//   rows transposed super-block by super-block (kp_pack, KpSrc).
// The packers (pack_rows, kp_pack) are in kquant_pack_avx512.cc; the weight
// sources the tile reads (RepackedSrc, KpSrc) are here.
// Include only from files compiled with the AVX-512 flags (kernels/CMakeLists.txt).
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "base/ggml_types.h"
#include "kernels/cpu/kquant.h"
#include "kernels/cpu/kquant_formats_avx512.h"

namespace pagoda::kernels::cpu::detail::kquant512 {

// ---- GEMM: 16 rows repacked row-interleaved ----------------------------------------
// Packed super-block of 16 rows (kSbBytes<Fmt> bytes, 64-byte aligned parts):
//   [0, 4096)    q: granule g (values 4g..4g+3) of the 16 rows at g*64, row r's
//                4 bytes (u8 quants) at g*64 + 4r
//   kSub x 64    sc: scale of sub-block k for row r at k*64 + 4r: int32, or
//                for Q4_K (kHalves) the int16 pair (scale, scale)
//   8 x 64       mp: Q4_K/Q5_K (min_m, min_m), IQ4_XS (sc_m, sc_m), Q2_K (min_2m, min_2m+1), Q3_K/Q6_K
//                (sc_2m, sc_2m+1) as int16 pairs, m = 0..7 (vpdpwssd with the bsum pair m)
//   64, 64       d, dmin of the 16 rows as f32 (Q3_K/Q6_K: dmin unused)
constexpr size_t kPackQ = 4096;
// Q4_K only: a 16-value half of a sub-block has |dot| <= 16 * 15 * 127 < 2^15,
// so the two halves' dots fit int16 and one vpdpwssd with (scale, scale)
// pairs replaces vpmulld + vpaddd. (Q5_K's halves reach 16 * 31 * 127.)
template <class Fmt>
constexpr bool kHalves = std::is_same_v<Fmt, Q4K>;
// The scale part ("meta", after the quants) on its own: sc at 0, mp at
// kMetaMp, d and dmin at kMetaD (write_meta writes it; the load-time packed
// layout below rebuilds it per super-block from the rows' raw header dwords).
template <class Fmt>
constexpr size_t kMetaMp = 64 * Fmt::kSub;
template <class Fmt>
constexpr size_t kMetaD = kMetaMp<Fmt> + 512;
template <class Fmt>
constexpr size_t kMetaBytes = kMetaD<Fmt> + 128;
template <class Fmt>
constexpr size_t kSbBytes = kPackQ + kMetaBytes<Fmt>;

// Writes the meta part (kMetaBytes<Fmt>) of 16 rows' super-block from their
// header dwords: gather(off) returns the 16 rows' dwords at byte offset off of
// the block (lane r = row r).
template <class Fmt, class Gather>
inline void write_meta(Gather gather, uint8_t* meta) {
  const __m512i byte = _mm512_set1_epi32(0xFF);
  (void)byte;
  // sc_k = byte k % 4 of words[k / 4]; mp_m = (min_m or scale pair) as int16 pairs
  __m512i words[4];
  if constexpr (std::is_same_v<Fmt, IQ4XS>) {  // f16 d | scales_h << 16, then scales_l
    const __m512i dh = gather(0), sl = gather(4);
    _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh)));
    _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_setzero_ps());
    const __m512i sh = _mm512_srli_epi32(dh, 16), four = _mm512_set1_epi32(0xF), three = _mm512_set1_epi32(3);
    for (int k = 0; k < 8; ++k) {  // int32 scale k - 32 (gemm_tile multiplies it), (sc, sc) int16 pairs in mp
      const __m512i sc = _mm512_sub_epi32(
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * k), four),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * k), three), 4)),
          _mm512_set1_epi32(32));
      _mm512_store_si512(meta + 64 * k, sc);
      _mm512_store_si512(meta + kMetaMp<Fmt> + 64 * k,
                         _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc, 16)));
    }
  } else if constexpr (Fmt::kSub == 8) {  // Q4_K, Q5_K
    const __m512i dd = gather(0);  // f16 d | f16 dmin << 16
    _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    // unpack_k4_scales on 16 rows at once
    const __m512i a = gather(4), bb = gather(8), c = gather(12);
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), m4 = _mm512_set1_epi32(0x0F0F0F0F),
                  m2 = _mm512_set1_epi32(0x03030303);
    words[0] = _mm512_and_si512(a, m6);
    words[1] = _mm512_or_si512(_mm512_and_si512(c, m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), m2), 4));
    words[2] = _mm512_and_si512(bb, m6);
    words[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bb, 6), m2), 4));
    for (int k = 0; k < 8; ++k) {
      const __m512i sck = _mm512_and_si512(_mm512_srli_epi32(words[k / 4], 8 * (k % 4)), byte);
      // Q4_K: (scale, scale) int16 pairs for vpdpwssd (see gemm_tile); Q5_K: int32 scale
      _mm512_store_si512(meta + 64 * k,
                         kHalves<Fmt> ? _mm512_or_si512(sck, _mm512_slli_epi32(sck, 16)) : sck);
      const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(words[2 + k / 4], 8 * (k % 4)), byte);
      _mm512_store_si512(meta + kMetaMp<Fmt> + 64 * k, _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16)));
    }
  } else {  // 16 sub-blocks: words = the 16 scales as int8, pw = the bytes paired into mp
    __m512i pw[4];
    if constexpr (Fmt::kMins) {  // Q2_K: scale | min << 4 in bytes 0..15, f16 d, dmin at 80
      const __m512i dd = gather(80);
      _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
      _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
      const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = gather(4 * j);
        words[j] = _mm512_and_si512(raw, m4);
        pw[j] = _mm512_and_si512(_mm512_srli_epi32(raw, 4), m4);
      }
    } else {
      // f16 d at kDOff (read as the high half of the dword 2 bytes before: stays inside the block)
      const __m512i dd = _mm512_srli_epi32(gather(Fmt::kDOff - 2), 16);
      _mm512_store_ps(meta + kMetaD<Fmt>, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
      _mm512_store_ps(meta + kMetaD<Fmt> + 64, _mm512_setzero_ps());
      if constexpr (std::is_same_v<Fmt, Q3K>) {  // unpack_q3_scales on 16 rows at once
        const __m512i a = gather(96), bb = gather(100), c = gather(104);
        const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F), m2 = _mm512_set1_epi32(0x03030303);
        const auto hi2 = [&](int sh) { return _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(c, sh), m2), 4); };
        words[0] = _mm512_or_si512(_mm512_and_si512(a, m4), hi2(0));
        words[1] = _mm512_or_si512(_mm512_and_si512(bb, m4), hi2(2));
        words[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a, 4), m4), hi2(4));
        words[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bb, 4), m4), hi2(6));
        for (int j = 0; j < 4; ++j) words[j] = _mm512_sub_epi8(words[j], _mm512_set1_epi8(32));
      } else {
        for (int j = 0; j < 4; ++j) words[j] = gather(192 + 4 * j);
      }
      for (int j = 0; j < 4; ++j) pw[j] = words[j];
    }
    for (int k = 0; k < 16; ++k)  // int8 scale k, sign-extended
      _mm512_store_si512(meta + 64 * k,
                         _mm512_srai_epi32(_mm512_slli_epi32(words[k / 4], 24 - 8 * (k % 4)), 24));
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    for (int m = 0; m < 8; ++m) {  // (pw_2m, pw_2m+1) as int16: bytes 2m%4, 2m%4+1 of pw[m / 2]
      const __m512i w = _mm512_srli_epi32(pw[m / 2], 16 * (m % 2));  // the pair in the low 16 bits
      const __m512i s0 = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(w, 24), 24), lo16);
      const __m512i s1 = _mm512_slli_epi32(_mm512_srai_epi32(_mm512_slli_epi32(w, 16), 24), 16);
      _mm512_store_si512(meta + kMetaMp<Fmt> + 64 * m, _mm512_or_si512(s0, s1));
    }
  }
}

// Weight source of gemm_tile over the per-call repacked super-blocks above.
template <class Fmt>
struct RepackedSrc {
  static constexpr int kG = 64 / Fmt::kSub;  // granules per sub-block
  static constexpr bool kUnrollK = false;
  const uint8_t* pk;
  const uint8_t* p = nullptr;
  // Super-block b's meta part (called once per super-block, in order).
  const uint8_t* meta(int64_t b) {
    p = pk + static_cast<size_t>(b) * kSbBytes<Fmt>;
    return p + kPackQ;
  }
  // The kG granule vectors (u8 quants of the 16 rows) of sub-block k.
  void granules(int k, __m512i* w) const {
#pragma GCC unroll 8
    for (int g = 0; g < kG; ++g) w[g] = _mm512_load_si512(p + 64 * (kG * k + g));
  }
};

// ---- Load-time packed layout (issue 22) -------------------------------------------
// kernels::pack_weight packs a K-quant matrix (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_XS) once at load into
// chunks of 16 rows (kKChunkRows; the last chunk repeats its last row), each
// chunk nb super-blocks of kKpBytes<Fmt> bytes, front to back. A super-block
// holds the same bits as the 16 rows' GGUF blocks, transposed so that every
// load is one aligned 64-byte vector with row r in dword lane r:
//   hdr   KpFmt<Fmt>::kHdr dwords of each row's block header (Q4_K/Q5_K: f16
//         d|dmin and the 12 scale bytes; Q6_K: the 16 int8 scales and f16 d;
//         Q2_K: the 16 scale|min bytes and f16 d|dmin; Q3_K: the 12 scale
//         bytes and f16 d (its dword overlaps the last scale dword by 2
//         bytes); IQ4_XS: f16 d|scales_h and scales_l), one vector per dword;
//         write_meta rebuilds the meta part from them
//   q     the quant bytes as 64-byte row slices transposed 16 x 16 dwords:
//         Q4_K/Q5_K qs: vector 8j + g = qs bytes 32j + 4g.. (low nibbles:
//         values 64j + 4g.., high: + 32); Q5_K then qh bytes 4g.. (g < 8);
//         Q6_K ql: vector 16h + i = bytes 64h + 4i.., then qh: vector 32 + i =
//         qh bytes 4i..; Q2_K qs: vector i = qs bytes 4i.. (2-bit field f:
//         values 128 (i / 8) + 32 f + 4 (i % 8)..); Q3_K hmask (vector i =
//         bytes 4i.., bit f: values 32 f + 4i..) then qs as Q2_K; IQ4_XS qs:
//         vector i = qs bytes 4i.. (low nibbles: values 32 (i / 4) + 4 (i % 4)..,
//         high: + 16)
// Sizes: Q4_K 2304 = 16 x 144, Q5_K 2816 = 16 x 176, Q2_K 1344 = 16 x 84 and
// IQ4_XS 2176 = 16 x 136 (exactly the rows' bytes); Q6_K 3392 = 16 x 210 + 32
// and Q3_K 1792 = 16 x 110 + 32 (the 2 bytes of f16 d padded to a dword: +1.8%
// for Q3_K). Nothing is expanded: the scales are unpacked per super-block as
// the kernel reads it (KpSrc::meta), the quants per sub-block. The integer sums
// S1 and S2 are exact whichever layout they come from and the float step is
// float_step, so the packed path gives bitwise the outputs of the unpacked one.
template <class Fmt>
struct KpFmt;
template <>
struct KpFmt<Q4K> {
  static constexpr int kHdr[] = {0, 4, 8, 12};
  static constexpr int kSeg[][2] = {{16, 16}, {80, 16}};  // (byte offset, dwords) of each transposed slice
};
template <>
struct KpFmt<Q5K> {
  static constexpr int kHdr[] = {0, 4, 8, 12};
  static constexpr int kSeg[][2] = {{48, 16}, {112, 16}, {16, 8}};
};
template <>
struct KpFmt<Q6K> {
  static constexpr int kHdr[] = {206, 192, 196, 200, 204};
  static constexpr int kSeg[][2] = {{0, 16}, {64, 16}, {128, 16}};
};
template <>
struct KpFmt<Q2K> {
  static constexpr int kHdr[] = {0, 4, 8, 12, 80};  // scale | min << 4 bytes, f16 d | dmin
  static constexpr int kSeg[][2] = {{16, 16}};
};
template <>
struct KpFmt<Q3K> {
  static constexpr int kHdr[] = {96, 100, 104, 106};  // packed scales, then f16 d in the high half
  static constexpr int kSeg[][2] = {{0, 8}, {32, 16}};  // hmask, qs
};
template <>
struct KpFmt<IQ4XS> {
  static constexpr int kHdr[] = {0, 4};  // f16 d | scales_h, scales_l
  static constexpr int kSeg[][2] = {{8, 16}, {72, 16}};
};
template <class Fmt>
constexpr int kp_vectors() {
  int n = static_cast<int>(std::size(KpFmt<Fmt>::kHdr));
  for (const auto& seg : KpFmt<Fmt>::kSeg) n += seg[1];
  return n;
}
template <class Fmt>
constexpr size_t kKpBytes = 64 * static_cast<size_t>(kp_vectors<Fmt>());
template <class Fmt>
constexpr size_t kKpQ = 64 * std::size(KpFmt<Fmt>::kHdr);  // offset of the quant vectors
template <class Fmt>
constexpr int kp_slot(int off) {
  for (int i = 0; i < static_cast<int>(std::size(KpFmt<Fmt>::kHdr)); ++i)
    if (KpFmt<Fmt>::kHdr[i] == off) return i;
  return -1;
}
static_assert(kKpBytes<Q4K> == 16 * Q4K::kBytes && kKpBytes<Q5K> == 16 * Q5K::kBytes);
static_assert(kKpBytes<Q6K> == 16 * Q6K::kBytes + 32);
static_assert(kKpBytes<Q2K> == 16 * Q2K::kBytes && kKpBytes<IQ4XS> == 16 * IQ4XS::kBytes);
static_assert(kKpBytes<Q3K> == 16 * Q3K::kBytes + 32);

// The packers of the two layouts (kquant_pack_avx512.cc, which instantiates
// them for the six formats).
template <class Fmt>
struct KPack {
  // Packs rows 0..nr-1 (row nr-1 repeated up to 16) of nb super-blocks. pk: [nb, kSbBytes<Fmt>]
  // Precondition: 15 * row_bytes < 2^31 (gather offsets are int32).
  static void pack_rows(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* pk);
  // Packs rows 0..nr-1 (row nr-1 repeated up to 16) of nb super-blocks into dst
  // ([nb, kKpBytes<Fmt>], 64-byte aligned).
  static void kp_pack(const uint8_t* w0, size_t row_bytes, int64_t nr, int64_t nb, uint8_t* dst);
};

// Weight source of gemm_tile over the load-time packed super-blocks: the meta
// part is rebuilt per super-block into buf (write_meta, as pack_rows does from
// the GGUF rows), the granules are unpacked from nibbles (+ high bits).
template <class Fmt>
struct KpSrc {
  static constexpr int kG = 64 / Fmt::kSub;
  static constexpr bool kUnrollK = true;
  KpSrc(const uint8_t* chunk, size_t ahead) : pk(chunk), prefetch(ahead) {}
  const uint8_t* pk;
  size_t prefetch;  // bytes ahead to prefetch (0: none)
  const uint8_t* q = nullptr;
  alignas(64) uint8_t buf[kMetaBytes<Fmt>];  // written by meta() before any read
  const uint8_t* meta(int64_t b) { return meta_to(b, buf); }
  const uint8_t* meta_to(int64_t b, uint8_t* out) {
    const uint8_t* p = pk + static_cast<size_t>(b) * kKpBytes<Fmt>;
    if (prefetch != 0) prefetch_block(p + prefetch, kKpBytes<Fmt>);
    write_meta<Fmt>([p](size_t off) { return _mm512_load_si512(p + 64 * kp_slot<Fmt>(static_cast<int>(off))); }, out);
    q = p + kKpQ<Fmt>;
    return out;
  }
  // Super-block b in the per-call layout of pack_rows (kSbBytes<Fmt> at out):
  // the same bits, so RepackedSrc over it gives the same integers.
  void expand(int64_t b, uint8_t* out) {
    meta_to(b, out + kPackQ);
    for (int k = 0; k < Fmt::kSub; ++k) {
      __m512i w[kG];
      granules(k, w);
      for (int g = 0; g < kG; ++g) _mm512_store_si512(out + 64 * (kG * k + g), w[g]);
    }
  }
  // Bit `from` of every byte of v moved to bit `to` (other bits: garbage).
  static __m512i move_bits(__m512i v, int from, int to) {
    return from < to ? _mm512_slli_epi16(v, to - from) : from > to ? _mm512_srli_epi16(v, from - to) : v;
  }
  void granules(int k, __m512i* w) const {
    // w = (nibble source & 0x0F) | high bits (already at bits 4.., the rest 0): one vpternlogd
    constexpr int kLowOrHigh = 0xEC;  // (A & C) | B for A, B, C = 0xF0, 0xCC, 0xAA
    const __m512i nib = _mm512_set1_epi8(0x0F);
    if constexpr (std::is_same_v<Fmt, Q6K>) {
      const __m512i m2 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) {  // granule G = 4k + g: ql half G / 32, dword i, nibble (G % 32) / 16
        const int G = 4 * k + g, h = G / 32, i = G % 16, hi = (G % 32) / 16;
        const __m512i ql = _mm512_load_si512(q + 64 * (16 * h + i));
        const __m512i qh = _mm512_load_si512(q + 64 * (32 + 8 * h + i % 8));
        const __m512i hb = _mm512_and_si512(move_bits(qh, (i < 8 ? 0 : 2) + 4 * hi, 4), m2);
        w[g] = _mm512_ternarylogic_epi32(hi ? _mm512_srli_epi16(ql, 4) : ql, hb, nib, kLowOrHigh);
      }
    } else if constexpr (std::is_same_v<Fmt, Q2K> || std::is_same_v<Fmt, Q3K>) {
      // granule G = 4k + g (values 4G..): 2-bit field (G % 32) / 8 of qs dword 8 (G / 32) + G % 8;
      // Q3_K: its bit 2 is bit G / 8 of hmask dword G % 8 (vectors 0..7, qs from 8)
      constexpr int kQs = std::is_same_v<Fmt, Q3K> ? 8 : 0;
      const __m512i m2 = _mm512_set1_epi8(0x03), m4 = _mm512_set1_epi8(0x04);
#pragma GCC unroll 4
      for (int g = 0; g < kG; ++g) {
        const int G = 4 * k + g;
        const __m512i v = move_bits(_mm512_load_si512(q + 64 * (kQs + 8 * (G / 32) + G % 8)), 2 * ((G % 32) / 8), 0);
        if constexpr (kQs != 0) {
          const __m512i hb = _mm512_and_si512(move_bits(_mm512_load_si512(q + 64 * (G % 8)), G / 8, 2), m4);
          w[g] = _mm512_ternarylogic_epi32(v, hb, m2, kLowOrHigh);
        } else {
          (void)m4;
          w[g] = _mm512_and_si512(v, m2);
        }
      }
      (void)nib;
    } else if constexpr (std::is_same_v<Fmt, IQ4XS>) {
      // granule g of group k: nibble g / 4 of qs dword 4k + g % 4, through the codebook + 128
      const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)), _mm_set1_epi8(static_cast<char>(0x80))));
#pragma GCC unroll 8
      for (int g = 0; g < kG; ++g) {
        const __m512i v = _mm512_load_si512(q + 64 * (4 * k + g % 4));
        w[g] = _mm512_shuffle_epi8(table, _mm512_and_si512(g < 4 ? v : _mm512_srli_epi16(v, 4), nib));
      }
    } else {  // Q4_K / Q5_K: sub-block k = 2j + h is nibble h of vectors 8j..8j+7
      const int j = k / 2, h = k % 2;
      const __m512i m1 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
      for (int g = 0; g < kG; ++g) {
        const __m512i v = _mm512_load_si512(q + 64 * (8 * j + g));
        if constexpr (std::is_same_v<Fmt, Q5K>) {  // bit k of qh bytes 4g.. is the value's bit 4
          const __m512i hb = _mm512_and_si512(move_bits(_mm512_load_si512(q + 64 * (32 + g)), k, 4), m1);
          w[g] = _mm512_ternarylogic_epi32(h ? _mm512_srli_epi16(v, 4) : v, hb, nib, kLowOrHigh);
        } else {
          (void)m1;
          w[g] = _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, nib);
        }
      }
    }
  }
};

}  // namespace pagoda::kernels::cpu::detail::kquant512
