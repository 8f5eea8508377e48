// The serving benchmark's report: what each request measured, the summary over a
// run (vLLM benchmark_serving's metrics: TTFT, TPOT, ITL, E2EL, throughput, plus
// KV usage, prefix hit rate, preemptions and output hashes) and its formats: the
// vLLM-style text block, one JSON object and vLLM's --save-result file.
// See docs/serving-bench.md for every metric's definition.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace pagoda::loadgen {

// Linear-interpolated percentile (numpy's default), p in [0, 100]; 0 for an empty set.
double percentile(std::vector<double> values, double p);

// What one request measured. Times in seconds.
struct RequestResult {
  bool ok = false;
  std::string error;
  double start = 0;                // submission, seconds after the run began
  double ttft = 0;                 // first token - submission
  double e2e = 0;                  // last event - submission
  std::vector<double> itl;         // gaps between consecutive token events/chunks
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = -1;      // prompt tokens served from the prefix cache; -1 unknown
  bool ids_known = false;          // output_ids holds every generated id
  std::vector<int32_t> output_ids;
  std::string text;
};

// Numbers the run loop measured besides the per-request results.
struct RunExtras {
  double duration = 0;             // seconds from the first submission to the last finish
  double peak_kv_usage = -1;       // 0..1; -1 unknown
  int64_t num_preemptions = -1;    // -1 unknown
  double steady_decode_tokens = 0; // offline: tokens produced in steady decode steps
  double steady_decode_time = 0;   //          and their wall time; 0 -> unknown
};

struct Summary {
  std::string mode;                // "offline" or "server"
  std::string workload;
  std::string model;
  int num_prompts = 0;
  int max_concurrency = 0;         // 0: unlimited
  double request_rate = std::numeric_limits<double>::infinity();
  uint64_t seed = 0;
  int completed = 0, failed = 0;
  std::string first_error;
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double request_throughput = 0, output_tokens_per_s = 0, total_tokens_per_s = 0;
  double steady_decode_tokens_per_s = -1;  // -1: not measured
  double ttft_ms_mean = 0, ttft_ms_p50 = 0, ttft_ms_p99 = 0;
  double tpot_ms_mean = 0, tpot_ms_p50 = 0, tpot_ms_p99 = 0;
  double itl_ms_mean = 0, itl_ms_p50 = 0, itl_ms_p99 = 0;
  double e2el_ms_mean = 0, e2el_ms_p50 = 0, e2el_ms_p99 = 0;
  double prefix_hit_rate = -1;     // 0..1 over successful requests; -1 unknown
  double peak_kv_usage = -1;       // 0..1; -1 unknown
  int64_t num_preemptions = -1;
  int64_t kv_cache_blocks = -1;    // offline: the engine's KV pool in blocks (-1: unknown, a server)
  int64_t kv_cache_bytes = -1;     // and in bytes
  bool output_hash_known = false;
  uint64_t output_hash = 0;        // xxh3-64 over (count, ids) of each request in order
  uint64_t output_text_hash = 0;   // xxh3-64 over (size, bytes) of each request's text in order
  // The samples (seconds) behind the latency statistics, over successful requests.
  std::vector<double> ttfts, tpots, itls, e2els;
  // vLLM's peak: the most tokens that arrived within one second of the run (buckets
  // from the first submission), and the most requests in flight in any such second.
  double max_output_tokens_per_s = 0;
  int64_t max_concurrent_requests = 0;
};

Summary summarize(const std::vector<RequestResult>& results, const RunExtras& extras);

// vLLM's --percentile-metrics / --metric-percentiles: which latencies are reported
// (ttft, tpot, itl, e2el) and at which percentiles.
struct MetricSelection {
  std::vector<std::string> metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> percentiles = {99};
};
// "ttft,tpot" -> names (each known, no repeats); "" or an error naming the flag.
// vLLM's key for percentile p: "p99", "p99.9".
std::string percentile_word(double p);

// The vLLM-style text block (latency sections as selected).
std::string format_report(const Summary& s, const MetricSelection& sel = {});
// One JSON object (see docs/serving-bench.md for the fields).
std::string format_json(const Summary& s);

// What vLLM's --save-result file says about the run besides the Summary.
struct ResultMeta {
  std::string date;                // YYYYmmdd-HHMMSS
  std::string backend = "openai";  // vLLM's --backend: openai (completions) or openai-chat
  std::string label;               // --label; "" -> null
  std::string model_id;
  std::string tokenizer_id;
  int num_prompts = 0;
  bool detailed = false;           // --save-detailed: per-request lists too
};
// The --save-result JSON: vLLM's keys (date, backend, model_id, num_prompts, request_rate,
// burstiness, max_concurrency, duration, completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput, total_token_throughput,
// max_output_tokens_per_s, max_concurrent_requests, mean_/median_/std_/pNN_<metric>_ms),
// then pagoda's (prefix_hit_rate, peak_kv_usage, num_preemptions, output hashes).
std::string format_vllm_result(const Summary& s, const MetricSelection& sel, const ResultMeta& meta,
                               const std::vector<RequestResult>& results);
// The current time through strftime(format), in UTC or local time.
std::string time_string(const char* format, bool utc);

// vLLM's default file name: LABEL-RATEqps[-concurrencyC]-MODEL-DATE.json (MODEL: the
// last path component of the model id).
std::string default_result_filename(const std::string& label, double request_rate, int max_concurrency,
                                    const std::string& model_id, const std::string& date);

}  // namespace pagoda::loadgen
