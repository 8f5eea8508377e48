// The cpu/ thread pool: every item runs exactly once whatever the thread count,
// the caller takes part, a slow participant's items are taken by the others,
// shares run static ranges, nested and concurrent loops run inline (no
// deadlock, same items), workers are started once and reused, launches are
// counted, and a worker preempted while the caller waited for it sends the next
// loops to the caller alone (a long wait without preemption does not).
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <climits>
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

// Ends a stall backoff window an earlier loop may have opened (a worker
// preempted on a loaded machine), for the tests that need a worker to take part.
void end_solo_window() { set_pool_solo_window(2'000, 1'024'000); }

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
  end_solo_window();
  std::mutex mu;
  std::set<std::thread::id> ids;
  const std::thread::id caller = std::this_thread::get_id();
  // Every item waits (up to 10 s) until the caller and another thread have both
  // run an item: passes only if the loop really runs on two threads, one of
  // them the caller, however late the OS schedules either.
  parallel_for(8, 2, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (ids.size() >= 2 && ids.count(caller) == 1) break;
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) break;
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids.count(caller), 1u);
  EXPECT_GE(pool_workers(), 1);
}

TEST(ThreadPool, SharesRunTheirStaticRangeOfEveryLoop) {
  // parallel_shares(3, fn): fn's loops run share p's static range [p * n / 3,
  // (p + 1) * n / 3) inline, so every item of each loop runs once, and the items
  // one invocation of fn ran form that exact range (whichever thread ran it).
  for (int64_t n : {1, 2, 7, 48}) {
    std::mutex mu;
    std::vector<std::vector<int64_t>> ranges;  // the items of loop A seen by one fn call, in order
    std::vector<std::atomic<int>> b_counts(static_cast<size_t>(n));
    parallel_shares(3, [&] {
      std::vector<int64_t> mine;
      parallel_for(n, 3, [&](int64_t i) { mine.push_back(i); });  // inline: no race on `mine`
      parallel_for(n, 3, [&](int64_t i) { b_counts[static_cast<size_t>(i)].fetch_add(1); });
      std::lock_guard<std::mutex> lock(mu);
      ranges.push_back(mine);
    });
    ASSERT_EQ(ranges.size(), 3u);
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
      return (a.empty() ? INT64_MAX : a.front()) < (b.empty() ? INT64_MAX : b.front());
    });
    std::vector<std::vector<int64_t>> want;
    for (int64_t p = 0; p < 3; ++p) {
      std::vector<int64_t> r;
      for (int64_t i = n * p / 3; i < n * (p + 1) / 3; ++i) r.push_back(i);
      want.push_back(r);
    }
    std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
      return (a.empty() ? INT64_MAX : a.front()) < (b.empty() ? INT64_MAX : b.front());
    });
    EXPECT_EQ(ranges, want) << "n " << n;
    for (auto& c : b_counts) EXPECT_EQ(c.load(), 1) << "n " << n;
  }
}

