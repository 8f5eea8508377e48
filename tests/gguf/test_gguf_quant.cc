// Dequantizers against independently written element-wise formulas (element e
// of a block -> its bits, its scale, its value) on random blocks; quantizers by
// hand-checked blocks and quantize->dequantize error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "base/fp16.h"
#include "base/rng.h"
#include "base/ggml_quant.h"

namespace pagoda::gguf {
namespace {

// Random block bytes with the fp16 scale fields (at the given byte offsets) set
// to moderate finite values, so the reference and the code see real numbers.
std::vector<uint8_t> random_blocks(GgmlType t, int n_blocks, std::vector<size_t> half_offsets, Rng& rng) {
  const auto& ti = ggml_type_info(t);
  std::vector<uint8_t> b(ti.type_size * static_cast<size_t>(n_blocks));
  for (auto& x : b) x = static_cast<uint8_t>(rng.next_u64());
  for (int i = 0; i < n_blocks; ++i)
    for (size_t off : half_offsets) {
      const uint16_t h = fp32_to_fp16(static_cast<float>(rng.uniform() * 2 - 1) * 0.05f);
      std::memcpy(&b[i * ti.type_size + off], &h, 2);
    }
  return b;
}

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Expected value of element e of one block, written from the format description.
using Formula = std::function<double(const uint8_t* blk, int e)>;

double q4_0(const uint8_t* b, int e) {  // d | qs[16]: element e<16 low nibble of qs[e], else high nibble of qs[e-16]
  const uint8_t byte = b[2 + e % 16];
  const int q = e < 16 ? (byte & 15) : (byte >> 4);
  return (q - 8) * static_cast<double>(half_at(b));
}
double q4_1(const uint8_t* b, int e) {  // d | m | qs[16]
  const uint8_t byte = b[4 + e % 16];
  const int q = e < 16 ? (byte & 15) : (byte >> 4);
  return q * static_cast<double>(half_at(b)) + half_at(b + 2);
}
int fifth_bit(const uint8_t* qh, int e) { return (qh[e / 8] >> (e % 8)) & 1; }  // bit e of the 32-bit qh
double q5_0(const uint8_t* b, int e) {  // d | qh[4] | qs[16]
  const uint8_t byte = b[6 + e % 16];
  const int lo = e < 16 ? (byte & 15) : (byte >> 4);
  return ((lo | fifth_bit(b + 2, e) << 4) - 16) * static_cast<double>(half_at(b));
}
double q5_1(const uint8_t* b, int e) {  // d | m | qh[4] | qs[16]
  const uint8_t byte = b[8 + e % 16];
  const int lo = e < 16 ? (byte & 15) : (byte >> 4);
  return (lo | fifth_bit(b + 4, e) << 4) * static_cast<double>(half_at(b)) + half_at(b + 2);
}
double q8_0(const uint8_t* b, int e) { return static_cast<int8_t>(b[2 + e]) * static_cast<double>(half_at(b)); }

// K-quants: sub-block j of 32 has a 6-bit scale and min in the 12 scale bytes:
// j<4: low 6 bits of bytes j and j+4; j>=4: low/high nibble of byte j+4 plus
// the top 2 bits of bytes j-4 and j.
void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] % 64;
    *m = s[j + 4] % 64;
  } else {
    *sc = s[j + 4] % 16 + (s[j - 4] / 64) * 16;
    *m = s[j + 4] / 16 + (s[j] / 64) * 16;
  }
}
double q4_k(const uint8_t* b, int e) {  // d | dmin | scales[12] | qs[128]
  const int j = e / 32, group = e / 64, l = e % 32;
  const uint8_t byte = b[16 + group * 32 + l];
  const int q = (j % 2 == 0) ? byte % 16 : byte / 16;
  int sc, m;
  k_scale_min(b + 4, j, &sc, &m);
  return static_cast<double>(half_at(b)) * sc * q - static_cast<double>(half_at(b + 2)) * m;
}
double q5_k(const uint8_t* b, int e) {  // d | dmin | scales[12] | qh[32] | qs[128]
  const int j = e / 32, group = e / 64, l = e % 32;
  const uint8_t byte = b[48 + group * 32 + l];
  const int lo = (j % 2 == 0) ? byte % 16 : byte / 16;
  const int hi = (b[16 + l] >> j) & 1;  // bit j of qh[l]
  int sc, m;
  k_scale_min(b + 4, j, &sc, &m);
  return static_cast<double>(half_at(b)) * sc * (lo + 16 * hi) - static_cast<double>(half_at(b + 2)) * m;
}
double q6_k(const uint8_t* b, int e) {  // ql[128] | qh[64] | scales[16] (int8) | d
  const int half = e / 128, p = e % 128, quarter = p / 32, l = p % 32;
  const uint8_t lo_byte = b[half * 64 + l + (quarter % 2) * 32];
  const int lo = quarter < 2 ? lo_byte % 16 : lo_byte / 16;
  const int hi = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
  const int sc = static_cast<int8_t>(b[192 + e / 16]);
  return static_cast<double>(half_at(b + 208)) * sc * ((lo | hi << 4) - 32);
}

