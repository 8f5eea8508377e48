#include "kernels/backend.h"

namespace pagoda::kernels {

namespace {

constexpr Backend kCpu{
    .name = "cpu",
    .matmul = &cpu::matmul,
    .matmul_multi = &cpu::matmul_multi,
    .rmsnorm = &cpu::rmsnorm,
    .rope = &cpu::rope,
    .kv_write = &kv_write,
    .paged_attention = &cpu::paged_attention,
    .get_rows = &get_rows,
    .gather_rows = &gather_rows,
    .add = &add_inplace,
    .add_rows = &add_rows,
    .silu_mul = &silu_mul,
    .gelu_mul = &cpu::gelu_mul,
    .mul_scalar = &mul_scalar,
};

// The shared ops (api.h) are the same functions as cpu's: ref checks the
// kernels that carry the arithmetic, and its forward stays the recorded one.
constexpr Backend kRef{
    .name = "ref",
    .matmul = &ref::matmul,
    .matmul_multi = &ref::matmul_multi,
    .rmsnorm = &ref::rmsnorm,
    .rope = &ref::rope,
    .kv_write = &kv_write,
    .paged_attention = &ref::paged_attention,
    .get_rows = &get_rows,
    .gather_rows = &gather_rows,
    .add = &add_inplace,
    .add_rows = &add_rows,
    .silu_mul = &silu_mul,
    .gelu_mul = &ref::gelu_mul,
    .mul_scalar = &mul_scalar,
};

}  // namespace

const Backend& backend(BackendKind kind) { return kind == BackendKind::Ref ? kRef : kCpu; }

}  // namespace pagoda::kernels
