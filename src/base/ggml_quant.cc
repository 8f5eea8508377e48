// Scalar dequantizers and reference quantizers, one per ggml block layout. The
// arithmetic and its order follow ggml's dequantize_row_* / quantize_row_*_ref;
// the Q4_0 / Q4_1 / Q8_0 rounding (x + 8.5 truncated, roundf, the sign of the
// max-magnitude value) is ggml's, so files quantized here match llama.cpp's
// reference path. Compiled with -ffp-contract=off (base/CMakeLists.txt).
#include "base/ggml_quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "base/fp16.h"

namespace pagoda {

namespace {

// ---- Dequantizers (nb blocks -> nb * block_size floats) ----------------------


// Q4_0 / Q4_1 / Q5_0 / Q5_1: 32 values, element j in the low nibble of qs[j]
// and element j + 16 in the high one; Q5 adds a fifth bit, qh bit j for element
// j. value = (q - offset) * d for the _0 types (offset 8 or 16), q * d + m for
// the _1 types (block member m).
template <class B, int kOffset>
void dequant_legacy(const B* x, float* y, int64_t nb) {
  constexpr bool kHigh = requires(const B& b) { b.qh; };
  constexpr bool kMin = requires(const B& b) { b.m; };
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = fp16_to_fp32(x[i].d);
    float m = 0;
    if constexpr (kMin) m = fp16_to_fp32(x[i].m);
    uint32_t qh = 0;
    if constexpr (kHigh) std::memcpy(&qh, x[i].qh, sizeof qh);
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = kHigh ? ((qh >> (j + 0)) << 4) & 0x10 : 0;
      const uint8_t xh1 = kHigh ? ((qh >> (j + 12))) & 0x10 : 0;
      const int x0 = ((x[i].qs[j] & 0x0F) | xh0) - kOffset;
      const int x1 = ((x[i].qs[j] >> 4) | xh1) - kOffset;
      if constexpr (kMin) {
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
      } else {
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
      }
    }
  }
}
static_assert(kQK4_0 == 32 && kQK4_1 == 32 && kQK5_0 == 32 && kQK5_1 == 32);

void dequant_q4_0(const BlockQ4_0* x, float* y, int64_t nb) { dequant_legacy<BlockQ4_0, 8>(x, y, nb); }
void dequant_q4_1(const BlockQ4_1* x, float* y, int64_t nb) { dequant_legacy<BlockQ4_1, 0>(x, y, nb); }
void dequant_q5_0(const BlockQ5_0* x, float* y, int64_t nb) { dequant_legacy<BlockQ5_0, 16>(x, y, nb); }
void dequant_q5_1(const BlockQ5_1* x, float* y, int64_t nb) { dequant_legacy<BlockQ5_1, 0>(x, y, nb); }

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = x[i].qs[j] * d;
  }
}

// Q2_K / Q3_K value v = 128n + 32j + l (n < 2, j < 4, l < 32) sits in bits
// 2j..2j+1 of qs[32n + l]; each 16 values share one scale (sub-block v / 16).
// The float order is ggml's: dl = d * scale, then dl * q (- ml).
void dequant_q2_k(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float min = fp16_to_fp32(x[i].dmin);
    for (int v = 0; v < kQK_K; v += 16) {
      const uint8_t sc = x[i].scales[v / 16];
      const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
      const uint8_t* q = x[i].qs + 32 * (v / 128) + v % 32;
      const int shift = 2 * ((v / 32) % 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l] >> shift) & 3) - ml;
    }
  }
}

// The 16 six-bit Q3_K scales (0..63, the stored value; the weight uses sc - 32).
inline void unpack_q3_k_scales(const uint8_t* s, int* sc) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    sc[j] = lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
  }
}

void dequant_q3_k(const BlockQ3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    int sc[16];
    unpack_q3_k_scales(x[i].scales, sc);
    for (int v = 0; v < kQK_K; v += 16) {
      const float dl = d * (sc[v / 16] - 32);
      const uint8_t* q = x[i].qs + 32 * (v / 128) + v % 32;
      const uint8_t* hm = x[i].hmask + v % 32;
      const int shift = 2 * ((v / 32) % 4);
      const uint8_t bit = static_cast<uint8_t>(1u << (v / 32));
      for (int l = 0; l < 16; ++l) *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & bit) ? 0 : 4));
    }
  }
}

