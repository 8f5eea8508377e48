// AVX-512 attention of a prefill tile: several tokens of one sequence and one KV
// head, span by span over their keys, each key slice decoded once for the tile.
// Every token's float operations are those it has alone (HeadRun,
// attention_head_run_avx512.h).
#include <immintrin.h>

#include <algorithm>
#include <utility>

#include "kernels/cpu/attention_head_run_avx512.h"
#include "kernels/cpu/transpose_avx512.h"

namespace pagoda::kernels::cpu::detail {
namespace {

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
  const __m512* ss[kMaxFull + 1][kGroupTokens];        // ss[b][i] = sum[i][b]
  for (int b = 0; b <= kMaxFull; ++b) {
    for (int i = 0; i < kGroupTokens; ++i) ss[b][i] = sum[i][b];
  }
  const size_t rows_bytes = static_cast<size_t>(span) * hd * sizeof(float);
  uint8_t* buf = scratch(3, 2 * rows_bytes);
  float* kt = reinterpret_cast<float*>(buf);
  float* vf = reinterpret_cast<float*>(buf + rows_bytes);
  const size_t k_off = KvRows<DK>::bytes(static_cast<int64_t>(a0.kv_head) * hd);
  const size_t v_off = KvRows<DV>::bytes(static_cast<int64_t>(a0.kv_head) * hd);
  const size_t k_slice = KvRows<DK>::bytes(hd), v_slice = KvRows<DV>::bytes(hd);
  const auto prefetch_keys = [&](int64_t p0, int64_t p1) {
    prefetch_key_slices(kv, a0.pages, p0, p1, k_off, k_slice, v_off, v_slice);
  };
  for (int64_t s0 = runs.begin / span * span; s0 < runs.end; s0 += span) {
    const int64_t s1 = s0 + span;
    // The span's keys any token reads, decoded once.
    const auto [d0, d1] = runs.keys_read(toks, s0, s1);
    if (d0 >= d1) continue;
    for (int64_t g0 = (d0 - s0) / kChunk * kChunk; s0 + g0 < d1; g0 += kChunk) {
      // The chunk's rows are consecutive slots of one page (bs % 16 == 0).
      const size_t r0 = cache_row(a0.pages, bs, s0 + g0);
      __m512i rows[kChunk];  // the floats' bits: the transpose only moves lanes
      for (int i = 0; i < NV; ++i) {
        for (int j = 0; j < kChunk; ++j) {
          const int64_t key = s0 + g0 + j;
          rows[j] = key >= d0 && key < d1
                        ? _mm512_castps_si512(KvRows<DK>::load16(kv.k + (r0 + j) * kv.row_bytes + k_off, i))
                        : _mm512_setzero_si512();
        }
        transpose16x16_epi32(rows);
        float* dst = kt + (g0 * hd + 16 * i * kChunk);
        for (int l = 0; l < kChunk; ++l) _mm512_store_ps(dst + l * kChunk, _mm512_castsi512_ps(rows[l]));
      }
      for (int j = 0; j < kChunk; ++j) {
        const int64_t key = s0 + g0 + j;
        if (key < d0 || key >= d1) continue;
        const uint8_t* vr = kv.v + (r0 + j) * kv.v_row_bytes + v_off;
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
      // The group's tokens (as) and their head runs per head batch (hs[b]; the
      // rest's: rs), stored as each token joins, read by group_absorb one
      // pointer at a time (pointers rebuilt at each flush were read back by
      // vector loads right after their scalar stores: a store-forwarding stall
      // per group, 2% of prefill attention at depth 4096 on model 207).
      const TokenAttn* as[kGroupTokens];
      typename Runs::Full* hs[kMaxFull][kGroupTokens];
      typename Runs::Rest* rs[kGroupTokens];
      int n = 0;
      const auto flush = [&] {
        for (int b = 0; b < nfull; ++b) group_absorb<kGroupTokens>(hs[b], as, ss[b], n, c0, vrow);
        if constexpr (R > 0) group_absorb<kGroupTokens>(rs, as, ss[nfull], n, c0, vrow);
        n = 0;
      };
      for (int t = 0; t < nt; ++t) {
        if (!runs.reads(t, toks[t], c0, c0 + kChunk) || c0 < runs.start[t]) continue;
        const float* q = toks[t].q;
        for (int b = 0; b < nfull; ++b) {
          Runs::Full::scores_t(q + static_cast<int64_t>(b) * runs.kBatch * hd, kc, sum[n][b]);
        }
        if constexpr (R > 0) Runs::Rest::scores_t(q + static_cast<int64_t>(nfull) * runs.kBatch * hd, kc, sum[n][nfull]);
        as[n] = &toks[t];
        for (int b = 0; b < nfull; ++b) hs[b][n] = &runs.full[t][b];
        rs[n] = &runs.rest[t];
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

}  // namespace

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

#define PAGODA_TILE_INST(K, V)                                                  \
  template void attend_tile<KvDtype::K, KvDtype::V, 2>(const TokenAttn*, int);  \
  template void attend_tile<KvDtype::K, KvDtype::V, 4>(const TokenAttn*, int);  \
  template void attend_tile<KvDtype::K, KvDtype::V, 8>(const TokenAttn*, int);  \
  template void attend_tile<KvDtype::K, KvDtype::V, 16>(const TokenAttn*, int);
PAGODA_KV_PAIRS(PAGODA_TILE_INST)
#undef PAGODA_TILE_INST
// head_dim 16: the types without 32-value blocks only (attend_token_avx512_supports).
template void attend_tile<KvDtype::F32, KvDtype::F32, 1>(const TokenAttn*, int);
template void attend_tile<KvDtype::F16, KvDtype::F16, 1>(const TokenAttn*, int);
template void attend_tile<KvDtype::BF16, KvDtype::BF16, 1>(const TokenAttn*, int);

}  // namespace pagoda::kernels::cpu::detail
