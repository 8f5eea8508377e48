// K-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) x q8_K matmul, AVX2 tiles, plus the parts both
// ISAs share: the q8_K activation quantizer and the row-chunk / token-tile
// driver (baseline AVX2 code).
//
// Per super-block of 256 values the op sequence behind one output is
//   isum  = sum over sub-blocks of scale * dot(q_w, q_x)           (int32, exact)
//   acc   = fma(float(isum), d_w * d_x, acc)                       (8 lanes)
//   Q2_K/Q4_K/Q5_K: acc = acc - float(sum_k min_k * bsum_k) * (dmin_w * d_x)
//   Q3_K/Q6_K: the -4 / -32 offset of the quants is folded into isum via bsums
//   IQ4_XS: signed codebook values, multiplied by the sign trick (no offset)
// and one horizontal sum at the end. The integer parts are exact, so only
// this float sequence matters, and it is the same for every tile shape.
// The structure follows ggml's ggml_vec_dot_q{2,3,4,5,6}_K_q8_K (x86 quants.c).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/check.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/kquant.h"

namespace pagoda::kernels::cpu::detail {
namespace {

constexpr int64_t kChunkRows = kKChunkRows;  // KTileSet::chunk handles chunks of exactly this many rows
// Below this many multiply-adds a fork/join costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;
// Few-token calls stream the weights once: prefetch this many rows ahead.
constexpr size_t kPrefetchRows = 8;

#include "kernels/cpu/kquant_prelude.inc"


// ---- Q4_K / Q5_K -------------------------------------------------------------
// One decoded super-block: q[k] = the 32 quants of sub-block k (u8, 0..15 or
// 0..31), sc[k] = its scale in every int16 lane, mins = int16 lanes 2k, 2k+1
// hold min k (so madd with bsums gives min_k * sum of sub-block k's q_x).
struct K4Block {
  __m256i q[8];
  __m256i sc[8];
  __m256i mins;
  __m256 d, dmin;  // f16 d and dmin in every lane
};

inline void k4_scales(const uint8_t* blk, K4Block* w) {
  const __m128i sm = unpack_k4_scales(blk + 4);
  const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
  for (int k = 0; k < 8; ++k)
    w->sc[k] = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k)));
  w->mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
  w->d = _mm256_set1_ps(load_f16(blk));
  w->dmin = _mm256_set1_ps(load_f16(blk + 2));
}

struct Q4K {
  static constexpr size_t kBytes = 144;
  static inline void decode(const uint8_t* blk, K4Block* w) {
    k4_scales(blk, w);
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(blk + 16 + 32 * j);
      w->q[2 * j] = _mm256_and_si256(bits, nib);
      w->q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), nib);
    }
  }
};

struct Q5K {
  static constexpr size_t kBytes = 176;
  static inline void decode(const uint8_t* blk, K4Block* w) {
    k4_scales(blk, w);
    const __m256i nib = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i hb = load256(blk + 16);
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = load256(blk + 48 + 32 * j);
      // bit 2j (2j+1) of qh[l] is the fifth bit of value l of sub-block 2j (2j+1)
      const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one);
      w->q[2 * j] = _mm256_or_si256(_mm256_and_si256(bits, nib), _mm256_slli_epi16(h0, 4));
      w->q[2 * j + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), nib), _mm256_slli_epi16(h1, 4));
    }
  }
};

inline __m256 k4_dot(__m256 acc, const K4Block& w, const uint8_t* xr) {
  __m256i isum = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i p = _mm256_maddubs_epi16(w.q[k], load256(xr + 32 * k));  // |pair| <= 2*31*127: no saturation
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(w.sc[k], p));
  }
  const __m256i msum = _mm256_madd_epi16(w.mins, load256(xr + kActKBsums));
  // d_w * d_x per lane: the same f32 product in every lane as a scalar multiply.
  float dxs;
  std::memcpy(&dxs, xr + kActKD, 4);
  const __m256 dx = _mm256_set1_ps(dxs);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.d, dx), acc);
  return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(w.dmin, dx), acc);
}

