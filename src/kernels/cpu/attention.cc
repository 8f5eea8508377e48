// Paged causal attention with grouped-query heads (baseline AVX2).
//
// One work item = (tile of up to 64 consecutive tokens of one sequence, kv head):
// the group's query heads and the tile's tokens are processed together so each
// K/V row is read and decoded once per tile. Keys are visited in
// logical order, one page at a time; per page: scores, page max, one rescale of
// the running output, then p * V in key order (online softmax). Every float op
// depends only on the token's own query, its position and the logical key
// sequence, never on physical block ids, other tokens or the thread count.
// On the AVX-512 path with at least two tiles per thread an item is a whole
// tile (every KV head), and a decode item reads the next item's K/V rows into
// cache while it computes (attention_avx512.h, RowPrefetch): only the work
// partition and the prefetches change, never a head's op sequence.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "base/ggml_quant.h"
#include "kernels/api.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels::cpu {
namespace {

constexpr int32_t kMaxBlockSize = 256;  // tokens per KV page
constexpr int32_t kQueryTile = 64;     // consecutive tokens of one sequence sharing decoded pages
constexpr int32_t kMaxRows = 64;        // (token, head) rows gathered for one page step

// 16-bit floats p[0, n) to f32: eight at a time with `wide` (from 8 packed
// halves), the tail one by one with `one`; both conversions are exact.
template <class Wide, class One>
inline void decode_16bit(const uint8_t* p, int32_t n, float* out, Wide wide, One one) {
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, wide(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = one(h);
  }
}

// One 32-value block of a 4/5-bit KV type to f32, the 32 values in registers
// 8 at a time: low nibbles are elements 0-15, high nibbles 16-31 (ggml's
// layouts, base/ggml_types.h); q5's fifth bit of element j is qh bit j.
// value = (q - offset) * d, q * d + m (_1 types) or d * codebook[q] (iq4_nl):
// the products and sums of ggml's dequantize_row_* (no FMA), so every value is
// bitwise the scalar dequantizer's.
template <KvDtype DT>
inline void decode_block32(const uint8_t* b, float* out) {
  constexpr bool kMin = DT == KvDtype::Q4_1 || DT == KvDtype::Q5_1;
  constexpr bool kHigh = DT == KvDtype::Q5_0 || DT == KvDtype::Q5_1;
  constexpr int32_t kOffset = DT == KvDtype::Q4_0 ? 8 : DT == KvDtype::Q5_0 ? 16 : 0;
  constexpr int kQs = 2 + (kMin ? 2 : 0) + (kHigh ? 4 : 0);  // byte offset of the nibbles
  uint16_t h;
  std::memcpy(&h, b, 2);
  const __m256 dv = _mm256_set1_ps(fp16_to_fp32(h));
  __m256 mv = _mm256_setzero_ps();
  if constexpr (kMin) {
    std::memcpy(&h, b + 2, 2);
    mv = _mm256_set1_ps(fp16_to_fp32(h));
  }
  uint32_t qh = 0;
  if constexpr (kHigh) std::memcpy(&qh, b + (kMin ? 4 : 2), 4);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i nib[2] = {_mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4)};
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int hi = 0; hi < 2; ++hi) {
    for (int e = 0; e < 2; ++e) {  // elements 16 hi + 8 e .. + 7
      const __m128i bytes = e ? _mm_srli_si128(nib[hi], 8) : nib[hi];
      __m256i q;
      if constexpr (DT == KvDtype::IQ4_NL) {
        const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues));
        q = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(table, bytes));
      } else {
        q = _mm256_cvtepu8_epi32(bytes);
        if constexpr (kHigh) {
          const __m256i sh = _mm256_add_epi32(lane, _mm256_set1_epi32(16 * hi + 8 * e));
          const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh)), sh),
                                               _mm256_set1_epi32(1));
          q = _mm256_or_si256(q, _mm256_slli_epi32(bit, 4));
        }
        if constexpr (kOffset != 0) q = _mm256_sub_epi32(q, _mm256_set1_epi32(kOffset));
      }
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv);
      if constexpr (kMin) v = _mm256_add_ps(v, mv);
      _mm256_storeu_ps(out + 16 * hi + 8 * e, v);
    }
  }
}

