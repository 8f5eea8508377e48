// AsyncEngine: runs the (single-threaded) Engine on its own thread. HTTP threads
// submit and abort through a command inbox and never wait for a step; events
// come back through per-request callbacks invoked on the engine thread (the
// callback must only post work elsewhere, never block).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace pagoda::server {

using Ticket = uint64_t;

class AsyncEngine {
 public:
  using EventFn = std::function<void(const engine::TokenEvent&)>;

  AsyncEngine(std::unique_ptr<engine::Engine> engine, Metrics* metrics);
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Queues a request. on_event gets every event of it, ending with one that has
  // finish != kNone (an add_request error arrives as finish == kError).
  Ticket submit(engine::RequestParams params, EventFn on_event);
  // Aborts a submitted request (any state); safe to call twice or after it ended.
  void abort(Ticket t);

  engine::EngineStats stats() const;
  int num_pending() const;  // submitted, not yet handed to the engine
  const engine::ModelInfo& model_info() const { return info_; }
  const tok::Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  void stop();

 private:
  struct Pending {
    Ticket ticket;
    engine::RequestParams params;
    EventFn on_event;
  };
  struct Live {
    engine::RequestId id = 0;
    EventFn on_event;
    double t_submit = 0, t_first = 0, t_last = 0;
    int n_choices = 1, n_finished = 0;
    bool any_error = false;
  };
  void loop();
  void publish_stats();

  std::unique_ptr<engine::Engine> engine_;
  Metrics* metrics_;
  engine::ModelInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> inbox_;
  std::vector<Ticket> aborts_;
  std::unordered_map<Ticket, double> submit_times_;
  engine::EngineStats stats_;
  Ticket next_ticket_ = 1;
  bool stop_ = false;
  // Engine-thread only.
  std::unordered_map<Ticket, Live> live_;
  std::unordered_map<engine::RequestId, Ticket> by_id_;
  engine::EngineStats last_stats_;
  std::thread thread_;
};

}  // namespace pagoda::server
