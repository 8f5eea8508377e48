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
#include "kernels/cpu/attention_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/kv_rows_avx512.h"
#include "kernels/cpu/transpose_avx512.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels::cpu::detail {
namespace {

constexpr int kChunk = 16;    // keys per chunk (lanes of a score vector)
constexpr int kMaxBatch = 4;  // query heads sharing one pass over the keys
constexpr int kPrefetchChunks = 1;  // chunks read ahead (1, 2, 4, 8 and L2 hints measured alike)

// vec_math's exp_lanes on 16 lanes: each lane bitwise what exp8 gives it.
struct Avx512Ops {
  using V = __m512;
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V pow2(V n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static V zero_below(V x, V lo, V y) {
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ)), y);
  }
};

inline __m512 exp16(__m512 x) { return exp_lanes<Avx512Ops>(x); }

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

  void start(int64_t k) {
    key = k;
    if (key >= end) return;
    const int32_t bs = kv->block_size;
    const size_t r = static_cast<size_t>(pages[key / bs]) * static_cast<size_t>(bs) + static_cast<size_t>(key % bs);
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
      if (line >= kn && line >= vn) start(key + 1);
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
  // operations as run()'s (the same bits).
  static void scores_t(const float* q, const float* kc, __m512* sum);
  // A chunk's online-softmax update and p * V: sum[g] = head g's 16 key scores
  // (unscaled; lanes outside `valid` ignored), vrow[j] the V slice of key j for
  // j in [lo, hi), read as DVR rows. absorb = softmax, then pv.
  template <KvDtype DVR>
  void absorb(const TokenAttn& a, const __m512* sum, __mmask16 valid, int lo, int hi, const uint8_t* const* vrow,
              SlicePrefetch* pf = nullptr, int64_t c0 = 0);
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
  // The cache slot of the chunk starting at c0's first row: a chunk never
  // crosses a page, so its rows are consecutive slots of one page (one page
  // lookup and one division per chunk, not per key).
  const auto chunk_slot = [&](int64_t c0) {
    return static_cast<size_t>(static_cast<int64_t>(a.pages[c0 / bs]) * bs + c0 % bs);
  };
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
    const size_t slot = chunk_slot(c);
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
    const size_t slot = chunk_slot(c0);
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
  __m512 sc[kMaxBatch];
  #pragma GCC unroll 4
  for (int g = 0; g < kMaxBatch; ++g) sc[g] = g < HB ? _mm512_mul_ps(sum[g], scale) : _mm512_setzero_ps();
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 masked[kMaxBatch];
  #pragma GCC unroll 4
  for (int g = 0; g < kMaxBatch; ++g) masked[g] = _mm512_mask_mov_ps(ninf, valid, sc[g]);
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
  __m512 e[kMaxBatch];
  #pragma GCC unroll 4
  for (int g = 0; g < kMaxBatch; ++g) {
    e[g] = g < HB ? _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(sc[g], _mm512_set1_ps(mn[g])))) : _mm512_setzero_ps();
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
void HeadRun<DK, DV, NV, HB>::scores_t(const float* q, const float* kc, __m512* sum) {
  // Lane j of T_l (l < 16) = head g's product chain of key j over values l,
  // 16 + l, ...: q[l] * k[l], then + q[16 i + l] * k[16 i + l] fused, in that
  // order, as lane l of run()'s score vector of key j. run()'s reduction tree
  // gives key j the score ((S0 + S2) + (S1 + S3)) with S_c = (T_4c + T_4c+2) +
  // (T_4c+1 + T_4c+3): here the same adds, vertical, all 16 keys at once.
  // The loops are unrolled whole (GCC kept t in memory otherwise: 167 vs 183
  // GFLOP/s at depth 4096 on the Intel Xeon, model 167).
  __m512 lo_half[HB], hi_half[HB];  // S0 (+ S2) and S1 (+ S3)
  #pragma GCC unroll 16
  for (int c = 0; c < 4; ++c) {
    __m512 t[4][HB];
    #pragma GCC unroll 16
    for (int m = 0; m < 4; ++m) {
      const int l = 4 * c + m;
      const __m512 k0 = _mm512_load_ps(kc + l * kChunk);
      #pragma GCC unroll 16
      for (int g = 0; g < HB; ++g) t[m][g] = _mm512_mul_ps(_mm512_set1_ps(q[g * hd + l]), k0);
      #pragma GCC unroll 16
      for (int i = 1; i < NV; ++i) {
        const __m512 ki = _mm512_load_ps(kc + (16 * i + l) * kChunk);
        #pragma GCC unroll 16
        for (int g = 0; g < HB; ++g) {
          t[m][g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * hd + 16 * i + l]), ki, t[m][g]);
        }
      }
    }
    #pragma GCC unroll 16
    for (int g = 0; g < HB; ++g) {
      const __m512 sc = _mm512_add_ps(_mm512_add_ps(t[0][g], t[2][g]), _mm512_add_ps(t[1][g], t[3][g]));
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

// Several KV heads of one token (TokenAttn::n_kv > 1), walked span by span (kSpanKeys keys):
// every head's runs take the span's chunks before the next span starts, so the
// token's rows are read as runs of n_kv heads' slices rather than one head's
// 2-line slice per row per pass (measured on the Intel Xeon: a head-by-head
// pass over 1 KiB rows streams 3.5 GB/s on one thread). On Intel cores the
// slices of the keys ahead go to L2 through a SlicePrefetch cursor that p * V
// steps key by key; on AMD ones as before it (kBurstSpanKeys).
// Each head's float operations are those of attend_all: HeadRun gives the same
// bits whatever the ranges.
constexpr int kMaxKvRun = 8;   // KV heads one call takes (attention.cc never asks more)
constexpr int kMaxFull = 4;    // full head batches per KV head taken here (else head by head)
// Intel Xeon (model 167): 16-32 best, 128-256 26% slower (with the next span's
// slices prefetched in one burst per KV head, before the cursor). With the
// cursor (model 207, the benchmark below): 16 keys 0.397 / 0.879 ms a layer, 32
// 0.410 / 0.897, 64 0.40-0.61 / 0.903, 128 0.408 / 0.966 (2 / 1 threads).
constexpr int64_t kSpanKeys = 16;
// The slice cursor's reach (SlicePrefetch). Intel Xeon model 207,
// bench_attention_decode 1 4096 {1,2} 20 16 f16 0 8 4, ms a layer: 32 keys
// 0.99 / 0.46, 64 0.95 / 0.40, 128 0.90 / 0.41, 256 0.88 / 0.42 (1 / 2
// threads); a cursor stepped twice as fast: 1.07 / 0.45; the span bursts it
// replaced: 1.22 / 0.47.
constexpr int64_t kReadAheadKeys = 128;
// AMD cores keep what was measured there before the cursor (not yet measured
// with it): spans of 32 keys, the next span's slices into L2 a share per KV
// head, and each chunk's lines into L1 one chunk ahead (HeadRun::run without a
// cursor). Intel cores (g_stream_prefetch_l2) take the cursor.
constexpr int64_t kBurstSpanKeys = 32;

template <KvDtype DK, KvDtype DV, int NV, int R>
void attend_kv_span(const TokenAttn& a, int nfull) {
  constexpr int kBatch = std::max(1, std::min(kMaxBatch, 16 / NV));
  constexpr int32_t hd = 16 * NV;
  const KvLayerView& kv = *a.kv;
  const int32_t bs = kv.block_size;
  const int n_kv = a.n_kv;
  HeadRun<DK, DV, NV, kBatch> full[kMaxKvRun][kMaxFull];
  HeadRun<DK, DV, NV, std::max(R, 1)> rest[kMaxKvRun];
  for (int k = 0; k < n_kv; ++k) {
    for (int b = 0; b < nfull; ++b) full[k][b].init();
    if constexpr (R > 0) rest[k].init();
  }
  const size_t k_off = KvRows<DK>::bytes(static_cast<int64_t>(a.kv_head) * hd);
  const size_t v_off = KvRows<DV>::bytes(static_cast<int64_t>(a.kv_head) * hd);
  const size_t k_run = KvRows<DK>::bytes(static_cast<int64_t>(n_kv) * hd);
  const size_t v_run = KvRows<DV>::bytes(static_cast<int64_t>(n_kv) * hd);
  const bool cursor = g_stream_prefetch_l2;
  // Whole pages: spans split no chunk.
  const int64_t span = std::max<int64_t>(1, (cursor ? kSpanKeys : kBurstSpanKeys) / bs) * bs;
  int64_t s0 = first_chunk(a);
  // Keys [p0, p1)'s slices of the n_kv heads into L2 (without the cursor).
  const auto prefetch_keys = [&](int64_t p0, int64_t p1) {
    for (int64_t key = std::max(p0, a.first); key < p1; ++key) {
      const size_t r = static_cast<size_t>(a.pages[key / bs]) * bs + static_cast<size_t>(key % bs);
      const size_t ko = r * kv.row_bytes + k_off, vo = r * kv.v_row_bytes + v_off;
      for (size_t b = ko & ~size_t{63}; b < ko + k_run; b += 64) prefetch_l2(kv.k + b);
      for (size_t b = vo & ~size_t{63}; b < vo + v_run; b += 64) prefetch_l2(kv.v + b);
    }
  };
  // The run's slices of the keys ahead go to L2 through a cursor stepped once
  // per key of each head batch's p * V: per step, its share of a key's lines
  // (every head batch of every KV head steps it) rounded up, so that it runs
  // ahead up to kReadAheadKeys keys and is held there. The first chunk's lines
  // at once.
  const int64_t lines = static_cast<int64_t>((std::max(k_run, v_run) + 63) / 64 + 1);
  const int64_t steps_per_key = static_cast<int64_t>(n_kv) * (nfull + (R > 0 ? 1 : 0));
  SlicePrefetch pf{.kv = &kv, .pages = a.pages, .end = a.n_keys, .distance = kReadAheadKeys, .k_off = k_off,
                   .v_off = v_off, .k_len = k_run, .v_len = v_run,
                   .per_step = static_cast<int>((lines + steps_per_key - 1) / steps_per_key)};
  SlicePrefetch* const ahead = cursor ? &pf : nullptr;
  if (cursor) {
    pf.start(std::max(s0, a.first));
    while (pf.key < std::min(a.n_keys, s0 + kChunk)) pf.step(s0);
  } else {
    prefetch_keys(s0, std::min(a.n_keys, (s0 / span + 1) * span));
  }
  for (; s0 < a.n_keys;) {
    const int64_t s1 = (s0 / span + 1) * span;
    const int64_t n0 = s1, n1 = std::min(a.n_keys, s1 + span);
    for (int k = 0; k < n_kv; ++k) {
      if (!cursor && n0 < n1) prefetch_keys(n0 + (n1 - n0) * k / n_kv, n0 + (n1 - n0) * (k + 1) / n_kv);
      const float* qk = a.q + static_cast<int64_t>(k) * a.n_heads * hd;
      for (int b = 0; b < nfull; ++b) {
        full[k][b].run(a, a.kv_head + k, qk + static_cast<int64_t>(b) * kBatch * hd, s0, s1, ahead);
      }
      if constexpr (R > 0) rest[k].run(a, a.kv_head + k, qk + static_cast<int64_t>(nfull) * kBatch * hd, s0, s1, ahead);
    }
    s0 = s1;
  }
  for (int k = 0; k < n_kv; ++k) {
    float* ok = a.out + static_cast<int64_t>(k) * a.n_heads * hd;
    for (int b = 0; b < nfull; ++b) full[k][b].finish(a, ok + static_cast<int64_t>(b) * kBatch * hd);
    if constexpr (R > 0) rest[k].finish(a, ok + static_cast<int64_t>(nfull) * kBatch * hd);
  }
}

template <KvDtype DK, KvDtype DV, int NV>
void attend_kv(const TokenAttn& a) {
  constexpr int kBatch = std::max(1, std::min(kMaxBatch, 16 / NV));
  constexpr int32_t hd = 16 * NV;
  const int nfull = a.n_heads / kBatch, r = a.n_heads % kBatch;
  if (a.n_kv > kMaxKvRun || nfull > kMaxFull) {  // head by head, as n_kv single calls
    for (int k = 0; k < a.n_kv; ++k) {
      TokenAttn one = a;
      one.n_kv = 1;
      one.kv_head = a.kv_head + k;
      one.q = a.q + static_cast<int64_t>(k) * a.n_heads * hd;
      one.out = a.out + static_cast<int64_t>(k) * a.n_heads * hd;
      attend_all<DK, DV, NV>(one);
    }
    return;
  }
  switch (r) {
    case 0: attend_kv_span<DK, DV, NV, 0>(a, nfull); break;
    case 1: attend_kv_span<DK, DV, NV, 1>(a, nfull); break;
    case 2: if constexpr (kBatch > 2) attend_kv_span<DK, DV, NV, 2>(a, nfull); break;
    default: if constexpr (kBatch > 3) attend_kv_span<DK, DV, NV, 3>(a, nfull); break;
  }
}

// Several tokens of one sequence and KV head (a prefill tile), walked span by
// span (kTileSpanKeys keys, whole pages): every token's head runs take the
// span's chunks before the next span starts, so the span's K/V slices are read
// from memory once for the tile and then from cache, where one token after
// another over all the keys read them once per token (at depth 4096 a KV
// head's slices are 1 MiB of f16: Intel Xeon, prefill attention at half the
// tile's rate). Each head's float operations are those of attend_all: HeadRun
// gives the same bits whatever the ranges.
constexpr int kMaxTileTokens = kAvx512TileTokens;
constexpr int64_t kTileSpanKeys = 128;

// The head runs of a tile's tokens (full batches of kBatch heads, then R
// heads), each token starting at its first chunk; [begin, end): the keys any
// token reads.
template <KvDtype DK, KvDtype DV, int NV, int R>
struct TileRuns {
  static constexpr int kBatch = std::max(1, std::min(kMaxBatch, 16 / NV));
  static constexpr int32_t hd = 16 * NV;
  using Full = HeadRun<DK, DV, NV, kBatch>;
  using Rest = HeadRun<DK, DV, NV, std::max(R, 1)>;
  Full full[kMaxTileTokens][kMaxFull];
  Rest rest[kMaxTileTokens];
  int64_t start[kMaxTileTokens], begin = INT64_MAX, end = 0;
  int nt = 0, nfull = 0;

  void init(const TokenAttn* toks, int n, int full_batches) {
    nt = n;
    nfull = full_batches;
    for (int t = 0; t < nt; ++t) {
      for (int b = 0; b < nfull; ++b) full[t][b].init();
      if constexpr (R > 0) rest[t].init();
      start[t] = first_chunk(toks[t]);
      if (toks[t].n_keys > toks[t].first) {
        begin = std::min(begin, start[t]);
        end = std::max(end, toks[t].n_keys);
      }
    }
    if (end == 0) begin = 0;
  }
  // Whether token t (toks[t] = a) has chunks starting in the span [s0, s1).
  bool reads(int t, const TokenAttn& a, int64_t s0, int64_t s1) const {
    return a.n_keys > a.first && start[t] < s1 && s0 < a.n_keys;
  }
  // The keys [d0, d1) of the span [s0, s1) that any token reads (d0 >= d1: none).
  std::pair<int64_t, int64_t> keys_read(const TokenAttn* toks, int64_t s0, int64_t s1) const {
    int64_t d0 = s1, d1 = s0;
    for (int t = 0; t < nt; ++t) {
      if (!reads(t, toks[t], s0, s1)) continue;
      d0 = std::min(d0, std::max(s0, std::max<int64_t>(toks[t].first, start[t])));
      d1 = std::max(d1, std::min(s1, toks[t].n_keys));
    }
    return {d0, d1};
  }
  // Token t's chunks starting in [s0, s1) (a: its TokenAttn, or a view of it).
  void run(int t, const TokenAttn& a, int64_t s0, int64_t s1) {
    const int64_t c0 = std::max(s0, start[t]);
    for (int b = 0; b < nfull; ++b) full[t][b].run(a, a.kv_head, a.q + static_cast<int64_t>(b) * kBatch * hd, c0, s1);
    if constexpr (R > 0) rest[t].run(a, a.kv_head, a.q + static_cast<int64_t>(nfull) * kBatch * hd, c0, s1);
  }
  void finish(const TokenAttn* toks) const {
    for (int t = 0; t < nt; ++t) {
      float* o = toks[t].out;
      for (int b = 0; b < nfull; ++b) full[t][b].finish(toks[t], o + static_cast<int64_t>(b) * kBatch * hd);
      if constexpr (R > 0) rest[t].finish(toks[t], o + static_cast<int64_t>(nfull) * kBatch * hd);
    }
  }
};

template <KvDtype DK, KvDtype DV, int NV, int R>
void attend_tile_span(const TokenAttn* toks, int nt, int nfull) {
  TileRuns<DK, DV, NV, R> runs;
  runs.init(toks, nt, nfull);
  const int32_t bs = toks[0].kv->block_size;
  const int64_t span = std::max<int64_t>(1, kTileSpanKeys / bs) * bs;  // whole pages: spans split no chunk
  for (int64_t s0 = runs.begin / span * span; s0 < runs.end; s0 += span) {
    for (int t = 0; t < nt; ++t) {
      if (runs.reads(t, toks[t], s0, s0 + span)) runs.run(t, toks[t], s0, s0 + span);
    }
  }
  runs.finish(toks);
}

// A prefill tile with pages of a multiple of 16 keys (every chunk is 16 keys
// from a multiple of 16, or fewer at the end), any K/V types: each span's K
// slices are decoded once for the tile into f32 and transposed (16 keys per
// vector), its V slices into f32 rows, and every token's heads take each chunk
// through HeadRun::scores_t: the scores of 16 keys come out of vertical
// multiply-adds, with no reduction tree per key, in the same float operations
// as run() (the same bits). Chunks go outermost inside a span, so a chunk's
// 2 x 16 x head_dim floats serve the whole tile from L1.
// Up to N tokens' absorb() of one chunk for one head batch each (h[i]: token
// i's runs of it, s[i] its scores, a[i] the token): every softmax step first,
// then every p * V, so that the later softmax steps (a chain of dependent
// reductions and exps) run beside the earlier tokens' multiply-adds rather than
// each stalling its own p * V. Each token's ops are absorb()'s (the same bits).
template <int N, class H>
[[gnu::noinline]] void group_absorb(H* const* h, const TokenAttn* const* a, const __m512* const* s, int n, int64_t c0,
                                    const uint8_t* const* vrow) {
  alignas(64) float p[N][H::kHeads][kChunk];
  float cs[N][kMaxBatch];
  int lo[N], hi[N], rescale[N];
  #pragma GCC unroll 8  // whole: the compiler interleaves the N chains
  for (int i = 0; i < N; ++i) {
    if (i >= n) break;
    lo[i] = static_cast<int>(std::max<int64_t>(a[i]->first, c0) - c0);
    hi[i] = static_cast<int>(std::min(c0 + kChunk, a[i]->n_keys) - c0);
    const auto valid = static_cast<__mmask16>(((1u << hi[i]) - 1) & ~((1u << lo[i]) - 1));
    rescale[i] = h[i]->softmax(*a[i], s[i], valid, p[i], cs[i]);
  }
  #pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    if (i >= n) break;
    h[i]->template pv<KvDtype::F32>(p[i], cs[i], rescale[i], lo[i], hi[i], vrow, nullptr, 0);
  }
}

