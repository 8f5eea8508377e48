// The one persistent thread pool every cpu/ kernel runs its parallel loops on
// (instead of an OpenMP team per kernel call: at decode sizes, SmolLM2's ~8
// parallel regions per layer x 30 layers, the fork/join and OpenMP's long
// active spin cost more than the second core gave back, and a co-tenant process
// made the spinning threads fight it for the cores).
//
// parallel_for(n_items, nth, fn) calls fn(i) once for every i in [0, n_items)
// on up to nth threads, the caller being one of them, and returns when all
// calls have returned. Items are handed out as static contiguous ranges, one
// per participant (participant p owns [p * n / k, (p + 1) * n / k)), so on a
// quiet machine each thread streams its own slice of the weight rows; a
// participant that finishes its range early takes the remaining items of the
// others' ranges one at a time (from the front of the victim's range), so a
// thread that the OS preempted does not hold up the whole loop. Which thread
// runs an item never changes what it computes (each item writes its own
// outputs with its own fixed op sequence): batch invariance is untouched.
//
// Waits (workers between loops, the caller for the last items) spin with
// _mm_pause for a short while (kSpinMicros) and then sleep on a futex, so idle
// workers give their core away and a busy co-tenant does not collapse decode.
// A worker joins a loop only while some item is unclaimed: once the caller has
// claimed the last item the loop is closed, and a worker that was asleep or
// descheduled (by a co-tenant) stays out of it, so the caller never waits for
// a thread that has no item; on a crowded machine a loop degrades to fewer
// threads instead of to the scheduler's wake-up latency.
//
// Stalls (co-tenancy): a worker that a busy co-tenant preempts inside an item
// holds the caller up for the rest of the scheduler's time slice (ms), once per
// loop it happens in. When the caller's wait outlasts the spin window and many
// of its own items (a "long wait"), lasted at least 500 us, and a worker it
// waited for was switched out by the scheduler for another task meanwhile (its
// involuntary context switches went up since it last looked), the pool counts a
// stall and runs the following loops on the caller alone for a window (2 ms,
// doubling up to 1024 ms while each stall comes within 100 ms of the previous
// window's end), then tries the workers again. A shorter preemption (a kernel
// thread's wake-up, tens to hundreds of us) is not a stall (session 13), and
// neither is a long wait without such a switch: on a virtual machine
// the hypervisor takes a vCPU away for milliseconds now and then (steal time),
// which no co-tenant in this machine causes (session 11 measured 10-130 long
// waits per 2-thread 1B decode run, 76-90% of them with no preemption; each
// used to cost a 2-64 ms solo window). On a quiet
// machine nothing changes; with a co-tenant, decode runs at about one thread's
// speed instead of collapsing. Results never depend on it (items compute the
// same on any thread).
//
// Concurrency: one loop runs on the pool at a time. A parallel_for issued while
// another is in flight (from another thread, or nested inside an item) runs
// inline on the calling thread, serially: same results, no deadlock.
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

namespace pagoda::kernels::cpu::detail {

// The non-template core: call(ctx, i) for every item.
void parallel_for_impl(int64_t n_items, int nth, void (*call)(void* ctx, int64_t item), void* ctx);

// Shares of the parallel_shares launch the calling thread is inside (0: none).
int active_shares();

template <class F>
void parallel_for(int64_t n_items, int nth, F&& fn) {
  if (nth <= 1 && active_shares() == 0) {
    // One thread: the plain loop, with fn inlined into it (a call through the
    // type-erased pointer per item cost 1-thread decode ~10%: the per-chunk
    // setup could no longer be hoisted). Same items, same order.
    for (int64_t i = 0; i < n_items; ++i) fn(i);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  parallel_for_impl(
      n_items, nth, [](void* ctx, int64_t i) { (*static_cast<Fn*>(ctx))(i); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

// Several loops in one launch: runs fn() once per share p of k = nth shares,
// spread over the pool like parallel_for's items, with share p active while it
// runs: every parallel_for issued inside fn then runs, inline on that thread,
// only the static range p of its items ([p * n / k, (p + 1) * n / k)) instead
// of launching. So fn = "matmul A; matmul B; matmul C" computes every output of
// A, B and C exactly once, with one fork/join instead of three (the decode
// step's Q/K/V and gate/up). Each share's loops must not depend on outputs of
// another share (A's rows are not B's input).
void parallel_shares_impl(int nth, void (*call)(void* ctx), void* ctx);

template <class F>
void parallel_shares(int nth, F&& fn) {
  if (nth <= 1 && active_shares() == 0) {  // one share is the whole of every loop
    fn();
    return;
  }
  using Fn = std::remove_reference_t<F>;
  parallel_shares_impl(nth, [](void* ctx) { (*static_cast<Fn*>(ctx))(); }, const_cast<void*>(static_cast<const void*>(&fn)));
}

// Worker threads the pool has started so far (for tests: the pool starts
// nth - 1 workers on first use and never more than the largest nth asked for).
int pool_workers();

// Loops the calling thread has run on the pool so far (parallel_for and
// parallel_shares launches that woke workers; a loop run inline is not one):
// each is one fork/join, i.e. one barrier. For tests and benchmarks that count
// the barriers of a decode step.
int64_t pool_launches();

// Stalls counted so far (see above), and the backoff window's bounds in
// microseconds (tests; the defaults are 2000 and 1024000). Setting the window
// also ends the current one.
int64_t pool_stalls();
void set_pool_solo_window(int64_t min_us, int64_t max_us);
// The shortest wait, in microseconds, that a preemption makes a stall (tests;
// the default is 500).
void set_pool_stall_min_wait(int64_t us);

// Long waits counted so far: stalls plus the long waits in which no worker was
// preempted (for tests and benchmarks).
int64_t pool_long_waits();

// Replaces how a worker reads its own involuntary context switch count (for
// tests: a fake counter that an item bumps, so preemption can be staged without
// depending on the scheduler); nullptr restores the default (getrusage's
// ru_nivcsw of the calling thread). A worker takes its baseline from the new
// probe at the start of the next loop it joins.
void set_pool_preemption_probe(int64_t (*probe)());

}  // namespace pagoda::kernels::cpu::detail
