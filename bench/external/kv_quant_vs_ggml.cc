// Issue 39: are pagoda's KV row quantizers (base/ggml_quant.h quantize_row) byte for
// byte ggml's quantize_row_*_ref, the function llama.cpp's CPU backend stores K/V
// rows with (ggml-cpu quantize_row_q4_0 etc. call the _ref)? Rows: Gaussian, with
// outliers, and the same rows after pagoda's Hadamard rotation (64 and 128 blocks),
// as the rotated 4/5-bit caches store them. Built and run by bench/kv_quant_vs_ggml.sh
// against a llama.cpp build (not part of the ctest suite: CI has no llama.cpp).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/ggml_quant.h"
#include "ggml.h"
#include "kernels/api.h"

int main() {
  using pagoda::GgmlType;
  struct T { GgmlType p; ggml_type g; const char* name; };
  const T types[] = {{GgmlType::Q4_0, GGML_TYPE_Q4_0, "q4_0"},   {GgmlType::Q4_1, GGML_TYPE_Q4_1, "q4_1"},
                     {GgmlType::Q5_0, GGML_TYPE_Q5_0, "q5_0"},   {GgmlType::Q5_1, GGML_TYPE_Q5_1, "q5_1"},
                     {GgmlType::IQ4_NL, GGML_TYPE_IQ4_NL, "iq4_nl"}, {GgmlType::Q8_0, GGML_TYPE_Q8_0, "q8_0"}};
  const int64_t n = 576;  // SmolLM2's K row is 192, Gemma 3 270M's 256: 576 covers blocks of 64 and 128 too
  const int n_rows = 20000;
  std::mt19937 rng(39);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_int_distribution<int> pos(0, n - 1);
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < n_rows; ++r) {
    std::vector<float> x(n);
    const float s = std::pow(10.f, static_cast<float>(r % 7) - 3.f);  // 1e-3 .. 1e3
    for (auto& v : x) v = g(rng) * s;
    if (r % 3 == 0) for (int o = 0; o < 4; ++o) x[pos(rng)] *= 40.f;  // outliers
    if (r % 5 == 0) for (int i = 0; i < n; i += 3) x[i] = 0.f;        // exact zeros
    const int mode = r % 4;  // 0: as is, 1 and 2: rotated in blocks of 64, 3: the first 512 in blocks of 128
    if (mode == 1 || mode == 2) pagoda::kernels::hadamard_rotate(x.data(), n, 64);
    if (mode == 3) pagoda::kernels::hadamard_rotate(x.data(), 512, 128);
    rows.push_back(std::move(x));
  }
  int bad_types = 0;
  for (const T& t : types) {
    const size_t bytes = ggml_row_size(t.g, n);
    std::vector<uint8_t> a(bytes), b(bytes);
    int64_t diff_rows = 0;
    const auto* tr = ggml_get_type_traits(t.g);
    for (const auto& x : rows) {
      if (!pagoda::quantize_row(t.p, x.data(), a.data(), n)) { std::printf("%s: pagoda refused\n", t.name); return 2; }
      tr->from_float_ref(x.data(), b.data(), n);
      if (std::memcmp(a.data(), b.data(), bytes) != 0) ++diff_rows;
    }
    std::printf("%-7s %d rows of %lld: %lld rows differ from ggml's quantize_row_%s_ref\n", t.name, n_rows,
                static_cast<long long>(n), static_cast<long long>(diff_rows), t.name);
    bad_types += diff_rows != 0;
  }
  return bad_types == 0 ? 0 : 1;
}
