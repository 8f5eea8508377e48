// Internal to kernels/cpu: the AVX-512 attention's per-head machinery, shared by
// one token's decode (attention_avx512.cc) and prefill tiles
// (attention_tile_avx512.cc).
//
// AVX-512 attention of one token over its paged keys, for one KV head and the
// query heads sharing it (GQA): every K/V row is decoded to f32 in registers
// (no staging) and serves all those heads. Keys go in chunks of up to 16
// logical positions that never cross a page (page-relative offsets 0, 16, 32,
// ...), so the chunking depends only on the logical positions and the page size.
// Per head and chunk: 16 dot products (one fixed multiply-add chain over the
// head's 16-lane vectors, then one fixed reduction tree that puts key j's score
// in lane j), the chunk max, one rescale of the running output when the max
// moved, exp, then p * V in key order (online softmax). Every float op of a
// head depends only on its query, its keys and its position, never on the other
// heads, other tokens, physical block ids or the thread count.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/kv_rows_avx512.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels::cpu::detail {

constexpr int kChunk = 16;    // keys per chunk (lanes of a score vector)
constexpr int kMaxBatch = 4;  // query heads sharing one pass over the keys
constexpr int kPrefetchChunks = 1;  // chunks read ahead (1, 2, 4, 8 and L2 hints measured alike)
constexpr int kMaxFull = 4;         // full head batches per KV head a span or tile walk takes (else head by head)

// vec_math's exp_lanes on 16 lanes, for softmax's x <= 0 only (its
// kNonPositive, the only form taken here): each lane bitwise what exp8 gives it.
struct Avx512Ops {
  using V = __m512;
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // y * 2^n for integral n in [-126, 0]: the exact product (rounded once where
  // it is subnormal), as Avx2Ops' mul(y, pow2(n)) gives it.
  static V mul_pow2(V y, V n) { return _mm512_scalef_ps(y, n); }
};

// For x <= 0 (or NaN) in the lanes of `valid`, zero in the others: there
// exp_lanes' bits in fewer ops (its kNonPositive; the lanes below kExpLow
// zeroed with the others, one masked compare and one masked move).
inline __m512 exp16_nonpos(__m512 x, __mmask16 valid) {
  const __mmask16 keep = _mm512_mask_cmp_ps_mask(valid, x, _mm512_set1_ps(kExpLow), _CMP_NLT_UQ);
  return _mm512_maskz_mov_ps(keep, exp_lanes<Avx512Ops, true>(x));
}

// v[g] reduced over its 16 lanes by op, for g = 0..3, into lane g: lanes i and
// i + 8 first, then i and i + 4, then i and i + 2, then 0 and 1 (the tree of
// _mm512_reduce_add_ps / _max_ps), the four vectors side by side in each step.
template <class Op>
inline __m128 reduce4(const __m512* v, Op op) {
  const __m512 ab = op(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
  const __m512 cd = op(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
  __m512 x = op(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));  // head g: 128-bit lane g
  x = op(x, _mm512_permute_ps(x, 0x4E));
  x = op(x, _mm512_permute_ps(x, 0xB1));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), x));
}

// The next span's K/V go to L2 through prefetch_l2 (cpu_internal.h, inline asm):
// with GCC 12 dropping every _mm_prefetch(p, _MM_HINT_T1) of this file, decode at
// depth read K/V on demand: 9.7 against 16.9 GB/s with them
// (bench_attention_decode 1 4096 2 20 16 f16 1 8 4, Intel Xeon model 167).

// The cache row (slot) of logical key `key` through the sequence's page table
// (one division by the runtime page size: callers take it once per chunk or
// page, not per key).
inline size_t cache_row(const int32_t* pages, int32_t bs, int64_t key) {
  return static_cast<size_t>(pages[key / bs]) * static_cast<size_t>(bs) + static_cast<size_t>(key % bs);
}