void dequant_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kIq4NlValues[x[i].qs[j] & 0xF];
      y[j + 16] = d * kIq4NlValues[x[i].qs[j] >> 4];
    }
  }
}

// The 6-bit scale of group g (0..7) of an IQ4_XS super-block (the weight uses ls - 32).
inline int iq4_xs_scale(const BlockIQ4_XS& b, int g) {
  return ((b.scales_l[g / 2] >> (4 * (g % 2))) & 0xF) | (((b.scales_h >> (2 * g)) & 3) << 4);
}

void dequant_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g = 0; g < 8; ++g, y += 32) {
      const float dl = d * (iq4_xs_scale(x[i], g) - 32);
      const uint8_t* qs = x[i].qs + 16 * g;
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4NlValues[qs[j] & 0xF];
        y[j + 16] = dl * kIq4NlValues[qs[j] >> 4];
      }
    }
  }
}

// 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed into 12 bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// One Q4_K or Q5_K super-block (256 values into y): sub-block pair (2p, 2p+1)
// takes the low / high nibbles of ql[32p ..]; Q5_K adds 16 where bit 2p / 2p+1
// of qh[l] is set (qh null: Q4_K). value = d*sc*q - dmin*m, ggml's order.
void dequant_k_super_block(const uint8_t* scales, float d, float min, const uint8_t* ql, const uint8_t* qh,
                           float* y) {
  uint8_t sc, m;
  for (int is = 0; is < 8; is += 2, ql += 32) {
    const uint8_t u1 = static_cast<uint8_t>(1u << is), u2 = static_cast<uint8_t>(2u << is);
    scale_min_k4(is + 0, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
  }
}

void dequant_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K)
    dequant_k_super_block(x[i].scales, fp16_to_fp32(x[i].d), fp16_to_fp32(x[i].dmin), x[i].qs, nullptr, y);
}

void dequant_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K)
    dequant_k_super_block(x[i].scales, fp16_to_fp32(x[i].d), fp16_to_fp32(x[i].dmin), x[i].qs, x[i].qh, y);
}

void dequant_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// ---- Quantizers (nb * block_size floats -> nb blocks) -----------------------


int nearest_int(float f) { return static_cast<int>(std::lrintf(f)); }

// The value of largest magnitude among x[0..n), with its sign (the first one on
// ties; 0 when all are 0): the symmetric quantizers map it to the most negative
// level, as ggml does.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Q6_K / Q3_K: scales[16] of the 16-value sub-blocks of a super-block x, each
// mapping its value of largest magnitude to the level `lowest` (< 0); returns the
// scale of largest magnitude, with its sign.
float symmetric_scales16(const float* x, float lowest, float* scales) {
  for (int j = 0; j < 16; ++j) scales[j] = signed_absmax(x + 16 * j, 16) / lowest;
  return signed_absmax(scales, 16);
}

// The largest sub-block scale and min of a K-quant super-block (see range_scales).
struct RangeMaxima {
  float scale = 0, min = 0;
};

// Q4_K / Q2_K sub-blocks (n_sub of `len` values x[len * j ..]) as value =
// scale * q - min with q in 0..levels: scale spans the sub-block's range
// [lo, hi], lo clamped to <= 0 so that the stored min (-lo) is >= 0.
// scales[n_sub], mins[n_sub].
RangeMaxima range_scales(const float* x, int n_sub, int len, float levels, float* scales, float* mins) {
  RangeMaxima m;
  for (int j = 0; j < n_sub; ++j) {
    float lo = 0.0f, hi = -FLT_MAX;
    for (int l = 0; l < len; ++l) {
      lo = std::min(lo, x[len * j + l]);
      hi = std::max(hi, x[len * j + l]);
    }
    scales[j] = (hi - lo) / levels;
    mins[j] = -lo;
    m.scale = std::max(m.scale, scales[j]);
    m.min = std::max(m.min, mins[j]);
  }
  return m;
}