TEST(ThreadPool, ASlowParticipantsItemsAreTakenByTheOthers) {
  end_solo_window();
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
  end_solo_window();
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

TEST(ThreadPool, CountsLaunchesOfTheCallingThread) {
  set_pool_solo_window(0, 0);  // a stall (loaded machine) must not turn a launch into an inline loop here
  const int64_t l0 = pool_launches();
  parallel_for(100, 2, [](int64_t) {});  // one launch
  EXPECT_EQ(pool_launches(), l0 + 1);
  parallel_for(100, 1, [](int64_t) {});  // one thread: inline
  parallel_for(1, 2, [](int64_t) {});    // one item: inline
  EXPECT_EQ(pool_launches(), l0 + 1);
  parallel_for(4, 2, [](int64_t) { parallel_for(8, 2, [](int64_t) {}); });  // nested loops run inline
  EXPECT_EQ(pool_launches(), l0 + 2);
  parallel_shares(2, [] {  // three loops, one launch
    for (int j = 0; j < 3; ++j) parallel_for(16, 2, [](int64_t) {});
  });
  EXPECT_EQ(pool_launches(), l0 + 3);
  end_solo_window();
}

// A fake involuntary-switch counter (set_pool_preemption_probe): an item bumps
// it to stage "the scheduler took this worker's core", whatever the machine does.
std::atomic<int64_t> g_fake_switches{0};
int64_t fake_switches() { return g_fake_switches.load(); }

// One 2-item loop in which the worker holds the caller up: item 0 (the
// caller's) waits until a worker has started item 1 and publishes how long
// that took (d0); the worker then stays in item 1 for 20 d0 + 20 ms (a sleep,
// so the caller's wait outlasts the spin window and far more than its own
// item: a long wait). With `preempt`, item 1 also bumps the fake switch
// counter, as if a co-tenant had taken the worker's core there. False if no
// worker came (the caller ran both items: nothing was staged).
bool hold_up_the_caller(bool preempt) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> started{false}, staged{false};
  std::atomic<int64_t> d0{-1};
  parallel_for(2, 2, [&](int64_t i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (i == 0) {
      while (!started.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
        std::this_thread::yield();
      d0.store(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
    } else {
      started.store(true);
      if (std::this_thread::get_id() == caller) return;  // the worker never came: no stall to make
      while (d0.load() < 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
        std::this_thread::yield();
      if (preempt) g_fake_switches.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(20 * std::max<int64_t>(d0.load(), 0) + 20'000));
      staged.store(true);
    }
  });
  return staged.load();
}

// The threads that ran a 64-item loop, and whether it launched.
std::set<std::thread::id> threads_of_a_loop(bool* launched) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  const int64_t l0 = pool_launches();
  parallel_for(64, 2, [&](int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  *launched = pool_launches() == l0 + 1;
  return ids;
}

TEST(ThreadPool, APreemptedWorkerSendsTheNextLoopsToTheCaller) {
  // A long window, so the check below does not depend on timing.
  set_pool_solo_window(10'000'000, 10'000'000);
  set_pool_preemption_probe(&fake_switches);
  parallel_for(64, 2, [](int64_t) {});  // the workers take their baseline from the fake probe
  set_pool_solo_window(10'000'000, 10'000'000);  // (in case that loop stalled on a loaded machine)
  const int64_t s0 = pool_stalls(), w0 = pool_long_waits();
  ASSERT_TRUE(hold_up_the_caller(/*preempt=*/true));
  EXPECT_EQ(pool_long_waits(), w0 + 1);
  ASSERT_EQ(pool_stalls(), s0 + 1);
  // Inside the window every item runs on the caller, without a launch.
  bool launched = true;
  EXPECT_EQ(threads_of_a_loop(&launched), std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_FALSE(launched);
  // Resetting the window (the defaults) ends it: loops launch again.
  end_solo_window();
  threads_of_a_loop(&launched);
  EXPECT_TRUE(launched);
  set_pool_preemption_probe(nullptr);
}

TEST(ThreadPool, ALongWaitWithoutPreemptionIsNoStall) {
  // The same hold-up with the worker's switch count unchanged (the hypervisor
  // took its vCPU, say): a long wait, not a stall, and no solo window opens
  // however long the window would be.
  set_pool_solo_window(10'000'000, 10'000'000);
  set_pool_preemption_probe(&fake_switches);
  parallel_for(64, 2, [](int64_t) {});
  set_pool_solo_window(10'000'000, 10'000'000);
  const int64_t s0 = pool_stalls(), w0 = pool_long_waits();
  ASSERT_TRUE(hold_up_the_caller(/*preempt=*/false));
  EXPECT_EQ(pool_long_waits(), w0 + 1);
  EXPECT_EQ(pool_stalls(), s0);
  bool launched = false;
  threads_of_a_loop(&launched);
  EXPECT_TRUE(launched);
  set_pool_preemption_probe(nullptr);
  end_solo_window();
}

TEST(ThreadPool, APreemptionShorterThanTheStallMinimumIsNoStall) {
  // The preempted hold-up (20 ms) against a minimum longer than it: a long wait,
  // not a stall (as a system daemon's brief wake-up on the worker's core), so
  // the workers keep their loops; with the minimum at 0 the same hold-up is one.
  set_pool_solo_window(10'000'000, 10'000'000);
  set_pool_preemption_probe(&fake_switches);
  parallel_for(64, 2, [](int64_t) {});
  set_pool_solo_window(10'000'000, 10'000'000);
  set_pool_stall_min_wait(10'000'000);
  int64_t s0 = pool_stalls(), w0 = pool_long_waits();
  ASSERT_TRUE(hold_up_the_caller(/*preempt=*/true));
  EXPECT_EQ(pool_long_waits(), w0 + 1);
  EXPECT_EQ(pool_stalls(), s0);
  bool launched = false;
  threads_of_a_loop(&launched);
  EXPECT_TRUE(launched);
  set_pool_stall_min_wait(0);
  s0 = pool_stalls();
  w0 = pool_long_waits();
  ASSERT_TRUE(hold_up_the_caller(/*preempt=*/true));
  EXPECT_EQ(pool_long_waits(), w0 + 1);
  EXPECT_EQ(pool_stalls(), s0 + 1);
  set_pool_stall_min_wait(500);
  set_pool_preemption_probe(nullptr);
  end_solo_window();
}

TEST(ThreadPool, AStallRightAfterAWindowDoublesTheNext) {
  // A co-tenant still there when the workers are tried again: a stall within
  // 100 ms of the previous window's end doubles the window (300 -> 600 ms), so
  // 350 ms after that second stall the loops still run on the caller alone
  // (with no doubling the window would have ended 50 ms before). Margins of
  // 250 ms either way, for a loaded machine.
  set_pool_preemption_probe(&fake_switches);
  parallel_for(64, 2, [](int64_t) {});
  set_pool_solo_window(300'000, 10'000'000);
  const int64_t s0 = pool_stalls();
  const auto t_before = std::chrono::steady_clock::now();  // the first window starts after this
  ASSERT_TRUE(hold_up_the_caller(/*preempt=*/true));
  ASSERT_EQ(pool_stalls(), s0 + 1);
  bool launched = false;
  const auto t_first = std::chrono::steady_clock::now();
  while (!launched && std::chrono::steady_clock::now() - t_first < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    threads_of_a_loop(&launched);  // the first loop that launches is the first after the window
  }
  ASSERT_TRUE(launched);
  ASSERT_TRUE(hold_up_the_caller(/*preempt=*/true));
  ASSERT_EQ(pool_stalls(), s0 + 2);
  const auto t_second = std::chrono::steady_clock::now();
  // The second stall came within 100 ms of the first window's end only if the whole
  // sequence took under 300 + 100 ms: a loaded machine that slept longer between the
  // launch and the second stall (a hold-up of 20 x its slow start-up) gives no verdict.
  const bool within_100ms = t_second - t_before < std::chrono::milliseconds(400);
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  if (within_100ms && std::chrono::steady_clock::now() - t_second < std::chrono::milliseconds(550)) {  // else: overslept, no verdict
    threads_of_a_loop(&launched);
    EXPECT_FALSE(launched);
  }
  set_pool_preemption_probe(nullptr);
  end_solo_window();
}

}  // namespace
}  // namespace pagoda::kernels::cpu::detail
