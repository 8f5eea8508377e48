// IQ4_NL x q8_0 matmul: the driver both ISAs share, and the AVX2 tiles (baseline
// x86-64-v3). See iq4nl.h for the arithmetic and the batch-invariance argument.
//
// AVX2 records: activations as quantize_act writes them with G = 2 (lo[32] hi[32]
// xd[8] xs[8], xs unused); a packed weight group is lo[32] hi[32] (signed codebook
// values of values 0..15 / 16..31 of its 2 blocks) and wd[8] (d of block b in
// lanes 4b..4b+3), 96 bytes.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/ggml_types.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/iq4nl.h"
#include "kernels/cpu/vec_math.h"

namespace pagoda::kernels::cpu::detail {
namespace {

constexpr int kG = 2;
constexpr size_t kXRec = 64 * kG;              // activation record bytes
constexpr size_t kWRec = 96;                   // packed weight record bytes
constexpr int kR = 4;                          // rows per tile
constexpr int kT = 2;                          // tokens per tile: 8 accumulators in 16 ymm
constexpr int64_t kChunkRows = 16;
constexpr size_t kPrefetchRows = 8;            // rows ahead the direct path prefetches
constexpr int64_t kMinParallelMacs = 1 << 16;  // below this a fork/join costs more than it saves

alignas(64) const uint8_t kZeroBlock[64] = {};  // d = 0, indices 0

struct WG {
  __m256i lo, hi;  // signed codebook values
  __m256 wd;
};

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Group g (blocks 2g, 2g + 1) of a row of nb blocks; blocks past nb read as zero.
inline WG decode(const uint8_t* row, int64_t nb, int64_t g) {
  const int64_t first = g * kG;
  const uint8_t* b0 = row + first * kIq4BlockBytes;
  const uint8_t* b1 = first + 1 < nb ? b0 + kIq4BlockBytes : kZeroBlock;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b1 + 2), reinterpret_cast<const __m128i*>(b0 + 2));
  WG w;
  w.lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
  w.hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
  w.wd = _mm256_setr_m128(_mm_set1_ps(load_f16(b0)), _mm_set1_ps(load_f16(b1)));
  return w;
}

inline __m256 group_dot(__m256 acc, const WG& w, const uint8_t* xr) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i xl = _mm256_load_si256(reinterpret_cast<const __m256i*>(xr));
  const __m256i xh = _mm256_load_si256(reinterpret_cast<const __m256i*>(xr + 32));
  const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.lo), _mm256_sign_epi8(xl, w.lo)), ones);
  const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w.hi), _mm256_sign_epi8(xh, w.hi)), ones);
  const __m256 dd = _mm256_mul_ps(w.wd, _mm256_load_ps(reinterpret_cast<const float*>(xr + 64)));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(pl, ph)), dd, acc);
}

inline WG load_packed(const uint8_t* p) {
  return WG{_mm256_load_si256(reinterpret_cast<const __m256i*>(p)),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)),
            _mm256_load_ps(reinterpret_cast<const float*>(p + 64))};
}

inline void store_packed(const WG& w, uint8_t* p) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(p), w.lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p + 32), w.hi);
  _mm256_store_ps(reinterpret_cast<float*>(p + 64), w.wd);
}

inline void prefetch_group(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

using Vec = __m256;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline float vhsum(Vec v) { return hsum8(v); }
constexpr void (*kPrepare)(uint8_t*, int64_t) = nullptr;  // the sign trick needs no activation rewrite

#include "kernels/cpu/iq4nl_tiles.inc"

}  // namespace

const Iq4NlKernels& iq4nl_kernels_avx2() { return kKernels; }

void matmul_iq4nl(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  PAGODA_CHECK(w.type == GgmlType::IQ4_NL && w.cols % 32 == 0);
  if (n_tokens <= 0 || w.rows <= 0) return;
  const Iq4NlKernels& k = isa() == Isa::kAvx512 ? iq4nl_kernels_avx512() : iq4nl_kernels_avx2();
  const int64_t nb = w.cols / 32, ng = act_groups(w.cols, k.g);
  const size_t xrow = static_cast<size_t>(ng) * act_record_bytes(k.g);
  uint8_t* act = scratch(0, static_cast<size_t>(n_tokens) * xrow);
  quantize_act(x, n_tokens, w.cols, k.g, ActMode::kSigned, act);
  if (k.prepare != nullptr) k.prepare(act, n_tokens * ng);
  const int64_t n_chunks = (w.rows + kChunkRows - 1) / kChunkRows;
  const bool big = w.rows * w.cols * n_tokens >= kMinParallelMacs;
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  const size_t prow = static_cast<size_t>(ng) * k.packed_bytes;
  parallel_for(n_chunks, big ? threads() : 1, [=, &k](int64_t ch) {
    const int64_t r0 = ch * kChunkRows, nr = std::min(kChunkRows, w.rows - r0);
    const bool is_direct = n_tokens <= kIq4DirectMaxTokens;
    uint8_t* pk = nullptr;
    if (!is_direct) {
      pk = scratch(1, static_cast<size_t>(nr) * prow);
      for (int64_t i = 0; i < nr; ++i) k.pack(wdata + (r0 + i) * w.row_bytes, nb, pk + i * prow);
    }
    float out[kIq4MaxT * kIq4MaxR];
    for (int64_t t0 = 0; t0 < n_tokens; t0 += k.max_t) {
      const int nt = static_cast<int>(std::min<int64_t>(k.max_t, n_tokens - t0));
      const uint8_t* xp[kIq4MaxT];
      for (int t = 0; t < kIq4MaxT; ++t) xp[t] = act + static_cast<size_t>(t0 + std::min(t, nt - 1)) * xrow;
      for (int64_t i0 = 0; i0 < nr; i0 += k.rows) {
        const uint8_t* rp[kIq4MaxR];
        for (int r = 0; r < kIq4MaxR; ++r) {
          const int64_t i = std::min<int64_t>(i0 + r, nr - 1);
          rp[r] = is_direct ? wdata + (r0 + i) * w.row_bytes : pk + static_cast<size_t>(i) * prow;
        }
        if (is_direct) {
          k.direct(nt, rp, nb, xp, ng, kPrefetchRows * w.row_bytes, out);
        } else {
          k.packed(nt, rp, xp, ng, out);
        }
        for (int t = 0; t < nt; ++t)
          for (int r = 0; r < k.rows && i0 + r < nr; ++r) y[(t0 + t) * w.rows + r0 + i0 + r] = out[t * k.rows + r];
      }
    }
  });
}

}  // namespace pagoda::kernels::cpu::detail
