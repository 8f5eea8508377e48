#include "loadgen/read_bandwidth.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "base/timer.h"

namespace pagoda::loadgen {
namespace {

// Sums the 64-bit words of [p, p + n) with the widest loads the processor has
// (four independent 64-byte accumulators with AVX-512, 32-byte with AVX2): the
// loads are what is measured; the sum keeps the compiler from dropping them.
// Scalar 8-byte loads under-measure a core: on the AMD EPYC machines one thread
// reads ~19 GB/s that way against ~34 GB/s with 64-byte loads (and 2 threads
// ~37 against ~65), less than the decode kernels themselves read, so the probe
// must load as wide as they do. n is a multiple of 32 words (the slices are).
__attribute__((target("avx512f"))) uint64_t read_slice_avx512(const uint64_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t s = 0;
  for (uint64_t v : lanes) s += v;
  return s;
}

__attribute__((target("avx2"))) uint64_t read_slice_avx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t read_slice(const uint64_t* p, size_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 ? read_slice_avx512(p, n) : read_slice_avx2(p, n);
}

// Where the sums go, so that the compiler keeps the loads.
volatile uint64_t g_sink = 0;

}  // namespace

double measure_read_gbs(int threads, size_t bytes, int passes) {
  threads = std::max(1, threads);
  const size_t words = bytes / sizeof(uint64_t);
  void* mem = mmap(nullptr, words * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0.0;
  madvise(mem, words * sizeof(uint64_t), MADV_HUGEPAGE);  // fewer TLB misses; a hint only
  auto* buf = static_cast<uint64_t*>(mem);
  // Each thread touches (and later reads) its own slice: first-touch puts the
  // pages near the thread that reads them on NUMA machines.
  auto slice = [&](int t, size_t* b, size_t* e) {
    *b = words * static_cast<size_t>(t) / static_cast<size_t>(threads) / 32 * 32;
    *e = words * static_cast<size_t>(t + 1) / static_cast<size_t>(threads) / 32 * 32;
  };
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int pass = -1; pass < passes; ++pass) {  // pass -1 writes the buffer
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        size_t b, e;
        slice(t, &b, &e);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        if (pass < 0) {
          for (size_t i = b; i < e; ++i) buf[i] = i;
        } else {
          sink.fetch_add(read_slice(buf + b, e - b), std::memory_order_relaxed);
        }
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    Timer timer;  // started once every thread exists: thread creation is not timed
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double s = timer.seconds();
    if (pass >= 0 && s > 0) best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / s / 1e9);
  }
  munmap(mem, words * sizeof(uint64_t));
  g_sink = sink.load();
  return best;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? "unknown" : line.substr(b);
  }
  return "unknown";
}

}  // namespace pagoda::loadgen
