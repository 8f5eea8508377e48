// Load-time packed K-quants (issue 22): Q2_K / Q3_K / Q4_K / Q5_K / Q6_K /
// IQ4_XS matrices packed by
// kernels::pack_weight into 16-row chunks (kquant_layouts_avx512.h, "load-time packed
// layout") give bitwise the outputs of the GGUF rows for every token count
// (the few-token and the GEMM paths both read the packed chunks), row counts
// that do not fill a chunk, 1 and 2 threads; one token's outputs do not depend
// on the batch around it; and a changed source byte shows in its row only.
// (test_kquant.cc checks the packed copy against the scalar reference.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/kpack_test_util.h"

namespace pagoda::kernels {
namespace {

using testing::BitwiseEqual;
using testing::KPacked;
using testing::make_packed;
using testing::make_weight;
using testing::random_vec;
using testing::repack;

const GgmlType kKPacked[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                             GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS};

class KPackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "K-quants are packed for the AVX-512 path only";
  }
  void TearDown() override {
    cpu::set_isa("auto");
    set_num_threads(1);
  }
};

TEST_F(KPackTest, PackedEqualsRowsBitwise) {
  uint64_t seed = 1;
  for (GgmlType type : kKPacked) {
    for (int64_t rows : {1, 5, 16, 17, 37}) {
      for (int64_t cols : {256, 768}) {
        KPacked k = make_packed(type, rows, cols, seed++);
        ASSERT_GT(k.copy.size(), 0u) << ggml_type_info(type).name;
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          // few-token path below 4, GEMM tiles of 8 from 4 (read in place up to 8, expanded above)
          for (int64_t n : {1, 2, 3, 4, 5, 8, 9, 17, 64}) {
            const auto x = random_vec(static_cast<size_t>(n * cols), seed++, 2.0);
            std::vector<float> rows_y(static_cast<size_t>(n * rows)), packed_y(rows_y.size(), -1.0f);
            cpu::matmul(k.src.view, x.data(), n, rows_y.data());
            cpu::matmul(k.view, x.data(), n, packed_y.data());
            ASSERT_TRUE(BitwiseEqual(packed_y.data(), rows_y.data(), rows_y.size()))
                << ggml_type_info(type).name << " rows=" << rows << " cols=" << cols << " n=" << n
                << " threads=" << threads;
          }
        }
      }
    }
  }
}

TEST_F(KPackTest, OneTokenIsTheSameInAnyBatch) {
  uint64_t seed = 300;
  for (GgmlType type : kKPacked) {
    const int64_t rows = 45, cols = 512;
    KPacked k = make_packed(type, rows, cols, seed++);
    const auto x0 = random_vec(static_cast<size_t>(cols), seed++);
    std::vector<float> alone(rows);
    cpu::matmul(k.view, x0.data(), 1, alone.data());
    for (int64_t n : {2, 3, 4, 7, 8, 9, 33}) {
      auto x = random_vec(static_cast<size_t>(n * cols), seed++, 3.0);
      const int64_t at = n - 1;
      std::copy(x0.begin(), x0.end(), x.begin() + at * cols);
      std::vector<float> y(static_cast<size_t>(n * rows));
      cpu::matmul(k.view, x.data(), n, y.data());
      ASSERT_TRUE(BitwiseEqual(y.data() + at * rows, alone.data(), rows)) << ggml_type_info(type).name << " n=" << n;
    }
  }
}

// The packed copy holds the matrix itself: changing one quant byte and one
// scale byte of row 19's last super-block changes row 19's outputs only.
TEST_F(KPackTest, AChangedSourceByteShowsInItsRowOnly) {
  for (GgmlType type : kKPacked) {
    const int64_t rows = 21, cols = 512;
    for (const size_t back : {size_t{3}, ggml_row_bytes(type, 256) - 6}) {  // near the block's end / start
      KPacked a = make_packed(type, rows, cols, 91);
      KPacked b = make_packed(type, rows, cols, 91);
      b.src.bytes[20 * b.src.view.row_bytes - back] ^= 0x25;
      repack(b);
      const auto x = random_vec(static_cast<size_t>(cols), 92);
      std::vector<float> ya(rows), yb(rows);
      cpu::matmul(a.view, x.data(), 1, ya.data());
      cpu::matmul(b.view, x.data(), 1, yb.data());
      for (int64_t r = 0; r < rows; ++r) {
        if (r == 19) {
          EXPECT_NE(ya[r], yb[r]) << ggml_type_info(type).name << " back=" << back;
        } else {
          EXPECT_EQ(ya[r], yb[r]) << ggml_type_info(type).name << " row " << r;
        }
      }
    }
  }
}

// The kernels read the copy, not the GGUF rows (which the model gives back to
// the kernel after packing): overwriting the rows changes nothing, few tokens
// or many.
TEST_F(KPackTest, TheCopyIsWhatIsRead) {
  for (GgmlType type : kKPacked) {
    const int64_t rows = 18, cols = 512;
    KPacked k = make_packed(type, rows, cols, 51);
    for (int64_t n : {1, 9}) {
      const auto x = random_vec(static_cast<size_t>(n * cols), 52);
      std::vector<float> before(static_cast<size_t>(n * rows)), after(before.size());
      cpu::matmul(k.view, x.data(), n, before.data());
      const auto other = make_weight(type, rows, cols, 53);
      const std::vector<uint8_t> saved = k.src.bytes;
      std::copy(other.bytes.begin(), other.bytes.end(), k.src.bytes.begin());
      cpu::matmul(k.view, x.data(), n, after.data());
      k.src.bytes = saved;
      ASSERT_TRUE(BitwiseEqual(after.data(), before.data(), before.size())) << ggml_type_info(type).name << " n=" << n;
    }
  }
}

TEST_F(KPackTest, PackedSizes) {
  // Q2_K, Q4_K, Q5_K and IQ4_XS: exactly the rows' bytes for whole 16-row
  // chunks; Q3_K and Q6_K: 32 bytes more per 16-row super-block (f16 d's dword).
  const int64_t rows = 32, cols = 2048;
  for (GgmlType type : kKPacked) {
    const auto w = make_weight(type, rows, cols, 5);
    const bool pad = type == GgmlType::Q6_K || type == GgmlType::Q3_K;
    const size_t extra = pad ? 32u * (cols / 256) * (rows / 16) : 0u;
    EXPECT_EQ(packed_weight_bytes(w.view), ggml_row_bytes(type, cols) * rows + extra) << ggml_type_info(type).name;
  }
  // A partial chunk is padded to 16 rows.
  EXPECT_EQ(packed_weight_bytes(make_weight(GgmlType::Q4_K, 17, 256, 7).view), 2u * 16u * 144u);
  ASSERT_TRUE(cpu::set_isa("avx2"));
  EXPECT_EQ(packed_weight_bytes(make_weight(GgmlType::Q4_K, rows, cols, 8).view), 0u);
}

}  // namespace
}  // namespace pagoda::kernels