// Tokens whose chunk steps group_absorb takes together. Intel Xeon model 207,
// bench_attention_prefill 512 2 5 32 8 f16 4096 1: 99.6 ms a layer token by
// token, 97.3 in pairs, 97.2 in threes, 96.0 in fours, 97.1 in eights.
constexpr int kGroupTokens = 4;

template <KvDtype DK, KvDtype DV, int NV, int R>
void attend_tile_transposed(const TokenAttn* toks, int nt, int nfull) {
  constexpr int32_t hd = 16 * NV;
  const TokenAttn& a0 = toks[0];
  const KvLayerView& kv = *a0.kv;
  const int32_t bs = kv.block_size;
  const int64_t span = std::max<int64_t>(1, kTileSpanKeys / bs) * bs;
  using Runs = TileRuns<DK, DV, NV, R>;
  Runs runs;
  runs.init(toks, nt, nfull);
  __m512 sum[kGroupTokens][kMaxFull + 1][kMaxBatch];  // a group's chunk scores per token and head batch
  const size_t rows_bytes = static_cast<size_t>(span) * hd * sizeof(float);
  uint8_t* buf = scratch(3, 2 * rows_bytes);
  float* kt = reinterpret_cast<float*>(buf);
  float* vf = reinterpret_cast<float*>(buf + rows_bytes);
  const size_t k_off = KvRows<DK>::bytes(static_cast<int64_t>(a0.kv_head) * hd);
  const size_t v_off = KvRows<DV>::bytes(static_cast<int64_t>(a0.kv_head) * hd);
  const auto row_of = [&](int64_t key) {
    return static_cast<size_t>(a0.pages[key / bs]) * bs + static_cast<size_t>(key % bs);
  };
  const size_t k_slice = KvRows<DK>::bytes(hd), v_slice = KvRows<DV>::bytes(hd);
  // The slices of keys [p0, p1) into L2.
  const auto prefetch_keys = [&](int64_t p0, int64_t p1) {
    for (int64_t key = p0; key < p1; ++key) {
      const size_t ko = row_of(key) * kv.row_bytes + k_off, vo = row_of(key) * kv.v_row_bytes + v_off;
      for (size_t b = ko & ~size_t{63}; b < ko + k_slice; b += 64) prefetch_l2(kv.k + b);
      for (size_t b = vo & ~size_t{63}; b < vo + v_slice; b += 64) prefetch_l2(kv.v + b);
    }
  };
  for (int64_t s0 = runs.begin / span * span; s0 < runs.end; s0 += span) {
    const int64_t s1 = s0 + span;
    // The span's keys any token reads, decoded once.
    const auto [d0, d1] = runs.keys_read(toks, s0, s1);
    if (d0 >= d1) continue;
    for (int64_t g0 = (d0 - s0) / kChunk * kChunk; s0 + g0 < d1; g0 += kChunk) {
      __m512i rows[kChunk];  // the floats' bits: the transpose only moves lanes
      for (int i = 0; i < NV; ++i) {
        for (int j = 0; j < kChunk; ++j) {
          const int64_t key = s0 + g0 + j;
          rows[j] = key >= d0 && key < d1
                        ? _mm512_castps_si512(KvRows<DK>::load16(kv.k + row_of(key) * kv.row_bytes + k_off, i))
                        : _mm512_setzero_si512();
        }
        transpose16x16_epi32(rows);
        float* dst = kt + (g0 * hd + 16 * i * kChunk);
        for (int l = 0; l < kChunk; ++l) _mm512_store_ps(dst + l * kChunk, _mm512_castsi512_ps(rows[l]));
      }
      for (int j = 0; j < kChunk; ++j) {
        const int64_t key = s0 + g0 + j;
        if (key < d0 || key >= d1) continue;
        const uint8_t* vr = kv.v + row_of(key) * kv.v_row_bytes + v_off;
        float* vo = vf + (g0 + j) * hd;
        for (int i = 0; i < NV; ++i) _mm512_store_ps(vo + 16 * i, KvRows<DV>::load16(vr, i));
      }
    }
    // The next span's keys go to L2 while this one's chunks are computed, a
    // chunk's share at each (a KV head's slices are a short stretch of each
    // row, which the hardware prefetchers missed: the decode above stalled on
    // memory for a sixth of prefill attention at depth 4096, Intel Xeon model 167).
    const auto [n0, n1] = runs.keys_read(toks, s1, s1 + span);
    const int64_t cfirst = std::max(s0, d0 / kChunk * kChunk);
    const int64_t n_chunks = (d1 - cfirst + kChunk - 1) / kChunk;
    for (int64_t c0 = cfirst; c0 < d1; c0 += kChunk) {
      if (n0 < n1) {
        const int64_t ci = (c0 - cfirst) / kChunk;
        prefetch_keys(n0 + (n1 - n0) * ci / n_chunks, n0 + (n1 - n0) * (ci + 1) / n_chunks);
      }
      // The tile's tokens kGroupTokens at a time: each token's scores (run()'s
      // float operations from transposed K), then the group's softmax steps and
      // p * V, head batch by head batch (group_absorb).
      const float* kc = kt + (c0 - s0) / kChunk * hd * kChunk;  // the chunk's hd vectors of 16 keys
      const uint8_t* vrow[kChunk];
      for (int j = 0; j < kChunk; ++j) vrow[j] = reinterpret_cast<const uint8_t*>(vf + (c0 - s0 + j) * hd);
      int group[kGroupTokens];
      int n = 0;
      const auto flush = [&] {
        const TokenAttn* as[kGroupTokens];
        const __m512* ss[kGroupTokens];
        for (int i = 0; i < n; ++i) as[i] = &toks[group[i]];
        for (int b = 0; b < nfull; ++b) {
          typename Runs::Full* hs[kGroupTokens];
          for (int i = 0; i < n; ++i) {
            hs[i] = &runs.full[group[i]][b];
            ss[i] = sum[i][b];
          }
          group_absorb<kGroupTokens>(hs, as, ss, n, c0, vrow);
        }
        if constexpr (R > 0) {
          typename Runs::Rest* hs[kGroupTokens];
          for (int i = 0; i < n; ++i) {
            hs[i] = &runs.rest[group[i]];
            ss[i] = sum[i][nfull];
          }
          group_absorb<kGroupTokens>(hs, as, ss, n, c0, vrow);
        }
        n = 0;
      };
      for (int t = 0; t < nt; ++t) {
        if (!runs.reads(t, toks[t], c0, c0 + kChunk) || c0 < runs.start[t]) continue;
        const float* q = toks[t].q;
        for (int b = 0; b < nfull; ++b) {
          Runs::Full::scores_t(q + static_cast<int64_t>(b) * runs.kBatch * hd, kc, sum[n][b]);
        }
        if constexpr (R > 0) Runs::Rest::scores_t(q + static_cast<int64_t>(nfull) * runs.kBatch * hd, kc, sum[n][nfull]);
        group[n] = t;
        if (++n == kGroupTokens) flush();
      }
      if (n > 0) flush();
    }
  }
  runs.finish(toks);
}