// Values [start, start + n) of a row of 32-value blocks of type DT (4/5-bit):
// whole blocks in registers, a partial one (a head slice not on a block
// boundary) through the scalar dequantizer.
template <KvDtype DT>
void decode_blocks(GgmlType type, const uint8_t* row, int64_t start, int32_t n, float* out) {
  const size_t bb = static_cast<size_t>(kv_dtype_block_bytes(DT));
  for (int32_t i = 0; i < n;) {
    const int64_t e = start + i, blk = e / 32, off = e % 32;
    const uint8_t* b = row + static_cast<size_t>(blk) * bb;
    const int32_t take = std::min<int32_t>(n - i, static_cast<int32_t>(32 - off));
    if (off == 0 && take == 32) {
      decode_block32<DT>(b, out + i);
    } else {
      float tmp[32];
      PAGODA_CHECK(dequantize_row(type, b, tmp, 32));
      std::memcpy(out + i, tmp + off, static_cast<size_t>(take) * sizeof(float));
    }
    i += take;
  }
}

// Decodes values [start, start + n) of a KV row to f32. out: [n]
void decode_slice(KvDtype dtype, const uint8_t* row, int64_t start, int32_t n, float* out) {
  int32_t i = 0;
  switch (dtype) {
    case KvDtype::F32: std::memcpy(out, row + start * 4, static_cast<size_t>(n) * 4); return;
    case KvDtype::F16:
      decode_16bit(
          row + start * 2, n, out, [](__m128i h) { return _mm256_cvtph_ps(h); },
          [](uint16_t h) { return fp16_to_fp32(h); });
      return;
    case KvDtype::BF16:
      decode_16bit(
          row + start * 2, n, out,
          [](__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); },
          [](uint16_t h) { return bf16_to_fp32(h); });
      return;
    case KvDtype::Q8_0: {
      for (; i < n;) {
        const int64_t e = start + i, blk = e / 32, off = e % 32;
        const auto* b = reinterpret_cast<const BlockQ8_0*>(row + blk * 34);
        uint16_t dh;
        std::memcpy(&dh, &b->d, 2);
        const float d = fp16_to_fp32(dh);
        const int32_t take = std::min<int32_t>(n - i, static_cast<int32_t>(32 - off));
        if (off == 0 && take == 32) {
          const __m256 dv = _mm256_set1_ps(d);
          for (int j = 0; j < 32; j += 8) {
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + j));
            _mm256_storeu_ps(out + i + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), dv));
          }
        } else {
          for (int32_t j = 0; j < take; ++j) out[i + j] = static_cast<float>(b->qs[off + j]) * d;
        }
        i += take;
      }
      return;
    }
    case KvDtype::Q4_0: decode_blocks<KvDtype::Q4_0>(GgmlType::Q4_0, row, start, n, out); return;
    case KvDtype::Q4_1: decode_blocks<KvDtype::Q4_1>(GgmlType::Q4_1, row, start, n, out); return;
    case KvDtype::IQ4_NL: decode_blocks<KvDtype::IQ4_NL>(GgmlType::IQ4_NL, row, start, n, out); return;
    case KvDtype::Q5_0: decode_blocks<KvDtype::Q5_0>(GgmlType::Q5_0, row, start, n, out); return;
    case KvDtype::Q5_1: decode_blocks<KvDtype::Q5_1>(GgmlType::Q5_1, row, start, n, out); return;
  }
}

// Fixed-order dot product of length n.
inline float dot(const float* a, const float* b, int32_t n) {
  __m256 acc = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = detail::hsum8(acc);
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

// y = y * c (c applied only when != 1 is bit-identical to always applying it).
inline void scale_inplace(float* y, float c, int32_t n) {
  const __m256 cv = _mm256_set1_ps(c);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), cv));
  for (; i < n; ++i) y[i] *= c;
}

inline void axpy(float a, const float* x, float* y, int32_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// Generic head_dim (not a multiple of 8): plain loops, same structure.
void page_generic(const float* qg, const float* const* krow, const float* const* vrow, int32_t nk, int32_t group,
                  int32_t bs, int32_t hd, float scale, float* sc, float* acc, float* mrun, float* lrun) {
  for (int32_t g = 0; g < group; ++g) {
    float* sg = sc + g * bs;
    for (int32_t j = 0; j < nk; ++j) sg[j] = dot(qg + g * hd, krow[j], hd) * scale;
    float corr;
    if (detail::softmax_page(sg, nk, mrun + g, lrun + g, &corr)) scale_inplace(acc + g * hd, corr, hd);
    float l = lrun[g];
    for (int32_t j = 0; j < nk; ++j) l += sg[j];
    lrun[g] = l;
    for (int32_t j = 0; j < nk; ++j) axpy(sg[j], vrow[j], acc + g * hd, hd);
  }
}

}  // namespace

