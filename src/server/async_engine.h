// AsyncEngine: runs the (single-threaded) Engine on its own thread. HTTP and
// worker threads submit and abort through a command inbox and never wait for a
// step; results come back through callbacks invoked on the engine thread (a
// callback must only post work elsewhere, never block). The engine is stepped by
// the one driver loop (engine/driver.h), which keeps each request's timings.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/driver.h"
#include "engine/engine.h"
#include "server/metrics.h"

namespace pagoda::server {

using Ticket = uint64_t;

// One HTTP generation request: every prompt of it, handed to the engine together.
struct Submission {
  std::vector<engine::RequestParams> prompts;
  // Called once, after add_request saw every prompt (all in one engine-loop turn, so
  // before any of them produced a token): "" when all were accepted, else the first
  // add_request error, and then none of the prompts is live (the accepted ones are
  // aborted). The engine is the only validator; the server maps this to one 400.
  std::function<void(const std::string& error)> on_added;
  // Every event of prompt `prompt` (an index into prompts), ending, per choice, with
  // one whose finish != kNone.
  std::function<void(size_t prompt, const engine::TokenEvent&)> on_event;
  // A label the dashboard shows for the engine requests of this submission (the
  // response id, "chatcmpl-..."); may be empty.
  std::string tag;
};

// What an inspection sees on the engine thread (AsyncEngine::inspect).
struct EngineView {
  const engine::Engine& engine;
  // The Submission::tag of an engine request ("" when unknown).
  std::function<std::string(engine::RequestId)> tag_of;
};

class AsyncEngine {
 public:
  // log_stats_interval_s > 0: every that many seconds in which something happened,
  // one vLLM-style stats line (throughput, running/waiting, KV usage, prefix hit rate).
  AsyncEngine(std::unique_ptr<engine::Engine> engine, Metrics* metrics, double log_stats_interval_s = 0);
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  Ticket submit(Submission s);
  // Aborts every prompt of a submission (any state); safe to call twice or after it ended.
  void abort(Ticket t);

  // Runs fn on the engine thread between two steps (wakes an idle engine), for
  // read-only looks such as the dashboard's snapshot; fn must be quick and must
  // not block. Dropped, never run, when the engine stops first.
  void inspect(std::function<void(const EngineView&)> fn);

  // Runs fn on the engine thread between two steps with the engine itself
  // (administration: reset_prefix_cache); same rules as inspect. fn returns its
  // reply (or an empty function), run after the stats are published, so a client
  // that reads /metrics after the reply sees what fn changed.
  using Reply = std::function<void()>;
  void control(std::function<Reply(engine::Engine&)> fn);

  engine::EngineStats stats() const;
  int num_pending() const;  // submissions not yet handed to the engine
  const engine::ModelInfo& model_info() const { return info_; }
  // Joins the engine thread. Live requests get a kError event and queued ones an
  // on_added error, so no client waits forever; after stop() no callback runs.
  void stop();

 private:
  struct Pending {
    Ticket ticket;
    Submission sub;
    double t_submit = 0;
  };
  // Where one engine request's events go: its submission and prompt index. Its
  // timings and counts are the driver's record (engine::DrivenRequest).
  struct Route {
    Ticket ticket = 0;
    size_t prompt = 0;
  };
  struct Group {
    std::vector<engine::RequestId> ids;  // still-live engine requests
    std::function<void(size_t, const engine::TokenEvent&)> on_event;
    std::string tag;
  };
  void loop();
  std::function<void()> admit(Pending& p);  // returns the submission's verdict to run
  void publish_stats();
  // The vLLM-style stats line, when the interval has passed and something happened.
  void maybe_log_stats(double now);
  // One finished engine request's per-request histograms.
  void observe_finished(const engine::DrivenRequest& r, const Route& route, const engine::TokenEvent& ev,
                        double now);
  // Routes one step's events of the driven requests to their submissions.
  void deliver(const engine::DriverStep& st);

  std::unique_ptr<engine::Engine> engine_;
  engine::Driver driver_;  // engine-thread only; every step of engine_ goes through it
  Metrics* metrics_;
  engine::ModelInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> inbox_;
  std::vector<Ticket> aborts_;
  std::vector<std::function<void(const EngineView&)>> inspections_;
  std::vector<std::function<Reply(engine::Engine&)>> controls_;
  engine::EngineStats stats_;
  Ticket next_ticket_ = 1;
  bool stop_ = false;
  // Engine-thread only.
  std::unordered_map<Ticket, Group> groups_;
  std::unordered_map<engine::RequestId, Route> routes_;
  engine::EngineStats last_stats_;
  double log_stats_interval_s_ = 0;
  double log_window_start_ = 0;
  engine::EngineStats log_window_stats_;  // the stats when the window started
  std::thread thread_;
};

}  // namespace pagoda::server