// ---- Q6_K --------------------------------------------------------------------
// q[k] = the 32 quants (u8 0..63, i.e. value + 32) of values 32k..32k+31;
// sc[k] = int16 lanes 0..7 scale of sub-block 2k, lanes 8..15 of 2k+1;
// sc16 = the 16 scales as int16.
struct K6Block {
  __m256i q[8];
  __m256i sc[8];
  __m256i sc16;
  __m256 d;  // f16 d in every lane
};

// kK6Select.v[k]: bytes 0..7 = 2k, bytes 8..15 = 2k + 1 (pshufb picks scales).
struct K6Select {
  alignas(16) uint8_t v[8][16];
};
constexpr K6Select make_k6_select() {
  K6Select s{};
  for (int k = 0; k < 8; ++k)
    for (int i = 0; i < 16; ++i) s.v[k][i] = static_cast<uint8_t>(2 * k + i / 8);
  return s;
}
constexpr K6Select kK6Select = make_k6_select();

struct Q6K {
  static constexpr size_t kBytes = 210;
  static inline void decode(const uint8_t* blk, K6Block* w) {
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const __m256i nib = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m256i l1 = load256(ql + 64 * h), l2 = load256(ql + 64 * h + 32), hb = load256(qh + 32 * h);
      const auto hi2 = [&](int shift) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift), two), 4);
      };
      w->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l1, nib), hi2(0));
      w->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l2, nib), hi2(2));
      w->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib), hi2(4));
      w->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), nib), hi2(6));
    }
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    for (int k = 0; k < 8; ++k)
      w->sc[k] = _mm256_cvtepi8_epi16(
          _mm_shuffle_epi8(sc8, _mm_load_si128(reinterpret_cast<const __m128i*>(kK6Select.v[k]))));
    w->sc16 = _mm256_cvtepi8_epi16(sc8);
    w->d = _mm256_set1_ps(load_f16(blk + 208));
  }
};

// Q6_K (kShift 5) and Q3_K (kShift 2): the quants are stored as q + 2^kShift.
template <int kShift>
inline __m256 k6_dot(__m256 acc, const K6Block& w, const uint8_t* xr) {
  __m256i isum = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i p = _mm256_maddubs_epi16(w.q[k], load256(xr + 32 * k));  // |pair| <= 2*63*127
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(w.sc[k], p));
  }
  // sum (q - 2^s) * x * sc = sum q * x * sc - 2^s * sum_j sc_j * bsum_j
  const __m256i off = _mm256_madd_epi16(w.sc16, load256(xr + kActKBsums));
  isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(off, kShift));
  // d_w * d_x per lane: the same f32 product in every lane as a scalar multiply.
  float dxs;
  std::memcpy(&dxs, xr + kActKD, 4);
  const __m256 dx = _mm256_set1_ps(dxs);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.d, dx), acc);
}

// ---- Q2_K / Q3_K ---------------------------------------------------------------
// 16 sub-blocks of 16 values as Q6_K, so the same K6Block layout (q[k] =
// values 32k..32k+31 as u8, sc[k] = scales of sub-blocks 2k, 2k+1 as int16
// lanes 0..7 / 8..15). Q2_K's sc16 holds the 16 mins (so madd with bsums gives
// the mins term as for Q4_K); Q3_K's sc16 the 16 signed scales (the -4 offset).

// Values 32k..32k+31: bits 2(k % 4).. of qs[32 (k / 4) + l] (u8 0..3).
inline __m256i k2_bits(const uint8_t* qs, int k) {
  return _mm256_and_si256(_mm256_srli_epi16(load256(qs + 32 * (k / 4)), 2 * (k % 4)), _mm256_set1_epi8(3));
}

// sc[k] from 16 int8 scales.
inline void k6_spread(__m128i sc8, K6Block* w) {
  for (int k = 0; k < 8; ++k)
    w->sc[k] = _mm256_cvtepi8_epi16(
        _mm_shuffle_epi8(sc8, _mm_load_si128(reinterpret_cast<const __m128i*>(kK6Select.v[k]))));
}

struct K2Block {
  K6Block b;     // q, sc (4-bit scales); b.sc16 = the 16 4-bit mins, b.d = d
  __m256 dmin;   // f16 dmin in every lane
};

