// What this process holds in RAM, and giving freed heap memory back to the OS.
//
// Why: glibc's malloc keeps memory a request freed. A large request (a 3 MB chat
// body of 100k messages is ~150 MB of JSON trees and template values) leaves its
// freed chunks in the arena of the thread that allocated them, and an arena only
// shrinks from its top: one small chunk still live above them (a log line, a
// connection's buffer) pins the rest. Each worker thread has its own arena, so
// the resident set grew by one request's peak per worker and per allocation
// pattern (issue 35: +70 MB per 400-answered chat, a hostile mix levelling off
// near 2x the baseline). malloc_trim(0) hands every whole free page of every
// arena back (madvise), wherever it lies.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pagoda::server {

struct ProcessMemory {
  size_t resident = 0;       // VmRSS: every resident page (the model's mapped file pages too)
  size_t resident_anon = 0;  // resident pages not backed by a file (heap, stacks, KV pool)
  size_t virtual_size = 0;   // VmSize
};
// From /proc/self/statm; all zero where it cannot be read.
ProcessMemory process_memory();

// Prometheus's standard process gauges (no prefix, no labels, as client libraries
// and vLLM write them): process_resident_memory_bytes, process_virtual_memory_bytes.
std::string process_metrics_text();

// Gives whole free pages of every malloc arena back to the OS (glibc
// malloc_trim(0)); false where the C library has no such call.
bool release_free_heap();

// Decides after a piece of work whether to call release_free_heap: when the
// process's anonymous resident memory grew by more than `threshold` bytes while
// it ran (what it freed is then likely held by the allocator). Measuring costs
// one read of /proc/self/statm at each end; small work never trims.
// Thread-safe (work may run on several threads; the growth seen may be another
// thread's, which only errs toward trimming).
class HeapReturn {
 public:
  explicit HeapReturn(size_t threshold) : threshold_(threshold) {}
  // Anonymous resident bytes now (0 when the threshold is 0: off).
  size_t before() const;
  // After the work (its memory already freed): trims when grown past the threshold.
  void after(size_t before_bytes);
  uint64_t trims() const { return trims_.load(std::memory_order_relaxed); }

 private:
  size_t threshold_;
  std::atomic<uint64_t> trims_{0};
};

}  // namespace pagoda::server
