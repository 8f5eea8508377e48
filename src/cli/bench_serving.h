// pagoda bench (serving mode): vLLM benchmark_serving-style workloads, run either
// offline through one in-process Engine or against any OpenAI-compatible server
// over HTTP (--server URL), reporting one metrics block (TTFT, TPOT, ITL,
// throughput, KV usage, prefix hit rate, preemptions, output hash).
// See docs/serving-bench.md for every flag and metric definition.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace pagoda::tok { class Tokenizer; }
namespace pagoda::engine { class Engine; struct EngineStats; }

namespace pagoda::cli {

// Entry point of the serving benchmark; argv[0] is the subcommand name ("bench").
int bench_serving_main(int argc, char** argv);

namespace bench {

// Which ids a random prompt may hold.
struct TokenSpace {
  int32_t bos = -1;                // prepended to every prompt when >= 0 (counts in the length)
  std::vector<int32_t> ordinary;   // normal/byte/user-defined ids: no control, unknown, unused or end-of-generation ids
};
TokenSpace token_space(const tok::Tokenizer& tk);

struct BenchRequest {
  std::vector<int32_t> prompt;     // token ids, BOS included
  int32_t max_tokens = 0;
  std::string text;                // the prompt as text when a dataset gave it (the chat endpoint sends
                                   // it; else the ids, decoded)
};

// N requests; prompt and output lengths uniform in [L*(1-r), L*(1+r)] (at least 1).
// Same arguments -> same requests. Precondition: space.ordinary non-empty.
std::vector<BenchRequest> make_random_workload(const TokenSpace& space, int num_prompts, int input_len, int output_len,
                                               double range_ratio, uint64_t seed);

// G random prefixes of P tokens (BOS included), each followed by R distinct random
// Q-token suffixes; the G*R requests are shuffled with the seed.
std::vector<BenchRequest> make_shared_prefix_workload(const TokenSpace& space, int num_groups, int prompts_per_group,
                                                      int prefix_len, int suffix_len, int output_len, uint64_t seed);

// JSONL of {"prompt": str, "max_tokens": int}; prompts encoded with the model's
// special tokens (BOS). max_tokens absent -> default_max_tokens. Keeps the first
// num_prompts lines (all when <= 0). Blank lines are skipped.
Expected<std::vector<BenchRequest>> load_dataset(const std::string& path, const tok::Tokenizer& tk,
                                                 int default_max_tokens, int num_prompts);

// vLLM's ShareGPT dataset: a JSON list of {"conversations": [{"from": "human", "value": P},
// {"from": "gpt", "value": C}, ...]}. Entries with fewer than two turns are skipped;
// the rest are shuffled with the seed (unless !shuffle); each gives prompt P (encoded
// with BOS) and max_tokens = the token count of C, or output_len when > 0. As vLLM,
// pairs with a prompt or completion under 4 tokens (the completion only when its length
// is not fixed), a prompt over 1024 or a total over 2048 tokens are skipped; when fewer
// than num_prompts remain, seeded picks of them repeat until there are num_prompts.
Expected<std::vector<BenchRequest>> load_sharegpt(const std::string& path, const tok::Tokenizer& tk, int num_prompts,
                                                  int output_len, uint64_t seed, bool shuffle);

// Arrival times in seconds from the start: 0 for the first, then exponential gaps
// of mean 1/rate (Poisson process). rate = inf: every request at 0.
std::vector<double> arrival_times(int n, double rate, uint64_t seed);

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
std::string parse_percentile_metrics(const std::string& s, std::vector<std::string>* out);
// "50,90,99" -> numbers in [0, 100]; "" or an error naming the flag.
std::string parse_metric_percentiles(const std::string& s, std::vector<double>* out);
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

// The serving benchmark's command line: pagoda's flags and vLLM `bench serve`'s.
struct ServingConfig {
  engine::EngineConfig engine;     // offline engine; its model_path is the tokenizer in server mode
  std::string workload;            // random | shared-prefix | sharegpt | jsonl
  std::string dataset_path;        // sharegpt JSON or pagoda's JSONL
  bool vllm_dataset = false;       // given as --dataset-name (vLLM's defaults and names)
  std::string server_url;          // "" -> offline
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string backend = "openai";  // openai | vllm (completions), openai-chat (chat)
  std::string model_name;          // the request's "model"; "" -> first of GET /v1/models
  std::string api_key, label;
  int num_prompts = 64, input_len = 128, output_len = 128, num_groups = 4, prompts_per_group = 8,
      prefix_len = 256, suffix_len = 32, max_concurrency = 0;
  int sharegpt_output_len = 0;     // > 0: fixed output lengths for sharegpt
  bool num_prompts_given = false, shuffle = true;
  int64_t seed = 0;
  double range_ratio = 0, request_rate = std::numeric_limits<double>::infinity(), request_timeout_s = 600;
  bool ignore_eos = true;
  bool as_json = false, progress = true;
  bool save_result = false, save_detailed = false;
  bool append_result = false;      // --append-result: one more JSON line in the file (implies saving)
  std::string result_dir, result_filename;
  std::string report_path;         // --report FILE.html: the run's time series (cli/run_report.h)
  std::string save_prompts_path;   // --save-prompts FILE.jsonl: write the workload (--dataset format), run nothing
  MetricSelection selection;
};
// argv[0] is the subcommand. Returns "" or an error naming the flag; *help on -h.
std::string parse_serving_args(int argc, char** argv, ServingConfig* c, bool* help);

// Runs the requests through one in-process engine (greedy). Results in request order.
std::vector<RequestResult> run_offline(engine::Engine& eng, const std::vector<BenchRequest>& requests,
                                       const RunOptions& opts, RunExtras* extras);

}  // namespace bench
}  // namespace pagoda::cli