// The K and V slices of keys [p0, p1) into L2: bytes [k_off, k_off + k_len) of
// each K row and [v_off, v_off + v_len) of each V row, walked page by page (one
// division by the runtime page size a page, not a key: per key it cost the
// prefill tile 2% at depth 4096, model 207). Only prefetches.
inline void prefetch_key_slices(const KvLayerView& kv, const int32_t* pages, int64_t p0, int64_t p1, size_t k_off,
                                size_t k_len, size_t v_off, size_t v_len) {
  const int32_t bs = kv.block_size;
  for (int64_t key = p0; key < p1;) {
    const int64_t stop = std::min(p1, (key / bs + 1) * bs);
    const size_t r0 = cache_row(pages, bs, key);
    for (size_t r = r0; r < r0 + static_cast<size_t>(stop - key); ++r) {
      const size_t ko = r * kv.row_bytes + k_off, vo = r * kv.v_row_bytes + v_off;
      for (size_t b = ko & ~size_t{63}; b < ko + k_len; b += 64) prefetch_l2(kv.k + b);
      for (size_t b = vo & ~size_t{63}; b < vo + v_len; b += 64) prefetch_l2(kv.v + b);
    }
    key = stop;
  }
}

// The chunk of keys starting at c0 (a chunk start): its end, never past the page
// or the token's last key.
inline int64_t chunk_end(int64_t c0, int32_t bs, int64_t n_keys) {
  const int64_t page_end = (c0 / bs + 1) * bs;
  return std::min({c0 + kChunk, page_end, n_keys});
}

// The first chunk start of the token's keys: chunks start at page-relative
// offsets 0, 16, 32, ..., so every page boundary is a chunk start.
inline int64_t first_chunk(const TokenAttn& a) {
  const int32_t bs = a.kv->block_size;
  const int64_t page0 = a.first / bs * bs;
  return page0 + (a.first - page0) / kChunk * kChunk;
}

// The K and V slices of a run of KV heads, key after key from `key` to `end`,
// into L2 a few lines at a time: decode of one sequence (attend_kv_span) steps
// it once per key of p * V, at most `distance` keys ahead of the chunk being
// computed, so the reads ahead go out evenly between the loads they feed rather
// than in bursts that filled the core's miss buffers (a span's share at once).
// Only prefetches: never changes a result.
struct SlicePrefetch {
  const KvLayerView* kv = nullptr;
  const int32_t* pages = nullptr;
  int64_t key = 0, end = 0, distance = 0;
  size_t k_off = 0, v_off = 0, k_len = 0, v_len = 0;  // the slices' bytes in a row
  int per_step = 1;                                   // lines of K (and of V) per step
  const uint8_t* kp = nullptr;                        // the current key's slices, from their first line
  const uint8_t* vp = nullptr;
  size_t kn = 0, vn = 0, line = 0;                    // their bytes from that line; the next line's offset
  int64_t page = 0;                                   // key's page index and offset in it
  int32_t off = 0;

  // Any key (one division by the page size).
  void start(int64_t k) {
    key = k;
    if (key >= end) return;
    page = key / kv->block_size;
    off = static_cast<int32_t>(key % kv->block_size);
    load();
  }
  // The next key: page and offset stepped, not divided (a 64-bit division per
  // key left decode at depth 4096 2-10% slower, model 207).
  void advance() {
    ++key;
    if (++off == kv->block_size) {
      off = 0;
      ++page;
    }
    if (key < end) load();
  }
  void load() {
    const size_t r = static_cast<size_t>(pages[page]) * static_cast<size_t>(kv->block_size) + static_cast<size_t>(off);
    const uintptr_t ks = reinterpret_cast<uintptr_t>(kv->k + r * kv->row_bytes + k_off);
    const uintptr_t vs = reinterpret_cast<uintptr_t>(kv->v + r * kv->v_row_bytes + v_off);
    kp = reinterpret_cast<const uint8_t*>(ks & ~uintptr_t{63});
    vp = reinterpret_cast<const uint8_t*>(vs & ~uintptr_t{63});
    kn = ks + k_len - reinterpret_cast<uintptr_t>(kp);
    vn = vs + v_len - reinterpret_cast<uintptr_t>(vp);
    line = 0;
  }
  // Up to per_step lines of K and of V, never for keys at or past `now + distance`.
  void step(int64_t now) {
    const int64_t stop = std::min(end, now + distance);
    for (int n = 0; n < per_step && key < stop; ++n) {
      if (line < kn) prefetch_l2(kp + line);
      if (line < vn) prefetch_l2(vp + line);
      line += 64;
      if (line >= kn && line >= vn) advance();
    }
  }
};

