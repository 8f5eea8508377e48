// AVX-512 (F/BW/VL/DQ/VNNI) matmul. Compiled with extra -m flags; only called
// when the CPU supports them (see dispatch.cc).
//
// Batch invariance: every output y[t, r] is produced by the same sequence of
// vector ops on the same lane map, whatever tile (4 rows x 1..kQT tokens) it
// lands in: per group the row's exact block sums, then acc = fma(cvt(bsum),
// wd * xd, acc) [+ fma(wm, xs, acc)] in its 4 lanes, then a fixed sum of those
// lanes (see qkernel_rows). Tiles differ only in how many independent
// accumulators run side by side. Threads split row chunks.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "base/ggml_quant.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/gemm_panel_avx512.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/packed_avx512.h"

namespace pagoda::kernels::cpu::detail {
namespace {

constexpr int kG = 4;             // blocks of 32 per record
constexpr size_t kRec = 64 * kG;  // record bytes
constexpr int kR = 4;             // rows per tile
constexpr int kT = 4;             // tokens per float tile (max)
constexpr int kQT = 8;            // tokens per integer tile (max): one accumulator each
constexpr int64_t kChunkRows = 16;
constexpr int64_t kGemmChunkRows = 64;  // measured: pp512 1B Q4_0 ~15% over 16 (2 threads)
// Below this many multiply-adds a fork/join costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;
// How far ahead (in rows) the direct (few-token) paths prefetch weights: one
// core streaming weights is limited by DRAM latency, not bandwidth.
constexpr size_t kPrefetchRows = 8;

// ---- Weight packing (one row, all groups) -------------------------------------
inline __m512i load4x128(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, const uint8_t* p3) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2)), 2);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3)), 3);
  return v;
}

template <GgmlType kType>
struct Layout;
template <> struct Layout<GgmlType::Q4_0> { static constexpr size_t kBB = 18, kQs = 2, kQh = 0; static constexpr bool kMin = false; static constexpr float kImplicit = -8.0f; };
template <> struct Layout<GgmlType::Q4_1> { static constexpr size_t kBB = 20, kQs = 4, kQh = 0; static constexpr bool kMin = true; static constexpr float kImplicit = 0.0f; };
template <> struct Layout<GgmlType::Q5_0> { static constexpr size_t kBB = 22, kQs = 6, kQh = 2; static constexpr bool kMin = false; static constexpr float kImplicit = -16.0f; };
template <> struct Layout<GgmlType::Q5_1> { static constexpr size_t kBB = 24, kQs = 8, kQh = 4; static constexpr bool kMin = true; static constexpr float kImplicit = 0.0f; };
// Q8_0's kQs, kQh and kMin are never read (its decoder is its own); clang warns of them.
template <> struct Layout<GgmlType::Q8_0> { static constexpr size_t kBB = 34; [[maybe_unused]] static constexpr size_t kQs = 2, kQh = 0; [[maybe_unused]] static constexpr bool kMin = false; static constexpr float kImplicit = 0.0f; };

// The integer mode (group_isum) of type kType's direct and staged kernels: Q8_0
// and the implicit-offset types (Q4_0, Q5_0) start each block's integer sum at
// the activation record's correction (mode 1; Q8_0 staged: mode 2), so their
// block sums are exact and one fma per block adds them; Q4_1 / Q5_1 (mode 0)
// add their m term with a second fma.
template <GgmlType kType>
constexpr int kIntMode = kType == GgmlType::Q8_0 || Layout<kType>::kImplicit != 0.0f ? 1 : 0;

// One decoded group of 4 blocks of one row: lo, hi (u8 values 0..31, or w + 128
// for q8_0), wd (d per lane), wm (m per lane; unused for q8_0, whose activation
// record carries the int32 correction -128 * sum(x) of each lane, so that
// dpbusd(corr, w + 128, x) = sum(w * x): see ActMode::kLaneCorr128).
struct WGroup {
  __m512i lo, hi;
  __m512 wd;
  __m512i wm;
};

