// The persistent pool of thread_pool.h: workers, the job hand-off and the
// spin-then-futex waits.
#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

namespace pagoda::kernels::cpu::detail {
namespace {

// Participants of one loop at most (the caller included); --threads allows 256.
constexpr int kMaxParticipants = 256;
// How long a waiting thread spins before it sleeps. Long enough to bridge the
// serial gaps between a decode step's matmuls (rmsnorm, rope, residual add: a
// few microseconds each), short against a scheduler time slice, so a worker
// spinning next to a busy co-tenant wastes little of the core.
constexpr int64_t kSpinMicros = 50;
// Co-tenancy (see thread_pool.h, "stalls"): a wait for the workers is a long
// wait when it outlasts the spin window and kStallItems of the caller's own
// items (a worker held up inside an item, not one running a long item), and a
// stall when it also lasted kStallMinMicros and a worker it waited for was
// switched out by this machine's scheduler meanwhile (an involuntary context
// switch: another process wanted its core). A busy co-tenant holds the core
// for a scheduler slice (3-4 ms measured with `yes` here); a system daemon's
// wake-up takes it for tens to hundreds of microseconds (15 of 25 such
// preemptions in a quiet 2-thread SmolLM2 decode, session 13), which is no
// reason to give up the second core. After a stall, loops run on the caller
// alone for a backoff window that doubles, from kSoloMinMicros up to
// kSoloMaxMicros, while each stall comes less than kStallMemoryMicros after
// the previous window ended (a co-tenant that is still there when the workers
// are tried again), and starts over from the minimum otherwise. Each retry of
// a co-tenant still there costs about one slice, so windows up to a second
// keep that under 1% of a long decode.
constexpr int64_t kStallItems = 8;
constexpr int64_t kStallMinMicros = 500;
constexpr int64_t kSoloMinMicros = 2'000, kSoloMaxMicros = 1'024'000, kStallMemoryMicros = 100'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The calling thread's involuntary context switches so far: how often the
// scheduler took its core for another runnable task. A vCPU the hypervisor
// deschedules (steal time) or an interrupt does not count here.
int64_t own_involuntary_switches() {
  rusage ru{};
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_nivcsw);
}

void futex_wait(std::atomic<uint32_t>* a, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* a) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Spins until pred() holds or kSpinMicros pass; true if pred() held.
template <class P>
bool spin_until(P pred) {
  if (pred()) return true;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      _mm_pause();
      if (pred()) return true;
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kSpinMicros)) return false;
  }
}

// One participant's static range; `next` is taken with fetch_add by the owner
// and by thieves. One cache line each: owners never share a line.
struct alignas(64) Range {
  std::atomic<int64_t> next{0};
  int64_t end = 0;
};

