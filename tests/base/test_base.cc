#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "base/checked_math.h"
#include "base/fp16.h"
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
