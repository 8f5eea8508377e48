// The kernel backend table: every operation a model forward performs, as one
// struct of function pointers. Model files call only through it, so a new
// backend is a new kernels/<name>/ folder plus one table in backend.cc, and
// never an edit to a model file. One indirect call per op per layer; the
// functions allocate nothing per call (scratch is per-thread and grows once).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/api.h"

namespace pagoda::kernels {

enum class BackendKind : uint8_t {
  Cpu,  // SIMD + threads (cpu/), the default
  Ref,  // scalar oracles (ref/) for matmul, rmsnorm, rope, attention and gelu_mul: debugging, parity tests
};

// Shapes and contracts are those of the functions of the same name in api.h.
struct Backend {
  const char* name;
  void (*matmul)(const WeightView& w, const float* x, int64_t n_tokens, float* y);
  void (*matmul_multi)(const WeightView* const* ws, int n, const float* x, int64_t n_tokens, float* const* ys);
  void (*rmsnorm)(const float* x, const float* weight, float eps, int64_t n_tokens, int64_t n, float* y);
  void (*rope)(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
               int32_t rope_dim, float theta_base, bool neox, const RopeScaling& scaling);
  void (*kv_write)(const KvLayerView& kv, const float* k, const float* v, const int64_t* slot_mapping,
                   int64_t n_tokens);
  void (*paged_attention)(const float* q, const KvLayerView& kv, const BatchView& batch, int32_t n_heads,
                          float scale, float* out, int32_t window);
  void (*get_rows)(const WeightView& table, const int32_t* ids, int64_t n_ids, float* out);
  void (*gather_rows)(const float* x, int64_t n, const int32_t* rows, int64_t n_rows, float* out);
  void (*add)(float* x, const float* y, int64_t n);
  void (*add_rows)(float* x, const float* bias, int64_t n_rows, int64_t n);
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  void (*gelu_mul)(float* gate, const float* up, int64_t n);
  void (*mul_scalar)(float* x, float s, int64_t n);
  void (*hadamard_rotate)(float* x, int64_t n, int32_t block);
  // ref::short_conv in both tables (api.h: its cost is negligible beside the matmuls).
  void (*short_conv)(const float* bcx, int64_t n_tokens, int64_t n, const float* weight, int32_t l_cache,
                     float* const* state, bool fresh, float* y);
  // Qwen3.5 (api.h): ref::ssm_conv_silu in both tables; gated_delta_net ref or cpu.
  void (*ssm_conv_silu)(const float* x, int64_t n_tokens, int64_t C, const float* weight, int32_t K,
                        float* const* state, int32_t row_floats, bool fresh, float* y, const float* bias);
  void (*gated_delta_net)(const GatedDeltaNetArgs& a);
  // Mamba-2 (api.h): ssm_scan ref or cpu.
  void (*ssm_scan)(const Mamba2ScanArgs& a);
  void (*sigmoid_mul)(float* x, const float* gate, int64_t n);
};

// The table of a backend; static storage, valid for the program's lifetime.
const Backend& backend(BackendKind kind);

// Decode-packed weights (cpu/pack.h, issue 22). Bytes of the CPU backend's packed
// copy of w: 0 when it does not pack w (types other than Q4_0 / Q4_1 / Q5_0 /
// Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K, or the CPU matmul in use is not the AVX-512 one).
size_t packed_weight_bytes(const WeightView& w);
// Writes that copy to dst (64-byte aligned, packed_weight_bytes(w) bytes; uses
// the thread pool). The caller then sets w.packed = dst and keeps dst alive.
void pack_weight(const WeightView& w, uint8_t* dst);

// Memory for packed copies: anonymous, 2 MiB aligned, transparent huge pages
// asked for (madvise), since decode streams all of it every token and 4 KiB
// pages cost a TLB miss every 4 KiB. Zero-filled; not copyable.
class PackedBuffer {
 public:
  PackedBuffer() = default;
  explicit PackedBuffer(size_t bytes);
  ~PackedBuffer();
  PackedBuffer(const PackedBuffer&) = delete;
  PackedBuffer& operator=(const PackedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* map_ = nullptr;  // the whole mapping (data_ is 2 MiB aligned inside it)
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pagoda::kernels