class Pool {
 public:
  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&epoch_);
    for (auto& t : workers_) t.join();
  }

  // Runs the loop if the pool is free; false (nothing ran) if it is busy.
  bool try_run(int64_t n_items, int nth, void (*call)(void*, int64_t), void* ctx) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    const int64_t t0 = now_ns();
    if (t0 < solo_until_ns_) {  // backing off after a stall: the caller runs the loop alone
      busy_.store(false, std::memory_order_release);
      return false;
    }
    const int k = static_cast<int>(std::min<int64_t>({n_items, nth, kMaxParticipants}));
    grow(k - 1);
    for (int p = 0; p < k; ++p) {
      ranges_[p].next.store(n_items * p / k, std::memory_order_relaxed);
      ranges_[p].end = n_items * (p + 1) / k;
    }
    call_ = call;
    ctx_ = ctx;
    participants_ = k;
    finished_.store(0, std::memory_order_relaxed);
    preempted_.store(0, std::memory_order_relaxed);
    const uint32_t e = epoch_.load(std::memory_order_relaxed) + 1;
    gate_.store(static_cast<uint64_t>(e) << 32, std::memory_order_release);  // open, nobody joined
    // seq_cst pairs with the workers' sleepers_ increment (see worker_wait).
    epoch_.store(e, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&epoch_);
    const int64_t mine = work(0);  // ends when no item is left unclaimed
    // Close the loop: a worker that has not joined yet (asleep, or descheduled
    // by a co-tenant) stays out, so the caller never waits for a thread that
    // has no item; it waits only for the joined ones still in an item.
    const uint64_t g = gate_.fetch_or(kClosed, std::memory_order_acq_rel);
    const int64_t t1 = now_ns();
    if (!wait_done(static_cast<uint32_t>(g & kJoinedMask))) {
      // The wait outlasted the spin window: a long wait if it also outlasted
      // kStallItems of the caller's items (per item: its time over its items),
      // and a stall if a worker was preempted by another task meanwhile (see
      // worker_main). A long wait with no preemption (the hypervisor took the
      // worker's vCPU for a while, an interrupt, a page fault) is not one:
      // there is no co-tenant that running alone would get out of the way of,
      // and the closed gate already keeps an absent worker out of later loops.
      const int64_t t2 = now_ns();
      if (mine > 0 && (t2 - t1) * mine > kStallItems * (t1 - t0)) {
        ++long_waits_;
        if (preempted_.load(std::memory_order_acquire) != 0 && t2 - t1 >= stall_min_ns_) note_stall(t2);
      }
    }
    busy_.store(false, std::memory_order_release);
    return true;
  }

  // Test hooks (under busy_ like the loops).
  int64_t stalls() {
    lock();
    const int64_t n = stalls_;
    busy_.store(false, std::memory_order_release);
    return n;
  }
  int64_t long_waits() {
    lock();
    const int64_t n = long_waits_;
    busy_.store(false, std::memory_order_release);
    return n;
  }
  void set_preemption_probe(int64_t (*probe)()) {
    probe_.store(probe ? probe : &own_involuntary_switches, std::memory_order_release);
  }
  void set_stall_min_wait(int64_t us) {
    lock();
    stall_min_ns_ = us * 1000;
    busy_.store(false, std::memory_order_release);
  }
  void set_solo_window(int64_t min_us, int64_t max_us) {
    lock();
    solo_min_ns_ = min_us * 1000;
    solo_max_ns_ = max_us * 1000;
    backoff_ns_ = solo_min_ns_;
    solo_until_ns_ = 0;
    busy_.store(false, std::memory_order_release);
  }

  int workers() {
    lock();
    const int n = static_cast<int>(workers_.size());
    busy_.store(false, std::memory_order_release);
    return n;
  }

 private:
  // Starts workers up to n (called with busy_ held, so no job is in flight and
  // the epoch a new worker starts from is the current one).
  void grow(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      const int idx = static_cast<int>(workers_.size()) + 1;
      const uint32_t seen = epoch_.load(std::memory_order_relaxed);
      workers_.emplace_back([this, idx, seen] { worker_main(idx, seen); });
    }
  }

  void lock() {
    bool expected = false;
    while (!busy_.compare_exchange_weak(expected, true, std::memory_order_acquire)) expected = false;
  }

  // Participant p: its own range first, then the others' leftovers. Returns
  // how many items it ran.
  int64_t work(int p) {
    const int k = participants_;
    int64_t ran = 0;
    for (int q = 0; q < k; ++q) {
      Range& r = ranges_[(p + q) % k];
      for (int64_t i = r.next.fetch_add(1, std::memory_order_relaxed); i < r.end;
           i = r.next.fetch_add(1, std::memory_order_relaxed), ++ran)
        call_(ctx_, i);
    }
    return ran;
  }

  // Waits until the `joined` workers of this loop have finished; false if it
  // had to sleep (they took longer than the spin window).
  bool wait_done(uint32_t joined) {
    const auto done = [&] { return finished_.load(std::memory_order_acquire) == joined; };
    if (spin_until(done)) return true;
    caller_sleeping_.store(1, std::memory_order_seq_cst);
    for (uint32_t f; (f = finished_.load(std::memory_order_seq_cst)) != joined;) futex_wait(&finished_, f);
    caller_sleeping_.store(0, std::memory_order_relaxed);
    return false;
  }

  // A worker held the caller up (preempted inside an item, most likely by a
  // co-tenant): run the next loops on the caller alone for a while, so that
  // decode degrades to one thread's speed instead of to the scheduler's time
  // slice per loop. Repeated stalls lengthen the window.
  void note_stall(int64_t now) {
    ++stalls_;
    // solo_until_ns_ is still the previous window's end.
    backoff_ns_ = now - solo_until_ns_ < kStallMemoryMicros * 1000 ? std::min(2 * backoff_ns_, solo_max_ns_)
                                                                   : solo_min_ns_;
    solo_until_ns_ = now + backoff_ns_;
  }

  // Joins the loop of epoch e if it is still open; false if it is closed (or
  // already replaced by a later loop): then this worker touches none of it.
  bool join(uint32_t e) {
    uint64_t g = gate_.load(std::memory_order_acquire);
    while ((g >> 32) == e && (g & kClosed) == 0)
      if (gate_.compare_exchange_weak(g, g + 1, std::memory_order_acq_rel)) return true;
    return false;
  }

  void worker_main(int idx, uint32_t seen) {
    // This worker's involuntary switches as of its last look (by `probe`).
    int64_t (*probe)() = nullptr;
    int64_t switches = 0;
    for (;;) {
      seen = worker_wait(seen);
      if (stop_.load()) return;
      if (!join(seen)) continue;
      if (int64_t (*p)() = probe_.load(std::memory_order_acquire); p != probe) {  // first loop, or a test's probe
        probe = p;
        switches = p();
      }
      // A worker with items: if the caller went to sleep waiting (its wait
      // outlasted the spin window), tell it whether this worker lost its core
      // to another task since it last looked (one getrusage, only on such
      // loops). Published before finished_.
      if (idx < participants_) {
        work(idx);
        if (caller_sleeping_.load(std::memory_order_seq_cst) != 0) {
          const int64_t now = probe();
          if (now != switches) preempted_.store(1, std::memory_order_relaxed);
          switches = now;
        }
      }
      // seq_cst pairs with wait_done's caller_sleeping_ store.
      finished_.fetch_add(1, std::memory_order_seq_cst);
      if (caller_sleeping_.load(std::memory_order_seq_cst) != 0) futex_wake_all(&finished_);
    }
  }

  // Waits for an epoch other than `seen`; returns it.
  uint32_t worker_wait(uint32_t seen) {
    const auto moved = [&] { return epoch_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(moved)) {
      // Either the dispatcher sees sleepers_ > 0 and wakes us, or our epoch
      // load below sees its increment (both seq_cst): no lost wake-up.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while (epoch_.load(std::memory_order_seq_cst) == seen) futex_wait(&epoch_, seen);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    return epoch_.load(std::memory_order_acquire);
  }

  std::atomic<bool> busy_{false};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<uint32_t> epoch_{0};  // bumped once per loop
  // The loop's admission: bits 63..32 its epoch, kClosed once the caller has
  // run out of items, the low bits the count of workers that joined.
  static constexpr uint64_t kClosed = uint64_t{1} << 31, kJoinedMask = kClosed - 1;
  alignas(64) std::atomic<uint64_t> gate_{0};
  alignas(64) std::atomic<uint32_t> finished_{0};  // joined workers done with this loop
  std::atomic<uint32_t> caller_sleeping_{0};
  std::atomic<uint32_t> preempted_{0};  // a joined worker of this loop was preempted (see worker_main)
  std::atomic<int64_t (*)()> probe_{&own_involuntary_switches};
  alignas(64) std::atomic<int> sleepers_{0};        // workers asleep on epoch_
  // The loop in flight (written before the epoch bump, read after it).
  void (*call_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  int participants_ = 0;
  // Stall backoff (caller side, under busy_).
  int64_t solo_min_ns_ = kSoloMinMicros * 1000, solo_max_ns_ = kSoloMaxMicros * 1000;
  int64_t backoff_ns_ = kSoloMinMicros * 1000, solo_until_ns_ = 0, stall_min_ns_ = kStallMinMicros * 1000;
  int64_t stalls_ = 0, long_waits_ = 0;
  Range ranges_[kMaxParticipants];
  std::vector<std::thread> workers_;
};

Pool& pool() {
  static Pool p;
  return p;
}

// The share (parallel_shares) active on this thread: share t_share of t_shares,
// or t_shares == 0 for none.
thread_local int t_share = 0, t_shares = 0;
// Loops this thread has launched on the pool (pool_launches()): one plain
// increment per launch, on the caller's own line.
thread_local int64_t t_launches = 0;

}  // namespace