// Heads [g0, g0 + HB) of KV head kv_head (queries q [HB, head_dim], head_dim =
// 16 * NV): the running state of their online softmax, advanced by run() over
// the chunks that start in a range of keys. A head's float operations depend
// only on the chunks, never on how the ranges split them, so a pass over all
// the keys at once and one resumed range by range give the same bits.
template <KvDtype DK, KvDtype DV, int NV, int HB>
struct HeadRun {
  static constexpr int32_t hd = 16 * NV;
  static constexpr int kHeads = HB;
  alignas(64) float acc[HB][hd];
  // Head g's running max and sum in lane g (lanes HB..3 unused: softmax
  // advances all four together).
  alignas(16) float mrun[kMaxBatch], lrun[kMaxBatch];

  void init() {
    for (int g = 0; g < HB; ++g) std::fill(acc[g], acc[g] + hd, 0.0f);
    for (int g = 0; g < kMaxBatch; ++g) {
      mrun[g] = -INFINITY;
      lrun[g] = 0.0f;
    }
  }
  void run(const TokenAttn& a, int32_t kv_head, const float* q, int64_t c_begin, int64_t c_end,
           SlicePrefetch* pf = nullptr);
  // The scores of one chunk of 16 keys from transposed K, kc: its hd vectors
  // of 16 keys (kc[d * 16 + j] = value d of key j, zero for keys not
  // decoded). sum[g] = head g's 16 key scores, unscaled, in the same float
  // operations as run()'s (the same bits). Inlined into the tile's token loop
  // (a call per token and chunk cost about 1%).
  [[gnu::always_inline]] static void scores_t(const float* q, const float* kc, __m512* sum);
  // A chunk's online-softmax update and p * V: sum[g] = head g's 16 key scores
  // (unscaled; lanes outside `valid` ignored), vrow[j] the V slice of key j for
  // j in [lo, hi), read as DVR rows. absorb = softmax, then pv.
  template <KvDtype DVR>
  void absorb(const TokenAttn& a, const __m512* sum, __mmask16 valid, int lo, int hi, const uint8_t* const* vrow,
              SlicePrefetch* pf, int64_t c0);
  // The softmax half: advances the running max and sum, writes p[g] = head
  // g's 16 exp(score - max) (zeros outside valid) and cs[g] = the factor its
  // running output takes; returns the heads whose output is rescaled (bit g).
  [[gnu::always_inline]] int softmax(const TokenAttn& a, const __m512* sum, __mmask16 valid, float (*p)[kChunk], float* cs);
  // The p * V half: the running outputs rescaled (heads in `rescale`, by
  // cs[g]), then + p[g][j] * V row j for j in [lo, hi), in key order; pf
  // (when set) stepped once per key, the chunk starting at c0.
  template <KvDtype DVR>
  [[gnu::always_inline]] void pv(const float (*p)[kChunk], const float* cs, int rescale, int lo, int hi,
                                 const uint8_t* const* vrow, SlicePrefetch* pf, int64_t c0);
  void finish(const TokenAttn& a, float* out) const {
    for (int g = 0; g < HB; ++g) {
      const float inv = a.n_keys > a.first ? 1.0f / lrun[g] : 0.0f;
      float* o = out + static_cast<int64_t>(g) * hd;
      for (int32_t d = 0; d < hd; ++d) o[d] = acc[g][d] * inv;
    }
  }
};