struct Q2K {
  static constexpr size_t kBytes = 84;
  static inline void decode(const uint8_t* blk, K2Block* w) {
    for (int k = 0; k < 8; ++k) w->b.q[k] = k2_bits(blk + 16, k);
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)), nib = _mm_set1_epi8(0x0F);
    k6_spread(_mm_and_si128(s, nib), &w->b);
    w->b.sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), nib));
    w->b.d = _mm256_set1_ps(load_f16(blk + 80));
    w->dmin = _mm256_set1_ps(load_f16(blk + 82));
  }
};

inline __m256 k2_dot(__m256 acc, const K2Block& w, const uint8_t* xr) {
  __m256i isum = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i p = _mm256_maddubs_epi16(w.b.q[k], load256(xr + 32 * k));  // |pair| <= 2*3*127
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(w.b.sc[k], p));
  }
  const __m256i msum = _mm256_madd_epi16(w.b.sc16, load256(xr + kActKBsums));
  float dxs;
  std::memcpy(&dxs, xr + kActKD, 4);
  const __m256 dx = _mm256_set1_ps(dxs);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.b.d, dx), acc);
  return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(w.dmin, dx), acc);
}

// Q3_K: q = low two bits | (hmask bit) << 2, u8 0..7 = value + 4.
struct Q3K {
  static constexpr size_t kBytes = 110;
  static inline void decode(const uint8_t* blk, K6Block* w) {
    const __m256i hb = load256(blk), one = _mm256_set1_epi8(1);
    for (int k = 0; k < 8; ++k)  // bit k of hmask[l] is the third bit of value 32k + l
      w->q[k] = _mm256_or_si256(k2_bits(blk + 32, k),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, k), one), 2));
    const __m128i sc8 = unpack_q3_scales(blk + 96);
    k6_spread(sc8, w);
    w->sc16 = _mm256_cvtepi8_epi16(sc8);
    w->d = _mm256_set1_ps(load_f16(blk + 108));
  }
};

// ---- IQ4_XS ------------------------------------------------------------------
// q[k] = the codebook values (int8 -127..113) of values 32k..32k+31 (group k),
// sc[k] = its scale ls - 32 in every int16 lane.
struct KIBlock {
  __m256i q[8];
  __m256i sc[8];
  __m256 d;
};

struct IQ4XS {
  static constexpr size_t kBytes = 136;
  static inline void decode(const uint8_t* blk, KIBlock* w) {
    const __m256i table = iq4_table256(), nib = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {  // groups 2j, 2j+1: 16 bytes each, low nibbles first
      const __m256i bits = load256(blk + 8 + 32 * j);
      const __m256i lo = _mm256_and_si256(bits, nib), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), nib);
      // group 2j = lo[0..15] hi[0..15], group 2j + 1 = lo[16..31] hi[16..31]
      w->q[2 * j] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
      w->q[2 * j + 1] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(unpack_iq4xs_scales(blk));
    for (int k = 0; k < 8; ++k)
      w->sc[k] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                     _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k)));
    w->d = _mm256_set1_ps(load_f16(blk));
  }
};

inline __m256 ki_dot(__m256 acc, const KIBlock& w, const uint8_t* xr) {
  __m256i isum = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    // |w| * (x with w's sign): |pair| <= 2 * 127 * 127 < 2^15, no saturation
    const __m256i x = load256(xr + 32 * k);
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w.q[k]), _mm256_sign_epi8(x, w.q[k]));
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(w.sc[k], p));
  }
  float dxs;
  std::memcpy(&dxs, xr + kActKD, 4);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(w.d, _mm256_set1_ps(dxs)), acc);
}

using Vec = __m256;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline float vhsum(Vec v) { return hsum8(v); }
constexpr int kWideTokens = 4;  // 2 rows x 4 tokens: 8 accumulators in the 16 ymm registers