void paged_attention(const float* q, const KvLayerView& kv, const BatchView& batch, int32_t n_heads,
                     float scale, float* out, int32_t window) {
  const int32_t hd = kv.head_dim, nkv = kv.n_kv_heads, bs = kv.block_size;
  PAGODA_CHECK(nkv > 0 && n_heads % nkv == 0 && bs > 0 && bs <= kMaxBlockSize);
  const int32_t group = n_heads / nkv;
  // The AVX-512 kernel reads every K/V type with itself and three mixed pairs
  // (attend_token_avx512_supports), its arithmetic pinned by
  // PagedAttention.Avx512OutputsArePinned and Avx512QuantizedOutputsArePinned;
  // where cpu::set_attention chose the tile, and for other pairs, the AVX2
  // path below runs. The choice depends
  // only on the machine and the cache's shape, so a token's op sequence never
  // depends on the batch.
  const bool avx512 = detail::attention_avx512() &&
                      detail::attend_token_avx512_supports(kv.dtype, kv.v_dtype, hd);
  // The AVX-512 path takes tiles of kAvx512TileTokens (64: a KV head's slices
  // are decoded once per tile; 8 decoded them 8x as often, 137 vs 167 GFLOP/s
  // at depth 4096 on the Intel Xeon with 32, and 64 gained 3.5% over 32); the
  // AVX2 path, which blocks a tile's rows, kQueryTile.
  static_assert(detail::kAvx512TileTokens <= kQueryTile, "the per-item arrays below hold kQueryTile tokens");
  const int32_t qtile = avx512 ? detail::kAvx512TileTokens : kQueryTile;
  // Tiles of up to qtile consecutive tokens of one sequence: the tile decodes
  // each K/V page once for all its tokens (a prefill chunk's tokens read the same
  // pages). Each token's own op sequence is exactly what it would be alone.
  int32_t* tiles = reinterpret_cast<int32_t*>(detail::scratch(2, static_cast<size_t>(batch.n_tokens) * 12 + 12));
  int32_t n_tiles = 0;
  for (int32_t s = 0; s < batch.n_seqs; ++s) {
    for (int32_t t = batch.q_indptr[s]; t < batch.q_indptr[s + 1]; t += qtile) {
      tiles[3 * n_tiles] = s;
      tiles[3 * n_tiles + 1] = t;
      tiles[3 * n_tiles + 2] = std::min(t + qtile, batch.q_indptr[s + 1]);
      ++n_tiles;
    }
  }
  // Items: (tile, KV head, slice of the KV head's query heads). The query heads
  // of a KV head are split only when tiles x KV heads are fewer than the
  // threads (decode with one KV head: gemma3): each slice then reads the KV
  // head's pages itself. Every head's op sequence is the same in any slice.
  const int nth = detail::threads();
  const int64_t base_items = static_cast<int64_t>(n_tiles) * nkv;
  int32_t hsplit = 1;
  if (base_items < nth) {
    const int64_t need = (nth + base_items - 1) / base_items;
    hsplit = group;
    for (int32_t d = static_cast<int32_t>(std::min<int64_t>(need, group)); d < group; ++d) {
      if (group % d == 0) {
        hsplit = d;
        break;
      }
    }
  }
  const int32_t gs = group / hsplit;  // query heads per item
  // With enough tiles, some of them one token (decode of many sequences, alone
  // or beside a prefill chunk), an AVX-512 item is a whole tile, every KV head:
  // a decode token reads whole rows span by span, the next item's rows read
  // ahead meanwhile (RowPrefetch).
  // Prefill alone (no one-token tile) keeps items of one KV head: its tiles go
  // KV head by KV head in any case, and a pp512 is only 8 tiles, so whole-tile
  // items left one thread idle for up to an eighth of the work at the end.
  bool one_token_tiles = false;
  for (int32_t i = 0; i < n_tiles && !one_token_tiles; ++i) one_token_tiles = tiles[3 * i + 2] - tiles[3 * i + 1] == 1;
  const bool whole_rows = avx512 && hsplit == 1 && n_tiles >= 2 * nth && one_token_tiles;
  int32_t kv_per_item = whole_rows ? nkv : 1;
  // Decode of fewer sequences (one-token tiles): an AVX-512 item takes a run of
  // KV heads, as many as still leave every thread an item, and walks their
  // slices of each row together (attend_token_avx512 with n_kv > 1) instead of
  // one head's 128 bytes of every row per pass.
  if (avx512 && hsplit == 1 && !whole_rows && batch.n_tokens == batch.n_seqs) {
    for (int32_t d = nkv; d > 1; --d) {
      if (nkv % d == 0 && static_cast<int64_t>(n_tiles) * (nkv / d) >= nth) {
        kv_per_item = d;
        break;
      }
    }
  }
  const int64_t items = base_items * hsplit / kv_per_item;
  const size_t kvbuf = static_cast<size_t>(bs) * static_cast<size_t>(hd);
  const size_t per_token_floats = static_cast<size_t>(group) * (hd + 2);
  const int32_t ld = (bs + 7) / 8 * 8;  // row stride of the blocked kernel's scores (8 rows: page_rows8)
  const size_t sc_floats = std::max<size_t>(static_cast<size_t>(group) * bs, 8 * static_cast<size_t>(ld));
  const size_t per_item_floats = 2 * kvbuf + sc_floats + kQueryTile * per_token_floats;
  detail::parallel_for(items, nth, [&](int64_t item) {
    const int64_t it = item * kv_per_item;  // the (tile, KV head, slice) item it starts at
    const int32_t tile = static_cast<int32_t>(it / (nkv * hsplit));
    const int32_t kvh = static_cast<int32_t>(it / hsplit % nkv), h0 = kvh * group + static_cast<int32_t>(it % hsplit) * gs;
    const int32_t s = tiles[3 * tile], t0 = tiles[3 * tile + 1], nt = tiles[3 * tile + 2] - t0;
    const int64_t seq_len = kv_len(batch, s, bs);
    // Token i sees keys [first[i], n_keys[i]): causal, and with a sliding window
    // only the last `window` positions. Pages wholly before every token's window
    // are skipped; each token's op sequence depends only on its own position.
    int64_t n_keys[kQueryTile], first[kQueryTile];
    int64_t max_keys = 0, min_first = INT64_MAX;
    for (int32_t i = 0; i < nt; ++i) {
      const int64_t pos = batch.positions[t0 + i];
      n_keys[i] = std::min<int64_t>(seq_len, pos + 1);
      first[i] = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      max_keys = std::max(max_keys, n_keys[i]);
      min_first = std::min(min_first, first[i]);
    }
    const int32_t* pages = batch.kv_indices + batch.kv_indptr[s];
    if (avx512) {  // token by token, K/V decoded in registers (attention_avx512.cc)
      // Whole-row items of decode (a one-token tile): the next item's token
      // (usually this thread's next, items go out in contiguous ranges) is read
      // into cache during this one when it is another sequence's. The item's
      // own rows are read span by span with every KV head (attend_kv_span, which
      // reads the next span ahead), not one KV head over all the keys at a time
      // after a prefetch of every row at once: at depth 4096 the whole sequence's
      // rows (8 MiB a layer, 1B shape) left the cache before their head read them
      // (bench_attention_decode 4 4096 2 10 16 f16 1 8 4: 6.5 -> 10.9 GB/s; 2 4096
      // on 1 thread 3.9 -> 6.7; B=32 L=192 alike, Intel Xeon model 167).
      detail::RowPrefetch ahead;
      const bool read_ahead = whole_rows && nt == 1 && item + 1 < items && tiles[3 * tile + 3] != s;
      if (read_ahead) {
        const int32_t s2 = tiles[3 * tile + 3];
        const int64_t pos2 = batch.positions[tiles[3 * tile + 4]];
        const int64_t n2 = std::min<int64_t>(kv_len(batch, s2, bs), pos2 + 1);
        const int64_t first2 = window > 0 ? std::max<int64_t>(0, pos2 - window + 1) : 0;
        const int64_t steps = ((n_keys[0] - first[0]) / 16 + 1) * nkv;  // chunks of this item (about)
        ahead = detail::RowPrefetch(kv, batch.kv_indices + batch.kv_indptr[s2], first2, n2, steps);
      }
      // Decode items (whole rows, or the KV-head runs of few-sequence decode) go
      // span by span over their kv_per_item KV heads (n_kv > 1; kv_per_item > 1
      // only when hsplit == 1: the heads are contiguous); a tile's tokens of one
      // KV head go span by span together (attend_tokens_avx512), each reading a
      // span's slices from cache after the first. Each (token, head)'s ops are
      // those it has alone. So a one-token tile takes its kv_per_item KV heads
      // in one call; a longer tile (prefill) goes KV head by KV head.
      const int32_t runs = nt == 1 ? 1 : kv_per_item, n_kv = nt == 1 ? kv_per_item : 1;
      for (int32_t k = 0; k < runs; ++k) {
        detail::TokenAttn toks[detail::kAvx512TileTokens];
        for (int32_t i = 0; i < nt; ++i) {
          const int64_t at = (static_cast<int64_t>(t0 + i) * n_heads + h0 + k * group) * hd;
          toks[i] = {.q = q + at, .out = out + at, .n_heads = gs, .kv = &kv, .kv_head = kvh + k, .n_kv = n_kv,
                     .pages = pages, .first = first[i], .n_keys = n_keys[i], .scale = scale,
                     .ahead = read_ahead ? &ahead : nullptr};
        }
        if (nt == 1) {
          detail::attend_token_avx512(toks[0]);
        } else {  // a tile of one KV head: span by span over its tokens (attend_tokens_avx512)
          detail::attend_tokens_avx512(toks, nt);
        }
      }
      return;
    }
    float* buf = reinterpret_cast<float*>(detail::scratch(3, per_item_floats * sizeof(float)));
    float* kbuf = buf;                        // [bs, hd] decoded K of one page
    float* vbuf = kbuf + kvbuf;               // [bs, hd] decoded V of one page
    float* sc = vbuf + kvbuf;                 // [group, bs] scores, then probabilities
    float* state = sc + sc_floats;            // per token: acc [group, hd], mrun [group], lrun [group]
    for (int32_t i = 0; i < nt; ++i) {
      float* st = state + i * per_token_floats;
      std::fill(st, st + gs * hd, 0.0f);
      std::fill(st + gs * hd, st + gs * (hd + 1), -INFINITY);
      std::fill(st + gs * (hd + 1), st + gs * (hd + 2), 0.0f);
    }
    const int64_t head_off = static_cast<int64_t>(kvh) * hd;
    // head_dim / 8 for the sizes the blocked kernel specializes, else 0 (generic).
    const int32_t nv = (hd == 8 || hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256) ? hd / 8 : 0;
    const size_t slice_off = kv_row_bytes(kv.dtype, head_off), slice_bytes = kv_row_bytes(kv.dtype, hd);
    const size_t v_slice_off = kv_row_bytes(kv.v_dtype, head_off), v_slice_bytes = kv_row_bytes(kv.v_dtype, hd);
    for (int64_t p0 = min_first / bs * bs; p0 < max_keys; p0 += bs) {
      const int32_t nk = static_cast<int32_t>(std::min<int64_t>(bs, max_keys - p0));
      const int32_t j_lo = static_cast<int32_t>(std::max<int64_t>(0, min_first - p0));  // first key any token sees
      const int64_t slot0 = static_cast<int64_t>(pages[p0 / bs]) * bs;
      if (p0 + bs < max_keys) {  // next page's K/V head slices: pages are scattered, so prefetch them
        const int64_t next = static_cast<int64_t>(pages[p0 / bs + 1]) * bs;
        const int32_t nn = static_cast<int32_t>(std::min<int64_t>(bs, max_keys - p0 - bs));
        for (int32_t j = 0; j < nn; ++j) {
          const size_t off = static_cast<size_t>(next + j) * kv.row_bytes + slice_off;
          const size_t voff = static_cast<size_t>(next + j) * kv.v_row_bytes + v_slice_off;
          for (size_t b = 0; b < std::max(slice_bytes, v_slice_bytes); b += 64) {
            if (b < slice_bytes) _mm_prefetch(reinterpret_cast<const char*>(kv.k + off + b), _MM_HINT_T0);
            if (b < v_slice_bytes) _mm_prefetch(reinterpret_cast<const char*>(kv.v + voff + b), _MM_HINT_T0);
          }
        }
      }
      const float* krow[kMaxBlockSize];
      const float* vrow[kMaxBlockSize];
      for (int32_t j = j_lo; j < nk; ++j) {
        const uint8_t* kr = kv.k + (slot0 + j) * kv.row_bytes;
        const uint8_t* vr = kv.v + (slot0 + j) * kv.v_row_bytes;
        if (kv.dtype == KvDtype::F32) {
          krow[j] = reinterpret_cast<const float*>(kr) + head_off;
        } else {
          decode_slice(kv.dtype, kr, head_off, hd, kbuf + j * hd);
          krow[j] = kbuf + j * hd;
        }
        if (kv.v_dtype == KvDtype::F32) {
          vrow[j] = reinterpret_cast<const float*>(vr) + head_off;
        } else {
          decode_slice(kv.v_dtype, vr, head_off, hd, vbuf + j * hd);
          vrow[j] = vbuf + j * hd;
        }
      }
      // Each token's keys in this page: [lo, lo + nki) of krow/vrow.
      int32_t lo_of[kQueryTile], nk_of[kQueryTile];
      for (int32_t i = 0; i < nt; ++i) {
        lo_of[i] = static_cast<int32_t>(std::max<int64_t>(0, first[i] - p0));
        nk_of[i] = static_cast<int32_t>(std::min<int64_t>(nk, n_keys[i] - p0)) - lo_of[i];
      }
      if (nv == 0) {  // generic head_dim: token by token
        for (int32_t i = 0; i < nt; ++i) {
          if (nk_of[i] <= 0) continue;  // causal: this page starts after the token (or ends before its window)
          const float* qg = q + (static_cast<int64_t>(t0 + i) * n_heads + h0) * hd;  // [gs, hd]
          float* acc = state + i * per_token_floats;
          page_generic(qg, krow + lo_of[i], vrow + lo_of[i], nk_of[i], gs, bs, hd, scale, sc, acc, acc + gs * hd,
                       acc + gs * (hd + 1));
        }
        continue;
      }
      // Runs of consecutive tokens with the same key range (every token of the
      // tile on the pages before the chunk): their (token, head) rows go
      // through the page in blocks that share each K/V load.
      for (int32_t i = 0; i < nt;) {
        int32_t i2 = i + 1;
        while (i2 < nt && lo_of[i2] == lo_of[i] && nk_of[i2] == nk_of[i]) ++i2;
        if (nk_of[i] > 0) {
          detail::TileRow rows[kMaxRows];
          int32_t n_rows = 0;
          const int32_t lo = lo_of[i], nki = nk_of[i];
          const auto flush = [&] {
            switch (nv) {
              case 1: detail::page_block<1>(rows, n_rows, krow + lo, vrow + lo, nki, scale, sc, ld); break;
              case 2: detail::page_block<2>(rows, n_rows, krow + lo, vrow + lo, nki, scale, sc, ld); break;
              case 4: detail::page_block<4>(rows, n_rows, krow + lo, vrow + lo, nki, scale, sc, ld); break;
              case 8: detail::page_block<8>(rows, n_rows, krow + lo, vrow + lo, nki, scale, sc, ld); break;
              case 16: detail::page_block<16>(rows, n_rows, krow + lo, vrow + lo, nki, scale, sc, ld); break;
              default: detail::page_block<32>(rows, n_rows, krow + lo, vrow + lo, nki, scale, sc, ld); break;
            }
            n_rows = 0;
          };
          for (int32_t t = i; t < i2; ++t) {
            float* acc = state + t * per_token_floats;
            const float* qt = q + (static_cast<int64_t>(t0 + t) * n_heads + h0) * hd;
            for (int32_t g = 0; g < gs; ++g) {
              rows[n_rows++] = {qt + g * hd, acc + g * hd, acc + gs * hd + g, acc + gs * (hd + 1) + g};
              if (n_rows == kMaxRows) flush();
            }
          }
          if (n_rows > 0) flush();
        }
        i = i2;
      }
    }
    for (int32_t i = 0; i < nt; ++i) {
      const float* acc = state + i * per_token_floats;
      const float* lrun = acc + gs * (hd + 1);
      for (int32_t g = 0; g < gs; ++g) {
        float* o = out + (static_cast<int64_t>(t0 + i) * n_heads + h0 + g) * hd;
        const float inv = n_keys[i] > first[i] ? 1.0f / lrun[g] : 0.0f;
        for (int32_t d = 0; d < hd; ++d) o[d] = acc[g * hd + d] * inv;
      }
    }
  });
}

}  // namespace pagoda::kernels::cpu
