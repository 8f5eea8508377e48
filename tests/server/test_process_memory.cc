// The resident set as /proc reports it, and HeapReturn: a worker job that grew the
// process's memory gives the freed heap back (issue 35, memory that stays).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "http/process_memory.h"
#include "http/worker_pool.h"

namespace pagoda::server {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// VmRSS of /proc/self/status in bytes.
size_t status_rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

TEST(ProcessMemory, ReadsThisProcess) {
  const ProcessMemory m = process_memory();
  ASSERT_GT(m.resident, 0u);
  EXPECT_LE(m.resident_anon, m.resident);
  EXPECT_GE(m.virtual_size, m.resident);
  const size_t rss = status_rss();
  EXPECT_LT(m.resident > rss ? m.resident - rss : rss - m.resident, 2 * kMiB);
  // 64 MiB of pages written: anonymous resident memory grows by them.
  auto block = std::make_unique<char[]>(64 * kMiB);
  std::memset(block.get(), 1, 64 * kMiB);
  const ProcessMemory after = process_memory();
  EXPECT_GE(after.resident_anon, m.resident_anon + 60 * kMiB);
  EXPECT_EQ(block[64 * kMiB - 1], 1);
}

TEST(ProcessMemory, PrometheusText) {
  const std::string text = process_metrics_text();
  EXPECT_NE(text.find("# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes "), std::string::npos);
  EXPECT_NE(text.find("# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes "), std::string::npos);
  const size_t at = text.find("process_resident_memory_bytes ", text.find("gauge\n"));
  const double v = std::stod(text.substr(at + std::strlen("process_resident_memory_bytes ")));
  EXPECT_GT(v, 1e6);
}

TEST(HeapReturn, TrimsOnlyPastItsThreshold) {
  HeapReturn h(1);  // any growth
  const size_t now = h.before();
  EXPECT_GT(now, 0u);
  h.after(now + 64 * kMiB);  // shrank: nothing to give back
  EXPECT_EQ(h.trims(), 0u);
  h.after(0);  // "grew" by everything resident
#if defined(__GLIBC__)
  EXPECT_EQ(h.trims(), 1u);
#else
  EXPECT_EQ(h.trims(), 0u);  // no malloc_trim to call
#endif
  HeapReturn off(0);
  EXPECT_EQ(off.before(), 0u);  // off: not even measured
  off.after(0);
  EXPECT_EQ(off.trims(), 0u);
}

// A job allocating `bytes` in small pieces, keeping one small piece (allocated last,
// so it sits above the rest in the thread's arena: the arena cannot shrink from its
// top) and freeing everything else: what a request's JSON tree does.
struct PinnedGarbage {
  void* pin = nullptr;
  void run(size_t bytes) {
    std::vector<std::unique_ptr<char[]>> pieces;
    pieces.reserve(bytes / 512);
    for (size_t n = 0; n < bytes; n += 512) {
      pieces.emplace_back(new char[512]);
      std::memset(pieces.back().get(), 7, 512);
    }
    pin = std::malloc(64);
    std::memset(pin, 1, 64);
  }
  ~PinnedGarbage() { std::free(pin); }
};

// Anonymous resident bytes the job left behind, and the pool's trims.
std::pair<long long, uint64_t> job_leaves(size_t threshold, PinnedGarbage* g) {
  WorkerPool pool(1, 4, threshold);
  const size_t before = process_memory().resident_anon;
  EXPECT_TRUE(pool.try_post([g] { g->run(128 * kMiB); }));
  pool.stop();  // waits for the job (and the check after it)
  return {static_cast<long long>(process_memory().resident_anon) - static_cast<long long>(before), pool.heap_trims()};
}

TEST(HeapReturn, WorkerPoolTrimsAfterAJobThatGrew) {
  PinnedGarbage big;
  EXPECT_EQ(job_leaves(16 * kMiB, &big).second, 1u);
  PinnedGarbage small;
  WorkerPool pool(1, 4, 16 * kMiB);
  EXPECT_TRUE(pool.try_post([&] { small.pin = std::malloc(4096); }));
  pool.stop();
  EXPECT_EQ(pool.heap_trims(), 0u);  // a small job is never trimmed after
}

TEST(HeapReturn, FreedMemoryGoesBackToTheSystem) {
#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
  GTEST_SKIP() << "measures glibc's malloc (ASan's allocator keeps frees in its quarantine)";
#endif
  {
    PinnedGarbage g;
    const auto [left, trims] = job_leaves(0, &g);  // off: what glibc keeps by itself
    EXPECT_EQ(trims, 0u);
    EXPECT_GT(left, static_cast<long long>(100 * kMiB));
  }
  release_free_heap();  // back to a clean start
  {
    PinnedGarbage g;
    const auto [left, trims] = job_leaves(16 * kMiB, &g);
    EXPECT_EQ(trims, 1u);
    EXPECT_LT(left, static_cast<long long>(8 * kMiB));
  }
}

}  // namespace
}  // namespace pagoda::server