template <KvDtype DK, KvDtype DV, int NV, int R>
void attend_tile_any(const TokenAttn* toks, int nt, int nfull) {
  if (toks[0].kv->block_size % kChunk == 0) {
    attend_tile_transposed<DK, DV, NV, R>(toks, nt, nfull);
  } else {  // pages of other sizes (rare): rows decoded in registers token by token, the same bits
    attend_tile_span<DK, DV, NV, R>(toks, nt, nfull);
  }
}

template <KvDtype DK, KvDtype DV, int NV>
void attend_tile(const TokenAttn* toks, int nt) {
  constexpr int kBatch = std::max(1, std::min(kMaxBatch, 16 / NV));
  const int n_heads = toks[0].n_heads, nfull = n_heads / kBatch, r = n_heads % kBatch;
  if (nt > kMaxTileTokens || nfull > kMaxFull) {  // token by token
    for (int t = 0; t < nt; ++t) attend_all<DK, DV, NV>(toks[t]);
    return;
  }
  switch (r) {
    case 0: attend_tile_any<DK, DV, NV, 0>(toks, nt, nfull); break;
    case 1: attend_tile_any<DK, DV, NV, 1>(toks, nt, nfull); break;
    case 2: if constexpr (kBatch > 2) attend_tile_any<DK, DV, NV, 2>(toks, nt, nfull); break;
    default: if constexpr (kBatch > 3) attend_tile_any<DK, DV, NV, 3>(toks, nt, nfull); break;
  }
}