// The chunks starting in [c_begin, min(c_end, n_keys)); c_begin is a chunk start.
template <KvDtype DK, KvDtype DV, int NV, int HB>
void HeadRun<DK, DV, NV, HB>::run(const TokenAttn& a, int32_t kv_head, const float* q, int64_t c_begin, int64_t c_end,
                                  SlicePrefetch* pf) {
  const KvLayerView& kv = *a.kv;
  const int32_t bs = kv.block_size;
  const size_t k_off = KvRows<DK>::bytes(static_cast<int64_t>(kv_head) * hd);
  const size_t v_off = KvRows<DV>::bytes(static_cast<int64_t>(kv_head) * hd);
  const int64_t stop = std::min(c_end, a.n_keys);
  // The cache lines of [p, p + n) into L1.
  const auto prefetch_bytes = [](const uint8_t* p, size_t n) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
    for (uintptr_t l = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; l < end; l += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
    }
  };
  // Prefetches the token's keys of the chunk starting at c (its K and V rows).
  const auto prefetch_chunk = [&](int64_t c) {
    const int64_t e = chunk_end(c, bs, a.n_keys);
    const size_t slot = cache_row(a.pages, bs, c);  // a chunk never crosses a page
    for (int64_t key = std::max(c, a.first); key < e; ++key) {
      const size_t r = slot + static_cast<size_t>(key - c);
      prefetch_bytes(kv.k + r * kv.row_bytes + k_off, KvRows<DK>::bytes(hd));
      prefetch_bytes(kv.v + r * kv.v_row_bytes + v_off, KvRows<DV>::bytes(hd));
    }
  };
  // Chunk starts; `ahead` runs kPrefetchChunks chunks in front of the one computed.
  int64_t ahead = pf == nullptr ? c_begin : a.n_keys;  // with pf, its reads ahead instead
  for (int n = 0; n < kPrefetchChunks && ahead < a.n_keys; ++n) {
    prefetch_chunk(ahead);
    ahead = chunk_end(ahead, bs, a.n_keys);
  }
  for (int64_t c0 = c_begin; c0 < stop;) {
    const int64_t c1 = chunk_end(c0, bs, a.n_keys);
    if (ahead < a.n_keys) {
      prefetch_chunk(ahead);
      ahead = chunk_end(ahead, bs, a.n_keys);
    }
    if (a.ahead != nullptr) a.ahead->step();
    const int lo = static_cast<int>(std::max<int64_t>(a.first, c0) - c0), hi = static_cast<int>(c1 - c0);
    const __mmask16 valid = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    const uint8_t* krow[kChunk];
    const uint8_t* vrow[kChunk];
    const size_t slot = cache_row(a.pages, bs, c0);  // the chunk's rows: slot, slot + 1, ...
    for (int j = lo; j < hi; ++j) {
      krow[j] = kv.k + (slot + static_cast<size_t>(j)) * kv.row_bytes + k_off;
      vrow[j] = kv.v + (slot + static_cast<size_t>(j)) * kv.v_row_bytes + v_off;
    }
    // Scores: key by key, each K vector decoded once for all the heads (the
    // queries stay in registers); head g's dot product with key j is its own
    // chain q0*k0, then + q1*k1, ... as if alone.
    __m512 qv[HB][NV];
    for (int g = 0; g < HB; ++g) {
      for (int i = 0; i < NV; ++i) qv[g][i] = _mm512_loadu_ps(q + static_cast<int64_t>(g) * hd + 16 * i);
    }
    // The scores of key j, or zeros when j is outside [lo, hi).
    const auto score = [&](int j, __m512* sj) {
      if (j < lo || j >= hi) {
        for (int g = 0; g < HB; ++g) sj[g] = _mm512_setzero_ps();
        return;
      }
      const __m512 k0 = KvRows<DK>::load16(krow[j], 0);
      for (int g = 0; g < HB; ++g) sj[g] = _mm512_mul_ps(qv[g][0], k0);
      for (int i = 1; i < NV; ++i) {
        const __m512 ki = KvRows<DK>::load16(krow[j], i);
        for (int g = 0; g < HB; ++g) sj[g] = _mm512_fmadd_ps(qv[g][i], ki, sj[g]);
      }
    };
    // Lane j of a head's score vector = the sum of its key-j products' 16 lanes,
    // always by the same tree: pairs within 128-bit lanes (keys 2i, 2i+1), then
    // quads (two such pairs), then across the four 128-bit lanes (keys 0-7 and
    // 8-15, then both). It is folded in as the keys come, so that a few partial
    // vectors per head are live at once rather than all 16 keys' (which spilled).
    __m512 x[HB][2], z[HB][2], s8[HB][2];
    #pragma GCC unroll 8
    for (int i = 0; i < kChunk / 2; ++i) {
      __m512 ka[HB], kb[HB];
      score(2 * i, ka);
      score(2 * i + 1, kb);
      for (int g = 0; g < HB; ++g) {
        x[g][i & 1] = _mm512_add_ps(_mm512_unpacklo_ps(ka[g], kb[g]), _mm512_unpackhi_ps(ka[g], kb[g]));
      }
      if (i & 1) {
        for (int g = 0; g < HB; ++g) {
          const __m512 x0 = x[g][0], x1 = x[g][1];
          z[g][(i >> 1) & 1] = _mm512_add_ps(_mm512_shuffle_ps(x0, x1, 0x44), _mm512_shuffle_ps(x0, x1, 0xEE));
        }
      }
      if ((i & 3) == 3) {
        for (int g = 0; g < HB; ++g) {
          const __m512 z0 = z[g][0], z1 = z[g][1];
          s8[g][i >> 2] = _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x44), _mm512_shuffle_f32x4(z0, z1, 0xEE));
        }
      }
    }
    __m512 sum[HB];
    for (int g = 0; g < HB; ++g) {
      const __m512 s0 = s8[g][0], s1 = s8[g][1];
      sum[g] = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s1, 0x88), _mm512_shuffle_f32x4(s0, s1, 0xDD));
    }
    absorb<DV>(a, sum, valid, lo, hi, vrow, pf, c0);
    c0 = c1;
  }
}