// The 16 nibble bytes of a Q4_0 / Q4_1 / Q5_0 / Q5_1 block from its 32 values
// x, and for Q5 (qh non-null) the fifth bits: element j in the low nibble of
// qs[j] (fifth bit: qh bit j), j + 16 in the high one (qh bit j + 16), each
// (x - min) * id + bias truncated and capped at top (ggml's rounding: bias
// 8.5 / 16.5 for the _0 types' signed levels, 0.5 for the _1 types; min 0 for
// the _0 types, where x - 0 is x exactly).
void pack_legacy_quants(const float* x, float min, float id, float bias, int top, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    const float x0 = (x[j] - min) * id;
    const float x1 = (x[16 + j] - min) * id;
    const auto xi0 = static_cast<uint32_t>(std::min<int>(top, static_cast<int8_t>(x0 + bias)));
    const auto xi1 = static_cast<uint32_t>(std::min<int>(top, static_cast<int8_t>(x1 + bias)));
    qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
    h |= ((xi0 >> 4) & 1) << j | ((xi1 >> 4) & 1) << (j + 16);
  }
  if (qh != nullptr) std::memcpy(qh, &h, sizeof h);
}

// Q4_0 (kBits 4) / Q5_0 (kBits 5): d = the signed absmax / -2^(kBits-1).
template <class B, int kBits>
void quant_legacy_signed(const float* x, B* y, int64_t nb) {
  constexpr int qk = 32, half = 1 << (kBits - 1);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = signed_absmax(x + i * qk, qk) / -half;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    uint8_t* qh = nullptr;
    if constexpr (kBits == 5) qh = y[i].qh;
    pack_legacy_quants(x + i * qk, 0.0f, id, half + 0.5f, 2 * half - 1, y[i].qs, qh);
  }
}

// Q4_1 (kBits 4) / Q5_1 (kBits 5): d = (max - min) / (2^kBits - 1), m = min.
template <class B, int kBits>
void quant_legacy_min(const float* x, B* y, int64_t nb) {
  constexpr int qk = 32, top = (1 << kBits) - 1;
  for (int64_t i = 0; i < nb; ++i) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < qk; ++j) {
      const float v = x[i * qk + j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / top;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    uint8_t* qh = nullptr;
    if constexpr (kBits == 5) qh = y[i].qh;
    pack_legacy_quants(x + i * qk, min, id, 0.5f, top, y[i].qs, qh);
  }
}
static_assert(kQK4_0 == 32 && kQK4_1 == 32 && kQK5_0 == 32 && kQK5_1 == 32);

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) { quant_legacy_signed<BlockQ4_0, 4>(x, y, nb); }
void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) { quant_legacy_min<BlockQ4_1, 4>(x, y, nb); }
void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) { quant_legacy_signed<BlockQ5_0, 5>(x, y, nb); }
void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) { quant_legacy_min<BlockQ5_1, 5>(x, y, nb); }

void quant_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  constexpr int qk = kQK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[i * qk + j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(std::roundf(x[i * qk + j] * id));
  }
}

// Q4_K: per 32-element sub-block, value = d*sc*q - dmin*m with 6-bit sc, m and
// 4-bit q. One pass: sub-block range -> (scale, min), both quantized to 6 bits
// against the super-block maxima, then q rounded against the stored scales.
void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8], mins[8];
    const RangeMaxima m = range_scales(x, 8, 32, 15.0f, scales, mins);
    const float d = m.scale / 63.0f, dmin = m.min / 63.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].dmin = fp32_to_fp16(dmin);
    const float d_stored = fp16_to_fp32(y[i].d), dmin_stored = fp16_to_fp32(y[i].dmin);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(std::clamp(d_stored > 0 ? nearest_int(scales[j] / d_stored) : 0, 0, 63));
      lm[j] = static_cast<uint8_t>(std::clamp(dmin_stored > 0 ? nearest_int(mins[j] / dmin_stored) : 0, 0, 63));
    }
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    for (int j = 0; j < 8; ++j) {
      if (j < 4) {
        y[i].scales[j] = ls[j];
        y[i].scales[j + 4] = lm[j];
      } else {
        y[i].scales[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
        y[i].scales[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
        y[i].scales[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
      }
    }
    uint8_t L[kQK_K];
    for (int j = 0; j < 8; ++j) {
      const float dl = d_stored * ls[j], ml = dmin_stored * lm[j];
      for (int l = 0; l < 32; ++l) {
        const int q = dl > 0 ? nearest_int((x[32 * j + l] + ml) / dl) : 0;
        L[32 * j + l] = static_cast<uint8_t>(std::clamp(q, 0, 15));
      }
    }
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
  }
}

// Q6_K: per 16-element sub-block, value = d*sc*(q-32) with signed 8-bit sc and
// 6-bit q. The value of largest magnitude maps to q-32 = -32, as in ggml.
void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    const float max_scale = symmetric_scales16(x, -32.0f, scales);
    y[i] = BlockQ6_K{};            // every byte 0: d = +0.0 in fp16
    if (max_scale == 0) continue;  // an all-zero block
    const float iscale = -128.0f / max_scale;
    y[i].d = fp32_to_fp16(1.0f / iscale);
    const float d = fp16_to_fp32(y[i].d);
    uint8_t L[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int sc = std::clamp(nearest_int(iscale * scales[j]), -128, 127);
      y[i].scales[j] = static_cast<int8_t>(sc);
      const float dl = d * sc;
      for (int l = 0; l < 16; ++l) {
        const int q = dl != 0 ? nearest_int(x[16 * j + l] / dl) : 0;
        L[16 * j + l] = static_cast<uint8_t>(std::clamp(q, -32, 31) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
  }
}

// Packs 256 two-bit values L (natural order) into Q2_K / Q3_K qs[64].
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l)
      qs[32 * n + l] = static_cast<uint8_t>((L[128 * n + l] & 3) | ((L[128 * n + l + 32] & 3) << 2) |
                                            ((L[128 * n + l + 64] & 3) << 4) | ((L[128 * n + l + 96] & 3) << 6));
}