template <KvDtype DK, KvDtype DV, int NV>
void attend_token_heads(const TokenAttn& a) {
  if (a.n_kv > 1) {
    attend_kv<DK, DV, NV>(a);
  } else {
    attend_all<DK, DV, NV>(a);
  }
}

// One token (nt == 1: its KV-head runs or its heads) or a tile of tokens of one KV head.
template <KvDtype DK, KvDtype DV, int NV>
void attend_tokens(const TokenAttn* toks, int nt) {
  if (nt == 1) {
    attend_token_heads<DK, DV, NV>(toks[0]);
  } else {
    attend_tile<DK, DV, NV>(toks, nt);
  }
}

template <KvDtype DK, KvDtype DV>
void attend_dtype(const TokenAttn* toks, int nt) {
  switch (toks[0].kv->head_dim) {
    case 16: if constexpr (!KvRows<DK>::kBlock && !KvRows<DV>::kBlock) attend_tokens<DK, DV, 1>(toks, nt); break;
    case 32: attend_tokens<DK, DV, 2>(toks, nt); break;
    case 64: attend_tokens<DK, DV, 4>(toks, nt); break;
    case 128: attend_tokens<DK, DV, 8>(toks, nt); break;
    case 256: attend_tokens<DK, DV, 16>(toks, nt); break;
    default: break;  // attend_token_avx512_supports said no
  }
}