template <KvDtype DK, KvDtype DV, int NV, int HB>
inline int HeadRun<DK, DV, NV, HB>::softmax(const TokenAttn& a, const __m512* sum, __mmask16 valid, float (*p)[kChunk],
                                     float* cs) {
  // The four heads' (HB of them; the rest zeros) horizontal max and sum go
  // through one shared tree each (reduce4 below). The max is exact whatever
  // the order; the sum adds the same pairs in the same order as
  // _mm512_reduce_add_ps (lanes i and i + 8, then i and i + 4, then i and
  // i + 2, then 0 and 1), so each head's sum keeps its bits.
  const __m512 scale = _mm512_set1_ps(a.scale);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  // The scaled scores in the valid lanes, -inf in the others (one masked multiply).
  __m512 masked[kMaxBatch];
  #pragma GCC unroll 4
  for (int g = 0; g < kMaxBatch; ++g) {
    masked[g] = g < HB ? _mm512_mask_mul_ps(ninf, valid, sum[g], scale) : _mm512_mask_mov_ps(ninf, valid, _mm512_setzero_ps());
  }
  const __m128 bm = reduce4(masked, [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); });
  const __m128 m_old = _mm_load_ps(mrun);
  const __m128 m_new = _mm_max_ps(bm, m_old);  // bm > m_old ? bm : m_old
  // Rescale only the heads whose max moved (exp(0) == 1 exactly otherwise).
  const __m128 moved = _mm_cmp_ps(m_new, m_old, _CMP_GT_OQ);
  const int rescale = _mm_movemask_ps(moved);
  __m128 corr = _mm_set1_ps(1.0f);
  __m128 l = _mm_load_ps(lrun);
  if (rescale != 0) {
    const __m128 c = _mm256_castps256_ps128(exp8(_mm256_zextps128_ps256(_mm_sub_ps(m_old, m_new))));
    corr = _mm_blendv_ps(corr, c, moved);
    l = _mm_blendv_ps(l, _mm_mul_ps(l, c), moved);
    _mm_store_ps(mrun, m_new);
  }
  alignas(16) float mn[kMaxBatch];
  _mm_storeu_ps(cs, corr);
  _mm_store_ps(mn, m_new);
  // score - max <= 0 in every valid lane (the max is over them), so
  // exp16_nonpos gives them exp8's bits; the other lanes are zeroed.
  __m512 e[kMaxBatch];
  #pragma GCC unroll 4
  for (int g = 0; g < kMaxBatch; ++g) {
    e[g] = g < HB ? exp16_nonpos(_mm512_sub_ps(masked[g], _mm512_set1_ps(mn[g])), valid) : _mm512_setzero_ps();
    if (g < HB) _mm512_store_ps(p[g], e[g]);
  }
  _mm_store_ps(lrun, _mm_add_ps(l, reduce4(e, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); })));
  return rescale;
}

