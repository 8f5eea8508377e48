// The cpu/ thread pool: every item runs exactly once whatever the thread count,
// the caller takes part, nested and concurrent loops run inline (no deadlock,
// same items), and workers are started once and reused.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace pagoda::kernels::cpu::detail {
namespace {

// Counts how often each item ran. counts: [n]
std::vector<int> run_counts(int64_t n, int nth) {
  std::vector<std::atomic<int>> c(static_cast<size_t>(n));
  parallel_for(n, nth, [&](int64_t i) { c[static_cast<size_t>(i)].fetch_add(1); });
  std::vector<int> out;
  for (auto& x : c) out.push_back(x.load());
  return out;
}

TEST(ThreadPool, EveryItemRunsExactlyOnce) {
  for (int nth : {1, 2, 3, 4, 7}) {
    for (int64_t n : {0, 1, 2, 3, 5, 16, 17, 100, 1001}) {
      const std::vector<int> c = run_counts(n, nth);
      ASSERT_EQ(c.size(), static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c[static_cast<size_t>(i)], 1) << "nth " << nth << " n " << n << " item " << i;
    }
  }
}

TEST(ThreadPool, UsesSeveralThreadsAndTheCaller) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  // Items long enough that the workers wake up before the caller ends its range.
  parallel_for(8, 2, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);
  EXPECT_GE(pool_workers(), 1);
}

TEST(ThreadPool, StaticRangesOnAQuietPool) {
  // With equal, short items each participant streams its own contiguous range:
  // item 0 (the caller's first) runs on the calling thread.
  std::thread::id first;
  parallel_for(64, 2, [&](int64_t i) {
    if (i == 0) first = std::this_thread::get_id();
  });
  EXPECT_EQ(first, std::this_thread::get_id());
}

TEST(ThreadPool, ASlowParticipantsItemsAreTakenByTheOthers) {
  // The caller's range is items [0, 4); item 0 blocks until every other item
  // ran, which can only happen if the worker takes items 1..3 of the caller's range.
  std::atomic<int> done{0};
  parallel_for(8, 2, [&](int64_t i) {
    if (i == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      while (done.load() < 7 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
        std::this_thread::yield();
    } else {
      done.fetch_add(1);
    }
  });
  EXPECT_EQ(done.load(), 7);
}

TEST(ThreadPool, NestedLoopRunsInline) {
  std::vector<std::atomic<int>> c(64);
  parallel_for(8, 2, [&](int64_t i) {
    parallel_for(8, 2, [&](int64_t j) { c[static_cast<size_t>(8 * i + j)].fetch_add(1); });
  });
  for (auto& x : c) EXPECT_EQ(x.load(), 1);
}

TEST(ThreadPool, ConcurrentCallersEachGetEveryItem) {
  std::vector<std::vector<int>> results(3);
  std::vector<std::thread> callers;
  for (int k = 0; k < 3; ++k)
    callers.emplace_back([&, k] {
      for (int rep = 0; rep < 200; ++rep) {
        results[static_cast<size_t>(k)] = run_counts(37, 2);
        for (int v : results[static_cast<size_t>(k)]) ASSERT_EQ(v, 1);
      }
    });
  for (auto& t : callers) t.join();
  for (auto& r : results) EXPECT_EQ(r, std::vector<int>(37, 1));
}

TEST(ThreadPool, WorkersAreReusedAcrossLoops) {
  parallel_for(100, 3, [](int64_t) {});
  const int w = pool_workers();
  EXPECT_GE(w, 2);
  for (int rep = 0; rep < 200; ++rep) parallel_for(100, 3, [](int64_t) {});
  EXPECT_EQ(pool_workers(), w);
}

TEST(ThreadPool, WakesWorkersThatFellAsleep) {
  // Idle long past the spin window: the workers sleep on the futex, and the
  // next loop must still see every item (no lost wake-up).
  for (int rep = 0; rep < 20; ++rep) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    const std::vector<int> c = run_counts(50, 2);
    for (int v : c) ASSERT_EQ(v, 1);
  }
}

}  // namespace
}  // namespace pagoda::kernels::cpu::detail
