// Run-time ISA choice, thread count, per-thread scratch and the activation
// quantizer shared by both matmul paths (baseline AVX2 code, so its output is
// the same whichever ISA consumes it).
#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "base/aligned.h"
#include "base/check.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/iq4nl.h"
#include "kernels/cpu/kquant.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels {
namespace {

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

int initial_isa() {
  const char* env = std::getenv("PAGODA_ISA");
  if (env != nullptr && std::strcmp(env, "avx2") == 0) return 0;
  return cpu_has_avx512() ? 1 : 0;
}

std::atomic<int>& isa_state() {
  static std::atomic<int> s{initial_isa()};
  return s;
}

// Paged attention on AVX-512: 0 auto (the start-up choice), 1 the AVX-512 kernel, 2 the tile.
int attention_from_name(const char* name) {
  if (name == nullptr) return -1;
  if (std::strcmp(name, "auto") == 0) return 0;
  if (std::strcmp(name, "avx512") == 0) return 1;
  if (std::strcmp(name, "tile") == 0) return 2;
  return -1;
}

int initial_attention() {
  const int v = attention_from_name(std::getenv("PAGODA_ATTENTION"));
  return v < 0 ? 0 : v;
}

std::atomic<int>& attention_state() {
  static std::atomic<int> s{0};
  return s;
}

// PAGODA_KQUANT_FALLBACK=1 at start-up sends K-quant (and IQ4_XS, IQ4_NL) weights through the
// old path (dequantize rows to f32, f32 activations) instead of the q8_K integer
// kernels: for speed comparisons and for bisecting numerics.
bool kquant_fallback() {
  static const bool v = [] {
    const char* env = std::getenv("PAGODA_KQUANT_FALLBACK");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return v;
}

// Default thread count: OMP_NUM_THREADS when set (what scripts set when the
// kernels ran on OpenMP), else the CPUs this process may run on.
int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

std::atomic<int>& thread_state() {
  static std::atomic<int> s{default_threads()};
  return s;
}

}  // namespace

void set_num_threads(int n) { thread_state().store(n < 1 ? 1 : n); }
int num_threads() { return thread_state().load(); }

PoolCounts pool_counts() { return {cpu::detail::pool_stalls(), cpu::detail::pool_long_waits()}; }

void parallel_for(int64_t n_items, void (*call)(void* ctx, int64_t item), void* ctx) {
  cpu::detail::parallel_for_impl(n_items, num_threads(), call, ctx);
}

namespace cpu {

const char* isa_name() { return isa_state().load() == 1 ? "avx512-vnni" : "avx2"; }

bool set_isa(const char* name) {
  if (std::strcmp(name, "avx2") == 0) {
    isa_state().store(0);
    return true;
  }
  if (std::strcmp(name, "avx512-vnni") == 0 || std::strcmp(name, "auto") == 0) {
    if (!cpu_has_avx512()) {
      if (std::strcmp(name, "auto") == 0) isa_state().store(0);
      return std::strcmp(name, "auto") == 0;
    }
    isa_state().store(1);
    return true;
  }
  return false;
}

bool set_attention(const char* name) {
  const int v = attention_from_name(name);
  if (v < 0) return false;
  attention_state().store(v);
  return true;
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  PAGODA_CHECK_MSG(matmul_supports(w.type), "matmul: unsupported weight type %u",
                   static_cast<unsigned>(w.type));
  if (n_tokens <= 0 || w.rows <= 0) return;
  if (w.type == GgmlType::IQ4_NL && !kquant_fallback()) {
    detail::matmul_iq4nl(w, x, n_tokens, y);
    return;
  }
  if (detail::is_kquant_type(w.type) && !kquant_fallback()) {
    const bool avx512 = detail::isa() == detail::Isa::kAvx512;
    detail::matmul_kquant(w, x, n_tokens, y, avx512 ? detail::ktiles_avx512(w.type) : detail::ktiles_avx2(w.type));
    return;
  }
  if (detail::isa() == detail::Isa::kAvx512) {
    detail::matmul_avx512(w, x, n_tokens, y);
  } else {
    detail::matmul_avx2(w, x, n_tokens, y);
  }
}

void matmul_multi(const WeightView* const* ws, int n, const float* x, int64_t n_tokens, float* const* ys) {
  // Decode sizes: one launch; each thread computes its static share of every
  // matrix's row chunks, quantizing x itself (a few hundred ns at these sizes,
  // less than the fork/join it saves). Larger batches: one launch per matrix,
  // with x quantized once per matrix as matmul does.
  constexpr int64_t kMultiMaxTokens = 4;
  const int nth = detail::threads();
  if (n_tokens <= kMultiMaxTokens && nth > 1 && n > 1) {
    detail::parallel_shares(nth, [&] {
      for (int i = 0; i < n; ++i) matmul(*ws[i], x, n_tokens, ys[i]);
    });
    return;
  }
  for (int i = 0; i < n; ++i) matmul(*ws[i], x, n_tokens, ys[i]);
}

namespace detail {

Isa isa() { return isa_state().load(std::memory_order_relaxed) == 1 ? Isa::kAvx512 : Isa::kAvx2; }

bool attention_avx512() {
  if (isa() != Isa::kAvx512) return false;
  static const int start_up = initial_attention();  // env PAGODA_ATTENTION, else 0
  int mode = attention_state().load(std::memory_order_relaxed);
  if (mode == 0) mode = start_up;
  return mode != 2;  // auto: the AVX-512 kernel wherever it takes the types (attend_token_avx512_supports)
}
int threads() { return thread_state().load(std::memory_order_relaxed); }

uint8_t* scratch(int slot, size_t bytes) {
  thread_local AlignedBuffer<uint8_t> bufs[4];
  PAGODA_CHECK(slot >= 0 && slot < 4);
  if (bufs[slot].size() < bytes) bufs[slot].resize(bytes + bytes / 4 + 64);
  return bufs[slot].data();
}

namespace {

void quantize_act_rows(const float* x, int64_t n_tokens, int64_t cols, int g, ActMode mode, uint8_t* out) {
  const int64_t nb = cols / 32, ng = act_groups(cols, g);
  const size_t rec = act_record_bytes(g);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(mode == ActMode::kOffsetU8 ? static_cast<char>(0x80) : 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* row = out + static_cast<size_t>(t * ng) * rec;
    if (nb % g != 0) std::memset(row + (ng - 1) * rec, 0, rec);
    for (int64_t i = 0; i < nb; ++i) {
      const float* src = x + t * cols + i * 32;
      const __m256 v0 = _mm256_loadu_ps(src), v1 = _mm256_loadu_ps(src + 8);
      const __m256 v2 = _mm256_loadu_ps(src + 16), v3 = _mm256_loadu_ps(src + 24);
      __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
      const float amax = hmax8(mx);
      const float d = amax / 127.0f;
      // ggml multiplies by 127 / amax (not 1 / d: the two differ in the last bit).
      const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      // cvtps rounds to nearest even under the default MXCSR, like ggml's _mm256_round_ps.
      const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));
      const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
      const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id));
      const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
      // packs interleave 128-bit lanes; the permute restores natural order.
      const __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
      __m256i q = _mm256_packs_epi16(p01, p23);
      q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      const __m256i qo = _mm256_xor_si256(q, flip);
      uint8_t* r = row + (i / g) * rec;
      const int b = static_cast<int>(i % g);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r + 16 * b), _mm256_castsi256_si128(qo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r + 16 * g + 16 * b), _mm256_extracti128_si256(qo, 1));
      // d as ggml stores it (f16, round to nearest even), used by every dot product.
      const float d16 = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT)));
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
      // s4 lane j: q[4j..4j+3] + q[16+4j..16+4j+3], the 8 values of dot-product lane j.
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      __m128i sx = _mm_setzero_si128();
      if (mode == ActMode::kLaneCorr128) {
        sx = _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(s4, 7));
      } else if (mode != ActMode::kOffsetU8) {
        s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
        const int32_t isum = _mm_cvtsi128_si32(s4);
        const float sum = static_cast<float>(isum);  // |sum| <= 32 * 127: exact
        float sterm = 0.0f;
        if (mode == ActMode::kImplicit8 || mode == ActMode::kImplicit16 || mode == ActMode::kImplicit128) {
          const int32_t off = mode == ActMode::kImplicit8 ? -8 : mode == ActMode::kImplicit16 ? -16 : -128;
          sterm = std::bit_cast<float>(isum * off);  // int32 in lane 0
        } else if (mode == ActMode::kQ8_1) {
          sterm = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(d * sum), _MM_FROUND_TO_NEAREST_INT)));
        } else {
          sterm = d16 * sum;  // 11 x 12 significant bits: exact
        }
        sx = _mm_castps_si128(_mm_setr_ps(sterm, 0.0f, 0.0f, 0.0f));
      }
      _mm_storeu_ps(reinterpret_cast<float*>(r + 32 * g + 16 * b), _mm_set1_ps(d16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r + 48 * g + 16 * b), sx);
    }
  }
}

}  // namespace

// Many tokens (a prefill, a batched step): tokens split over the pool in blocks
// of kTokens; each token's record is computed exactly as alone.
void quantize_act(const float* x, int64_t n_tokens, int64_t cols, int g, ActMode mode, uint8_t* out) {
  constexpr int64_t kTokens = 16;
  const int nth = threads();
  if (n_tokens < 2 * kTokens || nth <= 1) {
    quantize_act_rows(x, n_tokens, cols, g, mode, out);
    return;
  }
  const size_t row = static_cast<size_t>(act_groups(cols, g)) * act_record_bytes(g);
  parallel_for((n_tokens + kTokens - 1) / kTokens, nth, [=](int64_t i) {
    const int64_t t0 = i * kTokens;
    quantize_act_rows(x + t0 * cols, std::min(kTokens, n_tokens - t0), cols, g, mode, out + static_cast<size_t>(t0) * row);
  });
}

}  // namespace detail
}  // namespace cpu
}  // namespace pagoda::kernels