// The (K, V) type pairs taken here: every type with itself, and the mixed
// pairs llama.cpp users run (-ctk f16/q8_0 with a smaller -ctv). Others take
// the AVX2 path (attention.cc), on every machine, so the choice never depends
// on the batch.
#define PAGODA_KV_PAIRS(X)                                                                                  \
  X(F32, F32) X(F16, F16) X(BF16, BF16) X(Q8_0, Q8_0) X(Q4_0, Q4_0) X(Q4_1, Q4_1) X(IQ4_NL, IQ4_NL) \
      X(Q5_0, Q5_0) X(Q5_1, Q5_1) X(F16, Q8_0) X(F16, Q4_0) X(Q8_0, Q4_0)

}  // namespace

RowPrefetch::RowPrefetch(const KvLayerView& kv, const int32_t* pages, int64_t first, int64_t n_keys, int64_t steps)
    : kv_(&kv), pages_(pages), first_(first), n_keys_(n_keys), page_(first / kv.block_size - 1) {
  if (n_keys <= first) {
    page_ = n_keys;  // nothing to read
    return;
  }
  const int64_t row = static_cast<int64_t>(std::max(kv.row_bytes, kv.v_row_bytes));
  const int64_t lines = ((n_keys - first) * row + 63) / 64 + (n_keys - first) / kv.block_size + 2;
  per_step_ = lines / std::max<int64_t>(1, steps) + 1;
  next_page();
}

