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
inline void hsum8x8(const __m256* a, __m128* lo, __m128* hi) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
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

// One page for R rows sharing keys k[0..nk), v[0..nk): scores, each row's
// softmax update, P.V. sc: [R, ld] scratch (ld >= nk rounded up to 8).
template <int R, int NV>
inline void page_rows(const TileRow* rows, const float* const* k, const float* const* v, int32_t nk, float scale,
                      float* sc, int32_t ld) {
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

// n rows in blocks of 4, then 2, then 1.
template <int NV>
inline void page_block(const TileRow* rows, int32_t n, const float* const* k, const float* const* v, int32_t nk,
                       float scale, float* sc, int32_t ld) {
  int32_t r = 0;
  for (; r + 4 <= n; r += 4) page_rows<4, NV>(rows + r, k, v, nk, scale, sc, ld);
  for (; r + 2 <= n; r += 2) page_rows<2, NV>(rows + r, k, v, nk, scale, sc, ld);
  for (; r < n; ++r) page_rows<1, NV>(rows + r, k, v, nk, scale, sc, ld);
}

}  // namespace pagoda::kernels::cpu::detail
