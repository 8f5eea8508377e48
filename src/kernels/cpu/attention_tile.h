// Internal to kernels/cpu (attention.cc): the AVX2 page step of paged attention
// for a block of query rows (issue 39). A row is one (token, query head) of a
// tile; the rows of a block share the KV head and the page's key range, so each
// K and V vector loaded feeds every row of the block from registers.
//
// The op sequence of one row, the batch-invariance contract, is exactly that
// of the token-by-token kernel this replaced (and so of a decode step of the
// same token), whatever block the row is in:
//  - score of key j: 8-lane FMA chain over head_dim (lanes 8v..8v+7, v in
//    order, from zero), then the lane tree ((0+1)+(2+3))+((4+5)+(6+7)), then
//    * scale. Each score has its own accumulator, so the blocking of rows and
//    keys into registers (R rows x 8/R keys, hsum8x8 for any 8) never moves a bit;
//  - softmax_page per row, unchanged: page max, rescale when the max moved,
//    exp of (s - m), l += p in key order;
//  - P.V per row: acc * corr (when rescaled), then acc = fma(p_j, v_j, acc)
//    for keys j in order; lanes are independent, so splitting head_dim into
//    column blocks of C vectors across rows changes nothing.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels::cpu::detail {

constexpr int32_t kMaxPage = 256;  // keys per page (attention.cc's kMaxBlockSize)

// One query row of a block: its query vector, running output, max and sum.
struct TileRow {
  const float* q;  // [head_dim]
  float* acc;      // [head_dim]
  float* m;        // running max
  float* l;        // running sum of exp
};

// Sums of 8 vectors: lane j of (*lo, *hi) (lanes 0-3, 4-7) = sum of a[j]'s
// lanes, always with the tree ((0+1)+(2+3)) + ((4+5)+(6+7)) (the 256-bit hadd
// pairs within each 128-bit half; the halves are then added as two 128-bit
// vectors, not permuted back into one, cheaper on cores that split 256-bit ops).
// hadd(x, y) as two shuffles (even and odd lanes of x and y) and an add: the
// same sums (x0 + x1 is x1 + x0 in IEEE), faster where vhaddps is microcoded
// (Zen 1: one ymm vhaddps per ~3.4 cycles, a vshufps per cycle).
inline __m256 hadd_ps(__m256 x, __m256 y) {
  return _mm256_add_ps(_mm256_shuffle_ps(x, y, 0x88), _mm256_shuffle_ps(x, y, 0xDD));
}

inline void hsum8x8(const __m256* a, __m128* lo, __m128* hi) {
  const __m256 t0 = hadd_ps(a[0], a[1]), t1 = hadd_ps(a[2], a[3]);
  const __m256 t2 = hadd_ps(a[4], a[5]), t3 = hadd_ps(a[6], a[7]);
  const __m256 u0 = hadd_ps(t0, t1), u1 = hadd_ps(t2, t3);
  *lo = _mm_add_ps(_mm256_castps256_ps128(u0), _mm256_extractf128_ps(u0, 1));
  *hi = _mm_add_ps(_mm256_castps256_ps128(u1), _mm256_extractf128_ps(u1, 1));
}

// sc[r * ld + j] = dot(rows[r].q, k[j]) * scale for R rows and j < nk (head_dim
// = 8 * NV): R x 8/R accumulators, each K vector loaded once per R rows. Key
// groups past nk repeat the last key (their scores are computed, not stored).
template <int R, int NV>
inline void scores_rows(const TileRow* rows, const float* const* k, int32_t nk, float scale, float* sc,
                        int32_t ld) {
  constexpr int KK = 8 / R;
  const __m128 sv = _mm_set1_ps(scale);
  for (int32_t j0 = 0; j0 < nk; j0 += KK) {
    const float* kk[KK];
    for (int j = 0; j < KK; ++j) kk[j] = k[std::min(j0 + j, nk - 1)];
    __m256 acc[8];
    for (int a = 0; a < 8; ++a) acc[a] = _mm256_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      __m256 kv[KK];
      for (int j = 0; j < KK; ++j) kv[j] = _mm256_loadu_ps(kk[j] + 8 * v);
      for (int r = 0; r < R; ++r) {
        const __m256 qv = _mm256_loadu_ps(rows[r].q + 8 * v);
        for (int j = 0; j < KK; ++j) acc[r * KK + j] = _mm256_fmadd_ps(qv, kv[j], acc[r * KK + j]);
      }
    }
    __m128 lo, hi;  // lane r * KK + j (lo: 0-3, hi: 4-7): row r, key j0 + j
    hsum8x8(acc, &lo, &hi);
    lo = _mm_mul_ps(lo, sv);
    hi = _mm_mul_ps(hi, sv);
    if (j0 + KK <= nk) {
      if constexpr (R == 1) {
        _mm_storeu_ps(sc + j0, lo);
        _mm_storeu_ps(sc + j0 + 4, hi);
      } else if constexpr (R == 2) {
        _mm_storeu_ps(sc + j0, lo);
        _mm_storeu_ps(sc + ld + j0, hi);
      } else {
        _mm_storel_pi(reinterpret_cast<__m64*>(sc + j0), lo);
        _mm_storeh_pi(reinterpret_cast<__m64*>(sc + ld + j0), lo);
        _mm_storel_pi(reinterpret_cast<__m64*>(sc + 2 * ld + j0), hi);
        _mm_storeh_pi(reinterpret_cast<__m64*>(sc + 3 * ld + j0), hi);
      }
    } else {
      alignas(16) float tmp[8];
      _mm_store_ps(tmp, lo);
      _mm_store_ps(tmp + 4, hi);
      for (int r = 0; r < R; ++r) {
        for (int j = 0; j < KK && j0 + j < nk; ++j) sc[r * ld + j0 + j] = tmp[r * KK + j];
      }
    }
  }
}