alignas(64) const uint8_t kZeroBlock[64] = {};  // d = m = 0, all quants 0

// d (and m) of 4 blocks -> 8 floats [d0 m0 d1 m1 d2 m2 d3 m3] (m garbage without kMin).
template <GgmlType kType>
inline __m512 scales_of(const uint8_t* const* blk, const uint8_t* group, bool full) {
  using L = Layout<kType>;
  if constexpr (L::kBB * 3 + 4 <= 64) {
    if (full) {  // all 4 scale pairs lie in the group's first 64 bytes
      constexpr int h = static_cast<int>(L::kBB / 2);
      const __m512i idx = _mm512_zextsi128_si512(_mm_setr_epi16(0, 1, h, h + 1, 2 * h, 2 * h + 1, 3 * h, 3 * h + 1));
      const __m512i v = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(group));
      return _mm512_castps256_ps512(_mm256_cvtph_ps(_mm512_castsi512_si128(v)));
    }
  }
  const __m128i dm16 = _mm_setr_epi32(static_cast<int>(load_u32(blk[0])), static_cast<int>(load_u32(blk[1])),
                                      static_cast<int>(load_u32(blk[2])), static_cast<int>(load_u32(blk[3])));
  return _mm512_castps256_ps512(_mm256_cvtph_ps(dm16));
}

template <GgmlType kType>
inline WGroup decode_group(const uint8_t* const* blk, const uint8_t* group, bool full) {
  using L = Layout<kType>;
  const __m512i perm_d = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  const __m512 dm = scales_of<kType>(blk, group, full);
  WGroup w;
  w.wd = _mm512_permutexvar_ps(perm_d, dm);
  if constexpr (kType == GgmlType::Q8_0) {
    const __m512i a = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0] + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1] + 2)), 1);
    const __m512i c = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[2] + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[3] + 2)), 1);
    const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
    w.lo = _mm512_xor_si512(_mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0)), c128);
    w.hi = _mm512_xor_si512(_mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1)), c128);
    w.wm = _mm512_setzero_si512();
  } else {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i v = load4x128(blk[0] + L::kQs, blk[1] + L::kQs, blk[2] + L::kQs, blk[3] + L::kQs);
    w.lo = _mm512_and_si512(v, nib);
    w.hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    if constexpr (L::kQh != 0) {
      uint64_t klo = 0, khi = 0;
      for (int b = 0; b < kG; ++b) {
        const uint64_t qh = load_u32(blk[b] + L::kQh);
        klo |= (qh & 0xFFFF) << (16 * b);
        khi |= (qh >> 16) << (16 * b);
      }
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      w.lo = _mm512_or_si512(w.lo, _mm512_maskz_mov_epi8(klo, bit4));
      w.hi = _mm512_or_si512(w.hi, _mm512_maskz_mov_epi8(khi, bit4));
    }
    if constexpr (L::kMin) {
      const __m512i perm_m = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
      w.wm = _mm512_castps_si512(_mm512_permutexvar_ps(perm_m, dm));
    } else {
      w.wm = _mm512_setzero_si512();  // the offset is in the activation's correction (kIntMode)
    }
  }
  return w;
}

// Decodes group g of a row (handles the zero-padded tail group).
template <GgmlType kType>
inline WGroup decode_row_group(const uint8_t* row, int64_t nb, int64_t g) {
  constexpr size_t bb = Layout<kType>::kBB;
  const int64_t first = g * kG;
  const uint8_t* group = row + first * bb;
  const uint8_t* blk[4];
  const bool full = first + kG <= nb;
  for (int b = 0; b < kG; ++b) blk[b] = (full || first + b < nb) ? group + b * bb : kZeroBlock;
  return decode_group<kType>(blk, group, full);
}

inline void store_group(const WGroup& w, uint8_t* rec) {
  _mm512_store_si512(rec, w.lo);
  _mm512_store_si512(rec + 64, w.hi);
  _mm512_store_ps(reinterpret_cast<float*>(rec + 128), w.wd);
  _mm512_store_si512(rec + 192, w.wm);
}

