// Pieces of the double-precision dense reference forwards that the model tests
// check the engine against (tests/model/test_model.cc for llama,
// test_arch_parity.cc for every architecture).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/dequant.h"
#include "gguf/gguf.h"

namespace pagoda::testutil {

// Tensor `name` of f as doubles (row-major, as stored); empty when absent.
inline std::vector<double> dequant(const gguf::GgufFile& f, const std::string& name) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) return {};
  std::vector<float> tmp(t->n_elements);
  EXPECT_TRUE(gguf::dequantize_rows(*t, 0, gguf::tensor_rows(*t), tmp.data()).ok()) << name;
  return std::vector<double>(tmp.begin(), tmp.end());
}

// y[r] = sum_c W[r, c] x[c]; W: [rows, cols] with cols = x.size()
inline std::vector<double> mv(const std::vector<double>& w, const std::vector<double>& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  return y;
}

}  // namespace pagoda::testutil