// Q2_K: per 16-value sub-block, value = d*sc*q - dmin*m with 4-bit sc, m and
// 2-bit q. One pass as quant_q4_k: sub-block range -> (scale, min), both
// quantized to 4 bits against the super-block maxima, q rounded against the
// stored scales. (ggml's reference searches the scales; these blocks are valid
// but not byte-identical to its output.)
void quant_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16], mins[16];
    const RangeMaxima m = range_scales(x, 16, 16, 3.0f, scales, mins);
    y[i].d = fp32_to_fp16(m.scale / 15.0f);
    y[i].dmin = fp32_to_fp16(m.min / 15.0f);
    const float d = fp16_to_fp32(y[i].d), dmin = fp16_to_fp32(y[i].dmin);
    uint8_t L[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int ls = std::clamp(d > 0 ? nearest_int(scales[j] / d) : 0, 0, 15);
      const int lm = std::clamp(dmin > 0 ? nearest_int(mins[j] / dmin) : 0, 0, 15);
      y[i].scales[j] = static_cast<uint8_t>(ls | (lm << 4));
      const float dl = d * ls, ml = dmin * lm;
      for (int l = 0; l < 16; ++l) {
        const int q = dl > 0 ? nearest_int((x[16 * j + l] + ml) / dl) : 0;
        L[16 * j + l] = static_cast<uint8_t>(std::clamp(q, 0, 3));
      }
    }
    pack_2bit(L, y[i].qs);
  }
}

// Q3_K: per 16-value sub-block, value = d*(sc-32)*(q-4) with 6-bit sc and
// 3-bit q. As quant_q6_k: the value of largest magnitude maps to q-4 = -4,
// and the sub-block scale of largest magnitude to sc-32 = -32.
void quant_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    const float max_scale = symmetric_scales16(x, -4.0f, scales);
    y[i] = BlockQ3_K{};  // every byte 0; d stays +0.0 for an all-zero block (then every value is 0)
    uint8_t L[kQK_K];
    std::memset(L, 4, sizeof L);  // q - 4 = 0
    if (max_scale != 0) {
      const float iscale = -32.0f / max_scale;
      y[i].d = fp32_to_fp16(1.0f / iscale);
      const float d = fp16_to_fp32(y[i].d);
      for (int j = 0; j < 16; ++j) {
        const int sc = std::clamp(nearest_int(iscale * scales[j]), -32, 31);
        const int u = sc + 32;  // stored 6 bits
        y[i].scales[j % 8] |= static_cast<uint8_t>((u & 0xF) << (j < 8 ? 0 : 4));
        y[i].scales[8 + j % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (j / 4)));
        const float dl = d * sc;
        for (int l = 0; l < 16; ++l) {
          const int q = dl != 0 ? nearest_int(x[16 * j + l] / dl) : 0;
          L[16 * j + l] = static_cast<uint8_t>(std::clamp(q, -4, 3) + 4);
        }
      }
    }
    for (int v = 0; v < kQK_K; ++v)
      if (L[v] & 4) y[i].hmask[v % 32] |= static_cast<uint8_t>(1u << (v / 32));
    pack_2bit(L, y[i].qs);
  }
}

