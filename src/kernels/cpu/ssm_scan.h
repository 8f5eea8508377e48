// Internal to kernels/cpu: one head of cpu::ssm_scan (api.h), per ISA.
#pragma once
#include <cstdint>

namespace pagoda::kernels::cpu::detail {

// Head h's P rows over T tokens: x[t * ld_x + i], B/C rows of token t at
// B + t * ld_bc (the head's group), dt_sp[t * stride_h], dA[t * stride_h],
// out[t * ld_out + i] = row . C + x * D. Requires N % 8 == 0 (AVX2) / N % 16 == 0 (AVX-512).
struct ScanHead {
  const float* x;
  int64_t ld_x;
  const float* B;
  const float* C;
  int64_t ld_bc;
  const float* dt_sp;
  const float* dA;
  int64_t stride_h;
  float D;
  float* const* rows;  // [P]
  float* out;
  int64_t ld_out;
  int64_t T, P, N;
  bool fresh;
};

void scan_head_avx2(const ScanHead& h);
void scan_head_avx512(const ScanHead& h);

}  // namespace pagoda::kernels::cpu::detail
