// Internal to kernels/cpu: the AVX-512 attention of one token over its keys
// (paged_attention's fast path, attention.cc drives it).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/api.h"

namespace pagoda::kernels::cpu::detail {

// Reads another token's K/V rows (every KV head: whole rows, one contiguous run
// per page) into cache a few lines at a time, while the current token computes:
// decode reads each sequence's keys once per layer from scattered pages, and
// one thread's demand misses alone reach only a third of what it can stream
// with the reads issued ahead. Only prefetches: never changes a result.
class RowPrefetch {
 public:
  RowPrefetch() = default;
  // Keys [first, n_keys) of the sequence whose pages are pages[]; `steps`: the
  // calls of step() expected before the rows are needed (each then reads an
  // even share of the lines).
  RowPrefetch(const KvLayerView& kv, const int32_t* pages, int64_t first, int64_t n_keys, int64_t steps);
  void step();

 private:
  void next_page();
  const KvLayerView* kv_ = nullptr;
  const int32_t* pages_ = nullptr;
  int64_t first_ = 0, n_keys_ = 0, page_ = 0;  // page_: the logical page being read
  size_t off_ = 0, end_ = 0;                   // byte range of K left in that page's run
  size_t v_off_ = 0, v_end_ = 0;               // and of V
  int64_t per_step_ = 0;                       // lines (of K, and as many of V) per step()
};

// One token's heads [0, n_heads) of each of the KV heads [kv_head, kv_head +
// n_kv): q [n_kv, n_heads, head_dim] in, out [n_kv, n_heads, head_dim] out,
// over the token's keys [first, n_keys) (logical positions; pages[] maps them
// to blocks). Every head's result is the same bits for any n_kv.
struct TokenAttn {
  const float* q = nullptr;
  float* out = nullptr;
  int32_t n_heads = 0;
  const KvLayerView* kv = nullptr;
  int32_t kv_head = 0;
  int32_t n_kv = 1;
  const int32_t* pages = nullptr;
  int64_t first = 0, n_keys = 0;
  float scale = 1.0f;
  RowPrefetch* ahead = nullptr;  // stepped once per chunk when set
};

// Whether attend_token_avx512 takes this pair of K and V types and head size:
// every type with itself (f32, f16, bf16, q8_0 and the 4/5-bit types) and the
// pairs f16/q8_0, f16/q4_0, q8_0/q4_0 (K/V); head_dim 16 (16-bit and f32 types
// only), 32, 64, 128 or 256.
bool attend_token_avx512_supports(KvDtype k_dtype, KvDtype v_dtype, int32_t head_dim);
void attend_token_avx512(const TokenAttn& a);
// Tokens of one sequence and one KV head (n_kv == 1 each, the same kv, kv_head,
// pages, scale and n_heads; their own q, out, first, n_keys), a prefill tile:
// each token's result is bitwise attend_token_avx512's for it alone.
void attend_tokens_avx512(const TokenAttn* toks, int nt);
// Tokens per tile on the AVX-512 path (attention.cc's tiles; attend_tokens_avx512's most).
constexpr int32_t kAvx512TileTokens = 64;

}  // namespace pagoda::kernels::cpu::detail
