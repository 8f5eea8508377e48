// Sustained read bandwidth at 1 and 2 threads (or the -t list), the figure
// that bounds 2-thread decode scaling (issue 22): many back-to-back passes over
// a buffer the size of a model's weights (default 826 MiB, the synth
// Llama-3.2-1B Q4_0), each thread reading its own contiguous half, with the
// min / median / max GB/s over the passes. `pagoda bench`'s own probe keeps
// the best of 10 passes over 1 GiB, which on a virtual machine whose memory
// bandwidth swings pass to pass can sit far above what a decode of several
// seconds gets (session 11: 2-thread best 65 GB/s against a median of 35).
//
// Each thread count gets two lines:
//   raw   plain threads, one spin barrier per pass (no pagoda code);
//   pool  the same bytes read through the cpu/ thread pool as a decode step
//         reads its weights: each pass is --loops parallel_for launches over
//         64 KiB items (the 1B decode step launches 81 loops per token), so
//         pool/raw shows what the pool's fork/joins cost at the memory wall.
// Median of 2 threads over median of 1 thread is the most a 2-thread decode
// that already reads at the 1-thread wall can gain.
//   usage: bench_sustained_bandwidth [-t 1,2] [-m MIB] [-p PASSES] [--loops N]
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace {

// XOR-folds [p, p + bytes) with 64-byte loads, eight cache lines per step;
// bytes is a multiple of 512. The fold is returned so the loads stay.
__attribute__((target("avx512f"))) uint64_t fold(const uint8_t* p, size_t bytes) {
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (size_t off = 0; off < bytes; off += 512)
    for (int l = 0; l < 8; ++l) acc[l] = _mm512_xor_si512(acc[l], _mm512_load_si512(p + off + 64 * l));
  for (int l = 1; l < 8; ++l) acc[0] = _mm512_xor_si512(acc[0], acc[l]);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc[0]);
  uint64_t x = 0;
  for (uint64_t v : lanes) x ^= v;
  return x;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Plain threads: thread t reads [t * n / T, (t + 1) * n / T) (in 512-byte
// units) once per pass; a pass ends when all have. GB/s of every pass.
std::vector<double> raw_passes(const uint8_t* buf, size_t bytes, int threads, int passes, std::atomic<uint64_t>* sink) {
  const size_t units = bytes / 512;
  std::atomic<int> go{0}, done{0};
  auto slice = [&](int t) {
    const size_t b = units * static_cast<size_t>(t) / static_cast<size_t>(threads);
    const size_t e = units * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
    sink->fetch_xor(fold(buf + 512 * b, 512 * (e - b)), std::memory_order_relaxed);
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t)
    helpers.emplace_back([&, t] {
      for (int p = 1; p <= passes; ++p) {
        while (go.load(std::memory_order_acquire) < p) _mm_pause();
        slice(t);
        done.fetch_add(1, std::memory_order_release);
      }
    });
  std::vector<double> gbs;
  for (int p = 1; p <= passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    go.store(p, std::memory_order_release);
    slice(0);
    while (done.load(std::memory_order_acquire) < p * (threads - 1)) _mm_pause();
    gbs.push_back(static_cast<double>(bytes) / seconds_since(t0) / 1e9);
  }
  for (auto& h : helpers) h.join();
  return gbs;
}

// The pool: a pass is `loops` parallel_for launches, loop j over its share of
// the buffer in 64 KiB items. GB/s of every pass.
std::vector<double> pool_passes(const uint8_t* buf, size_t bytes, int threads, int passes, int loops,
                                std::atomic<uint64_t>* sink) {
  constexpr size_t kItem = 64 << 10;
  const size_t items = bytes / kItem;
  std::vector<double> gbs;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int j = 0; j < loops; ++j) {
      const size_t b = items * static_cast<size_t>(j) / static_cast<size_t>(loops);
      const size_t e = items * static_cast<size_t>(j + 1) / static_cast<size_t>(loops);
      pagoda::kernels::cpu::detail::parallel_for(static_cast<int64_t>(e - b), threads, [&](int64_t i) {
        sink->fetch_xor(fold(buf + kItem * (b + static_cast<size_t>(i)), kItem), std::memory_order_relaxed);
      });
    }
    gbs.push_back(static_cast<double>(items * kItem) / seconds_since(t0) / 1e9);
  }
  return gbs;
}

void print_line(const char* mode, int threads, std::vector<double> g) {
  std::sort(g.begin(), g.end());
  std::printf("%-4s t%d  passes %3zu  min %6.1f  median %6.1f  max %6.1f GB/s\n", mode, threads, g.size(), g.front(),
              g[g.size() / 2], g.back());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads{1, 2};
  size_t mib = 826;
  int passes = 40, loops = 81;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "-t" && has_value) {
      threads.clear();
      const char* s = argv[++i];
      for (char* end = nullptr;; s = end + 1) {
        threads.push_back(std::max(1, static_cast<int>(std::strtol(s, &end, 10))));
        if (*end != ',') break;
      }
    } else if (a == "-m" && has_value) {
      mib = std::max<size_t>(1, std::strtoull(argv[++i], nullptr, 10));
    } else if (a == "-p" && has_value) {
      passes = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--loops" && has_value) {
      loops = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_sustained_bandwidth [-t 1,2] [-m MIB] [-p PASSES] [--loops N]\n");
      return 2;
    }
  }
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "bench_sustained_bandwidth: needs AVX-512\n");
    return 1;
  }
  const size_t bytes = mib << 20;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  auto* buf = static_cast<uint8_t*>(mem);
  for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<uint8_t>(i * 131u);  // pages exist before timing
  std::atomic<uint64_t> sink{0};
  std::printf("buffer %zu MiB, %d passes, pool: %d loops per pass\n", mib, passes, loops);
  for (int t : threads) {
    print_line("raw", t, raw_passes(buf, bytes, t, passes, &sink));
    print_line("pool", t, pool_passes(buf, bytes, t, passes, loops, &sink));
  }
  std::printf("(fold %llx)\n", static_cast<unsigned long long>(sink.load()));
  munmap(mem, bytes);
  return 0;
}
