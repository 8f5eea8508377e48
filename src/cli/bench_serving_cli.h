// pagoda bench (serving mode): the command line of the serving benchmark (pagoda's
// flags and vLLM `bench serve`'s). The workloads, the runs (in-process through one
// Engine, or against any OpenAI-compatible server over HTTP) and the report are
// src/loadgen/; see docs/serving-bench.md for every flag and metric definition.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "loadgen/report.h"

namespace pagoda::cli {

// Entry point of the serving benchmark; argv[0] is the subcommand name ("bench").
int bench_serving_main(int argc, char** argv);

namespace bench {

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
  loadgen::MetricSelection selection;
};
// argv[0] is the subcommand. Returns "" or an error naming the flag; *help on -h.
std::string parse_serving_args(int argc, char** argv, ServingConfig* c, bool* help);
// "ttft,tpot" -> names (each known, no repeats); "" or an error naming the flag.
std::string parse_percentile_metrics(const std::string& s, std::vector<std::string>* out);
// "50,90,99" -> numbers in [0, 100]; "" or an error naming the flag.
std::string parse_metric_percentiles(const std::string& s, std::vector<double>* out);

}  // namespace bench
}  // namespace pagoda::cli