// Online-softmax state update for one row after its page scores are known:
// returns whether the running output must be rescaled and by how much; turns
// sg[0..nk) into probabilities relative to the new running max.
inline bool softmax_page(float* sg, int32_t nk, float* mrun, float* lrun, float* corr_out) {
  // Page max, 8 lanes at a time (max of finite floats is exact in any order).
  int32_t i = 1;
  float bm = sg[0];
  if (nk >= 8) {
    __m256 mv8 = _mm256_loadu_ps(sg);
    for (i = 8; i + 8 <= nk; i += 8) mv8 = _mm256_max_ps(mv8, _mm256_loadu_ps(sg + i));
    bm = hmax8(mv8);
  }
  for (; i < nk; ++i) bm = sg[i] > bm ? sg[i] : bm;
  const float m_new = bm > *mrun ? bm : *mrun;
  bool rescale = false;
  float corr = 1.0f;
  if (m_new > *mrun) {  // rescale only when the max moved (exp(0) == 1 exactly otherwise)
    corr = exp1(*mrun - m_new);
    *lrun *= corr;
    *mrun = m_new;
    rescale = true;
  }
  const __m256 mv = _mm256_set1_ps(m_new);
  int32_t j = 0;
  for (; j + 8 <= nk; j += 8) _mm256_storeu_ps(sg + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + j), mv)));
  for (; j < nk; ++j) sg[j] = exp1(sg[j] - m_new);
  *corr_out = corr;
  return rescale;
}

