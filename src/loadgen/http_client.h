// The HTTP side of the serving benchmark: an incremental SSE parser, the
// OpenAI completion-chunk reader, Prometheus scraping (openai_stream.cc), and the
// run loop that sends the workload to POST URL/v1/completions or /v1/chat/completions
// (http_client.cc: Boost.Beast, one worker thread and keep-alive connection per
// concurrency slot). The benchmark's client; the server's HTTP is elsewhere.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "loadgen/serving.h"

namespace pagoda::loadgen {

// Server-sent events, fed in arbitrary pieces. Each complete event (ended by a
// blank line) yields its data: the "data:" lines joined by '\n' (one leading space
// of each value dropped). Comments and other fields are ignored; CR, LF and CRLF
// all end a line.
class SseParser {
 public:
  using OnData = std::function<void(const std::string& data)>;
  void feed(std::string_view bytes, const OnData& on_data);
  // End of stream: an event not yet ended by a blank line is still delivered.
  void finish(const OnData& on_data);

 private:
  void end_line(const OnData& on_data);
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_cr_ = false;
};

// What one streamed /v1/completions chunk says.
struct StreamChunk {
  bool done = false;               // data: [DONE]
  bool error = false;              // not JSON, or an {"error": ...} object
  std::string error_message;
  bool has_choice = false;
  std::string text;                // choices[0].text, or choices[0].delta.content (chat)
  std::vector<int32_t> token_ids;  // choices[0].token_ids (vLLM return_token_ids) or "tokens" (llama-server)
  bool finished = false;           // choices[0].finish_reason set
  int64_t prompt_tokens = -1;      // usage.prompt_tokens
  int64_t completion_tokens = -1;  // usage.completion_tokens, else llama-server timings.predicted_n
  int64_t cached_tokens = -1;      // usage.prompt_tokens_details.cached_tokens, else timings.cache_n
};
StreamChunk parse_stream_chunk(const std::string& data);

// The JSON body sent for one request: token ids as the prompt of /v1/completions, or
// (chat) r.text as one user message of /v1/chat/completions, as vLLM's openai-chat does.
std::string completion_body(const BenchRequest& r, const std::string& model, bool ignore_eos, bool chat = false);

struct ServerUrl {
  std::string host;
  std::string port;                // "80" when absent
  std::string base_path;           // without a trailing '/', e.g. "" or "/proxy"
};
// http://host[:port][/base]; a trailing /v1 is dropped (the client appends /v1/...).
Expected<ServerUrl> parse_server_url(const std::string& url);

// Sum of the samples of the first metric (any labels) whose name ends with one of
// the suffixes, in Prometheus text format; -1 when none is there.
double scrape_metric(const std::string& text, const std::vector<std::string>& suffixes);

// "model" of the first entry of a GET /v1/models answer; "" when absent.
std::string first_model_id(const std::string& models_json);

struct ServerRunOptions {
  RunOptions run;                  // max_concurrency 0 -> min(N, 256) worker slots (written back)
  std::string model_name;          // "" -> first id of GET /v1/models (written back)
  std::string api_key;
  double request_timeout_s = 600;
  std::string endpoint = "/v1/completions";  // or "/v1/chat/completions" (sends BenchRequest::text)
};

// Sends every request (failures are results, never exceptions). Results in request order.
std::vector<RequestResult> run_server(const ServerUrl& url, const std::vector<BenchRequest>& requests,
                                      ServerRunOptions* opts, RunExtras* extras);

}  // namespace pagoda::loadgen
