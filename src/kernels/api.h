// Kernel API: plain non-owning views and function signatures. Two
// implementations stand behind it: ref/ (scalar oracles, obviously correct) and
// cpu/ (SIMD + threads, chosen at run time between AVX2 and AVX-512), plus the
// ops both share (shared_ops.cc, cpu/ops.cc's silu_mul). Model code reaches them
// only through the backend table of kernels/backend.h.
//
// Batch invariance contract (every cpu/ kernel): each output element is computed
// with a fixed reduction order that depends only on its own row/token inputs,
// never on how many other tokens are in the batch, which other tokens they are,
// the physical block ids, or the thread count. Threads split output rows, never
// a reduction. This makes greedy output identical alone, batched, after
// preemption and on a prefix-cache hit.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/ggml_types.h"
#include "base/kv_dtype.h"

namespace pagoda::kernels {

// ---- Weights ---------------------------------------------------------------
// A weight matrix W of `rows` output features, each a row of `cols` elements
// stored in `type` (ggml layout; quantized rows are sequences of blocks).
struct WeightView {
  const void* data = nullptr;
  GgmlType type = GgmlType::F32;
  int64_t rows = 0;       // output features
  int64_t cols = 0;       // input features (multiple of the type's block size)
  size_t row_bytes = 0;   // stride between rows
  // Optional decode-packed copy of the same matrix (cpu/pack.h; set by the model
  // loader through kernels::pack_weight); the AVX-512 CPU matmul reads it instead
  // of `data`, every other path ignores it. `data` stays valid either way.
  const void* packed = nullptr;
};

// ---- KV cache (one layer) ----------------------------------------------------
// The one KV dtype enum lives in base/kv_dtype.h (engine, sizing and flags share it).
using KvDtype = pagoda::KvDtype;
using pagoda::kv_dtype_name;
using pagoda::kv_row_bytes;

// K and V pools of one layer, indexed by slot = block_id * block_size + offset.
// Each slot holds one K row of n_kv_heads * head_dim values in `dtype` and one
// V row in `v_dtype` (llama.cpp's -ctk / -ctv); the quantized types quantize
// the row in blocks of 32 over the whole row.
struct KvLayerView {
  uint8_t* k = nullptr;      // [num_blocks * block_size, row_bytes]
  uint8_t* v = nullptr;      // [num_blocks * block_size, v_row_bytes]
  KvDtype dtype = KvDtype::F32;  // K's type
  int32_t block_size = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  size_t row_bytes = 0;      // K's row stride
  // The KV cache group whose block table addresses this layer (kv::KvManager
  // groups; 0 with one group): the layer reads group_view(batch, group).
  int32_t group = 0;
  KvDtype v_dtype = KvDtype::F32;  // V's type
  size_t v_row_bytes = 0;          // V's row stride
};

// ---- One step's ragged batch (built once per step by plan/) ------------------
// Sequences s = 0..n_seqs-1; the step's tokens are laid out sequence after
// sequence: the new tokens of s are rows q_indptr[s] .. q_indptr[s+1]-1.
// Sequence s's K/V lives in blocks kv_indices[kv_indptr[s] .. kv_indptr[s+1]-1]
// in logical order; the last page holds kv_last_page_len[s] tokens (>= 1). The
// K/V of this step's tokens is written (via slot_mapping) before attention runs,
// so kv length includes them. Causal: a token at position p sees positions <= p.
struct BatchView {
  int32_t n_tokens = 0;
  int32_t n_seqs = 0;
  const int32_t* token_ids = nullptr;        // [n_tokens]
  const int32_t* positions = nullptr;        // [n_tokens] absolute position in its sequence
  const int64_t* slot_mapping = nullptr;     // [n_tokens] slot receiving the token's K/V
  const int32_t* q_indptr = nullptr;         // [n_seqs + 1]
  const int32_t* kv_indptr = nullptr;        // [n_seqs + 1]
  const int32_t* kv_indices = nullptr;       // [kv_indptr[n_seqs]] block ids
  const int32_t* kv_last_page_len = nullptr; // [n_seqs]
  int32_t n_logits = 0;
  const int32_t* logit_rows = nullptr;       // [n_logits] token rows whose logits are wanted
  // KV cache groups 1.. (none with one group; the fields above are group 0's).
  // Every group's tables have the same logical length, so kv_indptr and
  // kv_last_page_len are shared; a window group's kv_indices hold the null
  // block 0 before its window, which paged_attention never reads (it starts at
  // the page of the first key in the window).
  int32_t n_groups = 1;
  const struct KvGroupBatch* groups = nullptr;  // [n_groups - 1]: groups 1..
  // Recurrent state (hybrid models; kv/recurrent_state_group.cc): each sequence's
  // fixed-size state as n_state_rows f32 rows, state_rows[s * n_state_rows + r]
  // row r of sequence s (which row holds what is the architecture's business;
  // each row is row-width floats, contiguous). The state is read and rewritten
  // by every step; a sequence whose first new token is at position 0 starts
  // from the zero state (its rows' old bytes are ignored). 0 / null: none.
  int32_t n_state_rows = 0;
  float* const* state_rows = nullptr;  // [n_seqs * n_state_rows]
};

// One KV group's addressing of a step (group g >= 1 of a BatchView).
struct KvGroupBatch {
  const int64_t* slot_mapping = nullptr;  // [n_tokens]
  const int32_t* kv_indices = nullptr;    // [kv_indptr[n_seqs]]
};

// The BatchView a layer of group g reads: group 0 is the view itself.
inline BatchView group_view(const BatchView& b, int32_t g) {
  if (g == 0) return b;
  BatchView v = b;
  v.slot_mapping = b.groups[g - 1].slot_mapping;
  v.kv_indices = b.groups[g - 1].kv_indices;
  return v;
}

inline int64_t kv_len(const BatchView& b, int32_t seq, int32_t block_size) {
  const int32_t pages = b.kv_indptr[seq + 1] - b.kv_indptr[seq];
  return pages == 0 ? 0 : static_cast<int64_t>(pages - 1) * block_size + b.kv_last_page_len[seq];
}

// ---- Rotary scaling (llama 3.x, phi3 LongRoPE, linear, YaRN) ---------------------
// As ggml_rope_ext: the angle of rotary pair i at position p is
// theta_e = p * base^(-2i/rope_dim) / freq_factors[i] extrapolated, theta_i =
// theta_e * freq_scale interpolated; theta = theta_i, or with YaRN (ext_factor
// != 0) theta_i * (1 - mix) + theta_e * mix, mix = ext_factor * ramp(i), ramp 1
// below yarn_low, 0 above yarn_high, linear between. The rotation (cos and sin)
// is scaled by attn_factor, with YaRN times 1 + 0.1 ln(1 / freq_scale). The
// defaults are plain RoPE, bit for bit.
struct RopeScaling {
  const float* freq_factors = nullptr;  // [rope_dim / 2] or null (all 1)
  float freq_scale = 1.0f;              // 1 / rope.scaling.factor (linear scaling)
  float attn_factor = 1.0f;             // rope.scaling.attn_factor (phi3 LongRoPE)
  float ext_factor = 0.0f;              // YaRN: 1 (0: off)
  float yarn_low = 0.0f, yarn_high = 0.0f;  // YaRN's correction dims (rotary pair indices)
};

// theta: the extrapolated angle of rotary pair i in, the scaled angle out; returns
// the rotation's scale (ggml's rope_yarn, in double). Shared by cpu:: and ref::
// rope so that both compute the same values.
inline double rope_yarn(double& theta, int32_t i, const RopeScaling& s) {
  const double extrap = theta;
  theta *= s.freq_scale;
  double mscale = s.attn_factor;
  if (s.ext_factor != 0.0f) {
    const double y = (i - s.yarn_low) / std::max(0.001, static_cast<double>(s.yarn_high - s.yarn_low));
    const double mix = (1.0 - std::min(1.0, std::max(0.0, y))) * s.ext_factor;
    theta = theta * (1.0 - mix) + extrap * mix;
    mscale *= 1.0 + 0.1 * std::log(1.0 / s.freq_scale);
  }
  return mscale;
}

// ---- Threads -----------------------------------------------------------------
// Every cpu:: kernel splits its rows over num_threads() threads of one persistent
// pool (cpu/thread_pool.h); scratch memory is thread_local, and a call made while
// another thread's call holds the pool runs on its caller alone, so calls from
// different threads are safe. The default is OMP_NUM_THREADS when set, else the
// CPUs the process may run on.
void set_num_threads(int n);
int num_threads();
// The pool's co-tenancy counters so far, process-wide (cpu/thread_pool.h,
// "stalls"): stalls (a worker preempted by another process held a loop up for
// at least 500 us; loops then ran on the caller alone for a while) and long
// waits (stalls plus waits in which no worker was preempted).
struct PoolCounts {
  int64_t stalls = 0, long_waits = 0;
};
PoolCounts pool_counts();
// Host work between kernel calls (e.g. the engine's per-choice grammar masks):
// call(ctx, i) once for every i in [0, n_items), on the same pool and threads as
// the kernels, so no second team of threads competes with them for the cores.
void parallel_for(int64_t n_items, void (*call)(void* ctx, int64_t item), void* ctx);
template <class F>
void parallel_for(int64_t n_items, F&& fn) {
  parallel_for(n_items, [](void* ctx, int64_t i) { (*static_cast<std::remove_reference_t<F>*>(ctx))(i); },
               const_cast<void*>(static_cast<const void*>(&fn)));
}

// ---- Ops with a scalar oracle (ref::) and a fast version (cpu::) ---------------
#define PAGODA_KERNEL_OPS                                                                       \
  /* y[t, r] = sum_c W[r, c] * x[t, c].  x: [n_tokens, w.cols], y: [n_tokens, w.rows]          \
     cpu:: multiplies quantized weights (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) by an 8-bit quantization    \
     of x bit for bit as ggml's x86 quantize_row_q8_0/q8_1 (per 32 values, q = round(x *       \
     127/amax), d = f16(amax/127), q8_1's s = f16(d * sum q)), and K-quants (Q2_K..Q6_K,       \
     IQ4_XS) by a q8_K quantization (per 256 values, one f32 d, as ggml's                      \
     quantize_row_q8_K_ref) in integer arithmetic; so it matches ref within the activation     \
     rounding, not to float precision. Env PAGODA_KQUANT_FALLBACK=1 (read at the first call)   \
     sends K-quants through the dequantize-to-f32 path instead. */                             \
  void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y);                 \
  /* Several matmuls of one x: ys[i] = ws[i] x for i < n, each exactly as matmul computes it   \
     (bitwise). cpu:: runs them as one thread-pool launch at decode sizes (Q/K/V, gate/up). */ \
  void matmul_multi(const WeightView* const* ws, int n, const float* x, int64_t n_tokens,       \
                    float* const* ys);                                                          \
  /* y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight.  x, y: [n_tokens, n] */         \
  void rmsnorm(const float* x, const float* weight, float eps, int64_t n_tokens, int64_t n,     \
               float* y);                                                                       \
  /* In place. x: [n_tokens, n_heads, head_dim]; rotates the first rope_dim dims of each head. \
     neox=false: pairs (2i, 2i+1) (llama); neox=true: pairs (i, i + rope_dim/2) (qwen2, neox). \
     scaling: see RopeScaling (the default is plain RoPE). */                                    \
  void rope(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,              \
            int32_t head_dim, int32_t rope_dim, float theta_base, bool neox,                    \
            const RopeScaling& scaling = RopeScaling{});                                        \
  /* Causal paged attention with grouped-query heads (n_heads % n_kv_heads == 0);              \
     cpu:: requires kv.block_size <= 256. window > 0: sliding window, a token at position p     \
     sees keys p - window < j <= p (llama.cpp's LLAMA_SWA_TYPE_STANDARD); 0: every j <= p.      \
     q: [n_tokens, n_heads, head_dim], out: [n_tokens, n_heads, head_dim] */                    \
  void paged_attention(const float* q, const KvLayerView& kv, const BatchView& batch,           \
                       int32_t n_heads, float scale, float* out, int32_t window = 0);           \
  /* gate = gelu(gate) * up with the tanh approximation of GELU (GeGLU; Gemma),               \
     gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated as llama.cpp's ggml   \
     does (its GGML_GELU_FP16 table): 0 for x <= -10, x for x >= 10, else gelu_of_f16 of x      \
     rounded to f16; the product with up in f32. gate, up: [n] */                               \
  void gelu_mul(float* gate, const float* up, int64_t n);