// The tile layer (kquant_avx512.cc has whole-chunk kernels, KTileSet::chunk):
// R rows x T tokens of one row chunk, every output with the same float op
// sequence (one Ops<Fmt>::dot per super-block, one horizontal sum at the end);
// tiles_of(type) is a table built once per type.
template <class Fmt>
struct Ops;
template <> struct Ops<Q4K> {
  using Block = K4Block;
  static Vec dot(Vec acc, const Block& w, const uint8_t* xr) { return k4_dot(acc, w, xr); }
};
template <> struct Ops<Q5K> {
  using Block = K4Block;
  static Vec dot(Vec acc, const Block& w, const uint8_t* xr) { return k4_dot(acc, w, xr); }
};
template <> struct Ops<Q6K> {
  using Block = K6Block;
  static Vec dot(Vec acc, const Block& w, const uint8_t* xr) { return k6_dot<5>(acc, w, xr); }
};
template <> struct Ops<Q2K> {
  using Block = K2Block;
  static Vec dot(Vec acc, const Block& w, const uint8_t* xr) { return k2_dot(acc, w, xr); }
};
template <> struct Ops<IQ4XS> {
  using Block = KIBlock;
  static Vec dot(Vec acc, const Block& w, const uint8_t* xr) { return ki_dot(acc, w, xr); }
};
template <> struct Ops<Q3K> {
  using Block = K6Block;
  static Vec dot(Vec acc, const Block& w, const uint8_t* xr) { return k6_dot<2>(acc, w, xr); }
};

inline void prefetch_block(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

template <class Fmt, int R, int T>
void ktile(const uint8_t* const* rows, const uint8_t* const* x, int64_t nb, size_t prefetch, float* out) {
  Vec acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vzero();
  for (int64_t b = 0; b < nb; ++b) {
    const size_t wo = static_cast<size_t>(b) * Fmt::kBytes, xo = static_cast<size_t>(b) * kActKBytes;
    for (int r = 0; r < R; ++r) {
      if (prefetch != 0) prefetch_block(rows[r] + prefetch + wo, Fmt::kBytes);
      typename Ops<Fmt>::Block w;
      Fmt::decode(rows[r] + wo, &w);
      for (int t = 0; t < T; ++t) acc[r][t] = Ops<Fmt>::dot(acc[r][t], w, x[t] + xo);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) out[t * R + r] = vhsum(acc[r][t]);
}

template <class Fmt, int R, int... Ts>
KTileSet make_tiles(std::integer_sequence<int, Ts...>) {
  KTileSet s;
  s.max_t = static_cast<int>(sizeof...(Ts));
  ((s.rows[Ts] = R, s.fn[Ts] = ktile<Fmt, R, Ts + 1>), ...);
  return s;
}

// 1-2 tokens (decode) stream the weights: 4 rows per tile share each token's
// loads. Wider token tiles: 2 rows x up to kWideTokens tokens, so each decoded
// row block serves that many tokens (the accumulators stay in registers).
template <class Fmt>
KTileSet tiles_for() {
  KTileSet s = make_tiles<Fmt, 2>(std::make_integer_sequence<int, kWideTokens>());
  s.rows[0] = 4;
  s.fn[0] = ktile<Fmt, 4, 1>;
  s.rows[1] = 4;
  s.fn[1] = ktile<Fmt, 4, 2>;
  return s;
}

// Built once per type (matmul asks for them on every call).
const KTileSet& tiles_of(GgmlType t) {
  static const KTileSet q2 = tiles_for<Q2K>(), q3 = tiles_for<Q3K>(), q4 = tiles_for<Q4K>(),
                        q5 = tiles_for<Q5K>(), q6 = tiles_for<Q6K>(), iq4xs = tiles_for<IQ4XS>();
  switch (t) {
    case GgmlType::IQ4_XS: return iq4xs;
    case GgmlType::Q2_K: return q2;
    case GgmlType::Q3_K: return q3;
    case GgmlType::Q4_K: return q4;
    case GgmlType::Q5_K: return q5;
    case GgmlType::Q6_K: return q6;
    default: PAGODA_CHECK_MSG(false, "not a K-quant type %u", static_cast<unsigned>(t));
  }
  return q4;
}

}  // namespace

const KTileSet& ktiles_avx2(GgmlType t) { return tiles_of(t); }

void quantize_act_k(const float* x, int64_t n_tokens, int64_t cols, uint8_t* out) {
  const int64_t nb = cols / 256;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* src = x + t * cols + b * 256;
      uint8_t* rec = out + static_cast<size_t>(t * nb + b) * kActKBytes;
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < 256; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
      const float amax = hmax8(mx);
      std::memset(rec + kActKD, 0, kActKBytes - kActKD);
      if (!(amax > 0.0f)) {  // all zero (ggml: d = 0, q = 0)
        std::memset(rec, 0, kActKBytes);
        continue;
      }
      // ggml keeps the first value whose |x| is the largest, with its sign.
      int first = 0;
      const __m256 am = _mm256_set1_ps(amax);
      for (int i = 0; i < 256; i += 8) {
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)), am, _CMP_EQ_OQ));
        if (m != 0) {
          first = i + __builtin_ctz(static_cast<unsigned>(m));
          break;
        }
      }
      const float iscale = -127.0f / src[first];
      const __m256 vs = _mm256_set1_ps(iscale);
      for (int g = 0; g < 8; ++g) {
        const float* s = src + 32 * g;
        // cvtps rounds half to even under the default MXCSR, as ggml's nearest_int does.
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s), vs));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + 8), vs));
        const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + 16), vs));
        const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + 24), vs));
        // |q| <= 127 for finite x, so the saturating packs equal ggml's MIN(127, v).
        const __m256i q = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), order);
        _mm256_store_si256(reinterpret_cast<__m256i*>(rec + 32 * g), q);
        // sums of bytes 0..15 and 16..31
        const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
        const __m256i s2 = _mm256_hadd_epi32(s4, s4);
        const __m256i s1 = _mm256_hadd_epi32(s2, s2);
        const int16_t b0 = static_cast<int16_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(s1)));
        const int16_t b1 = static_cast<int16_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(s1, 1)));
        std::memcpy(rec + kActKBsums + 4 * g, &b0, 2);
        std::memcpy(rec + kActKBsums + 4 * g + 2, &b1, 2);
      }
      const float d = 1.0f / iscale;
      std::memcpy(rec + kActKD, &d, 4);
    }
  }
}

