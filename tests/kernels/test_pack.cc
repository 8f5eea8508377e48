// Decode-packed weights (cpu/pack.h, issue 22): the AVX-512 matmul through a
// packed copy gives bitwise what it gives from the GGUF rows (which
// test_matmul.cc checks against the scalar reference, packed copies included:
// Matmul.PackedMatchesReference), for every packed type, row counts that do not
// fill a tile, tail groups, the direct (few-token) and the staged (many-token)
// paths, and 1 or 2 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "base/aligned.h"
#include "kernels/backend.h"
#include "kernels/cpu/pack.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using testing::BitwiseEqual;
using testing::make_weight;
using testing::random_vec;

const GgmlType kPacked[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0};

struct Packed {
  AlignedBuffer<uint8_t> buf;
  WeightView view;
};

Packed pack(const WeightView& w) {
  Packed p;
  const size_t n = packed_weight_bytes(w);
  EXPECT_GT(n, 0u);
  p.buf.resize(n);
  pack_weight(w, p.buf.data());
  p.view = w;
  p.view.packed = p.buf.data();
  return p;
}

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::set_isa("avx512-vnni")) GTEST_SKIP() << "packed weights are read by the AVX-512 path only";
    cpu::set_isa("auto");
  }
};

// For every type x rows x cols x thread count x token count: the packed copy's
// outputs are bitwise the GGUF rows' outputs.
void expect_packed_equals_rows(std::initializer_list<GgmlType> types, std::initializer_list<int64_t> row_counts,
                               std::initializer_list<int64_t> col_counts, std::initializer_list<int64_t> tokens,
                               uint64_t seed) {
  for (GgmlType type : types) {
    for (int64_t rows : row_counts) {
      for (int64_t cols : col_counts) {
        auto w = make_weight(type, rows, cols, seed++);
        Packed p = pack(w.view);
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          for (int64_t n : tokens) {
            const auto x = random_vec(static_cast<size_t>(n * cols), seed++, 2.0);
            std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size(), -1.0f);
            cpu::matmul(w.view, x.data(), n, want.data());
            cpu::matmul(p.view, x.data(), n, got.data());
            ASSERT_TRUE(BitwiseEqual(got.data(), want.data(), got.size()))
                << ggml_type_info(type).name << " rows=" << rows << " cols=" << cols << " n=" << n
                << " threads=" << threads;
          }
        }
      }
    }
  }
  set_num_threads(1);
}

TEST_F(PackTest, PackedEqualsRowsBitwise) {
  testing::IsaScope scope("avx512-vnni");
  // direct up to 12 tokens, staged beyond (panels from 16: below)
  expect_packed_equals_rows({GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}, {1, 3, 4, 5, 19, 37},
                            {32, 96, 128, 160, 416}, {1, 2, 3, 4, 5, 12, 13, 21}, 1);
}

// Packed Q4_0 / Q4_1 / Q8_0 at 16 or more tokens go through the 16-row panel GEMM
// (gemm_panel_avx512.inc): bitwise the GGUF rows' outputs for row counts that
// leave a partial panel (or a partial tile, or an odd last panel beside the
// two-panel tiles), groups with zero-padded tail blocks (cols % 128 != 0), token
// counts off the 6-token register tile, and 1 or 2
// threads (chunks of several panels at 2 threads for the larger shapes).
TEST_F(PackTest, PanelGemmEqualsRowsBitwise) {
  testing::IsaScope scope("avx512-vnni");
  expect_packed_equals_rows({GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}, {16, 17, 30, 64, 211},
                            {32, 64, 96, 576, 640}, {16, 18, 23, 40}, 900);
}

// Rows wider than a segment of the panel kernel's passes (half the L1's worth of
// a 6-token tile's records: 2048 columns at 48 KiB) carry each partial sum from
// one segment to the next: bitwise the same rows' outputs, with a zero-padded
// tail group (4160 = 32 groups + 2 blocks) in a short last segment.
TEST_F(PackTest, WidePanelGemmEqualsRowsBitwise) {
  testing::IsaScope scope("avx512-vnni");
  expect_packed_equals_rows({GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}, {17, 40}, {4160, 4224}, {16, 23}, 1900);
}

