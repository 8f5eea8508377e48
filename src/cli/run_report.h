// `--report FILE.html` of `pagoda bench` (serving workloads) and `pagoda sim`:
// the run's time series (KV usage, prefix hit rate, running/waiting,
// preemptions, tokens/s) recorded while it runs, written as one self-contained
// HTML file with the dashboard's plotting code inlined (server/dashboard.h).
#pragma once
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "server/dashboard.h"

namespace pagoda::cli {

class RunRecorder {
 public:
  RunRecorder();
  // Offline bench: the engine's counters after a step.
  void on_engine_stats(const engine::EngineStats& s);
  // Bench against a server: one /metrics scrape (pagoda's or vLLM's names).
  void on_metrics(const std::string& prometheus_text);
  // Sim: a point at simulated time t_s.
  void add(const server::SeriesPoint& p) { points_.push_back(p); }
  size_t num_points() const { return points_.size() + (has_tail_ ? 1 : 0); }
  // Writes the report; summary_json is the run's summary (a JSON object).
  Status write(const std::string& path, const std::string& title, const std::string& summary_json) const;

 private:
  double t0_;
  double last_ = -1;
  std::vector<server::SeriesPoint> points_;
  server::SeriesPoint tail_;  // the latest skipped sample (offline bench)
  bool has_tail_ = false;
};

}  // namespace pagoda::cli
