// Internal to kernels/cpu: one v-head of cpu::gated_delta_net (api.h), per ISA.
#pragma once
#include <cstdint>

namespace pagoda::kernels::cpu::detail {

// Head h's S rows over T tokens. q/k rows of token t at qn + t * qk_stride (the
// head's normalized q and k); v[t * ld_v + j]; eg[t * g_stride] = exp(g),
// b[t * g_stride]; out[t * ld_out + j]. Requires S % 8 == 0 (AVX2) / S % 16 == 0 (AVX-512).
struct DeltaHead {
  const float* qn;
  const float* kn;
  int64_t qk_stride;
  const float* eg;
  const float* b;
  int64_t g_stride;
  const float* v;
  int64_t ld_v;
  float* const* rows;  // [S]
  float* out;
  int64_t ld_out;
  int64_t T, S;
  float scale;
  bool fresh;
};

void delta_head_avx2(const DeltaHead& h);
void delta_head_avx512(const DeltaHead& h);

}  // namespace pagoda::kernels::cpu::detail
