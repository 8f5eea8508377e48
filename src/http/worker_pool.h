// A fixed pool of worker threads with a bounded queue. The server runs request
// parsing, tokenization and chat rendering here so a large body never stalls the
// I/O threads (which keep answering /health and streaming other clients).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "http/process_memory.h"

namespace pagoda::server {

class WorkerPool {
 public:
  // threads >= 1; max_queued: jobs waiting (not running) beyond which try_post refuses.
  // trim_threshold > 0: after a job during which the process's anonymous resident
  // memory grew by more than this many bytes, free heap pages go back to the OS
  // (HeapReturn: a large request's freed memory would otherwise stay resident).
  WorkerPool(int threads, size_t max_queued, size_t trim_threshold = 0);
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False (and the job is dropped) when the queue is full or the pool stopped.
  bool try_post(std::function<void()> job);
  void stop();  // idempotent; waits for queued and running jobs
  size_t num_queued() const;  // jobs waiting for a worker now
  // Times a job's growth gave memory back (see trim_threshold).
  uint64_t heap_trims() const { return heap_return_.trims(); }

 private:
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t max_queued_;
  bool stop_ = false;
  HeapReturn heap_return_;
  std::vector<std::thread> threads_;
};

}  // namespace pagoda::server
