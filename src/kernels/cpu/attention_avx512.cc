// AVX-512 attention of one token over its paged keys (decode), its KV heads
// one at a time or in runs walked span by span, and the entry points
// (attention_avx512.h); prefill tiles in attention_tile_avx512.cc, the per-head
// machinery both use in attention_head_run_avx512.h.
#include "kernels/cpu/attention_avx512.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/attention_head_run_avx512.h"

namespace pagoda::kernels::cpu::detail {
namespace {

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
    prefetch_key_slices(kv, a.pages, std::max(p0, a.first), p1, k_off, k_run, v_off, v_run);
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