// Q2_K / Q3_K: element e is bits 2 ((e / 32) % 4).. of qs[32 (e / 128) + e % 32];
// sub-block e / 16 holds its scale.
int two_bits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3; }
double q2_k(const uint8_t* b, int e) {  // scales[16] (scale | min << 4) | qs[64] | d | dmin
  const int sc = b[e / 16] & 15, m = b[e / 16] >> 4;
  return static_cast<double>(half_at(b + 80)) * sc * two_bits(b + 16, e) - static_cast<double>(half_at(b + 82)) * m;
}
double q3_k(const uint8_t* b, int e) {  // hmask[32] | qs[64] | scales[12] | d
  const int j = e / 16;
  const int lo4 = j < 8 ? b[96 + j] % 16 : b[96 + j - 8] / 16;  // low nibble, then high nibble of bytes 0..7
  const int hi2 = (b[96 + 8 + j % 4] >> (2 * (j / 4))) & 3;     // top 2 bits from bytes 8..11
  const int third = (b[e % 32] >> (e / 32)) & 1;                // bit e / 32 of hmask[e % 32]
  const int q = two_bits(b + 32, e) + 4 * third - 4;
  return static_cast<double>(half_at(b + 108)) * (lo4 + 16 * hi2 - 32) * q;
}

// IQ4_NL / IQ4_XS: byte j of a 32-value group's 16 holds element j (low nibble)
// and j + 16 (high nibble), an index into the codebook.
const int kCodebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
int iq4_index(const uint8_t* qs, int e) { return e % 32 < 16 ? qs[e % 16] % 16 : qs[e % 16] / 16; }
double iq4_nl(const uint8_t* b, int e) {  // d | qs[16]
  return static_cast<double>(half_at(b)) * kCodebook[iq4_index(b + 2, e)];
}
double iq4_xs(const uint8_t* b, int e) {  // d | scales_h (u16) | scales_l[4] | qs[128]
  const int g = e / 32;
  const int lo4 = (b[4 + g / 2] >> (4 * (g % 2))) & 15;
  const int hi2 = ((b[2] | b[3] << 8) >> (2 * g)) & 3;
  return static_cast<double>(half_at(b)) * (lo4 + 16 * hi2 - 32) * kCodebook[iq4_index(b + 8 + 16 * g, e)];
}

