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

namespace pagoda::server {

class WorkerPool {
 public:
  // threads >= 1; max_queued: jobs waiting (not running) beyond which try_post refuses.
  WorkerPool(int threads, size_t max_queued);
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False (and the job is dropped) when the queue is full or the pool stopped.
  bool try_post(std::function<void()> job);
  void stop();  // idempotent; waits for queued and running jobs
  size_t num_queued() const;  // jobs waiting for a worker now

 private:
  void loop();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t max_queued_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pagoda::server
