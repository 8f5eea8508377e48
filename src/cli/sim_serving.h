// `pagoda sim` with a client-side concurrency limit, as `pagoda bench
// --max-concurrency C` runs its workload: at most C requests are in the engine
// at once; the next one is submitted when one finishes, and its TTFT counts from
// that submission. Same scheduler, KV manager and step_cost as sim::simulate.
//
// It lives in cli/ only because sim/simulator.cc belongs to another owner: it is
// sim::simulate plus the limit (max_concurrency <= 0 gives sim::simulate's run
// step for step, which tests/sim checks), and should move into SimConfig.
#pragma once
#include <vector>

#include "base/status.h"
#include "sim/simulator.h"
#include "sim/workload.h"

namespace pagoda::cli {

// Runs the requests to completion. max_concurrency <= 0: no limit (open loop).
Expected<sim::SimResult> simulate_with_client_limit(const sim::SimConfig& config,
                                                    const std::vector<sim::SimRequest>& requests,
                                                    int max_concurrency);

}  // namespace pagoda::cli
