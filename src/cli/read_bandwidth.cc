#include "cli/read_bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "base/timer.h"

namespace pagoda::cli {
namespace {

// Sums the 64-bit words of [p, p + n) with 8 independent accumulators: the
// loads are what is measured; the sum keeps the compiler from dropping them.
uint64_t read_slice(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) a[k] += p[i + k];
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
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
    *b = words * static_cast<size_t>(t) / static_cast<size_t>(threads);
    *e = words * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
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

}  // namespace pagoda::cli
