// The many-token GEMM of the AVX2 path over Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
// weights: gemm_panel_avx2.cc. Only matmul_avx2.cc calls it.
#pragma once
#include <cstdint>

#include "base/ggml_types.h"
#include "kernels/cpu/cpu_internal.h"

namespace pagoda::kernels::cpu::detail {

// From this many tokens on, matmul_avx2 takes the panels; fewer go through its
// direct tiles (restaging the rows costs about what a few direct tiles do).
constexpr int64_t kPanelMinTokensAvx2 = 8;

// y[n_tokens, w.rows] = x[n_tokens, w.cols] * w^T from the GGUF rows of w
// (w.packed is ignored); bitwise what matmul_avx2's direct tiles give.
template <GgmlType kType>
void matmul_panels_avx2(const WeightView& w, const float* x, int64_t n_tokens, float* y);

extern template void matmul_panels_avx2<GgmlType::Q4_0>(const WeightView&, const float*, int64_t, float*);
extern template void matmul_panels_avx2<GgmlType::Q4_1>(const WeightView&, const float*, int64_t, float*);
extern template void matmul_panels_avx2<GgmlType::Q5_0>(const WeightView&, const float*, int64_t, float*);
extern template void matmul_panels_avx2<GgmlType::Q5_1>(const WeightView&, const float*, int64_t, float*);
extern template void matmul_panels_avx2<GgmlType::Q8_0>(const WeightView&, const float*, int64_t, float*);

}  // namespace pagoda::kernels::cpu::detail