void matmul_kquant(const WeightView& w, const float* x, int64_t n_tokens, float* y, const KTileSet& tiles) {
  const int64_t nb = w.cols / 256;
  const size_t xrow = static_cast<size_t>(nb) * kActKBytes;
  uint8_t* act = scratch(0, static_cast<size_t>(n_tokens) * xrow);
  quantize_act_k(x, n_tokens, w.cols, act);
  const int64_t n_chunks = (w.rows + kChunkRows - 1) / kChunkRows;
  const int nth = threads();
  const bool big = w.rows * w.cols * n_tokens >= kMinParallelMacs;
  const size_t prefetch = n_tokens <= 2 ? kPrefetchRows * w.row_bytes : 0;
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  // The packed copy (pack.cc) is made for the AVX-512 tiles only.
  const auto* packed = tiles.packed_chunk != nullptr ? static_cast<const uint8_t*>(w.packed) : nullptr;
  parallel_for(n_chunks, big ? nth : 1, [=](int64_t ch) {
    const int64_t r0 = ch * kChunkRows, nr = std::min(kChunkRows, w.rows - r0);
    if (packed != nullptr) {
      tiles.packed_chunk(packed + static_cast<size_t>(ch * nb) * tiles.packed_sb_bytes, nr, act, n_tokens, nb,
                         y + r0, w.rows);
      return;
    }
    if (tiles.chunk != nullptr) {
      tiles.chunk(wdata + r0 * w.row_bytes, w.row_bytes, nr, act, n_tokens, nb, y + r0, w.rows);
      return;
    }
    float out[kKTileMaxT * kKTileMaxR];
    for (int64_t t0 = 0; t0 < n_tokens; t0 += tiles.max_t) {
      const int nt = static_cast<int>(std::min<int64_t>(tiles.max_t, n_tokens - t0));
      const int R = tiles.rows[nt - 1];
      const uint8_t* xp[kKTileMaxT];
      for (int t = 0; t < kKTileMaxT; ++t) xp[t] = act + static_cast<size_t>(t0 + std::min(t, nt - 1)) * xrow;
      for (int64_t i0 = 0; i0 < nr; i0 += R) {
        const uint8_t* rp[kKTileMaxR];
        for (int r = 0; r < kKTileMaxR; ++r) rp[r] = wdata + (r0 + std::min<int64_t>(i0 + r, nr - 1)) * w.row_bytes;
        tiles.fn[nt - 1](rp, xp, nb, prefetch, out);
        for (int t = 0; t < nt; ++t)
          for (int r = 0; r < R && i0 + r < nr; ++r) y[(t0 + t) * w.rows + r0 + i0 + r] = out[t * R + r];
      }
    }
  });
}

}  // namespace pagoda::kernels::cpu::detail