inline WGroup load_group(const uint8_t* rec) {
  return {_mm512_load_si512(rec), _mm512_load_si512(rec + 64),
          _mm512_load_ps(reinterpret_cast<const float*>(rec + 128)), _mm512_load_si512(rec + 192)};
}

// The exact integer lane sums of one group (16 lanes: block b's lanes 4b..4b+3).
// kMode 0: s8 x; 1: the activation record's correction first, then u8 weights
// times s8 x: Q8_0 direct (weights w + 128, lane correction -128 * sum(x), so
// each lane holds sum(w * x)) and Q4_0 / Q5_0 (weights as stored, block
// correction -8 or -16 * sum(x) in lane 4b, so the block sums are exactly
// sum((w - 8) * x) or sum((w - 16) * x)); 2: Q8_0 staged (u8 x + 128, s8
// weights, the record's correction -128 * sum(w) first). For Q8_0, 1 and 2 give
// each lane the same exact integer sum(w * x), so everything after is identical.
template <int kMode>
inline __m512i group_isum(const WGroup& w, const uint8_t* xt) {
  __m512i is;
  if constexpr (kMode == 1) {
    is = _mm512_dpbusd_epi32(_mm512_load_si512(xt + 192), w.lo, _mm512_load_si512(xt));
    is = _mm512_dpbusd_epi32(is, w.hi, _mm512_load_si512(xt + 64));
  } else if constexpr (kMode == 2) {
    is = _mm512_dpbusd_epi32(w.wm, _mm512_load_si512(xt), w.lo);
    is = _mm512_dpbusd_epi32(is, _mm512_load_si512(xt + 64), w.hi);
  } else {
    is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.lo, _mm512_load_si512(xt));
    is = _mm512_dpbusd_epi32(is, w.hi, _mm512_load_si512(xt + 64));
  }
  return is;
}

// Four rows' lane sums a, b, c, d -> one vector whose lane 4k + r holds row r's
// block k sum (exact integers: the order of the adds does not matter).
inline __m512i block_sums4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

// Lane 4k + r of the result: lane 4k (any of 4k..4k+3) of v[r] (row r's block k).
inline __m512 rows_lanes4(const __m512 (&v)[4]) {
  __m512 o = v[0];
  o = _mm512_mask_mov_ps(o, 0x2222, v[1]);
  o = _mm512_mask_mov_ps(o, 0x4444, v[2]);
  return _mm512_mask_mov_ps(o, 0x8888, v[3]);
}

// A decoded group as the staged path's record holds it: Q8_0 back to s8
// weights with wm = -128 * sum(w) per lane (mode 2 above); others unchanged.
template <GgmlType kType>
inline WGroup staged(WGroup w) {
  if constexpr (kType == GgmlType::Q8_0) {
    const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
    w.lo = _mm512_xor_si512(w.lo, c128);
    w.hi = _mm512_xor_si512(w.hi, c128);
    const __m512i corr = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w.lo), c128, w.hi);
    w.wm = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
  }
  return w;
}

// ---- Integer micro-kernels -------------------------------------------------------
// One group of a kR (= 4) row tile: each row's decoded quants (w[r].lo / hi, and
// for mode 2 its integer correction w[r].wm), and the tile's scales in the block-sum
// lane map: lane 4k + r of wd (wm) = row r's d (m, or Q4_0/Q5_0's implicit offset
// times d) of block k.
struct TileGroup {
  WGroup w[kR];
  __m512 wd, wm;
};

// A tile group from 4 rows' decoded groups (lane 4k + j of w[r].wd is its block k's d).
inline TileGroup tile_of(const WGroup& w0, const WGroup& w1, const WGroup& w2, const WGroup& w3) {
  TileGroup tg{{w0, w1, w2, w3}, {}, {}};
  tg.wd = rows_lanes4({w0.wd, w1.wd, w2.wd, w3.wd});
  tg.wm = rows_lanes4({_mm512_castsi512_ps(w0.wm), _mm512_castsi512_ps(w1.wm), _mm512_castsi512_ps(w2.wm),
                       _mm512_castsi512_ps(w3.wm)});
  return tg;
}