// acc_r = acc_r * corr_r (when rescaled) then acc_r += p_r[j] * v[j] for j in
// order, R rows x C vectors of head_dim in registers at a time.
template <int R, int NV>
inline void pv_rows(const TileRow* rows, const bool* rescale, const float* corr, const float* p, int32_t ld,
                    const float* const* v, int32_t nk) {
  constexpr int C = (8 / R) < NV ? (8 / R) : NV;
  for (int c0 = 0; c0 < NV; c0 += C) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(rows[r].acc + 8 * (c0 + c));
      if (rescale[r]) {
        const __m256 cv = _mm256_set1_ps(corr[r]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_mul_ps(acc[r][c], cv);
      }
    }
    for (int32_t j = 0; j < nk; ++j) {
      __m256 vv[C];
      for (int c = 0; c < C; ++c) vv[c] = _mm256_loadu_ps(v[j] + 8 * (c0 + c));
      for (int r = 0; r < R; ++r) {
        const __m256 pj = _mm256_broadcast_ss(p + r * ld + j);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(pj, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(rows[r].acc + 8 * (c0 + c), acc[r][c]);
    }
  }
}

// Blocks of 4 rows (a GQA group of 4 heads, or 4 (token, head) rows of any
// group) keep their page's scores key-major, st[4 j + r] (row r, key j), so the
// softmax update of the 4 rows runs with the rows in the lanes of one vector:
// the page max, the rescale exp and each row's l += p chain, one op per key
// for all 4 rows instead of a scalar chain per row. Each score keeps its own
// accumulator, FMA chain and lane tree (accumulator 4 j + r instead of 2 r + j);
// max is exact in any order; exp is lane-wise; l adds p in key order; so every
// row's ops and bits are those of page_rows<1> (the decode step) above.
template <int NV>
inline void scores4t(const TileRow* rows, const float* const* k, int32_t nk, float scale, float* st, int32_t ls = 4) {
  const __m128 sv = _mm_set1_ps(scale);
  alignas(32) float raw[8 * 4 * (kMaxPage + 1)];  // the chains' accumulators, 8 per 2 keys
  for (int32_t j0 = 0; j0 < nk; j0 += 2) {
    const float* k0 = k[j0];
    const float* k1 = k[std::min(j0 + 1, nk - 1)];
    __m256 acc[8];
    for (int a = 0; a < 8; ++a) acc[a] = _mm256_setzero_ps();
    const float* qp[4] = {rows[0].q, rows[1].q, rows[2].q, rows[3].q};
    // Opaque to the compiler: it reloads each Q vector once per use below
    // instead of keeping a stack copy of all of them (registers run out).
    __asm__("" : "+r"(qp[0]), "+r"(qp[1]), "+r"(qp[2]), "+r"(qp[3]));
    for (int v = 0; v < NV; ++v) {
      const __m256 kv0 = _mm256_loadu_ps(k0 + 8 * v), kv1 = _mm256_loadu_ps(k1 + 8 * v);
      for (int r = 0; r < 4; ++r) {
        __m256 qv = _mm256_loadu_ps(qp[r] + 8 * v);
        __asm__("" : "+x"(qv));
        acc[r] = _mm256_fmadd_ps(qv, kv0, acc[r]);
        acc[4 + r] = _mm256_fmadd_ps(qv, kv1, acc[4 + r]);
      }
    }
    for (int a = 0; a < 8; ++a) _mm256_store_ps(raw + 8 * (4 * j0 + a), acc[a]);
  }
  // The lane trees after every chain of the page: independent of each other,
  // they overlap instead of waiting on the chains they end.
  for (int32_t j0 = 0; j0 < nk; j0 += 2) {
    __m256 acc[8];
    for (int a = 0; a < 8; ++a) acc[a] = _mm256_load_ps(raw + 8 * (4 * j0 + a));
    __m128 lo, hi;  // lo: key j0, rows 0-3; hi: key j0 + 1 (stored even past nk: st has room)
    hsum8x8(acc, &lo, &hi);
    _mm_storeu_ps(st + ls * j0, _mm_mul_ps(lo, sv));
    _mm_storeu_ps(st + ls * (j0 + 1), _mm_mul_ps(hi, sv));
  }
}

// Avx2Ops on two vectors at once (lane-wise the same ops, so the same bits).
struct Avx2x2Ops {
  struct V {
    __m256 a, b;
  };
  using O = Avx2Ops;
  static V set1(float x) { return {O::set1(x), O::set1(x)}; }
  static V min(V x, V y) { return {O::min(x.a, y.a), O::min(x.b, y.b)}; }
  static V max(V x, V y) { return {O::max(x.a, y.a), O::max(x.b, y.b)}; }
  static V mul(V x, V y) { return {O::mul(x.a, y.a), O::mul(x.b, y.b)}; }
  static V add(V x, V y) { return {O::add(x.a, y.a), O::add(x.b, y.b)}; }
  static V fmadd(V x, V y, V z) { return {O::fmadd(x.a, y.a, z.a), O::fmadd(x.b, y.b, z.b)}; }
  static V fnmadd(V x, V y, V z) { return {O::fnmadd(x.a, y.a, z.a), O::fnmadd(x.b, y.b, z.b)}; }
  static V round(V x) { return {O::round(x.a), O::round(x.b)}; }
  static V pow2(V n) { return {O::pow2(n.a), O::pow2(n.b)}; }
  static V zero_below(V x, V lo, V y) { return {O::zero_below(x.a, lo.a, y.a), O::zero_below(x.b, lo.b, y.b)}; }
};

// The softmax update of 4 rows from key-major scores st[0, 4 nk): page max,
// rescale of l where the max moved (*rescale bit r, corr[r]), st turned into
// exp(s - m), l += p in key order. st holds 4 (nk rounded up to 2) floats.
inline void softmax4t(const TileRow* rows, float* st, int32_t nk, int* rescale, float* corr) {
  const __m128 m_old = _mm_setr_ps(*rows[0].m, *rows[1].m, *rows[2].m, *rows[3].m);
  __m128 l = _mm_setr_ps(*rows[0].l, *rows[1].l, *rows[2].l, *rows[3].l);
  __m128 bm = _mm_loadu_ps(st);
  for (int32_t j = 1; j < nk; ++j) bm = _mm_max_ps(bm, _mm_loadu_ps(st + 4 * j));
  const __m128 moved = _mm_cmp_ps(bm, m_old, _CMP_GT_OQ);
  const __m128 m_new = _mm_blendv_ps(m_old, bm, moved);
  const __m256 d = _mm256_castps128_ps256(_mm_sub_ps(m_old, m_new));
  const __m128 c = _mm256_castps256_ps128(exp8(_mm256_insertf128_ps(d, _mm256_castps256_ps128(d), 1)));
  l = _mm_blendv_ps(l, _mm_mul_ps(l, c), moved);
  *rescale = _mm_movemask_ps(moved);
  _mm_storeu_ps(corr, c);
  const __m256 mv = _mm256_insertf128_ps(_mm256_castps128_ps256(m_new), m_new, 1);
  int32_t j = 0;
  for (; j + 4 <= nk; j += 4) {  // two vectors at a time: two independent exp chains in flight
    const Avx2x2Ops::V x{_mm256_sub_ps(_mm256_loadu_ps(st + 4 * j), mv), _mm256_sub_ps(_mm256_loadu_ps(st + 4 * j + 8), mv)};
    const Avx2x2Ops::V e = exp_lanes<Avx2x2Ops>(x);
    _mm256_storeu_ps(st + 4 * j, e.a);
    _mm256_storeu_ps(st + 4 * j + 8, e.b);
  }
  for (; j < nk; j += 2) _mm256_storeu_ps(st + 4 * j, exp8(_mm256_sub_ps(_mm256_loadu_ps(st + 4 * j), mv)));
  for (int32_t j = 0; j < nk; ++j) l = _mm_add_ps(l, _mm_loadu_ps(st + 4 * j));
  alignas(16) float mo[4], lo[4];
  _mm_store_ps(mo, m_new);
  _mm_store_ps(lo, l);
  for (int r = 0; r < 4; ++r) {
    *rows[r].m = mo[r];
    *rows[r].l = lo[r];
  }
}

// softmax4t for two blocks of 4 rows (rows[0, 8)) whose scores are
// interleaved key-major, st[8 j + r]: one 8-lane op per key for the 8 rows
// (the max in two chains, max being exact in any order; l += p in key order).
inline void softmax8t(const TileRow* rows, float* st, int32_t nk, int* rescale, float* corr) {
  const __m256 m_old = _mm256_setr_ps(*rows[0].m, *rows[1].m, *rows[2].m, *rows[3].m, *rows[4].m, *rows[5].m,
                                      *rows[6].m, *rows[7].m);
  __m256 l = _mm256_setr_ps(*rows[0].l, *rows[1].l, *rows[2].l, *rows[3].l, *rows[4].l, *rows[5].l, *rows[6].l,
                            *rows[7].l);
  __m256 b0 = _mm256_loadu_ps(st), b1 = b0;
  for (int32_t j = 1; j < nk; j += 2) {
    b1 = _mm256_max_ps(b1, _mm256_loadu_ps(st + 8 * j));
    if (j + 1 < nk) b0 = _mm256_max_ps(b0, _mm256_loadu_ps(st + 8 * (j + 1)));
  }
  const __m256 bm = _mm256_max_ps(b0, b1);
  const __m256 moved = _mm256_cmp_ps(bm, m_old, _CMP_GT_OQ);
  const __m256 m_new = _mm256_blendv_ps(m_old, bm, moved);
  const __m256 c = exp8(_mm256_sub_ps(m_old, m_new));
  l = _mm256_blendv_ps(l, _mm256_mul_ps(l, c), moved);
  *rescale = _mm256_movemask_ps(moved);
  _mm256_storeu_ps(corr, c);
  int32_t j = 0;
  for (; j + 2 <= nk; j += 2) {  // two keys at a time: two independent exp chains in flight
    const Avx2x2Ops::V x{_mm256_sub_ps(_mm256_loadu_ps(st + 8 * j), m_new),
                         _mm256_sub_ps(_mm256_loadu_ps(st + 8 * j + 8), m_new)};
    const Avx2x2Ops::V e = exp_lanes<Avx2x2Ops>(x);
    _mm256_storeu_ps(st + 8 * j, e.a);
    _mm256_storeu_ps(st + 8 * j + 8, e.b);
    l = _mm256_add_ps(_mm256_add_ps(l, e.a), e.b);
  }
  if (j < nk) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(st + 8 * j), m_new));
    _mm256_storeu_ps(st + 8 * j, e);
    l = _mm256_add_ps(l, e);
  }
  alignas(32) float mo[8], lo[8];
  _mm256_store_ps(mo, m_new);
  _mm256_store_ps(lo, l);
  for (int r = 0; r < 8; ++r) {
    *rows[r].m = mo[r];
    *rows[r].l = lo[r];
  }
}