void RowPrefetch::next_page() {
  const int64_t bs = kv_->block_size;
  ++page_;
  if (page_ * bs >= n_keys_) return;
  const int64_t s0 = std::max(first_, page_ * bs) - page_ * bs, s1 = std::min(n_keys_, (page_ + 1) * bs) - page_ * bs;
  const size_t slot = static_cast<size_t>(pages_[page_]) * static_cast<size_t>(bs);
  const size_t kr = kv_->row_bytes, vr = kv_->v_row_bytes;
  off_ = ((slot + static_cast<size_t>(s0)) * kr) & ~size_t{63};
  end_ = (slot + static_cast<size_t>(s1)) * kr;
  v_off_ = ((slot + static_cast<size_t>(s0)) * vr) & ~size_t{63};
  v_end_ = (slot + static_cast<size_t>(s1)) * vr;
}

void RowPrefetch::step() {
  for (int64_t n = 0; n < per_step_ && page_ * kv_->block_size < n_keys_; ++n) {
    if (off_ < end_) _mm_prefetch(reinterpret_cast<const char*>(kv_->k + off_), _MM_HINT_T0);
    if (v_off_ < v_end_) _mm_prefetch(reinterpret_cast<const char*>(kv_->v + v_off_), _MM_HINT_T0);
    off_ += 64;
    v_off_ += 64;
    if (off_ >= end_ && v_off_ >= v_end_) next_page();
  }
}

