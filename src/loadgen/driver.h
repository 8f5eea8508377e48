// The one loop around engine::Engine::step (issue 34): submit requests, step the
// engine, fold each step's events into one record per request (tokens, text,
// timings, finish) and hand the step back to the caller. `pagoda run`, `pagoda
// bench`, the serving benchmark's offline run and `pagoda sim --calibrate` drive
// the engine through it; the server keeps its AsyncEngine (a thread of its own).
// Only engine/engine.h, the engine's public API, is used (tests/check_layering.py).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace pagoda::loadgen {

// What one request has produced. Times are now_seconds() (base/timer.h).
struct Stream {
  engine::RequestId id = 0;
  double submitted = 0;            // when it was handed to add_request
  double first_token = -1;         // end of the step that gave the first token; -1: none yet
  double last_token = -1;          // end of the latest step that gave tokens
  std::vector<double> itl;         // gaps between the steps that gave tokens, after the first
  std::vector<int32_t> tokens;     // generated ids, in order
  std::string text;                // the events' text, in order
  int64_t prompt_tokens = 0;       // the prompt's length (the engine's count once it gives one)
  int64_t cached_tokens = 0;       // prompt tokens the prefix cache supplied
  int32_t num_kv_blocks = 0;       // KV blocks held at the latest step that gave tokens
  // Seconds of the engine steps run while the request was in flight: those up to and
  // including the step of its first token (the prefill) and those after it (decode);
  // decode_steps of the latter gave it decode_tokens tokens (several a step when
  // speculative decoding accepts drafts).
  double prefill_s = 0, decode_s = 0;
  int64_t decode_steps = 0, decode_tokens = 0;
  engine::FinishReason finish = engine::FinishReason::kNone;
  std::string error;               // set when finish is kError ("the engine dropped the request"
                                   // when the engine went idle without finishing it)
};

// One Engine::step as the driver saw it.
struct Step {
  double start = 0, end = 0;       // now_seconds() right before and after Engine::step
  size_t in_flight = 0;            // the driver's requests in flight when it began
  bool all_decoding = false;       // every one of them had its first token before it
  size_t advanced = 0;             // of them, those it gave tokens
  int64_t tokens = 0;              // the tokens it gave them
  std::vector<engine::TokenEvent> events;  // as the engine returned them (other requests' too)
  std::vector<Stream> finished;    // the driver's requests that finished in it, in event order
  double seconds() const { return end - start; }
};

// Drives one engine; not thread-safe (call it from the engine's one thread).
// Tracks only the requests submitted through it; events of others pass through in
// Step::events. One choice per request (RequestParams::n == 1).
class Driver {
 public:
  explicit Driver(engine::Engine& eng) : eng_(eng) {}

  // Engine::add_request, timed. An error (the engine's, or n != 1) leaves nothing behind.
  Expected<engine::RequestId> submit(const engine::RequestParams& params);
  // One Engine::step; the result is valid until the next call. Finished requests
  // leave the driver in Step::finished.
  const Step& step();
  // Engine::abort; the request leaves the driver without a Stream.
  void abort(engine::RequestId id);

  bool has_unfinished() const { return eng_.has_unfinished(); }
  size_t num_in_flight() const { return live_.size(); }
  // The record of a request in flight; nullptr once it finished or was aborted.
  const Stream* find(engine::RequestId id) const;
  engine::Engine& engine() const { return eng_; }

 private:
  engine::Engine& eng_;
  std::unordered_map<engine::RequestId, Stream> live_;
  Step step_;
};

// Called after each step of run_one; a non-OK status ends the loop with that error.
using OnStep = std::function<Status(const Step& step)>;

// Submits one request and steps the engine until it has nothing left to do.
// Returns the request's Stream, or the error it finished with (kError, or dropped).
Expected<Stream> run_one(engine::Engine& eng, const engine::RequestParams& params, const OnStep& on_step = {});

}  // namespace pagoda::loadgen
