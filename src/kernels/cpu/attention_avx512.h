// Internal to kernels/cpu: the AVX-512 attention of one token over its keys
// (paged_attention's fast path, attention.cc drives it).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/api.h"

namespace pagoda::kernels::cpu::detail {

// One token's heads [0, n_heads) of one KV head: q [n_heads, head_dim] in, out
// [n_heads, head_dim] out, over the token's keys [first, n_keys) (logical
// positions; pages[] maps them to blocks).
struct TokenAttn {
  const float* q = nullptr;
  float* out = nullptr;
  int32_t n_heads = 0;
  const KvLayerView* kv = nullptr;
  int32_t kv_head = 0;
  const int32_t* pages = nullptr;
  int64_t first = 0, n_keys = 0;
  float scale = 1.0f;
};

// Whether attend_token_avx512 takes this KV dtype and head size (f32, f16 and
// bf16 K/V; head_dim a multiple of 16 up to 256).
bool attend_token_avx512_supports(KvDtype dtype, int32_t head_dim);
void attend_token_avx512(const TokenAttn& a);

}  // namespace pagoda::kernels::cpu::detail