bool attend_token_avx512_supports(KvDtype k_dtype, KvDtype v_dtype, int32_t head_dim) {
  bool pair = false;
#define PAGODA_KV_PAIR_IS(K, V) pair = pair || (k_dtype == KvDtype::K && v_dtype == KvDtype::V);
  PAGODA_KV_PAIRS(PAGODA_KV_PAIR_IS)
#undef PAGODA_KV_PAIR_IS
  // A quantized slice must start on a 32-value block: head_dim a multiple of 32.
  const bool blocks = kv_dtype_is_quantized(k_dtype) || kv_dtype_is_quantized(v_dtype);
  return pair && ((head_dim == 16 && !blocks) || head_dim == 32 || head_dim == 64 || head_dim == 128 ||
                  head_dim == 256);
}

void attend_tokens_avx512(const TokenAttn* toks, int nt) {
  if (nt <= 0) return;
  const KvLayerView& kv = *toks[0].kv;
#define PAGODA_KV_PAIR_RUN(K, V)                                         \
  if (kv.dtype == KvDtype::K && kv.v_dtype == KvDtype::V) {            \
    attend_dtype<KvDtype::K, KvDtype::V>(toks, nt);                      \
    return;                                                              \
  }
  PAGODA_KV_PAIRS(PAGODA_KV_PAIR_RUN)
#undef PAGODA_KV_PAIR_RUN
  // Not reached: attend_token_avx512_supports said no.
}

void attend_token_avx512(const TokenAttn& a) { attend_tokens_avx512(&a, 1); }

}  // namespace pagoda::kernels::cpu::detail
