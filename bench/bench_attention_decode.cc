// Paged-attention decode step in isolation: B sequences of L cached tokens each
// (one new token per sequence), SmolLM2-135M's shape by default (9 query heads,
// 3 KV heads, head_dim 64, f16 KV, 16-token pages), n_layers layers' pools so the
// K/V read each step comes from memory as in a real step, the sequences' pages
// scattered over the pool. Prints ms per layer call and the K/V bytes read per
// second. Usage: bench_attention_decode [B=32] [L=192] [threads=2] [reps=20]
// [layers=30] [dtype=f16|f32|bf16|q8_0] [huge=0: 1 asks for transparent huge
// pages for the pools (madvise; measured no faster here, few were granted)]
// [kv_heads=3] [query heads per KV head=3] (Llama-3.2-1B: 8 4)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "base/rng.h"
#include "kernels/api.h"

using namespace pagoda;

int main(int argc, char** argv) {
  const int32_t B = argc > 1 ? std::atoi(argv[1]) : 32, L = argc > 2 ? std::atoi(argv[2]) : 192;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2, reps = argc > 4 ? std::atoi(argv[4]) : 20;
  const int32_t layers = argc > 5 ? std::atoi(argv[5]) : 30;
  const std::string dts = argc > 6 ? argv[6] : "f16";
  const bool huge = argc > 7 && std::atoi(argv[7]) != 0;
  const int32_t kKv = argc > 8 ? std::atoi(argv[8]) : 3, kGroup = argc > 9 ? std::atoi(argv[9]) : 3;
  KvDtype dt = KvDtype::F16;
  if (!kv_dtype_from_name(dts, &dt)) {
    std::fprintf(stderr, "dtype: one of %s\n", kv_dtype_names());
    return 2;
  }
  if (B <= 0 || L <= 0 || threads <= 0 || reps <= 0 || layers <= 0 || kKv <= 0 || kGroup <= 0) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const int32_t kHeads = kKv * kGroup, kHd = 64, kBs = 16;
  kernels::set_num_threads(threads);
  const int32_t pages_per_seq = (L + kBs - 1) / kBs, pages = B * pages_per_seq * 2;  // half the pool unused
  const size_t row_bytes = kernels::kv_row_bytes(dt, kKv * kHd);
  const size_t pool = static_cast<size_t>(pages) * kBs * row_bytes;
  const size_t all = 2 * pool * static_cast<size_t>(layers);
  void* mem = mmap(nullptr, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  if (huge) madvise(mem, all, MADV_HUGEPAGE);
  auto* base = static_cast<uint8_t*>(mem);
  Rng rng(7);
  std::vector<float> row(static_cast<size_t>(kKv * kHd));
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (int32_t i = pages - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng.uniform_int(0, i))]);
  std::vector<int32_t> q_indptr{0}, kv_indptr{0}, indices, last, positions;
  for (int32_t s = 0; s < B; ++s) {
    for (int32_t p = 0; p < pages_per_seq; ++p) indices.push_back(perm[static_cast<size_t>(s * pages_per_seq + p)]);
    kv_indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(L - (pages_per_seq - 1) * kBs);
    positions.push_back(L - 1);
    q_indptr.push_back(s + 1);
  }
  std::vector<kernels::KvLayerView> kv(static_cast<size_t>(layers));
  for (int32_t l = 0; l < layers; ++l) {
    uint8_t* kp = base + 2 * pool * static_cast<size_t>(l);
    kv[static_cast<size_t>(l)] = kernels::KvLayerView{kp, kp + pool, dt, kBs, kKv, kHd, row_bytes, 0, dt, row_bytes};
    for (int64_t slot = 0; slot < static_cast<int64_t>(pages) * kBs; ++slot) {
      for (float& x : row) x = static_cast<float>(rng.uniform() * 2 - 1);
      kernels::kv_write(kv[static_cast<size_t>(l)], row.data(), row.data(), &slot, 1);
    }
  }
  const kernels::BatchView batch{.n_tokens = B, .n_seqs = B, .positions = positions.data(), .q_indptr = q_indptr.data(),
                                 .kv_indptr = kv_indptr.data(), .kv_indices = indices.data(),
                                 .kv_last_page_len = last.data()};
  std::vector<float> q(static_cast<size_t>(B) * kHeads * kHd), out(q.size());
  for (float& x : q) x = static_cast<float>(rng.uniform() * 2 - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHd));
  std::vector<double> per_rep;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t l = 0; l < layers; ++l) kernels::cpu::paged_attention(q.data(), kv[static_cast<size_t>(l)], batch, kHeads, scale, out.data(), 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) per_rep.push_back(s);  // the first rep warms up
  }
  std::sort(per_rep.begin(), per_rep.end());
  const double med = per_rep[per_rep.size() / 2];
  const double bytes = 2.0 * B * L * static_cast<double>(row_bytes) * layers;
  munmap(mem, all);
  std::printf("attention decode B=%d L=%d %s huge=%d threads=%d layers=%d: step %.3f ms (median of %d), %.3f ms/layer, %.1f GB/s K/V\n",
              B, L, dts.c_str(), huge ? 1 : 0, threads, layers, med * 1e3, reps, med * 1e3 / layers, bytes / med / 1e9);
  return 0;
}
