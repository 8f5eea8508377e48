// Internal to kernels/cpu: ISA dispatch state, thread count, and the shared
// "q8 activation" format the integer matmul kernels consume.
//
// Activation format (one record per group of G blocks of 32 values, G = 4 for
// AVX-512, 2 for AVX2; a token row is ceil(nb / G) records, zero padded):
//   lo[16G] int8   values 0..15 of each block (block b at bytes 16b..16b+15)
//   hi[16G] int8   values 16..31 of each block
//   xd[4G]  float  d of block b in lanes 4b..4b+3
//   xs[4G]  float  lane 4b: the block's sum term (see ActMode), lanes 4b+1..4b+3: 0
//                  (kLaneCorr128: int32 per lane instead, see ActMode)
// Packed weight records use the same shape (lo, hi, wd, wm / correction), so
// lane l of every vector always refers to the same 8 values: this fixed lane
// map is what keeps the float reduction order identical for every tile shape.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/api.h"
#include "kernels/cpu/thread_pool.h"

namespace pagoda::kernels::cpu::detail {

enum class Isa { kAvx2 = 0, kAvx512 = 1 };
Isa isa();
int threads();
// Whether paged attention takes the AVX-512 kernel (where it supports the K/V
// types, attend_token_avx512_supports): the ISA and cpu::set_attention's choice (api.h).
bool attention_avx512();

// Where software prefetches of a streamed read (weights, K/V rows read ahead)
// put their lines. On Intel cores: L2 (prefetcht1). A prefetcht0 holds one of
// the core's L1 fill buffers until its line arrives from memory, so one core's
// stream stays capped near what 16 buffers carry, while the L2's queue has more
// room: decode of synth Llama-3.2-1B Q4_0 reads its weights 13-19% faster on 2
// threads, 10-13% on 1 (Intel Xeon model 167, 3 interleaved rounds). On AMD:
// L1 (prefetcht0), as measured best on Zen 5. Chosen once from the vendor.
inline const bool g_stream_prefetch_l2 = [] {
  __builtin_cpu_init();  // may run before libgcc's own initializer
  return __builtin_cpu_is("intel") != 0;
}();
// The cache line of p into L2 (prefetcht1) or L1 (prefetcht0). Inline asm: GCC 12
// at -O3 dropped _mm_prefetch(p, _MM_HINT_T1) (none was left in attention_avx512.o);
// check the objects for prefetcht1 after touching a caller.
inline void prefetch_l2(const void* p) { asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p))); }
inline void prefetch_l1(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }
// The cache line of p, read ahead as above.
inline void prefetch_stream(const void* p) {
  if (g_stream_prefetch_l2) {
    prefetch_l2(p);
  } else {
    prefetch_l1(p);
  }
}

inline size_t act_record_bytes(int g) { return static_cast<size_t>(64 * g); }
inline int64_t act_groups(int64_t cols, int g) { return (cols / 32 + g - 1) / g; }

// How quantize_act fills xs and the quant bytes, by the weight type consuming them.
enum class ActMode {
  kSigned,    // s8 quants; xs = d * sum(q) (exact): Q8_0 on AVX2 and IQ4_NL (xs unused by both)
  kQ8_1,      // s8 quants; xs = f16(d_f32 * sum(q)) like ggml's block_q8_1 s: Q4_1, Q5_1
  // s8 quants; xs lane 4b + j holds int32 -128 * (q[4j..4j+3] + q[16+4j..16+4j+3]) of
  // block b: Q8_0 on AVX-512, whose kernel holds the weights as w + 128 (u8, dpbusd's
  // unsigned operand) and starts each lane's integer sum at this correction, so the
  // lane sum is exactly sum(w * q).
  kLaneCorr128,
  // u8 quants q + 128; xs unused: Q8_0 on AVX-512 in the staged (many-token) path,
  // whose records hold s8 weights and the correction -128 * sum(w) per lane (fewer
  // live registers in the 4 x 4 tile than a per-token correction: pp512 stays as fast).
  kOffsetU8,
  // s8 quants; xs lane 4b holds int32 -8 * sum(q) (kImplicit16: -16 * sum(q)) of
  // block b, lanes 4b+1..4b+3 zero: Q4_0 (Q5_0) on both ISAs, whose kernels hold the
  // weights as stored (u8 0..15, 0..31) and start block b's integer sum at this
  // correction, so the block sum is exactly sum((w - 8) * q) (sum((w - 16) * q)),
  // as ggml's own integer dot, and one fma per block adds it: no float offset term.
  kImplicit8,
  kImplicit16,
  // The same with -128 * sum(q): Q8_0 on AVX-512 in the panel GEMM, whose
  // weights are w + 128 (u8), so its block sums are exactly sum(w * q).
  kImplicit128,
};
// The mode for weights of type t (an is_q32_type) on the given ISA and path.
// direct: the few-token path (decoded in registers), else the staged path. Both
// give each lane the same exact integer sum, so the outputs are the same bitwise.
inline ActMode act_mode_for(GgmlType t, bool avx512, bool direct) {
  if (t == GgmlType::Q8_0) return !avx512 ? ActMode::kSigned : direct ? ActMode::kLaneCorr128 : ActMode::kOffsetU8;
  if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) return ActMode::kQ8_1;
  return t == GgmlType::Q4_0 ? ActMode::kImplicit8 : ActMode::kImplicit16;
}

// Quantizes x [n_tokens, cols] (cols % 32 == 0) to q8 records (see above), bit
// for bit as ggml's x86 quantize_row_q8_0 / quantize_row_q8_1 do: per block
// amax, q = round-to-nearest-even(x * (127 / amax)), and d = f16(amax / 127)
// (the f16-rounded d is what xd holds, as ggml's dot products use it). A
// block's whole xs term sits in lane 4b (lanes 4b+1..4b+3 are 0): the weight's
// m (or implicit offset) is the same in all four lanes of a block.
// out: [n_tokens, act_groups(cols, g), act_record_bytes(g)]
void quantize_act(const float* x, int64_t n_tokens, int64_t cols, int g, ActMode mode, uint8_t* out);

// True for the types the integer (q8 activation) path handles.
inline bool is_q32_type(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
         t == GgmlType::Q8_0;
}

void matmul_avx2(const WeightView& w, const float* x, int64_t n_tokens, float* y);
void matmul_avx512(const WeightView& w, const float* x, int64_t n_tokens, float* y);

// Grows (never shrinks) a per-thread 64-byte aligned scratch buffer; slot picks
// one of a few independent buffers. Contents are unspecified.
uint8_t* scratch(int slot, size_t bytes);

}  // namespace pagoda::kernels::cpu::detail
