// Paged causal attention of one prefill in isolation: one sequence whose L
// tokens are all new (each attends to itself and every earlier token), the
// synth Llama-3.2-1B shape by default (32 query heads, 8 KV heads, head_dim 64,
// f16 KV, 16-token pages scattered over the pool). This is compute, not memory:
// L x L / 2 (token, key) pairs per head, 4 * head_dim flops each (q.k and p.v).
// Prints the median ms per layer call and GFLOP/s, so a change to the attention
// kernel shows without a model (prefill attention is about a quarter of a 1B
// pp2048 on 2 threads). The output hash must not change with a kernel change:
// every (token, head) keeps its op sequence. With a depth D the L new tokens
// follow D cached ones (pagoda bench's pp512 @ d4096 is L=512 D=4096), and
// (D + (L + 1) / 2) * L pairs per head. The process CPU seconds per call are
// printed too: on a shared machine they compare two builds better than wall time.
//   usage: bench_attention_prefill [L=2048] [threads=2] [reps=7] [heads=32] [kv_heads=8] [dtype=f16] [depth=0]
//          [huge=0: 1 maps the K/V pools with transparent huge pages (madvise), as KvStorage does]
//   (dtype: any KV type, f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1)
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "base/hash.h"
#include "base/rng.h"
#include "kernels/api.h"

using namespace pagoda;

int main(int argc, char** argv) {
  const int32_t L = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2, reps = argc > 3 ? std::atoi(argv[3]) : 7;
  const int32_t heads = argc > 4 ? std::atoi(argv[4]) : 32, n_kv = argc > 5 ? std::atoi(argv[5]) : 8;
  const std::string dts = argc > 6 ? argv[6] : "f16";
  const int32_t D = argc > 7 ? std::atoi(argv[7]) : 0;
  KvDtype dt = KvDtype::F16;
  if (!kv_dtype_from_name(dts, &dt)) {
    std::fprintf(stderr, "dtype: one of %s\n", kv_dtype_names());
    return 2;
  }
  if (D < 0 || L <= 0 || threads <= 0 || reps <= 0 || n_kv <= 0 || heads <= 0 || heads % n_kv != 0) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  constexpr int32_t kHd = 64, kBs = 16;
  kernels::set_num_threads(threads);
  const int32_t T = D + L;  // keys in the cache
  const int32_t n_pages = (T + kBs - 1) / kBs, pool_pages = 2 * n_pages;  // half the pool unused
  const size_t row_bytes = kernels::kv_row_bytes(dt, static_cast<int64_t>(n_kv) * kHd);
  const size_t pool = static_cast<size_t>(pool_pages) * kBs * row_bytes;
  // huge=1: the pools in transparent huge pages, as KvStorage maps them (madvise).
  const bool huge = argc > 8 && std::atoi(argv[8]) != 0;
  const auto map_pool = [&] {
    void* m = mmap(nullptr, pool, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    if (huge) madvise(m, pool, MADV_HUGEPAGE);
    return static_cast<uint8_t*>(m);
  };
  uint8_t* kmem = map_pool();
  uint8_t* vmem = map_pool();
  Rng rng(11);
  std::vector<int32_t> perm(static_cast<size_t>(pool_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (int32_t i = pool_pages - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng.uniform_int(0, i))]);
  std::vector<int32_t> indices(perm.begin(), perm.begin() + n_pages);
  const kernels::KvLayerView kv{kmem, vmem, dt, kBs, n_kv, kHd, row_bytes, 0, dt, row_bytes};
  std::vector<float> row(static_cast<size_t>(n_kv) * kHd);
  for (int32_t t = 0; t < T; ++t) {
    const int64_t slot = static_cast<int64_t>(indices[static_cast<size_t>(t / kBs)]) * kBs + t % kBs;
    for (float& x : row) x = static_cast<float>(rng.uniform() * 2 - 1);
    kernels::kv_write(kv, row.data(), row.data(), &slot, 1);
  }
  std::vector<int32_t> positions(static_cast<size_t>(L));
  std::iota(positions.begin(), positions.end(), D);
  const int32_t q_indptr[2] = {0, L}, kv_indptr[2] = {0, n_pages}, last[1] = {T - (n_pages - 1) * kBs};
  const kernels::BatchView batch{.n_tokens = L, .n_seqs = 1, .positions = positions.data(), .q_indptr = q_indptr,
                                 .kv_indptr = kv_indptr, .kv_indices = indices.data(), .kv_last_page_len = last};
  std::vector<float> q(static_cast<size_t>(L) * heads * kHd), out(q.size());
  for (float& x : q) x = static_cast<float>(rng.uniform() * 2 - 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHd));
  std::vector<double> per_rep, cpu_rep;
  for (int r = 0; r < reps + 1; ++r) {
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::paged_attention(q.data(), kv, batch, heads, scale, out.data(), 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double c = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (r > 0) {  // the first rep warms up
      per_rep.push_back(s);
      cpu_rep.push_back(c);
    }
  }
  std::sort(per_rep.begin(), per_rep.end());
  std::sort(cpu_rep.begin(), cpu_rep.end());
  const double med = per_rep[per_rep.size() / 2], cpu_med = cpu_rep[cpu_rep.size() / 2];
  const double pairs = (static_cast<double>(D) + (L + 1) / 2.0) * L * heads;
  std::printf("attention prefill L=%d depth=%d heads=%d/%d %s threads=%d: %.3f ms per layer (median of %d), "
              "%.3f CPU s, %.1f GFLOP/s, out hash %016llx\n",
              L, D, heads, n_kv, dts.c_str(), threads, med * 1e3, reps, cpu_med, pairs * 4 * kHd / med / 1e9,
              static_cast<unsigned long long>(xxh3_64(out.data(), out.size() * sizeof(float))));
  return 0;
}
