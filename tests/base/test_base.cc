#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "base/checked_math.h"
#include "base/fp16.h"
#include "base/ggml_quant.h"
#include "base/hash.h"
#include "base/rng.h"
#include "base/status.h"

using namespace pagoda;

TEST(CheckedMath, DetectsOverflow) {
  uint64_t out;
  EXPECT_FALSE(checked_add(UINT64_MAX, 1, &out));
  EXPECT_FALSE(checked_mul(1ull << 33, 1ull << 31, &out));
  EXPECT_TRUE(checked_mul(1ull << 31, 1ull << 31, &out));
  EXPECT_EQ(out, 1ull << 62);
  EXPECT_FALSE(fits_within(8812, 4096, 10240));
  EXPECT_TRUE(fits_within(6144, 4096, 10240));
  EXPECT_FALSE(fits_within(UINT64_MAX - 1, 4, UINT64_MAX));
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), h) << "half bits " << h;
  }
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
}

TEST(Hash, StreamingEqualsOneShot) {
  const char data[] = "the quick brown fox jumps over the lazy dog";
  Hasher128 h(7);
  h.update(data, 10);
  h.update(data + 10, sizeof(data) - 10);
  EXPECT_EQ(h.digest(), xxh3_128(data, sizeof(data), 7));
  EXPECT_NE(xxh3_128(data, sizeof(data), 7), xxh3_128(data, sizeof(data), 8));
}

TEST(Rng, SameSeedSameSequence) {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    if (i == 0) { EXPECT_NE(x, c.next_u64()); }
  }
}

TEST(Status, PropagatesErrors) {
  auto f = []() -> Expected<int> { return errorf("bad %d", 3); };
  auto g = [&]() -> Status { PAGODA_ASSIGN_OR_RETURN(int v, f()); (void)v; return Status::Ok(); };
  Status s = g();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "bad 3");
}

// The F16 row quantizer (the KV cache's writes; vectorized with F16C) gives
// exactly fp32_to_fp16 for every value: random normals at many scales, the
// edges of the half range (overflow to inf, subnormals, underflow to 0), signed
// zeros, infinities, and a NaN (its group of 8 falls back to the scalar code),
// at lengths that leave a tail.
TEST(Fp16, RowQuantizerEqualsScalarConversion) {
  Rng rng(17);
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) x.push_back(static_cast<float>(rng.normal() * std::pow(2.0, rng.uniform() * 60 - 40)));
  for (float v : {65504.0f, 65520.0f, 65519.99f, 1e6f, 6.1e-5f, 5.96e-8f, 2.9e-8f, 3e-8f, 1e-10f, 0.0f, -0.0f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 1.0f, -2.5f, 0.33333334f})
    x.push_back(v);
  for (size_t n : {x.size(), x.size() - 3, size_t{5}}) {
    std::vector<uint16_t> got(n);
    ASSERT_TRUE(quantize_row(GgmlType::F16, x.data(), got.data(), static_cast<int64_t>(n)));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], fp32_to_fp16(x[i])) << "x=" << x[i] << " i=" << i;
  }
}