namespace ref {
PAGODA_KERNEL_OPS
}  // namespace ref
namespace ref {
// LFM2's gated short convolution over ONE sequence's n_tokens new rows (the op
// between its shortconv in_proj and out_proj). bcx: [n_tokens, 3 n], each row
// B | C | x; weight: [n, l_cache], channel c's taps oldest first; state:
// l_cache - 1 row pointers of n floats, the B*x of the sequence's previous
// positions, oldest first; fresh: the state is taken as zeros (position 0).
//   bx[t] = B[t] * x[t]
//   y[t, c] = C[t, c] * sum_{k=0}^{l_cache-1} w[c, k] * bx[t + k - (l_cache - 1), c]
// (rows before 0 from the state), each sum from 0 in k order (ggml_ssm_conv's
// order); then the state rows become the last l_cache - 1 rows of [state; bx].
// Per element only its own channel's values, so the result does not depend on
// the batch. Both backends call this scalar version: it is n x l_cache
// multiply-adds per token and layer, nothing next to the matmuls. y: [n_tokens, n].
void short_conv(const float* bcx, int64_t n_tokens, int64_t n, const float* weight, int32_t l_cache,
                float* const* state, bool fresh, float* y);
// Qwen3.5's causal depthwise convolution + SiLU over ONE sequence's n_tokens new
// rows (ggml_ssm_conv then ggml_silu, between its attn_qkv projection and the
// delta rule). x: [n_tokens, C]; weight: [C, K], channel c's taps oldest first;
// state: the x rows of the sequence's previous K - 1 positions, oldest first,
// (K - 1) x C floats packed flat across row pointers of row_floats floats each
// (element (j, c) at flat index j C + c; C % row_floats == 0); fresh: zeros.
//   y[t, c] = silu(sum_{k=0}^{K-1} w[c, k] * x[t + k - (K - 1), c])
// (rows before 0 from the state), each sum from 0 in k order as ggml_ssm_conv,
// silu(v) = v / (1 + exp(-v)); then the state becomes the last K - 1 rows of
// [state; x]. bias: null (Qwen3.5), or [C] added to each sum before the SiLU
// (Mamba-2's conv1d bias, ggml_add after ggml_ssm_conv). y must not alias x.
// Both backends call this scalar version (C x K multiply-adds per token and
// layer, nothing beside the matmuls). y: [n_tokens, C].
void ssm_conv_silu(const float* x, int64_t n_tokens, int64_t C, const float* weight, int32_t K,
                   float* const* state, int32_t row_floats, bool fresh, float* y, const float* bias);
}  // namespace ref

