// The state of one HTTP generation request (completions or chat; possibly several
// prompts x n choices) between the engine's callbacks and the client: accumulates
// each choice, streams SSE chunks or sends the final object. Engine-thread
// callbacks (on_added, on_event) and the I/O thread's on_disconnect are serialized
// by the object's mutex; every send goes through the Responder (which posts).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "http/http.h"
#include "openai/openai_api.h"

namespace pagoda::server {

class Metrics;
class TextCodec;

struct GenerationSetup {
  ResponseMeta meta;
  bool stream = false, include_usage = false, echo = false, return_token_ids = false;
  int n = 1;
  std::vector<std::string> echo_text;             // per prompt (completions with echo)
  std::vector<int32_t> prompt_lens;               // per prompt
  std::vector<std::vector<int32_t>> prompt_ids;   // per prompt, only with return_token_ids
  // Chat with tools (tool_choice auto, required or named): the declared function
  // names. Calls in the output become `tool_calls` (finish_reason "tool_calls");
  // streaming holds back text that may still become a call.
  std::vector<std::string> tool_names;
  bool log_access = true;  // the access line when the response ends
  double t_start = 0;  // now_seconds() when the HTTP request arrived (the access line's duration and TTFT)
};

class Generation {
 public:
  Generation(GenerationSetup setup, const TextCodec& text, Metrics& metrics, std::shared_ptr<Responder> res);

  // add_request's verdict on the whole submission: "" starts the response (the 200
  // header of a stream goes out only now), an error answers one 400.
  void on_added(const std::string& error);
  // One engine event of prompt `prompt`.
  void on_event(size_t prompt, const engine::TokenEvent& ev);
  // The client went away: nothing more is sent. Returns true if the request was
  // still running (the caller aborts it in the engine).
  bool on_disconnect();

 private:
  struct Choice {
    std::string text;
    std::vector<int32_t> tokens;                  // kept only when not streaming
    std::vector<engine::TokenLogprob> logprobs;   // likewise
    int64_t num_tokens = 0;  // the last event's num_output_tokens (usage; streamed tokens are not kept)
    engine::FinishReason finish = engine::FinishReason::kNone;
    bool first_sent = false;
    // Streaming with tools: output held back while it may be a tool call.
    bool holding = true;
    std::string held;
    std::vector<engine::TokenLogprob> held_logprobs;
  };
  // Streaming with tools: holds or releases the event's text; true when the
  // event was fully handled here.
  bool stream_tool_event(size_t ci, const engine::TokenEvent& ev);
  std::string call_id(size_t ci, size_t k) const;
  void fail(const ApiError& e);          // mu_ held
  void stream_event(size_t prompt, size_t ci, const engine::TokenEvent& ev, size_t text_off0);
  void finish_all();                     // mu_ held, every choice done
  json usage() const;
  // Why prompt p's prefix-cache hit ended where it did (engine::TokenEvent's
  // prefix_miss fields, from its first event). Reported on the access line
  // and, non-streamed, in the x-pagoda-prefix response header (docs/prefix_miss.md).
  struct PrefixReport {
    bool known = false;
    int64_t matched = 0;
    std::string cause;
    int32_t position = -1;
    double evicted_ago_s = -1;
  };
  // "matched=N; cause=C[; position=P][; evicted_ago=S]" per prompt, joined by ", ".
  std::string prefix_header() const;
  // The access line: one per request, at info level, when its response ends.
  void access_log(int status, const std::string& finish, const std::string& error) const;

  GenerationSetup s_;
  const TextCodec& text_;
  Metrics& metrics_;
  // Released once the response has ended: the session's disconnect callback holds
  // this object, so keeping the Responder (which holds the session) would be a cycle
  // that leaks the socket when a server shuts down mid-response.
  std::shared_ptr<Responder> res_;
  std::mutex mu_;
  std::vector<Choice> choices_;  // [prompt * n + i]
  int64_t cached_tokens_ = 0;
  std::vector<PrefixReport> prefix_;  // [prompt]
  int pending_choices_ = 0;
  double t_first_ = 0;           // first output token (0: none yet)
  bool done_ = false;            // response ended (sent, failed or client gone)
};

}  // namespace pagoda::server
