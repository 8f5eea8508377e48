#include "http/worker_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace pagoda::server {

WorkerPool::WorkerPool(int threads, size_t max_queued, size_t trim_threshold)
    : max_queued_(max_queued), heap_return_(trim_threshold) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { loop(); });
}

WorkerPool::~WorkerPool() { stop(); }

bool WorkerPool::try_post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

size_t WorkerPool::num_queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return queue_.size();
}

void WorkerPool::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void WorkerPool::loop() {
  // Parsing and tokenizing yield to the I/O threads (and the engine) on a busy machine:
  // a few nice levels keep /health and streams responsive while a big body tokenizes.
  // Best effort: raising one's own nice value needs no privilege; failure changes nothing.
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  errno = 0;
  const int prio = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno == 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, prio + 5));
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const size_t before = heap_return_.before();
    job();
    job = nullptr;  // its captures (the request and its body) are freed before measuring
    heap_return_.after(before);
  }
}

}  // namespace pagoda::server