// The packed copy holds the matrix, not something near it: one flipped quant
// byte in the source changes exactly its row's outputs after repacking.
TEST_F(PackTest, APackedByteChangeShowsInItsRowOnly) {
  testing::IsaScope scope("avx512-vnni");
  for (GgmlType type : kPacked) {
    const int64_t rows = 9, cols = 160;
    auto w = make_weight(type, rows, cols, 77);
    const auto x = random_vec(static_cast<size_t>(cols), 78);
    std::vector<float> a(rows), b(rows);
    Packed p = pack(w.view);
    cpu::matmul(p.view, x.data(), 1, a.data());
    const size_t rb = w.view.row_bytes;
    w.bytes[6 * rb + rb - 3] ^= 0x11;  // row 6, last block, a quant byte
    Packed q = pack(w.view);
    cpu::matmul(q.view, x.data(), 1, b.data());
    for (int64_t r = 0; r < rows; ++r) {
      if (r == 6) {
        EXPECT_NE(a[r], b[r]) << ggml_type_info(type).name;
      } else {
        EXPECT_EQ(a[r], b[r]) << ggml_type_info(type).name << " row " << r;
      }
    }
  }
}

// y[t] of one token is bitwise the same alone (direct kernel over the packed
// tile) and inside batches (records staged from the packed tile).
TEST_F(PackTest, BatchInvariantThroughPackedCopy) {
  testing::IsaScope scope("avx512-vnni");
  uint64_t seed = 500;
  for (GgmlType type : kPacked) {
    const int64_t rows = 67, cols = 576;
    auto w = make_weight(type, rows, cols, seed++);
    Packed p = pack(w.view);
    const auto x0 = random_vec(static_cast<size_t>(cols), seed++);
    std::vector<float> alone(rows);
    cpu::matmul(p.view, x0.data(), 1, alone.data());
    for (int64_t n : {2, 5, 13, 33}) {
      auto x = random_vec(static_cast<size_t>(n * cols), seed++, 3.0);
      const int64_t at = n / 2;
      std::copy(x0.begin(), x0.end(), x.begin() + at * cols);
      std::vector<float> y(static_cast<size_t>(n * rows));
      cpu::matmul(p.view, x.data(), n, y.data());
      ASSERT_TRUE(BitwiseEqual(y.data() + at * rows, alone.data(), rows)) << ggml_type_info(type).name << " n=" << n;
    }
  }
}

TEST(Pack, OnlyPackedTypesOnTheAvx512PathHaveACopy) {
  const auto iq4nl = testing::make_weight(GgmlType::IQ4_NL, 4, 256, 1);  // K types: test_kpack.cc
  const auto f32 = testing::make_weight(GgmlType::F32, 4, 32, 2);
  const auto q40 = testing::make_weight(GgmlType::Q4_0, 5, 160, 3);
  EXPECT_EQ(packed_weight_bytes(iq4nl.view), 0u);
  EXPECT_EQ(packed_weight_bytes(f32.view), 0u);
  ASSERT_TRUE(cpu::set_isa("avx2"));
  EXPECT_EQ(packed_weight_bytes(q40.view), 0u);
  if (cpu::set_isa("avx512-vnni")) {
    // 2 tiles of 4 rows; 2 groups: 2 * 4 * 64 quant bytes + 2 * 32 scale bytes = 576 = 9 lines.
    EXPECT_EQ(packed_weight_bytes(q40.view), 2u * 576u);
    // The same bytes as the GGUF rows, up to the padding of rows and groups.
    const auto l = cpu::detail::pack_layout(GgmlType::Q8_0, 4096, 2048);
    EXPECT_EQ(l.total(), ggml_row_bytes(GgmlType::Q8_0, 2048) * 4096);
  }
  cpu::set_isa("auto");
}

}  // namespace
}  // namespace pagoda::kernels