// Qwen3.5's gated delta rule (llama.cpp's ggml_gated_delta_net, fed as its
// qwen35 graph feeds it) over ONE sequence's n_tokens new tokens.
//   qkv row t: q (H_k heads x S) | k (H_k x S) | v (H_v x S), from column 0, row
//     stride ld (the conv output); q and k are L2-normalized per head here as
//     llama.cpp's build_gdn_l2_norm: rms_norm(x, eps / S) * (1 / sqrt(S)).
//   alpha, beta row t (stride ld_ab): H_v raw projections each;
//     g = softplus(alpha + dt_bias) * ssm_a (ssm_a = -exp(A_log), stored so),
//     b = sigmoid(beta). v head h reads q/k head h % H_k (ggml's broadcast).
//   state: H_v x S rows of S floats; row h S + j is column j of head h's S x S
//     state matrix M (ggml's transposed layout), so every row evolves alone:
//       row *= exp(g); d = (v[j] - row . k) * b; row += d k; out[t, h, j] = (row . q) / sqrt(S).
//   fresh: the state is taken as zeros (position 0); its rows are overwritten.
//   out: [n_tokens, H_v x S].
// The prologue (norms, g, b) is one shared scalar function, so ref and cpu differ
// only in the row updates' summation order (cpu: SIMD lanes, fused multiply-adds).
// Each row's arithmetic is a fixed sequence whatever the batch, split or thread
// count, so results are bitwise batch-invariant on one ISA.
struct GatedDeltaNetArgs {
  const float* qkv = nullptr;
  int64_t ld = 0;
  const float* alpha = nullptr;
  const float* beta = nullptr;
  int64_t ld_ab = 0;
  const float* dt_bias = nullptr;  // [H_v]
  const float* ssm_a = nullptr;    // [H_v]
  int32_t n_tokens = 0, S = 0, H_k = 0, H_v = 0;
  float eps = 1e-6f;
  float* const* state = nullptr;   // [H_v x S] rows
  bool fresh = false;
  float* out = nullptr;            // [n_tokens, H_v x S]
};
namespace ref {
void gated_delta_net(const GatedDeltaNetArgs& a);
}  // namespace ref
namespace cpu {
// AVX-512 or AVX2 (isa_name()), heads split over the thread pool.
void gated_delta_net(const GatedDeltaNetArgs& a);
}  // namespace cpu
namespace detail {
// The shared prologue: qn, kn: [n_tokens, H_k, S] normalized; g, b: [n_tokens, H_v].
void gated_delta_net_prologue(const GatedDeltaNetArgs& a, float* qn, float* kn, float* g, float* b);
}  // namespace detail