// exact: the formula's value rounded once to f32 must equal the output bit for
// bit (Q2_K / Q3_K / IQ4: every product is exact in f32, so ggml's float order
// leaves at most one rounding, of Q2_K's difference).
void check_dequant(GgmlType t, std::vector<size_t> half_offsets, const Formula& f, bool exact = false) {
  Rng rng(1234 + static_cast<uint64_t>(t));
  const auto& ti = ggml_type_info(t);
  const int n_blocks = 7;
  for (int rep = 0; rep < 20; ++rep) {
    auto blocks = random_blocks(t, n_blocks, half_offsets, rng);
    const int64_t n = static_cast<int64_t>(ti.block_size) * n_blocks;
    std::vector<float> out(static_cast<size_t>(n), -999.0f);
    ASSERT_TRUE(dequantize_row(t, blocks.data(), out.data(), n));
    for (int64_t i = 0; i < n; ++i) {
      const double want = f(blocks.data() + (i / ti.block_size) * ti.type_size, static_cast<int>(i % ti.block_size));
      if (exact) {
        ASSERT_EQ(out[i], static_cast<float>(want)) << ti.name << " element " << i;
      } else {
        ASSERT_NEAR(out[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << ti.name << " element " << i;
      }
    }
  }
}

TEST(Dequant, Q4_0) { check_dequant(GgmlType::Q4_0, {0}, q4_0); }
TEST(Dequant, Q4_1) { check_dequant(GgmlType::Q4_1, {0, 2}, q4_1); }
TEST(Dequant, Q5_0) { check_dequant(GgmlType::Q5_0, {0}, q5_0); }
TEST(Dequant, Q5_1) { check_dequant(GgmlType::Q5_1, {0, 2}, q5_1); }
TEST(Dequant, Q8_0) { check_dequant(GgmlType::Q8_0, {0}, q8_0); }
TEST(Dequant, Q4_K) { check_dequant(GgmlType::Q4_K, {0, 2}, q4_k); }
TEST(Dequant, Q5_K) { check_dequant(GgmlType::Q5_K, {0, 2}, q5_k); }
TEST(Dequant, Q6_K) { check_dequant(GgmlType::Q6_K, {208}, q6_k); }
TEST(Dequant, Q2_K) { check_dequant(GgmlType::Q2_K, {80, 82}, q2_k, true); }
TEST(Dequant, Q3_K) { check_dequant(GgmlType::Q3_K, {108}, q3_k, true); }
TEST(Dequant, IQ4_NL) { check_dequant(GgmlType::IQ4_NL, {0}, iq4_nl, true); }
TEST(Dequant, IQ4_XS) { check_dequant(GgmlType::IQ4_XS, {0}, iq4_xs, true); }

TEST(Dequant, FloatTypes) {
  const float vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f, -1e30f};
  std::vector<uint16_t> h, bf;
  for (float v : vals) {
    h.push_back(fp32_to_fp16(v));
    bf.push_back(fp32_to_bf16(v));
  }
  float out[8];
  ASSERT_TRUE(dequantize_row(GgmlType::F32, vals, out, 8));
  EXPECT_EQ(std::memcmp(out, vals, sizeof vals), 0);
  ASSERT_TRUE(dequantize_row(GgmlType::F16, h.data(), out, 8));
  EXPECT_EQ(out[3], -2.5f);
  EXPECT_EQ(out[4], 65504.0f);
  EXPECT_TRUE(std::isinf(out[7]));
  // bf16 is the top half of the f32 bits
  ASSERT_TRUE(dequantize_row(GgmlType::BF16, bf.data(), out, 8));
  for (int i = 0; i < 8; ++i) {
    uint32_t bits = static_cast<uint32_t>(bf[i]) << 16;
    float want;
    std::memcpy(&want, &bits, 4);
    EXPECT_EQ(out[i], want);
    EXPECT_NEAR(out[i], vals[i], std::fabs(vals[i]) / 128);
  }
}

TEST(Dequant, RejectsUnsupportedAndBadLength) {
  float out[64];
  uint8_t blk[84] = {};
  EXPECT_FALSE(dequantize_row(GgmlType::Q8_K, blk, out, 256));
  EXPECT_FALSE(dequantize_row(GgmlType::Q2_K, blk, out, 255));
  EXPECT_FALSE(dequantize_row(GgmlType::Q8_0, blk, out, 33));
  EXPECT_TRUE(dequantize_row(GgmlType::Q8_0, blk, out, 0));
}

// Hand-built blocks with known values check the dequantizers against ggml's layout.
TEST(Dequant, KnownBlocks) {
  {  // Q4_0: d = 0.5, byte j = (lo = j % 16, hi = 15 - j % 16)
    BlockQ4_0 b{};
    b.d = fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float y[32];
    ASSERT_TRUE(dequantize_row(GgmlType::Q4_0, &b, y, 32));
    EXPECT_EQ(y[0], -4.0f);    // (0 - 8) * 0.5
    EXPECT_EQ(y[15], 3.5f);    // (15 - 8) * 0.5
    EXPECT_EQ(y[16], 3.5f);    // hi nibble of byte 0 = 15
    EXPECT_EQ(y[31], -4.0f);
  }
  {  // Q4_1: d = 0.25, m = -1
    BlockQ4_1 b{};
    b.d = fp32_to_fp16(0.25f);
    b.m = fp32_to_fp16(-1.0f);
    b.qs[3] = 0x4A;  // element 3 = 10, element 19 = 4
    float y[32];
    ASSERT_TRUE(dequantize_row(GgmlType::Q4_1, &b, y, 32));
    EXPECT_EQ(y[3], 1.5f);
    EXPECT_EQ(y[19], 0.0f);
    EXPECT_EQ(y[0], -1.0f);
  }
  {  // Q5_0: high bit of element 2 and element 18
    BlockQ5_0 b{};
    b.d = fp32_to_fp16(1.0f);
    const uint32_t qh = (1u << 2) | (1u << 18);
    std::memcpy(b.qh, &qh, 4);
    b.qs[2] = 0x31;
    float y[32];
    ASSERT_TRUE(dequantize_row(GgmlType::Q5_0, &b, y, 32));
    EXPECT_EQ(y[2], 1.0f);    // (1 | 16) - 16
    EXPECT_EQ(y[18], 3.0f);   // (3 | 16) - 16
    EXPECT_EQ(y[0], -16.0f);
  }
  {  // Q8_0
    BlockQ8_0 b{};
    b.d = fp32_to_fp16(2.0f);
    b.qs[5] = -7;
    float y[32];
    ASSERT_TRUE(dequantize_row(GgmlType::Q8_0, &b, y, 32));
    EXPECT_EQ(y[5], -14.0f);
    EXPECT_EQ(y[6], 0.0f);
  }
  {  // Q6_K: element 0 uses ql[0] low nibble, qh[0] bits 0-1, scale[0]
    BlockQ6_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.ql[0] = 0x05;
    b.qh[0] = 0x02;  // high bits of element 0 = 2 -> q = 5 | 32 = 37 - 32 = 5
    b.scales[0] = 3;
    float y[256];
    ASSERT_TRUE(dequantize_row(GgmlType::Q6_K, &b, y, 256));
    EXPECT_EQ(y[0], 7.5f);  // 0.5 * 3 * 5
    EXPECT_EQ(y[1], 0.5f * 3 * -32);
  }
  {  // Q4_K: sub-block 0 scale 2 min 1; sub-block 1 (high nibbles) scale 4 min 0
    BlockQ4_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(0.5f);
    b.scales[0] = 2;
    b.scales[4] = 1;
    b.scales[1] = 4;
    b.qs[0] = 0x73;
    float y[256];
    ASSERT_TRUE(dequantize_row(GgmlType::Q4_K, &b, y, 256));
    EXPECT_EQ(y[0], 2.0f * 3 - 0.5f);
    EXPECT_EQ(y[32], 4.0f * 7);
  }
  {  // Q2_K: value = d * (scale & 15) * q - dmin * (scale >> 4), sub-blocks of 16
    BlockQ2_K b{};
    b.d = fp32_to_fp16(1.0f);
    b.dmin = fp32_to_fp16(0.5f);
    b.scales[0] = 0x23;  // sub-block 0: scale 3, min 2
    b.scales[1] = 0x01;
    b.scales[2] = 0x05;
    b.scales[4] = 0x12;
    b.scales[8] = 0x37;
    b.qs[0] = 0xE4;   // elements 0, 32, 64, 96 = 0, 1, 2, 3
    b.qs[16] = 0x03;  // element 16 = 3
    b.qs[32] = 0x02;  // element 128 = 2
    float y[256];
    ASSERT_TRUE(dequantize_row(GgmlType::Q2_K, &b, y, 256));
    EXPECT_EQ(y[0], 3.0f * 0 - 0.5f * 2);
    EXPECT_EQ(y[1], -1.0f);
    EXPECT_EQ(y[16], 1.0f * 3);
    EXPECT_EQ(y[32], 5.0f * 1);
    EXPECT_EQ(y[64], 2.0f * 2 - 0.5f);
    EXPECT_EQ(y[96], 0.0f);  // sub-block 6: scale 0, min 0
    EXPECT_EQ(y[128], 7.0f * 2 - 0.5f * 3);
  }
  {  // Q3_K: value = d * (sc - 32) * (q - 4), q = 2 low bits | hmask bit << 2
    BlockQ3_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.scales[0] = 0x01;   // sub-block 0: low nibble 1 ...
    b.scales[8] = 0x02;   // ... high bits 2: sc = 33
    b.scales[1] = 0x40;   // sub-block 9: low nibble 4 (high nibble of byte 1) ...
    b.scales[9] = 0x10;   // ... high bits 1 (byte 8 + 9 % 4, bits 4-5): sc = 20
    b.scales[7] = 0xF0;   // sub-block 15: low nibble 15 ...
    b.scales[11] = 0xC0;  // ... high bits 3 (byte 11, bits 6-7): sc = 63
    b.qs[0] = 0x03;
    b.hmask[0] = 0x01;   // element 0: 3 | 4 -> q - 4 = 3
    b.qs[48] = 0x01;
    b.hmask[16] = 0x10;  // element 144: qs[32 + 16] bits 0-1, hmask[16] bit 4 -> 1
    b.qs[63] = 0x80;     // element 255: qs[63] bits 6-7 = 2, hmask[31] bit 7 clear -> -2
    float y[256];
    ASSERT_TRUE(dequantize_row(GgmlType::Q3_K, &b, y, 256));
    EXPECT_EQ(y[0], 0.5f * 1 * 3);
    EXPECT_EQ(y[1], 0.5f * 1 * -4);
    EXPECT_EQ(y[32], 0.5f * -32 * -4);  // sub-block 2: sc = 0
    EXPECT_EQ(y[144], 0.5f * -12 * 1);
    EXPECT_EQ(y[255], 0.5f * 31 * -2);
  }
  {  // IQ4_NL: d * codebook[index]
    BlockIQ4_NL b{};
    b.d = fp32_to_fp16(0.5f);
    b.qs[0] = 0xF8;  // element 0 -> index 8 (1), element 16 -> index 15 (113)
    b.qs[15] = 0x07;  // element 15 -> index 7 (-10), element 31 -> index 0 (-127)
    float y[32];
    ASSERT_TRUE(dequantize_row(GgmlType::IQ4_NL, &b, y, 32));
    EXPECT_EQ(y[0], 0.5f);
    EXPECT_EQ(y[16], 56.5f);
    EXPECT_EQ(y[15], -5.0f);
    EXPECT_EQ(y[31], -63.5f);
    EXPECT_EQ(y[1], -63.5f);
  }
  {  // IQ4_XS: group 0 scale 33 (low nibble 1, high bits 2), group 5 scale 20 (4 | 1 << 4), others 0
    BlockIQ4_XS b{};
    b.d = fp32_to_fp16(0.25f);
    b.scales_l[0] = 0x01;
    b.scales_l[2] = 0x40;  // group 5: high nibble of scales_l[2]
    b.scales_h = static_cast<uint16_t>((2 << 0) | (1 << 10));
    b.qs[0] = 0x9F;           // element 0 -> 113, element 16 -> 13
    b.qs[16 * 5 + 3] = 0x30;  // group 5: element 163 -> -127, element 179 -> -65
    float y[256];
    ASSERT_TRUE(dequantize_row(GgmlType::IQ4_XS, &b, y, 256));
    EXPECT_EQ(y[0], 0.25f * 1 * 113);
    EXPECT_EQ(y[16], 0.25f * 1 * 13);
    EXPECT_EQ(y[163], 0.25f * -12 * -127);
    EXPECT_EQ(y[179], 0.25f * -12 * -65);
    EXPECT_EQ(y[32], 0.25f * -32 * -127);  // group 1: scale 0 -> -32, index 0
  }
}

TEST(Quantize, Q4_0HandCheckedBlock) {
  // x = j - 16: the largest magnitude is -16, so d = -16 / -8 = 2 and
  // q = trunc((j-16)/2 + 8.5) = trunc(j/2 + 0.5), clamped to 15.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  BlockQ4_0 b;
  ASSERT_TRUE(quantize_row(GgmlType::Q4_0, x, &b, 32));
  EXPECT_EQ(fp16_to_fp32(b.d), 2.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(b.qs[j] & 15, (j + 1) / 2) << j;
    EXPECT_EQ(b.qs[j] >> 4, std::min(15, (j + 16 + 1) / 2)) << j;
  }
}

TEST(Quantize, Q8_0HandCheckedBlock) {
  float x[32] = {};
  x[0] = 1.27f;
  x[1] = -0.5f;
  x[2] = 0.005f;   // 0.5 after scaling: roundf rounds half away from zero
  x[3] = -0.015f;  // -1.5 -> -2
  BlockQ8_0 b;
  ASSERT_TRUE(quantize_row(GgmlType::Q8_0, x, &b, 32));
  EXPECT_EQ(b.d, fp32_to_fp16(0.01f));
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], -50);
  EXPECT_EQ(b.qs[2], 1);
  EXPECT_EQ(b.qs[3], -2);
  EXPECT_EQ(b.qs[4], 0);
}

