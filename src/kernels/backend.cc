#include "kernels/backend.h"

namespace pagoda::kernels {

namespace {

// The kernels that carry a backend's own arithmetic. The other table entries,
// api.h's shared ops (kv_write, row gathers, adds, silu_mul, mul_scalar,
// hadamard_rotate), are the
// same functions for every backend: ref checks the arithmetic kernels, and its
// forward stays the recorded one.
struct ArithKernels {
  decltype(Backend::matmul) matmul;
  decltype(Backend::matmul_multi) matmul_multi;
  decltype(Backend::rmsnorm) rmsnorm;
  decltype(Backend::rope) rope;
  decltype(Backend::paged_attention) paged_attention;
  decltype(Backend::gelu_mul) gelu_mul;
  decltype(Backend::gated_delta_net) gated_delta_net;
  decltype(Backend::ssm_scan) ssm_scan;
};

constexpr Backend make_backend(const char* name, const ArithKernels& k) {
  return Backend{.name = name,
                 .matmul = k.matmul,
                 .matmul_multi = k.matmul_multi,
                 .rmsnorm = k.rmsnorm,
                 .rope = k.rope,
                 .kv_write = &kv_write,
                 .paged_attention = k.paged_attention,
                 .get_rows = &get_rows,
                 .gather_rows = &gather_rows,
                 .add = &add_inplace,
                 .add_rows = &add_rows,
                 .silu_mul = &silu_mul,
                 .gelu_mul = k.gelu_mul,
                 .mul_scalar = &mul_scalar,
                 .hadamard_rotate = &hadamard_rotate,
                 .short_conv = &ref::short_conv,
                 .ssm_conv_silu = &ref::ssm_conv_silu,
                 .gated_delta_net = k.gated_delta_net,
                 .ssm_scan = k.ssm_scan,
                 .sigmoid_mul = &sigmoid_mul};
}

constexpr Backend kCpu = make_backend("cpu", {&cpu::matmul, &cpu::matmul_multi, &cpu::rmsnorm, &cpu::rope,
                                              &cpu::paged_attention, &cpu::gelu_mul, &cpu::gated_delta_net,
                                              &cpu::ssm_scan});
constexpr Backend kRef = make_backend("ref", {&ref::matmul, &ref::matmul_multi, &ref::rmsnorm, &ref::rope,
                                              &ref::paged_attention, &ref::gelu_mul, &ref::gated_delta_net,
                                              &ref::ssm_scan});

}  // namespace

const Backend& backend(BackendKind kind) { return kind == BackendKind::Ref ? kRef : kCpu; }

}  // namespace pagoda::kernels