// Mamba-2's selective scan (llama.cpp's ggml_ssm_scan with a scalar A per head,
// then its ggml_add of x * D) over ONE sequence's n_tokens new tokens.
//   x row t (stride ld_x): H heads x P values; B and C rows t (stride ld_bc):
//     G groups x N values each; head h reads group h / (H / G) (repeat_interleave).
//   dt row t (stride ld_dt): H raw values; dt_sp = softplus(dt + dt_bias[h])
//     (ggml's: x > 20 ? x : log(1 + exp(x))), dA = exp(dt_sp * A[h]).
//   state: H x P rows of N floats, row h P + i (ggml's {d_state, head_dim, n_head}):
//     row = row * dA + B * (x[h, i] * dt_sp); out[t, h, i] = (row . C) + x[h, i] * D[h].
//   fresh: the state is taken as zeros (position 0); its rows are overwritten.
//   out: [n_tokens, H x P], row stride ld_out; must not alias x, B, C or dt.
// dt_sp and dA come from one shared scalar prologue, so ref and cpu differ only
// in the rows' summation order (cpu: SIMD lanes, fused multiply-adds). Each
// row's arithmetic is a fixed sequence whatever the batch, split or thread
// count, so results are bitwise batch-invariant on one ISA.
struct Mamba2ScanArgs {
  const float* x = nullptr;
  int64_t ld_x = 0;
  const float* dt = nullptr;
  int64_t ld_dt = 0;
  const float* B = nullptr;
  const float* C = nullptr;
  int64_t ld_bc = 0;
  const float* dt_bias = nullptr;  // [H]
  const float* A = nullptr;        // [H] (-exp(A_log))
  const float* D = nullptr;        // [H]
  int32_t n_tokens = 0, H = 0, P = 0, N = 0, G = 0;
  float* const* state = nullptr;   // [H x P] rows of N floats
  bool fresh = false;
  float* out = nullptr;
  int64_t ld_out = 0;
};
namespace ref {
void ssm_scan(const Mamba2ScanArgs& a);
}  // namespace ref
namespace cpu {
// AVX-512 (N % 16 == 0) or AVX2 (N % 8 == 0) by isa_name(), else the scalar
// oracle; heads split over the thread pool.
void ssm_scan(const Mamba2ScanArgs& a);
}  // namespace cpu
namespace detail {
// The shared prologue: dt_sp, dA: [n_tokens, H].
void ssm_scan_prologue(const Mamba2ScanArgs& a, float* dt_sp, float* dA);
}  // namespace detail
namespace cpu {
PAGODA_KERNEL_OPS
// Which ISA the dispatcher picked ("avx512-vnni", "avx2"). Bitwise batch
// invariance holds for a fixed ISA. Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matmuls give
// the same bits on both (one canonical sequence, Matmul.Q32OutputsAreTheCanonicalSequence);
// the float, K-quant and IQ4 paths and attention round differently (8- vs 16-lane
// sums), so goldens recorded on one may differ in the last bits on the other;
// PAGODA_ISA=avx2 pins the AVX2 path.
const char* isa_name();
// Forces the ISA for later calls: "avx2", "avx512-vnni" or "auto" (the best the
// machine supports; the default, unless env PAGODA_ISA=avx2 is set at start-up).
// Returns false (and changes nothing) if the name is unknown or unsupported here.
// Not thread-safe: call between steps, never while a kernel runs.
bool set_isa(const char* name);
// Which paged-attention kernel runs where the ISA is AVX-512 (AVX2 machines have
// one): "avx512" (attention_avx512.cc: K/V decoded in registers, each token's
// heads alone; a prefill tile's tokens go span by span over shared K/V) or
// "tile" (attention.cc's page tiles, the AVX2 arithmetic). "auto", the default,
// is the AVX-512 kernel wherever it takes the K/V types (measured on an Intel
// Xeon, model 167: prefill attention at depth 4096 within 2% of the tile for
// f16, q8_0 and q4_0, decode at depth 5-27% faster); env PAGODA_ATTENTION=
// avx512|tile at start-up forces one ("auto" then means it), for comparisons.
// The choice depends only on the machine and the cache's types, never on the
// batch; the two round differently (16- vs 8-lane sums). Returns false for an
// unknown name. Not thread-safe, like set_isa.
bool set_attention(const char* name);
}  // namespace cpu