// The index of the codebook entry nearest to v (ties: the lower entry).
int nearest_iq4(float v) {
  int best = 0;
  for (int k = 1; k < 16; ++k)
    if (std::fabs(v - kIq4NlValues[k]) < std::fabs(v - kIq4NlValues[best])) best = k;
  return best;
}

// One 32-value group against scale dl: nibbles into qs[16] (0 if dl == 0).
void quant_iq4_group(const float* x, float dl, uint8_t* qs) {
  const float id = dl != 0 ? 1.0f / dl : 0.0f;
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(nearest_iq4(x[j] * id) | (nearest_iq4(x[j + 16] * id) << 4));
}

// IQ4_XS's group scale: the value of largest magnitude maps to the codebook
// end -127 (one pass, valid blocks but not ggml's bytes).
float iq4_group_scale(const float* x) { return signed_absmax(x, 32) / static_cast<float>(kIq4NlValues[0]); }

// ggml's best_index_int8: the codebook entry nearest to x (ties: the upper one),
// by bisection as ggml does.
int iq4_best_index(float x) {
  const int8_t* val = kIq4NlValues;
  if (x <= val[0]) return 0;
  if (x >= val[15]) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) mu = mav;
    else ml = mav;
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// IQ4_NL: ggml's quantize_row_iq4_nl_ref (quantize_row_iq4_nl_impl with one
// 32-value block, no importance weights and ntry = -1, the path llama.cpp's KV
// cache writes take): the value of largest magnitude maps to the codebook end
// -127, each value takes its nearest entry against that scale, and the stored
// d is the least-squares scale of those entries (weights x^2). The float
// operations are ggml's, in its order (this file has no FP contraction). A
// block of zeros (|max| < 1e-15) gets d = 0 and, as in ggml, the previous
// block's indices (ggml: whatever its buffer held; here 0 for a row's first).
void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb) {
  const int8_t* values = kIq4NlValues;
  uint8_t L[32] = {};
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float weight[32];
    for (int j = 0; j < 32; ++j) weight[j] = x[j] * x[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    float scale = 0;
    if (!(amax < 1e-15f)) {  // ggml's GROUP_MAX_EPS
      const float d = max / values[0];
      const float id = 1 / d;
      float sumqx = 0, sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const int l = iq4_best_index(id * x[j]);
        L[j] = static_cast<uint8_t>(l);
        const float q = values[l];
        const float w = weight[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
      }
      scale = sumqx / sumq2;
    }
    y[i].d = fp32_to_fp16(scale);
    for (int j = 0; j < 16; ++j) y[i].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

// IQ4_XS: group scales as IQ4_NL's, quantized to 6 bits (ls - 32 in -32..31)
// against the super-block's largest, which maps to -32.
void quant_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8];
    for (int g = 0; g < 8; ++g) scales[g] = iq4_group_scale(x + 32 * g);
    const float max_scale = signed_absmax(scales, 8);
    y[i].d = fp32_to_fp16(max_scale / -32.0f);
    const float d = fp16_to_fp32(y[i].d);
    y[i].scales_h = 0;
    std::memset(y[i].scales_l, 0, sizeof y[i].scales_l);
    for (int g = 0; g < 8; ++g) {
      const int ls = std::clamp(d != 0 ? nearest_int(scales[g] / d) : 0, -32, 31) + 32;
      y[i].scales_l[g / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (g % 2)));
      y[i].scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * g));
      quant_iq4_group(x + 32 * g, d * (ls - 32), y[i].qs + 16 * g);
    }
  }
}

// ---- One table row per format ------------------------------------------------

// F32 / F16 / BF16, either way: one element at a time (F32: a copy).
template <class From, class To, To (*Convert)(From)>
void convert_elems(const From* x, To* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Convert(x[i]);
}
float same_f32(float v) { return v; }

