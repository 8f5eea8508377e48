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

#include <cstring>

#include "base/ggml_types.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/iq4nl.h"

namespace pagoda::kernels::cpu::detail {
namespace {

constexpr int kG = 4;
constexpr size_t kBB = 18;         // bytes per IQ4_NL block: f16 d, 16 index bytes
constexpr size_t kXRec = 64 * kG;  // activation record bytes
constexpr size_t kWRec = 192;      // packed weight record bytes
constexpr int kR = 4;              // rows per tile
constexpr int kT = 4;              // tokens per tile: 16 accumulators

alignas(64) const uint8_t kZeroBlock[64] = {};  // d = 0, indices 0

struct WG {
  __m512i lo, hi;  // codebook + 128 (u8)
  __m512 wd;
};

inline __m512i load4x128(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, const uint8_t* p3) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2)), 2);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3)), 3);
  return v;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Group g (blocks 4g..4g+3) of a row of nb blocks; blocks past nb read as zero.
inline WG decode(const uint8_t* row, int64_t nb, int64_t g) {
  const int64_t first = g * kG;
  const uint8_t* grp = row + first * kBB;
  const uint8_t* b[kG];
  for (int i = 0; i < kG; ++i) b[i] = first + i < nb ? grp + i * kBB : kZeroBlock;
  __m256i d16;
  if (first + kG <= nb) {
    // the 4 f16 d at bytes 0, 18, 36, 54 of the group (u16 0, 9, 18, 27), each 4 times
    const __m512i idx = _mm512_castsi256_si512(
        _mm256_setr_epi16(0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27));
    d16 = _mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, _mm512_loadu_si512(grp)));
  } else {
    const auto d = [&](int i) { return static_cast<short>(load_u16(b[i])); };
    d16 = _mm256_setr_epi16(d(0), d(0), d(0), d(0), d(1), d(1), d(1), d(1), d(2), d(2), d(2), d(2), d(3), d(3),
                            d(3), d(3));
  }
  const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)), _mm_set1_epi8(static_cast<char>(0x80))));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i v = load4x128(b[0] + 2, b[1] + 2, b[2] + 2, b[3] + 2);
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

// kR rows x T tokens, group by group; load(r, g) gives row r's group g.
template <int T, class Load>
inline void tile(Load load, const uint8_t* const* x, int64_t ng, float* out) {
  __m512 acc[kR][T];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    for (int r = 0; r < kR; ++r) {
      const WG w = load(r, g);
      for (int t = 0; t < T; ++t) acc[r][t] = group_dot(acc[r][t], w, x[t] + g * kXRec);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < T; ++t) out[t * kR + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <class Load>
inline void tile_n(int nt, Load load, const uint8_t* const* x, int64_t ng, float* out) {
  switch (nt) {
    case 1: tile<1>(load, x, ng, out); break;
    case 2: tile<2>(load, x, ng, out); break;
    case 3: tile<3>(load, x, ng, out); break;
    default: tile<4>(load, x, ng, out); break;
  }
}

void prepare(uint8_t* act, int64_t n) {
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < n; ++i, act += kXRec) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, _mm512_load_si512(act)),
                                          c128, _mm512_load_si512(act + 64));
    _mm512_store_si512(act + 192, _mm512_sub_epi32(_mm512_setzero_si512(), s));
  }
}

void direct(int nt, const uint8_t* const* rows, int64_t nb, const uint8_t* const* x, int64_t ng, size_t prefetch,
            float* out) {
  tile_n(
      nt,
      [rows, nb, prefetch](int r, int64_t g) {
        const uint8_t* p = rows[r] + prefetch + g * kG * kBB;
        _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + 64), _MM_HINT_T0);
        return decode(rows[r], nb, g);
      },
      x, ng, out);
}

void pack(const uint8_t* row, int64_t nb, uint8_t* out) {
  const int64_t ng = act_groups(nb * 32, kG);
  for (int64_t g = 0; g < ng; ++g, out += kWRec) {
    const WG w = decode(row, nb, g);
    _mm512_store_si512(out, w.lo);
    _mm512_store_si512(out + 64, w.hi);
    _mm512_store_ps(reinterpret_cast<float*>(out + 128), w.wd);
  }
}

void packed(int nt, const uint8_t* const* w, const uint8_t* const* x, int64_t ng, float* out) {
  tile_n(
      nt,
      [w](int r, int64_t g) {
        const uint8_t* p = w[r] + g * kWRec;
        return WG{_mm512_load_si512(p), _mm512_load_si512(p + 64), _mm512_load_ps(reinterpret_cast<const float*>(p + 128))};
      },
      x, ng, out);
}

}  // namespace

const Iq4NlKernels& iq4nl_kernels_avx512() {
  static const Iq4NlKernels k = [] {
    Iq4NlKernels s;
    s.g = kG;
    s.packed_bytes = kWRec;
    s.rows = kR;
    s.max_t = kT;
    s.prepare = prepare;
    s.direct = direct;
    s.pack = pack;
    s.packed = packed;
    return s;
  }();
  return k;
}

}  // namespace pagoda::kernels::cpu::detail