TEST(Quantize, Q4_1HandCheckedBlock) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = 1.0f + 0.5f * static_cast<float>(j % 16);  // min 1, max 8.5, d = 0.5
  BlockQ4_1 b;
  ASSERT_TRUE(quantize_row(GgmlType::Q4_1, x, &b, 32));
  EXPECT_EQ(fp16_to_fp32(b.d), 0.5f);
  EXPECT_EQ(fp16_to_fp32(b.m), 1.0f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j | (j << 4)) << j;
  float y[32];
  ASSERT_TRUE(dequantize_row(GgmlType::Q4_1, &b, y, 32));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]);
}

// Q5_0 / Q5_1 (synth files of those types, issue 22): levels that land exactly
// on 0..31, so the blocks are known byte for byte (ggml's quantize_row_q5_*_ref
// gives the same) and dequantize back exactly; the fifth bits are qh.
TEST(Quantize, Q5HandCheckedBlocks) {
  float x0[32], x1[32];
  for (int j = 0; j < 32; ++j) {
    x0[j] = static_cast<float>(j - 16);  // signed absmax -16: d = 1, q = j
    x1[j] = 0.5f * static_cast<float>(j) - 1.0f;  // min -1, max 14.5: d = 0.5, q = j
  }
  BlockQ5_0 b0;
  BlockQ5_1 b1;
  ASSERT_TRUE(quantize_row(GgmlType::Q5_0, x0, &b0, 32));
  ASSERT_TRUE(quantize_row(GgmlType::Q5_1, x1, &b1, 32));
  EXPECT_EQ(fp16_to_fp32(b0.d), 1.0f);
  EXPECT_EQ(fp16_to_fp32(b1.d), 0.5f);
  EXPECT_EQ(fp16_to_fp32(b1.m), -1.0f);
  uint32_t qh0, qh1;
  std::memcpy(&qh0, b0.qh, 4);
  std::memcpy(&qh1, b1.qh, 4);
  EXPECT_EQ(qh0, 0xFFFF0000u);  // values 16..31 have the fifth bit
  EXPECT_EQ(qh1, 0xFFFF0000u);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(b0.qs[j], j | (j << 4)) << j;
    EXPECT_EQ(b1.qs[j], j | (j << 4)) << j;
  }
  float y0[32], y1[32];
  ASSERT_TRUE(dequantize_row(GgmlType::Q5_0, &b0, y0, 32));
  ASSERT_TRUE(dequantize_row(GgmlType::Q5_1, &b1, y1, 32));
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y0[j], x0[j]) << j;
    EXPECT_EQ(y1[j], x1[j]) << j;
  }
}