void parallel_for_impl(int64_t n_items, int nth, void (*call)(void* ctx, int64_t item), void* ctx) {
  if (n_items <= 0) return;
  if (t_shares > 0) {  // inside a share: this share's static range, inline
    const int64_t end = n_items * (t_share + 1) / t_shares;
    for (int64_t i = n_items * t_share / t_shares; i < end; ++i) call(ctx, i);
    return;
  }
  if (nth <= 1 || n_items == 1 || !pool().try_run(n_items, nth, call, ctx)) {
    for (int64_t i = 0; i < n_items; ++i) call(ctx, i);
    return;
  }
  ++t_launches;
}

void parallel_shares_impl(int nth, void (*call)(void* ctx), void* ctx) {
  struct Shares {
    int k;
    void (*call)(void*);
    void* ctx;
  } sh{std::max(1, nth), call, ctx};
  if (t_shares > 0) {  // nested: already inside a share, run as one
    call(ctx);
    return;
  }
  parallel_for_impl(sh.k, sh.k, [](void* c, int64_t p) {
    const Shares& s = *static_cast<const Shares*>(c);
    t_share = static_cast<int>(p);
    t_shares = s.k;
    s.call(s.ctx);
    t_shares = 0;
  }, &sh);
}

int pool_workers() { return pool().workers(); }

int active_shares() { return t_shares; }

int64_t pool_launches() { return t_launches; }

int64_t pool_stalls() { return pool().stalls(); }

int64_t pool_long_waits() { return pool().long_waits(); }

void set_pool_preemption_probe(int64_t (*probe)()) { pool().set_preemption_probe(probe); }

void set_pool_solo_window(int64_t min_us, int64_t max_us) { pool().set_solo_window(min_us, max_us); }

void set_pool_stall_min_wait(int64_t us) { pool().set_stall_min_wait(us); }

}  // namespace pagoda::kernels::cpu::detail