template <KvDtype DK, KvDtype DV, int NV, int HB>
template <KvDtype DVR>
inline void HeadRun<DK, DV, NV, HB>::pv(const float (*p)[kChunk], const float* cs, int rescale, int lo, int hi,
                                const uint8_t* const* vrow, SlicePrefetch* pf, int64_t c0) {
  // p * V in key order, each V vector decoded once for all the heads. All
  // HB * NV running output vectors stay in registers over the chunk, so the
  // key loop has HB * NV independent multiply-add chains (each vector's own
  // chain still takes the keys in order).
  __m512 o[HB][NV];
  #pragma GCC unroll 16
  for (int g = 0; g < HB; ++g) {
    #pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) {
      o[g][i] = _mm512_load_ps(acc[g] + 16 * i);
      if (rescale & (1 << g)) o[g][i] = _mm512_mul_ps(o[g][i], _mm512_set1_ps(cs[g]));
    }
  }
  for (int j = lo; j < hi; ++j) {
    if (pf != nullptr) pf->step(c0);
    #pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) {
      const __m512 vv = KvRows<DVR>::load16(vrow[j], i);
      #pragma GCC unroll 16
      for (int g = 0; g < HB; ++g) o[g][i] = _mm512_fmadd_ps(_mm512_set1_ps(p[g][j]), vv, o[g][i]);
    }
  }
  #pragma GCC unroll 16
  for (int g = 0; g < HB; ++g) {
    #pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) _mm512_store_ps(acc[g] + 16 * i, o[g][i]);
  }
}

template <KvDtype DK, KvDtype DV, int NV, int HB>
template <KvDtype DVR>
void HeadRun<DK, DV, NV, HB>::absorb(const TokenAttn& a, const __m512* sum, __mmask16 valid, int lo, int hi,
                                     const uint8_t* const* vrow, SlicePrefetch* pf, int64_t c0) {
  alignas(64) float p[HB][kChunk];
  float cs[kMaxBatch];
  const int rescale = softmax(a, sum, valid, p, cs);
  pv<DVR>(p, cs, rescale, lo, hi, vrow, pf, c0);
}

