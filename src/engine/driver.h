// The one loop around Engine::step (issue 34): submit requests, step the engine,
// fold each step's events into one record per request (timings, token counts,
// choices finished, finish) and hand the step back to the caller. Every
// Engine::step outside the tests goes through it: the server's AsyncEngine
// (which streams each step's events to its clients) and, through the
// accumulating layer loadgen/driver.h, `pagoda run`, `pagoda bench`, the serving
// benchmark's offline run, `perplexity` and `pagoda sim --calibrate`.
// Built on engine.h, the engine's public API, only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace pagoda::engine {

struct DriverOptions {
  // Keep each request's tokens, text and inter-token gaps (DrivenRequest's last
  // three fields): the offline users want the whole output; the server streams
  // each step's events and keeps none. Needs one choice per request (n == 1).
  bool accumulate = false;
};

// What the driver keeps of one request it submitted, all its choices together.
// Times are now_seconds() (base/timer.h).
struct DrivenRequest {
  RequestId id = 0;
  int n = 1;                       // choices
  int max_tokens = 0;              // as asked (per choice)
  double submitted = 0;            // the caller's arrival time, else when submit handed it to add_request
  double scheduled = -1;           // start of the step that first scheduled it (Engine::newly_scheduled); -1: not yet
  double first_token = -1;         // end of the step that gave its first token (any choice); -1: none yet
  double last_token = -1;          // end of the latest step that gave it tokens
  int64_t prompt_tokens = 0;       // the prompt's length (the engine's count once it gives one)
  int64_t cached_tokens = 0;       // prompt tokens the prefix cache supplied
  int32_t num_kv_blocks = 0;       // KV blocks held at the latest event that gave tokens
  int64_t output_tokens = 0;       // every choice's tokens so far
  int choices_finished = 0;
  uint64_t last_token_step = 0;    // the driver's step count at last_token (0: none yet)
  // Seconds of the engine steps run while the request was in flight: those up to and
  // including the step of its first token (the prefill) and those after it (decode);
  // decode_steps of the latter gave it decode_tokens tokens (several a step when
  // speculative decoding accepts drafts, or n > 1; the other choices' first tokens,
  // given with the request's first, are not decode tokens).
  double prefill_s = 0, decode_s = 0;
  int64_t decode_steps = 0, decode_tokens = 0;
  // Set when it finished: the last choice's reason, or kError when a choice failed
  // (the first error ends the whole request) or when the engine went idle without
  // finishing it ("the engine dropped the request").
  FinishReason finish = FinishReason::kNone;
  std::string error;
  // DriverOptions::accumulate only (n == 1): generated ids, the events' text, and
  // the gaps between the steps that gave tokens, after the first.
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<double> itl;
};

// One event of a driven request, as the driver folded it (in event order).
struct DrivenEvent {
  const TokenEvent* event = nullptr;   // into DriverStep::events, or ::dropped
  // The request: in DriverStep::finished when `done`, else the driver's live record
  // (valid until the next step() or abort() of that request).
  const DrivenRequest* request = nullptr;
  bool first_token = false;            // it gave the request's first token
  // It gave tokens after the first: seconds since the end of the previous step that
  // gave the request tokens (per request: a second choice in the same step sees 0).
  // A server observes it as the inter-token latency of each event after the first.
  double gap = 0;
  bool done = false;                   // the request finished with it
};

// One Engine::step as the driver saw it.
struct DriverStep {
  double start = 0, end = 0;           // now_seconds() right before and after Engine::step
  size_t in_flight = 0;                // the driver's requests in flight when it began
  bool all_decoding = false;           // every one of them had its first token before it
  size_t advanced = 0;                 // of them, those it gave tokens
  int64_t tokens = 0;                  // the tokens it gave them
  std::vector<TokenEvent> events;      // as the engine returned them (other requests' too)
  // One kError event per request the engine went idle without finishing (the
  // driver's own, not the engine's).
  std::vector<TokenEvent> dropped;
  std::vector<DrivenEvent> driven;     // the driver's requests' events, then the dropped ones
  std::vector<DrivenRequest> finished; // the driver's requests that finished in it, in that order
  double seconds() const { return end - start; }
};

// Drives one engine; not thread-safe (call it from the engine's one thread).
// Tracks only the requests submitted through it; events of others pass through in
// DriverStep::events.
class Driver {
 public:
  explicit Driver(Engine& eng, DriverOptions options = {}) : eng_(eng), options_(options) {}

  // Engine::add_request; `submitted` is the request's arrival (< 0: now). An error
  // (the engine's, or n != 1 when accumulating) leaves nothing behind.
  Expected<RequestId> submit(const RequestParams& params, double submitted = -1);
  // One Engine::step; the result is valid until the next call. Finished requests
  // leave the driver in DriverStep::finished; a request the engine went idle without
  // finishing finishes there with kError, so none is left hanging.
  const DriverStep& step();
  // Engine::abort; the request leaves the driver without a record.
  void abort(RequestId id);

  bool has_unfinished() const { return eng_.has_unfinished(); }
  size_t num_in_flight() const { return live_.size(); }
  // The record of a request in flight; nullptr once it finished or was aborted.
  const DrivenRequest* find(RequestId id) const;
  Engine& engine() const { return eng_; }

 private:
  // Folds one event of a driven request into its record and the step's counters;
  // returns whether the request finished with it.
  bool fold(DrivenRequest& r, const TokenEvent& ev, DrivenEvent& out);

  Engine& eng_;
  DriverOptions options_;
  std::unordered_map<RequestId, DrivenRequest> live_;
  uint64_t steps_ = 0;
  DriverStep step_;
};

}  // namespace pagoda::engine