TEST(Quantize, AllZeroBlocksStayZero) {
  std::vector<float> x(512, 0.0f), y(512, 1.0f);
  std::vector<uint8_t> q(2048);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,
                     GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
    ASSERT_TRUE(quantize_row(t, x.data(), q.data(), 512));
    ASSERT_TRUE(dequantize_row(t, q.data(), y.data(), 512));
    for (float v : y) ASSERT_EQ(v, 0.0f) << ggml_type_info(t).name;
  }
}

// Max |x - dequant(quant(x))| per block, relative to the block's max |x| (or range).
struct Bound {
  GgmlType t;
  double max_err_over_amax;  // worst element error / block amax
  double rms_over_std;       // rms error / data std
};

TEST(Quantize, RoundTripErrorBounds) {
  const Bound bounds[] = {
      {GgmlType::F16, 1.0 / 2048, 1.0 / 2048},   {GgmlType::BF16, 1.0 / 256, 1.0 / 256},
      {GgmlType::Q8_0, 0.5 / 127 + 0.001, 0.008}, {GgmlType::Q4_0, 1.0 / 8 + 0.002, 0.12},
      {GgmlType::Q4_1, 2.0 / 30 + 0.004, 0.12},   {GgmlType::Q4_K, 0.2, 0.15},
      {GgmlType::Q5_0, 1.0 / 16 + 0.002, 0.06},   {GgmlType::Q5_1, 2.0 / 62 + 0.004, 0.06},
      {GgmlType::Q6_K, 0.05, 0.035},
      // 2 and 3 bits of normal data: ~0.34 and ~0.17 std rms error is what 4 / 8 levels allow
      // (Lloyd-Max: 0.34, 0.19); a wrong bit layout or scale would be off by ~1 std.
      {GgmlType::Q2_K, 0.4, 0.4},                 {GgmlType::Q3_K, 0.3, 0.2},
      {GgmlType::IQ4_NL, 0.15, 0.1},              {GgmlType::IQ4_XS, 0.15, 0.1},
  };
  Rng rng(99);
  const int64_t n = 256 * 8;
  std::vector<float> x(n), y(n);
  std::vector<uint8_t> q(n * 4);
  for (const Bound& b : bounds) {
    const auto& ti = ggml_type_info(b.t);
    for (int rep = 0; rep < 5; ++rep) {
      const double scale = rep == 4 ? 1000.0 : 0.02 * (rep + 1);
      for (auto& v : x) v = static_cast<float>(rng.normal() * scale);
      ASSERT_TRUE(quantize_row(b.t, x.data(), q.data(), n));
      ASSERT_TRUE(dequantize_row(b.t, q.data(), y.data(), n));
      double se = 0;
      for (int64_t blk = 0; blk < n / ti.block_size; ++blk) {
        const int64_t bsz = std::max<int64_t>(ti.block_size, 32);
        if (blk * ti.block_size % bsz) continue;
        double amax = 0, worst = 0;
        for (int64_t i = blk * ti.block_size; i < blk * ti.block_size + bsz; ++i) {
          amax = std::max(amax, std::fabs(double(x[i])));
          worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
        }
        ASSERT_LE(worst, b.max_err_over_amax * (ti.block_size == 1 ? std::fabs(amax) : amax) + 1e-30)
            << ti.name << " block " << blk << " scale " << scale;
      }
      for (int64_t i = 0; i < n; ++i) se += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      EXPECT_LE(std::sqrt(se / n), b.rms_over_std * scale) << ti.name << " scale " << scale;
    }
  }
}

TEST(Quantize, RejectsUnsupported) {
  float x[32] = {};
  uint8_t q[64];
  EXPECT_FALSE(quantize_row(GgmlType::Q5_K, x, q, 256));
  EXPECT_FALSE(quantize_row(GgmlType::Q8_0, x, q, 31));
  EXPECT_TRUE(quantize_supported(GgmlType::Q6_K));
  EXPECT_TRUE(quantize_supported(GgmlType::Q2_K));
  EXPECT_TRUE(quantize_supported(GgmlType::Q3_K));
  EXPECT_TRUE(quantize_supported(GgmlType::IQ4_NL));
  EXPECT_TRUE(quantize_supported(GgmlType::IQ4_XS));
  EXPECT_FALSE(quantize_supported(GgmlType::Q5_K));
}

}  // namespace
}  // namespace pagoda::gguf