// The micro-kernel loop shared by the staged, direct and packed kernels: kR rows
// times T tokens, group by group; load(g) gives the tile's group g (TileGroup);
// x[t] activation records; out[t * kR + r].
//
// Batch invariance: per group, each row's exact integer lane sums are reduced to
// block sums (block_sums4), so one vector holds the 4 rows x 4 blocks of a token
// (lane 4k + r); then acc = fma(cvt(bsum), wd * xd, acc) [+ fma(wm, xs, acc)] per
// lane and, at the end, y[t, r] = (l_r + l_8+r) + (l_4+r + l_12+r). Every output
// sees that same op sequence whatever T, tile or thread it lands in (rows past
// the end are duplicates, whose lanes are dropped).
template <int T, int kMode, class LoadTile>
inline void qkernel_rows(LoadTile load, const uint8_t* const* x, int64_t ng, float* out) {
  static_assert(kR == 4, "block_sums4 / rows_lanes4 take 4 rows");
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const size_t o = static_cast<size_t>(g) * kRec;
    const TileGroup tg = load(g);
    for (int t = 0; t < T; ++t) {
      const uint8_t* xt = x[t] + o;
      const __m512i bs = block_sums4(group_isum<kMode>(tg.w[0], xt), group_isum<kMode>(tg.w[1], xt),
                                     group_isum<kMode>(tg.w[2], xt), group_isum<kMode>(tg.w[3], xt));
      // d_w * d_x first, then one fma per lane: ggml's per-block order.
      const __m512 dd = _mm512_mul_ps(tg.wd, _mm512_load_ps(reinterpret_cast<const float*>(xt + 128)));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bs), dd, acc[t]);
      if constexpr (kMode == 0) {  // the block's sum term sits in lane 4k: spread it over 4k..4k+3
        const __m512 xs = _mm512_permute_ps(_mm512_load_ps(reinterpret_cast<const float*>(xt + 192)), 0);
        acc[t] = _mm512_fmadd_ps(tg.wm, xs, acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m512 h = _mm512_add_ps(acc[t], _mm512_shuffle_f32x4(acc[t], acc[t], _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 q = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
    _mm_storeu_ps(out + t * kR, _mm512_castps512_ps128(q));
  }
}

// Staged records (Q8_0: mode 2).
template <GgmlType kType, int T>
void qkernel(const uint8_t* const* w, const uint8_t* const* x, int64_t ng, float* out) {
  qkernel_rows<T, kType == GgmlType::Q8_0 ? 2 : kIntMode<kType>>(
      [w](int64_t g) {
        const size_t o = static_cast<size_t>(g) * kRec;
        return tile_of(load_group(w[0] + o), load_group(w[1] + o), load_group(w[2] + o), load_group(w[3] + o));
      },
      x, ng, out);
}


// Direct (few tokens): decode each group in registers and use it at once.
// rows: kR row pointers; out[t * kR + r].
template <GgmlType kType, int T>
void qkernel_direct(const uint8_t* const* rows, int64_t nb, const uint8_t* const* x, int64_t ng, size_t prefetch,
                    float* out) {
  constexpr int kMode = kIntMode<kType>;
  constexpr size_t kGroupBytes = Layout<kType>::kBB * kG;
  qkernel_rows<T, kMode>(
      [rows, nb, prefetch](int64_t g) {
        for (int r = 0; r < kR; ++r)
          for (size_t b = 0; b < kGroupBytes; b += 64)
            prefetch_stream(rows[r] + prefetch + g * kGroupBytes + b);
        return tile_of(decode_row_group<kType>(rows[0], nb, g), decode_row_group<kType>(rows[1], nb, g),
                       decode_row_group<kType>(rows[2], nb, g), decode_row_group<kType>(rows[3], nb, g));
      },
      x, ng, out);
}

// ---- Packed weights (pack.h) ------------------------------------------------------
static_assert(kR == kPackRows && kG == kPackBlocks, "pack.h's tile is the kernel's row tile and group");

// Row r's quants of a packed group: q its nibble bytes (or Q8_0's two u8
// vectors), qh the group's qh line (Q5_0 / Q5_1: row r's two u64 masks at
// 16r, pack.h). lo / hi as decode_group makes them from the GGUF blocks: the
// nibbles (a value's high bit added where its mask bit is set: lo < 16, so
// adding 16 is decode_group's or), or Q8_0's bytes.
template <GgmlType kType>
inline void packed_quants(const uint8_t* q, const uint8_t* qh, int r, __m512i& lo, __m512i& hi) {
  if constexpr (kType == GgmlType::Q8_0) {
    lo = _mm512_load_si512(q);
    hi = _mm512_load_si512(q + 64);
  } else {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_load_si512(q);
    lo = _mm512_and_si512(v, nib);
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    if constexpr (pack_has_qh(kType)) {
      uint64_t klo, khi;
      std::memcpy(&klo, qh + 16 * r, 8);
      std::memcpy(&khi, qh + 16 * r + 8, 8);
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      lo = _mm512_mask_add_epi8(lo, klo, lo, bit4);
      hi = _mm512_mask_add_epi8(hi, khi, hi, bit4);
    } else {
      (void)qh;
      (void)r;
    }
  }
}

// Row r (0..3) of a packed tile, group g: the same registers decode_row_group
// gives from the GGUF row (same values in the same lanes).
template <GgmlType kType>
inline WGroup packed_group(const uint8_t* tile, size_t scales_off, int64_t g, int r) {
  constexpr size_t qb = pack_quant_bytes(kType), sb = pack_scale_bytes(kType), gb = pack_group_bytes(kType);
  const uint8_t* q = tile + static_cast<size_t>(g) * gb;
  const uint8_t* s = tile + scales_off + static_cast<size_t>(g) * sb;
  // lane l of row r takes d of block l / 4: scale 4r + l / 4.
  const __m512i idx =
      _mm512_add_epi32(_mm512_set1_epi32(4 * r), _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
  WGroup w;
  w.wd = packed_scales(s, idx);
  packed_quants<kType>(q + r * qb, q + kPackRows * qb, r, w.lo, w.hi);
  // m (Q4_1 / Q5_1); Q8_0 and the implicit offsets need none (kIntMode).
  w.wm = pack_has_min(kType) ? _mm512_castps_si512(packed_scales(s + 32, idx)) : _mm512_setzero_si512();
  return w;
}

// Group g of a packed tile as the kernel's TileGroup: the same values in the
// same lanes as tile_of over the 4 rows' packed_group (or decode_row_group), so
// packed and unpacked weights give bitwise the same outputs.
template <GgmlType kType>
inline TileGroup packed_tile_group(const uint8_t* tile, size_t scales_off, int64_t g) {
  constexpr size_t qb = pack_quant_bytes(kType), sb = pack_scale_bytes(kType), gb = pack_group_bytes(kType);
  const uint8_t* q = tile + static_cast<size_t>(g) * gb;
  const uint8_t* s = tile + scales_off + static_cast<size_t>(g) * sb;
  TileGroup tg;
  for (int r = 0; r < kR; ++r) {
    packed_quants<kType>(q + r * qb, q + kPackRows * qb, r, tg.w[r].lo, tg.w[r].hi);
    tg.w[r].wm = _mm512_setzero_si512();  // only the staged mode reads it
  }
  // packed scale 4r + k (row r, block k) -> lane 4k + r
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  tg.wd = packed_scales(s, tr);
  tg.wm = pack_has_min(kType) ? packed_scales(s + 32, tr) : _mm512_setzero_ps();  // m, or none (kIntMode)
  return tg;
}

// How far ahead (bytes) the packed direct kernel prefetches its stream. This
// machine's hardware prefetchers do not keep one core's stream ahead: without it
// bench_decode reads Q4_0 at a third of the speed; 8-16 KB ahead measured best
// (2-4 KB slower; see docs/benchmarks-history.md), into L1 on Zen 5 and into L2
// on the Intel Xeon (prefetch_stream: cpu_internal.h).
constexpr size_t kPackedPrefetch = 16384;

// Direct kernel over one packed tile (kR rows), T tokens; out[t * kR + r].
// Prefetches the stream kPackedPrefetch bytes ahead: each group the
// tile_bytes / ng bytes that lie that far ahead of its share of the tile
// (quants and scales alike; past the buffer's end a prefetch is harmless).
template <GgmlType kType, int T>
void qkernel_packed(const uint8_t* tile, const PackLayout& l, const uint8_t* const* x, float* out) {
  constexpr int kMode = kIntMode<kType>;
  const size_t step = (l.tile_bytes + static_cast<size_t>(l.ng) - 1) / static_cast<size_t>(l.ng);
  const size_t scales_off = l.scales_off;
  qkernel_rows<T, kMode>(
      [tile, scales_off, step](int64_t g) {
        const char* p = reinterpret_cast<const char*>(tile + kPackedPrefetch + static_cast<size_t>(g) * step);
        for (size_t b = 0; b < step; b += 64) prefetch_stream(p + b);
        return packed_tile_group<kType>(tile, scales_off, g);
      },
      x, l.ng, out);
}

// Weight source of matmul_q32_src (matmul_driver.inc) over a packed copy.
template <GgmlType kType>
struct PackedSource {
  static constexpr bool kAlwaysDirect = true;
  const uint8_t* base;
  PackLayout l;
  WGroup group(int64_t row, int64_t g) const {
    return packed_group<kType>(base + static_cast<size_t>(row / kPackRows) * l.tile_bytes, l.scales_off, g,
                               static_cast<int>(row % kPackRows));
  }
  // row0 is a multiple of kR (chunks are kChunkRows rows); padded rows are zero.
  template <int T>
  void direct(int64_t row0, int64_t /*last*/, const uint8_t* const* xp, int64_t ng, float* out) const {
    (void)ng;  // == l.ng
    qkernel_packed<kType, T>(base + static_cast<size_t>(row0 / kPackRows) * l.tile_bytes, l, xp, out);
  }
};

// ---- Float micro-kernel (F32 rows; F16/BF16/K-quants are converted first) --------
// The float micro-kernel loop shared by fkernel and hkernel_direct: T tokens
// times kR rows, 16 columns at a time, then a masked tail. load(r, c, m, tail)
// gives row r's weights at columns c.. as f32 (lanes off in m zero); `tail` is
// std::true_type only in the tail, so each path compiles to its own loads.
template <int T, class LoadW>
inline void fkernel_rows(LoadW load, const float* const* x, int64_t k, float* out) {
  __m512 acc[kR][T];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    for (int r = 0; r < kR; ++r) {
      const __m512 wv = load(r, c, static_cast<__mmask16>(0xFFFF), std::false_type{});
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[t] + c), acc[r][t]);
    }
  }
  if (c < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - c)) - 1);
    for (int r = 0; r < kR; ++r) {
      const __m512 wv = load(r, c, m, std::true_type{});
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[t] + c), acc[r][t]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) out[t * kR + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int T>
void fkernel(const float* const* w, const float* const* x, int64_t k, float* out) {
  fkernel_rows<T>(
      [w](int r, int64_t c, __mmask16 m, auto tail) {
        if constexpr (decltype(tail)::value) {
          return _mm512_maskz_loadu_ps(m, w[r] + c);
        } else {
          return _mm512_loadu_ps(w[r] + c);
        }
      },
      x, k, out);
}

void fkernel_n(int nt, const float* const* w, const float* const* x, int64_t k, float* out) {
  switch (nt) {
    case 1: fkernel<1>(w, x, k, out); break;
    case 2: fkernel<2>(w, x, k, out); break;
    case 3: fkernel<3>(w, x, k, out); break;
    default: fkernel<4>(w, x, k, out); break;
  }
}

// 16 weights at column c of a half-precision row as f32 (exact conversion).
template <GgmlType kType>
inline __m512 load_half16(const uint8_t* row, int64_t c, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * c);
  if constexpr (kType == GgmlType::F16) {
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Direct F16/BF16 kernel for few tokens: converts in registers; the op sequence
// per output is exactly fkernel's (same lanes, same masked tail).
template <GgmlType kType, int T>
void hkernel_direct(const uint8_t* const* w, const float* const* x, int64_t k, size_t prefetch, float* out) {
  fkernel_rows<T>(
      [w, prefetch](int r, int64_t c, __mmask16 m, auto tail) {
        if constexpr (!decltype(tail)::value) {
          if ((c & 31) == 0) prefetch_stream(w[r] + prefetch + 2 * c);
        }
        return load_half16<kType>(w[r], c, m);
      },
      x, k, out);
}

template <GgmlType kType>
void hkernel_direct_n(int nt, const uint8_t* const* w, const float* const* x, int64_t k, size_t prefetch,
                      float* out) {
  switch (nt) {
    case 1: hkernel_direct<kType, 1>(w, x, k, prefetch, out); break;
    case 2: hkernel_direct<kType, 2>(w, x, k, prefetch, out); break;
    case 3: hkernel_direct<kType, 3>(w, x, k, prefetch, out); break;
    default: hkernel_direct<kType, 4>(w, x, k, prefetch, out); break;
  }
}

// Converts one weight row to f32. out: [k]
void row_to_f32(const WeightView& w, int64_t r, float* out) {
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
  const int64_t k = w.cols;
  int64_t c = 0;
  if (w.type == GgmlType::F16) {
    for (; c + 16 <= k; c += 16)
      _mm512_storeu_ps(out + c, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * c))));
  } else if (w.type == GgmlType::BF16) {
    for (; c + 16 <= k; c += 16) {
      const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * c)));
      _mm512_storeu_ps(out + c, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
    }
  }
  if (c < k) dequantize_row(w.type, src + ggml_row_bytes(w.type, static_cast<size_t>(c)), out + c, k - c);
}

