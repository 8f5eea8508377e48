// The IQ4_NL integer matmul path (iq4nl_avx2.cc, iq4nl_avx512.cc): exact integer
// results on inputs where every float op is exact, a hand-computed value, and
// bitwise invariance over row position, token count (direct and packed paths)
// and thread count. (test_matmul.cc checks it against ggml's integer formula and
// against ref::matmul over odd shapes, and batch invariance with the other types.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "base/ggml_types.h"
#include "base/rng.h"
#include "kernels/api.h"
#include "kernels/kernel_test_util.h"

namespace pagoda::kernels {
namespace {

using namespace testing;  // kernel_test_util.h

// An IQ4_NL matrix of the given codebook indices (idx[r][c], 0..15) and block
// scales d[r][b] (exact in f16).
struct Iq4Matrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Iq4Matrix make_iq4(int64_t rows, int64_t cols, const std::vector<int>& idx, const std::vector<float>& d) {
  Iq4Matrix m;
  const size_t rb = ggml_row_bytes(GgmlType::IQ4_NL, static_cast<size_t>(cols));
  m.bytes.assign(rb * static_cast<size_t>(rows), 0);
  const int64_t nb = cols / 32;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = m.bytes.data() + r * rb + b * 18;
      put_f16(blk, d[r * nb + b]);
      for (int j = 0; j < 16; ++j) {
        const int64_t c = r * cols + b * 32;
        blk[2 + j] = static_cast<uint8_t>(idx[c + j] | (idx[c + j + 16] << 4));
      }
    }
  }
  m.view = WeightView{m.bytes.data(), GgmlType::IQ4_NL, rows, cols, rb};
  return m;
}

// One block: indices 0..15 for values 0..15 and 15..0 for values 16..31, d = 1;
// x = 127 everywhere quantizes to q = 127 with d_x = 1, so y = 127 * 2 * sum(codebook)
// = 127 * 2 * (-94) = -23876, exact in every float op.
TEST(Iq4Nl, HandComputedBlock) {
  std::vector<int> idx(32);
  for (int j = 0; j < 16; ++j) {
    idx[j] = j;
    idx[16 + j] = 15 - j;
  }
  const Iq4Matrix w = make_iq4(1, 32, idx, {1.0f});
  const std::vector<float> x(32, 127.0f);
  int sum = 0;
  for (int8_t v : kIq4NlValues) sum += v;
  ASSERT_EQ(sum, -94);
  for (const auto& isa : testing::isas()) {
    IsaScope scope(isa);
    float y = 0.0f;
    cpu::matmul(w.view, x.data(), 1, &y);
    EXPECT_EQ(y, -23876.0f) << isa;
  }
}

// Integer activations with a 127 in every block quantize to themselves (d_x = 1);
// with power-of-two d_w every float op of the kernel is exact, so y must equal
// sum_b d_w * sum(codebook[idx] * x) exactly: a wrong nibble, lane, scale or tail
// block is off by whole units. Shapes cover 1..18 blocks (tails of the 2- and
// 4-block groups), row tiles, and token counts on both paths (direct <= 4 < packed).
TEST(Iq4Nl, ExactOnIntegerInputs) {
  Rng rng(11);
  const float scales[] = {0.5f, 1.0f, 2.0f};
  for (const auto& isa : testing::isas()) {
    IsaScope scope(isa);
    for (int64_t nb : {1, 2, 3, 5, 18}) {
      for (int64_t rows : {1, 5, 17, 33}) {
        for (int64_t n_tokens : {1, 3, 4, 5, 9}) {
          const int64_t cols = nb * 32;
          std::vector<int> idx(static_cast<size_t>(rows * cols));
          for (auto& i : idx) i = static_cast<int>(rng.uniform_int(0, 15));
          std::vector<float> d(static_cast<size_t>(rows * nb));
          for (auto& s : d) s = scales[rng.uniform_int(0, 2)];
          const Iq4Matrix w = make_iq4(rows, cols, idx, d);
          std::vector<float> x(static_cast<size_t>(n_tokens * cols));
          for (int64_t c = 0; c < n_tokens * cols; ++c) x[c] = static_cast<float>(rng.uniform_int(-127, 127));
          for (int64_t t = 0; t < n_tokens; ++t)
            for (int64_t b = 0; b < nb; ++b) x[t * cols + b * 32 + rng.uniform_int(0, 31)] = rng.uniform() < 0.5 ? 127.0f : -127.0f;
          std::vector<float> want(static_cast<size_t>(n_tokens * rows)), got(want.size(), -1.0f);
          for (int64_t t = 0; t < n_tokens; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              double y = 0, mag = 0;
              for (int64_t c = 0; c < cols; ++c) {
                const double term = d[r * nb + c / 32] * kIq4NlValues[idx[r * cols + c]] * x[t * cols + c];
                y += term;
                mag += std::fabs(term);
              }
              ASSERT_LT(mag, 0x1.0p22);  // every partial sum is a multiple of 0.5 below 2^23: exact in f32
              want[t * rows + r] = static_cast<float>(y);
            }
          }
          cpu::matmul(w.view, x.data(), n_tokens, got.data());
          ASSERT_TRUE(BitwiseEqual(got.data(), want.data(), want.size()))
              << "isa=" << isa << " nb=" << nb << " rows=" << rows << " n_tokens=" << n_tokens;
        }
      }
    }
  }
}

class Iq4NlIsa : public ::testing::TestWithParam<std::string> {};

// A row's outputs do not depend on where the 16-row chunks and 4-row tiles fall,
// on the token count (1..4 decode in registers, more use packed records) nor on
// the thread count: views of one matrix starting at rows 0, 3, 16, 21 give bitwise
// the first token's single-token result, and every token its own.
TEST_P(Iq4NlIsa, RowPositionTokenCountAndThreadsInvariantBitwise) {
  IsaScope scope(GetParam());
  const int64_t rows = 16 * 3 + 5, cols = 32 * 7;
  auto w = make_weight(GgmlType::IQ4_NL, rows, cols, 4242);
  const auto x = random_vec(static_cast<size_t>(20 * cols), 4243, 2.0);
  std::vector<std::vector<float>> single(20, std::vector<float>(static_cast<size_t>(rows)));
  for (int64_t t = 0; t < 20; ++t) cpu::matmul(w.view, x.data() + t * cols, 1, single[t].data());
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int64_t first : {0, 3, 16, 21}) {
      WeightView v = w.view;
      v.data = static_cast<const uint8_t*>(w.view.data) + first * w.view.row_bytes;
      v.rows = rows - first;
      for (int64_t n : {1, 2, 3, 4, 5, 8, 20}) {
        std::vector<float> y(static_cast<size_t>(n * v.rows));
        cpu::matmul(v, x.data(), n, y.data());
        for (int64_t t = 0; t < n; ++t)
          ASSERT_TRUE(BitwiseEqual(y.data() + t * v.rows, single[t].data() + first, v.rows))
              << "first=" << first << " n_tokens=" << n << " token=" << t << " threads=" << threads;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, Iq4NlIsa, ::testing::ValuesIn(testing::isas()), testing::IsaParamName);

}  // namespace
}  // namespace pagoda::kernels
