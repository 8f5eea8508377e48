// The offline users' view of the one driver loop around engine::Engine::step
// (engine/driver.h, issue 34): the engine's Driver with each request's tokens,
// text and inter-token gaps accumulated into its record (a Stream), and run_one.
// `pagoda run`, `pagoda bench`, the serving benchmark's offline run, `perplexity`
// and `pagoda sim --calibrate` drive the engine through it; the server's
// AsyncEngine uses the engine's Driver without accumulating.
// Only engine/engine.h and engine/driver.h, the engine's public API, are used
// (tests/check_layering.py).
#pragma once
#include <functional>

#include "base/status.h"
#include "engine/driver.h"
#include "engine/engine.h"

namespace pagoda::loadgen {

// What one request has produced (engine/driver.h: timings, counts, finish, and here
// its tokens, text and gaps).
using Stream = engine::DrivenRequest;
// One Engine::step as the driver saw it.
using Step = engine::DriverStep;

// The accumulating driver: one choice per request (RequestParams::n == 1).
class Driver : public engine::Driver {
 public:
  explicit Driver(engine::Engine& eng) : engine::Driver(eng, engine::DriverOptions{.accumulate = true}) {}
};

// Called after each step of run_one; a non-OK status ends the loop with that error.
using OnStep = std::function<Status(const Step& step)>;

// Submits one request and steps the engine until it has nothing left to do.
// Returns the request's Stream, or the error it finished with (kError, or dropped).
Expected<Stream> run_one(engine::Engine& eng, const engine::RequestParams& params, const OnStep& on_step = {});

}  // namespace pagoda::loadgen