// Tokens up to which GGUF rows (not packed: PAGODA_PACK=0, row slices) are
// decoded in registers (in tiles of kQT tokens) instead of staged once per
// chunk: staging every weight costs about as much as a few direct tiles, so a
// speculative verify step (1 + k tokens) stays direct. Packed tiles are always
// read directly (PackedSource::kAlwaysDirect).
constexpr int64_t kDirectMaxTokens = 12;


constexpr bool kAvx512 = true;
constexpr int64_t kFloatLanes = 16;

#include "kernels/cpu/matmul_driver.inc"

template <GgmlType kType>
void matmul_q32_t(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  if constexpr (is_packable_type(kType)) {
    if (w.packed != nullptr) {
      if constexpr (panel_type(kType)) {
        if (n_tokens >= kPanelMinTokens) {
          matmul_panels<kType>(w, x, n_tokens, y);
          return;
        }
      }
      static_assert(kChunkRows % kPackRows == 0 && kGemmChunkRows % kPackRows == 0);
      const PackedSource<kType> src{static_cast<const uint8_t*>(w.packed), pack_layout(kType, w.rows, w.cols)};
      matmul_q32_src<kType>(w, src, x, n_tokens, y);
      return;
    }
  }
  matmul_q32_rows<kType>(w, x, n_tokens, y);
}

}  // namespace

void matmul_avx512(const WeightView& w, const float* x, int64_t n_tokens, float* y) { matmul_isa(w, x, n_tokens, y); }

}  // namespace pagoda::kernels::cpu::detail
