// IQ4_NL x q8_0 matmul tiles for AVX-512 (BW + VNNI). Compiled with extra -m
// flags; only called when the CPU has them (dispatch.cc). See iq4nl.h.
//
// Records: activations as quantize_act writes them with G = 4 (lo[64] hi[64]
// xd[16] xs[16]); prepare() overwrites xs with the int32 -128 * (sum of the 8
// q of lane l) per lane, so that vpdpbusd(that, codebook + 128, q) is exactly
// sum(codebook * q) per lane. A packed weight group is lo[64] hi[64] (codebook
// + 128 as u8, values 0..15 / 16..31 of its 4 blocks) and wd[16] (d of block b
// in lanes 4b..4b+3), 192 bytes.
#include <immintrin.h>

#include <algorithm>

#include "base/ggml_types.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/iq4nl.h"

namespace pagoda::kernels::cpu::detail {
namespace {

// blocks per activation record, rows and tokens per tile (16 accumulators);
// activation and packed weight record bytes
constexpr int kG = 4, kR = 4, kT = 4;
constexpr size_t kXRec = 64 * kG, kWRec = 192;

struct WG {
  __m512i lo, hi;  // codebook + 128 (u8)
  __m512 wd;
};

// Group g (blocks 4g..4g+3, 72 bytes) of a row of nb blocks. Two masked loads
// read the group's valid bytes (blocks past nb read as zero: d = 0, indices 0);
// every field of a block starts at an even byte (block b at 18b: d at word 9b,
// index bytes at words 9b+1..9b+8), so 16-bit permutes gather them.
inline WG decode(const uint8_t* row, int64_t nb, int64_t g) {
  const int64_t first = g * kG;
  const uint8_t* grp = row + first * kIq4BlockBytes;
  const int64_t bytes = static_cast<int64_t>(kIq4BlockBytes) * std::min<int64_t>(kG, nb - first);  // 18..72
  const __mmask64 m0 = bytes >= 64 ? ~0ULL : (1ULL << bytes) - 1;
  const __mmask64 m1 = bytes > 64 ? (1ULL << (bytes - 64)) - 1 : 0;
  const __m512i v0 = _mm512_maskz_loadu_epi8(m0, grp), v1 = _mm512_maskz_loadu_epi8(m1, grp + 64);
  // 128-bit lane b: the 8 index words of block b; then the 4 d, each 4 times
  alignas(64) static constexpr uint16_t kQIdx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                                     19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
  const __m512i qidx = _mm512_load_si512(kQIdx);
  const __m256i didx = _mm256_setr_epi16(0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27);
  const __m512i v = _mm512_permutex2var_epi16(v0, qidx, v1);
  const __m256i d16 = _mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_castsi256_si512(didx), v0));
  const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)), _mm_set1_epi8(static_cast<char>(0x80))));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  WG w;
  w.lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nib));
  w.hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
  w.wd = _mm512_cvtph_ps(d16);
  return w;
}

inline __m512 group_dot(__m512 acc, const WG& w, const uint8_t* xr) {
  __m512i is = _mm512_dpbusd_epi32(_mm512_load_si512(xr + 192), w.lo, _mm512_load_si512(xr));
  is = _mm512_dpbusd_epi32(is, w.hi, _mm512_load_si512(xr + 64));
  const __m512 dd = _mm512_mul_ps(w.wd, _mm512_load_ps(reinterpret_cast<const float*>(xr + 128)));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), dd, acc);
}

inline WG load_packed(const uint8_t* p) {
  return WG{_mm512_load_si512(p), _mm512_load_si512(p + 64), _mm512_load_ps(reinterpret_cast<const float*>(p + 128))};
}

inline void store_packed(const WG& w, uint8_t* p) {
  _mm512_store_si512(p, w.lo);
  _mm512_store_si512(p + 64, w.hi);
  _mm512_store_ps(reinterpret_cast<float*>(p + 128), w.wd);
}

inline void prefetch_group(const uint8_t* p) {
  prefetch_stream(p);
  prefetch_stream(p + 64);
}

// xs of each record := -128 * (sum of lane l's 8 q), as int32 (see the file comment).
void prepare(uint8_t* act, int64_t n) {
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < n; ++i, act += kXRec) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, _mm512_load_si512(act)),
                                          c128, _mm512_load_si512(act + 64));
    _mm512_store_si512(act + 192, _mm512_sub_epi32(_mm512_setzero_si512(), s));
  }
}

using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline float vhsum(Vec v) { return _mm512_reduce_add_ps(v); }
constexpr void (*kPrepare)(uint8_t*, int64_t) = prepare;

#include "kernels/cpu/iq4nl_tiles.inc"

}  // namespace

const Iq4NlKernels& iq4nl_kernels_avx512() { return kKernels; }

}  // namespace pagoda::kernels::cpu::detail