// P.V of 4 rows from key-major probabilities st: pv_rows<4>'s op sequence.
template <int NV>
inline void pv4t(const TileRow* rows, int rescale, const float* corr, const float* st, const float* const* v,
                 int32_t nk, int32_t ls = 4) {
  constexpr int C = 2 < NV ? 2 : NV;
  for (int c0 = 0; c0 < NV; c0 += C) {
    __m256 acc[4][C];
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(rows[r].acc + 8 * (c0 + c));
      if (rescale & (1 << r)) {
        const __m256 cv = _mm256_set1_ps(corr[r]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_mul_ps(acc[r][c], cv);
      }
    }
    for (int32_t j = 0; j < nk; ++j) {
      __m256 vv[C];
      for (int c = 0; c < C; ++c) vv[c] = _mm256_loadu_ps(v[j] + 8 * (c0 + c));
      for (int r = 0; r < 4; ++r) {
        const __m256 pj = _mm256_broadcast_ss(st + ls * j + r);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(pj, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(rows[r].acc + 8 * (c0 + c), acc[r][c]);
    }
  }
}

// One page for R rows sharing keys k[0..nk), v[0..nk): scores, each row's
// softmax update, P.V. sc: [R, ld] scratch (ld >= nk rounded up to 8).
template <int R, int NV>
inline void page_rows(const TileRow* rows, const float* const* k, const float* const* v, int32_t nk, float scale,
                      float* sc, int32_t ld) {
  if constexpr (R == 4) {  // 4 ld >= 4 (nk rounded up to 2): the key-major scores fit
    int rescale;
    alignas(16) float corr[4];
    scores4t<NV>(rows, k, nk, scale, sc);
    softmax4t(rows, sc, nk, &rescale, corr);
    pv4t<NV>(rows, rescale, corr, sc, v, nk);
    return;
  }
  scores_rows<R, NV>(rows, k, nk, scale, sc, ld);
  bool rescale[R];
  float corr[R];
  for (int r = 0; r < R; ++r) rescale[r] = softmax_page(sc + r * ld, nk, rows[r].m, rows[r].l, corr + r);
  // Each row's l += p[j] in key order; the rows' chains interleaved.
  float l[R];
  for (int r = 0; r < R; ++r) l[r] = *rows[r].l;
  for (int32_t j = 0; j < nk; ++j) {
    for (int r = 0; r < R; ++r) l[r] += sc[r * ld + j];
  }
  for (int r = 0; r < R; ++r) *rows[r].l = l[r];
  pv_rows<R, NV>(rows, rescale, corr, sc, ld, v, nk);
}

// Two blocks of 4 rows through one page: their scores interleaved key-major
// (sc: [8, ld] floats, st[8 j + r]), one softmax8t, then each block's P.V.
template <int NV>
inline void page_rows8(const TileRow* rows, const float* const* k, const float* const* v, int32_t nk, float scale,
                       float* sc) {
  int rescale;
  alignas(32) float corr[8];
  scores4t<NV>(rows, k, nk, scale, sc, 8);
  scores4t<NV>(rows + 4, k, nk, scale, sc + 4, 8);
  softmax8t(rows, sc, nk, &rescale, corr);
  pv4t<NV>(rows, rescale & 15, corr, sc, v, nk, 8);
  pv4t<NV>(rows + 4, rescale >> 4, corr + 4, sc + 4, v, nk, 8);
}

// n rows in blocks of 8 (two of 4), then 4, then 2, then 1.
template <int NV>
inline void page_block(const TileRow* rows, int32_t n, const float* const* k, const float* const* v, int32_t nk,
                       float scale, float* sc, int32_t ld) {
  int32_t r = 0;
  for (; r + 8 <= n; r += 8) page_rows8<NV>(rows + r, k, v, nk, scale, sc);
  for (; r + 4 <= n; r += 4) page_rows<4, NV>(rows + r, k, v, nk, scale, sc, ld);
  for (; r + 2 <= n; r += 2) page_rows<2, NV>(rows + r, k, v, nk, scale, sc, ld);
  for (; r < n; ++r) page_rows<1, NV>(rows + r, k, v, nk, scale, sc, ld);
}

}  // namespace pagoda::kernels::cpu::detail