// F32 -> F16 (the KV cache's default row format, written every step): 8 at a
// time with F16C (in the x86-64-v3 baseline), round to nearest even, which is
// exactly fp32_to_fp16 for every non-NaN value; a group holding a NaN takes the
// scalar path (canonical quiet NaN 0x7E00, where the instruction keeps payload).
void f32_to_f16_elems(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) y[j] = fp32_to_fp16(x[j]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

// Type-erased entry points over the typed block functions above.
using DequantFn = void (*)(const void* src, float* dst, int64_t nb);
using QuantFn = void (*)(const float* src, void* dst, int64_t nb);
template <class B, void (*F)(const B*, float*, int64_t)>
void deq(const void* src, float* dst, int64_t nb) {
  F(static_cast<const B*>(src), dst, nb);
}
template <class B, void (*F)(const float*, B*, int64_t)>
void qnt(const float* src, void* dst, int64_t nb) {
  F(src, static_cast<B*>(dst), nb);
}

struct Codec {
  DequantFn dequant = nullptr;  // null: not supported
  QuantFn quant = nullptr;      // null: no quantizer for this format
};

Codec codec(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return {deq<float, convert_elems<float, float, same_f32>>, qnt<float, convert_elems<float, float, same_f32>>};
    case GgmlType::F16:
      return {deq<uint16_t, convert_elems<uint16_t, float, fp16_to_fp32>>,
              qnt<uint16_t, f32_to_f16_elems>};
    case GgmlType::BF16:
      return {deq<uint16_t, convert_elems<uint16_t, float, bf16_to_fp32>>,
              qnt<uint16_t, convert_elems<float, uint16_t, fp32_to_bf16>>};
    case GgmlType::Q4_0: return {deq<BlockQ4_0, dequant_q4_0>, qnt<BlockQ4_0, quant_q4_0>};
    case GgmlType::Q4_1: return {deq<BlockQ4_1, dequant_q4_1>, qnt<BlockQ4_1, quant_q4_1>};
    case GgmlType::Q5_0: return {deq<BlockQ5_0, dequant_q5_0>, qnt<BlockQ5_0, quant_q5_0>};
    case GgmlType::Q5_1: return {deq<BlockQ5_1, dequant_q5_1>, qnt<BlockQ5_1, quant_q5_1>};
    case GgmlType::Q8_0: return {deq<BlockQ8_0, dequant_q8_0>, qnt<BlockQ8_0, quant_q8_0>};
    case GgmlType::Q2_K: return {deq<BlockQ2_K, dequant_q2_k>, qnt<BlockQ2_K, quant_q2_k>};
    case GgmlType::Q3_K: return {deq<BlockQ3_K, dequant_q3_k>, qnt<BlockQ3_K, quant_q3_k>};
    case GgmlType::IQ4_NL: return {deq<BlockIQ4_NL, dequant_iq4_nl>, qnt<BlockIQ4_NL, quant_iq4_nl>};
    case GgmlType::IQ4_XS: return {deq<BlockIQ4_XS, dequant_iq4_xs>, qnt<BlockIQ4_XS, quant_iq4_xs>};
    case GgmlType::Q4_K: return {deq<BlockQ4_K, dequant_q4_k>, qnt<BlockQ4_K, quant_q4_k>};
    case GgmlType::Q5_K: return {deq<BlockQ5_K, dequant_q5_k>, nullptr};
    case GgmlType::Q6_K: return {deq<BlockQ6_K, dequant_q6_k>, qnt<BlockQ6_K, quant_q6_k>};
    default: return {};
  }
}

// Blocks in a row of n elements, or -1 if n is negative or not whole blocks.
int64_t row_blocks(GgmlType t, int64_t n) {
  const int64_t bs = ggml_type_info(t).block_size;
  return n < 0 || n % bs != 0 ? -1 : n / bs;
}

// f over the whole blocks of a row of n elements; false (nothing written) when
// f is null or n is not whole blocks.
template <class Fn, class Src, class Dst>
bool apply_to_row(Fn f, GgmlType type, Src src, Dst dst, int64_t n) {
  const int64_t nb = f ? row_blocks(type, n) : -1;
  if (nb < 0) return false;
  f(src, dst, nb);
  return true;
}

}  // namespace

bool dequantize_supported(GgmlType type) { return codec(type).dequant != nullptr; }
bool quantize_supported(GgmlType type) { return codec(type).quant != nullptr; }

bool dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  return apply_to_row(codec(type).dequant, type, src, dst, n);
}

bool quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  return apply_to_row(codec(type).quant, type, src, dst, n);
}

}  // namespace pagoda