template <KvDtype DK, KvDtype DV, int NV, int HB>
inline void HeadRun<DK, DV, NV, HB>::scores_t(const float* q, const float* kc, __m512* sum) {
  // Lane j of T_l (l < 16) = head g's product chain of key j over values l,
  // 16 + l, ...: q[l] * k[l], then + q[16 i + l] * k[16 i + l] fused, in that
  // order, as lane l of run()'s score vector of key j. run()'s reduction tree
  // gives key j the score ((S0 + S2) + (S1 + S3)) with S_c = (T_4c + T_4c+2) +
  // (T_4c+1 + T_4c+3): here the same adds, vertical, all 16 keys at once.
  // The loops are unrolled whole (GCC kept t in memory otherwise: 167 vs 183
  // GFLOP/s at depth 4096 on the Intel Xeon, model 167).
  // Each S_c is built pair by pair, (T_4c + T_4c+2) before T_4c+1 and T_4c+3
  // are computed, each pair's sum pinned where it is made (an empty asm), so
  // that about 20 vectors are live at once: GCC 12 otherwise moved work across
  // the unrolled steps and kept 33 vectors on the stack (prefill attention 3%
  // slower, bench_attention_prefill on the Intel Xeon model 207). Only the
  // order of independent operations changes: the same bits.
  __m512 lo_half[HB], hi_half[HB];  // S0 (+ S2) and S1 (+ S3)
  #pragma GCC unroll 16
  for (int c = 0; c < 4; ++c) {
    __m512 pair[2][HB];  // T_4c + T_4c+2, T_4c+1 + T_4c+3
    #pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      __m512 t[2][HB];
      #pragma GCC unroll 16
      for (int e = 0; e < 2; ++e) {
        const int l = 4 * c + h + 2 * e;
        const __m512 k0 = _mm512_load_ps(kc + l * kChunk);
        #pragma GCC unroll 16
        for (int g = 0; g < HB; ++g) t[e][g] = _mm512_mul_ps(_mm512_set1_ps(q[g * hd + l]), k0);
        #pragma GCC unroll 16
        for (int i = 1; i < NV; ++i) {
          const __m512 ki = _mm512_load_ps(kc + (16 * i + l) * kChunk);
          #pragma GCC unroll 16
          for (int g = 0; g < HB; ++g) {
            t[e][g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + 16 * i + l]), ki, t[e][g]);
          }
        }
      }
      #pragma GCC unroll 16
      for (int g = 0; g < HB; ++g) {
        pair[h][g] = _mm512_add_ps(t[0][g], t[1][g]);
        asm("" : "+v"(pair[h][g]));
      }
    }
    #pragma GCC unroll 16
    for (int g = 0; g < HB; ++g) {
      const __m512 sc = _mm512_add_ps(pair[0][g], pair[1][g]);
      if (c == 0) lo_half[g] = sc;
      else if (c == 1) hi_half[g] = sc;
      else if (c == 2) lo_half[g] = _mm512_add_ps(lo_half[g], sc);
      else hi_half[g] = _mm512_add_ps(hi_half[g], sc);
    }
  }
  #pragma GCC unroll 16
  for (int g = 0; g < HB; ++g) sum[g] = _mm512_add_ps(lo_half[g], hi_half[g]);
}

// Heads [g0, g0 + HB) of the token's KV head, over all its keys in one run.
template <KvDtype DK, KvDtype DV, int NV, int HB>
void attend_heads(const TokenAttn& a, int32_t g0) {
  constexpr int32_t hd = 16 * NV;
  HeadRun<DK, DV, NV, HB> h;
  h.init();
  h.run(a, a.kv_head, a.q + static_cast<int64_t>(g0) * hd, first_chunk(a), a.n_keys);
  h.finish(a, a.out + static_cast<int64_t>(g0) * hd);
}

// All the token's heads, up to kMaxBatch (fewer for wide heads: their running
// outputs stay in registers) per pass over the keys.
template <KvDtype DK, KvDtype DV, int NV>
void attend_all(const TokenAttn& a) {
  constexpr int kBatch = std::max(1, std::min(kMaxBatch, 16 / NV));
  int32_t g = 0;
  for (; g + kBatch <= a.n_heads; g += kBatch) attend_heads<DK, DV, NV, kBatch>(a, g);
  switch (a.n_heads - g) {  // the rest: fewer than kBatch heads
    case 0: break;
    case 1: attend_heads<DK, DV, NV, 1>(a, g); break;
    case 2: if constexpr (kBatch > 2) attend_heads<DK, DV, NV, 2>(a, g); break;
    default: if constexpr (kBatch > 3) attend_heads<DK, DV, NV, 3>(a, g); break;
  }
}

// The (K, V) type pairs taken here: every type with itself, and the mixed
// pairs llama.cpp users run (-ctk f16/q8_0 with a smaller -ctv). Others take
// the AVX2 path (attention.cc), on every machine, so the choice never depends
// on the batch.
#define PAGODA_KV_PAIRS(X)                                                                                  \
  X(F32, F32) X(F16, F16) X(BF16, BF16) X(Q8_0, Q8_0) X(Q4_0, Q4_0) X(Q4_1, Q4_1) X(IQ4_NL, IQ4_NL) \
      X(Q5_0, Q5_0) X(Q5_1, Q5_1) X(F16, Q8_0) X(F16, Q4_0) X(Q8_0, Q4_0)

// Tokens of one sequence and one KV head (a prefill tile): attention_tile_avx512.cc,
// instantiated there for every pair above and head size.
template <KvDtype DK, KvDtype DV, int NV>
void attend_tile(const TokenAttn* toks, int nt);

}  // namespace pagoda::kernels::cpu::detail
