// Decode-packed Q5_0 / Q5_1 (cpu/pack.h, issue 22): the AVX-512 matmul through
// a packed copy gives bitwise what it gives from the GGUF rows, at the token
// counts of decode (1, 2), a speculative verify (5, 8), and prefill tiles (17,
// 64: every count reads the packed tiles, no second copy), for row counts that
// do not fill a tile and column counts that leave a partial group, with 1 or 2
// threads; the high bits (qh) travel with their row; and the packed copy holds
// the file's bytes and no more. The scalar-reference check of the packed copies
// is Matmul.PackedMatchesReference (test_matmul.cc, Q5_0 / Q5_1 included).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/pack.h"
#include "kernels/kernel_test_util.h"
#include "kernels/kpack_test_util.h"

namespace pagoda::kernels {
namespace {

using testing::BitwiseEqual;
using testing::make_packed;
using testing::random_vec;

const GgmlType kQ5[] = {GgmlType::Q5_0, GgmlType::Q5_1};

class PackQ5Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "packed weights are read by the AVX-512 path only";
    cpu::set_isa("auto");
  }
};

TEST_F(PackQ5Test, PackedEqualsRowsBitwise) {
  testing::IsaScope scope("avx512-vnni");
  uint64_t seed = 2200;
  for (GgmlType type : kQ5) {
    // rows: partial tiles (4k + 1..3) and one full one; cols: 1, 3, 5, 8 and 13 blocks (all but 256 end
    // in a partial group of 4 blocks).
    for (int64_t rows : {1, 3, 5, 18, 39}) {
      for (int64_t cols : {32, 96, 160, 256, 416}) {
        auto k = make_packed(type, rows, cols, seed++);
        ASSERT_GT(k.copy.size(), 0u);
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          for (int64_t n : {1, 2, 5, 8, 17, 64}) {
            const auto x = random_vec(static_cast<size_t>(n * cols), seed++, 2.0);
            std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size(), -1.0f);
            cpu::matmul(k.src.view, x.data(), n, want.data());
            cpu::matmul(k.view, x.data(), n, got.data());
            ASSERT_TRUE(BitwiseEqual(got.data(), want.data(), got.size()))
                << ggml_type_info(type).name << " rows=" << rows << " cols=" << cols << " n=" << n
                << " threads=" << threads;
          }
        }
      }
    }
  }
}

// Each high bit is read from its own row and block: flipping one qh bit (then
// repacking) changes exactly that row's output. Checked for a bit of a value
// 0..15 and of a value 16..31, in a full group and in the partial tail group,
// on a row in the middle of a tile and on the last (partial-tile) row.
TEST_F(PackQ5Test, AHighBitChangeShowsInItsRowOnly) {
  testing::IsaScope scope("avx512-vnni");
  for (GgmlType type : kQ5) {
    const int64_t rows = 11, cols = 192;  // 6 blocks: one full group, one half group
    const size_t qh_off = type == GgmlType::Q5_0 ? 2 : 4, bb = ggml_type_info(type).type_size;
    auto k = make_packed(type, rows, cols, 91);
    const auto x = random_vec(static_cast<size_t>(cols), 92);
    std::vector<float> a(rows);
    cpu::matmul(k.view, x.data(), 1, a.data());
    struct Flip {
      int64_t row, block;
      int bit;
    };
    for (const Flip f : {Flip{6, 1, 3}, Flip{6, 2, 20}, Flip{10, 5, 31}, Flip{10, 4, 0}}) {
      uint8_t* qh = k.src.bytes.data() + f.row * k.src.view.row_bytes + f.block * bb + qh_off;
      qh[f.bit / 8] ^= static_cast<uint8_t>(1u << (f.bit % 8));
      testing::repack(k);
      std::vector<float> b(rows);
      cpu::matmul(k.view, x.data(), 1, b.data());
      for (int64_t r = 0; r < rows; ++r) {
        if (r == f.row) {
          EXPECT_NE(a[r], b[r]) << ggml_type_info(type).name << " row " << r << " bit " << f.bit;
        } else {
          EXPECT_EQ(a[r], b[r]) << ggml_type_info(type).name << " row " << r << " bit " << f.bit;
        }
      }
      qh[f.bit / 8] ^= static_cast<uint8_t>(1u << (f.bit % 8));  // back
      testing::repack(k);
    }
  }
}

// y[t] of one token is bitwise the same alone and inside batches of every size,
// through the packed copy.
TEST_F(PackQ5Test, BatchInvariantThroughPackedCopy) {
  testing::IsaScope scope("avx512-vnni");
  uint64_t seed = 700;
  for (GgmlType type : kQ5) {
    const int64_t rows = 67, cols = 576;
    auto k = make_packed(type, rows, cols, seed++);
    const auto x0 = random_vec(static_cast<size_t>(cols), seed++);
    std::vector<float> alone(rows);
    cpu::matmul(k.view, x0.data(), 1, alone.data());
    for (int64_t n : {2, 5, 8, 17, 64}) {
      auto x = random_vec(static_cast<size_t>(n * cols), seed++, 3.0);
      const int64_t at = n / 2;
      std::copy(x0.begin(), x0.end(), x.begin() + at * cols);
      std::vector<float> y(static_cast<size_t>(n * rows));
      cpu::matmul(k.view, x.data(), n, y.data());
      ASSERT_TRUE(BitwiseEqual(y.data() + at * rows, alone.data(), rows)) << ggml_type_info(type).name << " n=" << n;
    }
  }
}

// The packed copy holds the GGUF bytes (d [, m], qh, nibbles), nothing
// expanded: the same size as the file's rows up to row and group padding.
TEST(PackQ5, PackedCopyHoldsTheFileBytes) {
  for (GgmlType type : kQ5) {
    const auto l = cpu::detail::pack_layout(type, 4096, 2048);
    EXPECT_EQ(l.total(), ggml_row_bytes(type, 2048) * 4096) << ggml_type_info(type).name;
    EXPECT_EQ(l.tile_bytes % 64, 0u);
    EXPECT_EQ(cpu::detail::pack_group_bytes(type) % 64, 0u);
  }
  const auto w = testing::make_weight(GgmlType::Q5_1, 5, 160, 3);
  ASSERT_TRUE(cpu::set_isa("avx2"));
  EXPECT_EQ(packed_weight_bytes(w.view), 0u);  // only the AVX-512 path reads a packed copy
  if (cpu::set_isa("avx512-vnni")) {
    // 2 tiles of 4 rows; 2 groups of (4 * 64 nibble + 64 qh) bytes + 2 * 64 scale bytes = 768.
    EXPECT_EQ(packed_weight_bytes(w.view), 2u * 768u);
  }
  cpu::set_isa("auto");
}

}  // namespace
}  // namespace pagoda::kernels
