// The serving benchmark's in-process run: a workload (loadgen/workload.h) through one
// engine with the arrivals and concurrency limit of vLLM's `bench serve`, measured
// per request (loadgen/report.h). The HTTP run is loadgen/http_client.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "loadgen/report.h"
#include "loadgen/workload.h"

namespace pagoda::loadgen {

struct RunOptions {
  int max_concurrency = 0;         // 0: unlimited
  double request_rate = std::numeric_limits<double>::infinity();
  uint64_t seed = 0;
  bool ignore_eos = true;
  // Called (from the run's thread) as requests finish: done of total. Empty: none.
  std::function<void(size_t done, size_t total)> progress;
  // --report: the engine's counters after every step (offline) or each /metrics
  // scrape, every 100 ms (server); unset: nothing recorded.
  std::function<void(const engine::EngineStats&)> on_step;
  std::function<void(const std::string& metrics)> on_scrape;
};

// Runs the requests through one in-process engine (greedy), stepped by the load
// driver (loadgen/driver.h). Results in request order.
std::vector<RequestResult> run_offline(engine::Engine& eng, const std::vector<BenchRequest>& requests,
                                       const RunOptions& opts, RunExtras* extras);

}  // namespace pagoda::loadgen
