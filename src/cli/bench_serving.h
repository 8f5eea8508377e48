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

// Arrival times in seconds from the start: 0 for the first, then exponential gaps
// of mean 1/rate (Poisson process). rate = inf: every request at 0.
std::vector<double> arrival_times(int n, double rate, uint64_t seed);

// Linear-interpolated percentile (numpy's default), p in [0, 100]; 0 for an empty set.
double percentile(std::vector<double> values, double p);

// What one request measured. Times in seconds.
struct RequestResult {
  bool ok = false;
  std::string error;
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
  bool output_hash_known = false;
  uint64_t output_hash = 0;        // xxh3-64 over (count, ids) of each request in order
  uint64_t output_text_hash = 0;   // xxh3-64 over (size, bytes) of each request's text in order
};

Summary summarize(const std::vector<RequestResult>& results, const RunExtras& extras);
// The vLLM-style text block.
std::string format_report(const Summary& s);
// One JSON object (see docs/serving-bench.md for the fields).
std::string format_json(const Summary& s);

struct RunOptions {
  int max_concurrency = 0;         // 0: unlimited
  double request_rate = std::numeric_limits<double>::infinity();
  uint64_t seed = 0;
  bool ignore_eos = true;
  // --report: the engine's counters after every step (offline) or each /metrics
  // scrape, every 100 ms (server); unset: nothing recorded.
  std::function<void(const engine::EngineStats&)> on_step;
  std::function<void(const std::string& metrics)> on_scrape;
};

// Runs the requests through one in-process engine (greedy). Results in request order.
std::vector<RequestResult> run_offline(engine::Engine& eng, const std::vector<BenchRequest>& requests,
                                       const RunOptions& opts, RunExtras* extras);

}  // namespace bench
}  // namespace pagoda::cli