// ---- Ops both backends share ----------------------------------------------------
// Data movement, exact arithmetic, or (silu_mul) one vectorized formula: a single
// implementation keeps ref and cpu forwards on the same values outside the ops above.

// True if matmul (ref and cpu) accepts weights of this type:
// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS.
bool matmul_supports(GgmlType type);
// Writes each token's K and V rows into its slot (quantized types: ggml's
// reference quantizer of each row, base/ggml_quant.h); tokens
// whose slot_mapping entry is negative (padding) are skipped.
// k, v: [n_tokens, n_kv_heads * head_dim]
void kv_write(const KvLayerView& kv, const float* k, const float* v, const int64_t* slot_mapping,
              int64_t n_tokens);
// In place: every `block` consecutive floats of x (n of them, n % block == 0,
// block a power of two) become H x / sqrt(block), H the Sylvester Walsh-Hadamard
// matrix (H[i][j] = (-1)^popcount(i & j), llama.cpp's ggml_gen_hadamard): a fast
// transform, block * log2(block) adds, one fixed order of operations per block
// (so bitwise the same for a row alone or in any batch). Orthonormal and its own
// inverse up to rounding. Used for the K/V rotation of base/kv_dtype.h.
void hadamard_rotate(float* x, int64_t n, int32_t block);
// Reads one token's K or V row (all heads) back to f32. row: kv_row_bytes(dtype, n), out: [n]
void kv_read_row(KvDtype dtype, const uint8_t* row, int64_t n, float* out);
// Embedding lookup: out[i, :] = dequantized row ids[i] of table.
// Precondition: 0 <= ids[i] < table.rows. out: [n_ids, table.cols]
void get_rows(const WeightView& table, const int32_t* ids, int64_t n_ids, float* out);
// out[i, :] = x[rows[i], :] (e.g. the rows whose logits are wanted).
// x: [*, n], out: [n_rows, n]; rows[i] within x.
void gather_rows(const float* x, int64_t n, const int32_t* rows, int64_t n_rows, float* out);
void add_inplace(float* x, const float* y, int64_t n);                        // x += y.  x, y: [n]
void add_rows(float* x, const float* bias, int64_t n_rows, int64_t n);        // x[r, :] += bias.  x: [n_rows, n]
void silu_mul(float* gate, const float* up, int64_t n);                       // gate = silu(gate) * up.  [n]
// GELU (tanh form) of the f16 value h, rounded to f16 and widened back:
// ggml's ggml_table_gelu_f16[h] bit for bit, the table llama.cpp's CPU backend
// evaluates GELU through. gelu_mul (ref and cpu) computes GELU this way:
// with iq4_nl K/V on Gemma 3 the f32 formula put perplexity 1.06% above
// llama-perplexity's (385 chunks), the f16 table +0.09% (docs/perplexity.md).
float gelu_of_f16(uint16_t h);
void mul_scalar(float* x, float s, int64_t n);                                 // x *= s.  x: [n]
void sigmoid_mul(float* x, const float* gate, int64_t n);                      // x *= 1 / (1 + exp(-gate)).  [n]

}  // namespace pagoda::kernels
