// The many-token GEMM over packed Q4_0 / Q4_1 / Q8_0 weights (issue 23), AVX-512
// VNNI: gemm_panel_avx512.cc. Only matmul_avx512.cc calls it, and only where
// the CPU has AVX-512 (dispatch.cc).
#pragma once
#include <cstdint>

#include "base/ggml_types.h"
#include "kernels/cpu/cpu_internal.h"

namespace pagoda::kernels::cpu::detail {

// The weight types the panels take.
constexpr bool panel_type(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q8_0; }
// From this many tokens on, packed Q4_0 / Q4_1 / Q8_0 go through the panels
// (fewer stay direct: restaging a chunk costs about what a few direct tiles do).
constexpr int64_t kPanelMinTokens = 16;

// y[n_tokens, w.rows] = x[n_tokens, w.cols] * w^T for w packed (w.packed, pack.h)
// of a panel_type; bitwise what matmul_avx512's direct kernel gives (see the .cc).
template <GgmlType kType>
void matmul_panels(const WeightView& w, const float* x, int64_t n_tokens, float* y);

extern template void matmul_panels<GgmlType::Q4_0>(const WeightView&, const float*, int64_t, float*);
extern template void matmul_panels<GgmlType::Q4_1>(const WeightView&, const float*, int64_t, float*);
extern template void matmul_panels<GgmlType::Q8_0>(const WeightView&, const float*, int64_t, float*);

}  // namespace pagoda::kernels::cpu::detail
