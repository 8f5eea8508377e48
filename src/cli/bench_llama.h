// pagoda bench, single-stream mode, spelled as llama.cpp's llama-bench: its flags
// (-m -p -n -pg -r -t -b -ub -o, each a comma list whose cross product is run in
// llama-bench's order), its test names (pp512, tg128, pp512+tg128), its output
// formats (md, csv, json, jsonl) with its column and field names, plus pagoda's
// extras (weight-read bandwidth, the greedy tokens hash) where they fit.
// Parsing and formatting live here, apart from the engine, so tests can check them.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/kv_dtype.h"

namespace pagoda::cli::llb {

// llama-bench's integer list: comma-separated items, each `first[-last[(+|*)step]]`
// ("128,512", "1-4", "64-512*2"). Appends to *out; returns "" or what is wrong.
std::string parse_int_range(const std::string& s, std::vector<int64_t>* out);

enum class Format { kMarkdown, kCsv, kJson, kJsonl };

struct Options {
  std::vector<std::string> models;
  std::vector<int64_t> n_prompt, n_gen, n_threads, n_batch, n_ubatch, n_depth;
  std::vector<std::pair<int64_t, int64_t>> n_pg;  // -pg PP,TG
  int64_t reps = 5;
  Format format = Format::kMarkdown;
  bool legacy_json = false;  // --json: pagoda's one-object summary (one pp and one tg test)
  KvTypes kv_dtype = KvDtype::F16;
  int64_t block_size = 16;
  int64_t state_checkpoint_interval = 4;  // hybrid models (EngineConfig::state_checkpoint_interval)
  int64_t seed = 1234;
  bool ctx_sweep = false;
  bool bandwidth = true;
  bool progress = false;  // llama-bench's --progress: one line per test on stderr
  bool warmup = true;
  std::vector<std::string> warnings;  // accepted flags that do nothing on a CPU
};

// llama-bench's defaults for lists left empty.
constexpr int64_t kDefaultPrompt = 512, kDefaultGen = 128, kDefaultBatch = 2048, kDefaultUbatch = 512;

// Parses argv (argv[0] is the subcommand) into *o and fills the defaults of the
// lists not given (models: default_model, threads: default_threads). Returns ""
// or an error that names the flag. -h sets *help.
std::string parse_options(int argc, char** argv, const std::string& default_model, int64_t default_threads,
                          Options* o, bool* help);

// One test: what llama-bench calls a cmd_params_instance.
struct Instance {
  std::string model;
  int64_t n_prompt = 0, n_gen = 0, n_batch = kDefaultBatch, n_ubatch = kDefaultUbatch, n_threads = 1;
  int64_t n_depth = 0;  // -d: tokens already in the context when the timed part starts
};
// The cross product in llama-bench's order: model, n_batch, n_ubatch, threads,
// depth (outer to inner), then the pp tests, the tg tests and the pp+tg pairs of
// each combination; 0 entries are skipped as llama-bench skips them.
std::vector<Instance> instances(const Options& o);
// "pp512", "tg128", "pp512+tg128", with " @ d1024" for a depth.
std::string test_name(int64_t n_prompt, int64_t n_gen, int64_t n_depth = 0);

// What a GGUF says about itself, for the model columns.
struct ModelDesc {
  std::string filename;   // as given on the command line
  std::string type;       // llama-bench's model_type: "ARCH SIZE TYPE", e.g. "llama 135M Q4_1"
  uint64_t size = 0;      // bytes of all tensors
  uint64_t n_params = 0;  // elements of all tensors
};

struct Result {
  Instance inst;
  ModelDesc model;
  std::string type_k, type_v;     // the K and V types ("f16", "q8_0", ...)
  std::string test_time;          // RFC 3339, UTC
  std::vector<uint64_t> samples_ns;
  // pagoda's extras
  uint64_t weight_bytes_per_token = 0;
  double read_gb_per_s = 0;       // the machine's read bandwidth at n_threads; 0: not measured
  std::string tokens_hash;        // tg: xxh3 of the greedy tokens, "0x..."; "" otherwise
  bool tokens_consistent = true;  // the same tokens in every repetition
  // tg: the CPU thread pool's stalls (a worker preempted by another process held
  // a loop up; the pool then ran loops on the caller alone for a while) and
  // long waits (stalls plus waits with no preemption: the host took a vCPU)
  // over the timed repetitions; text output only.
  int64_t pool_stalls = 0, pool_long_waits = 0;

  double avg_ns() const;
  double stddev_ns() const;
  std::vector<double> samples_ts() const;  // (n_prompt + n_gen) tokens / sample
  double avg_ts() const;
  double stddev_ts() const;
  // Weight bytes read per second of decode (tg tests only; else 0), and that
  // as a fraction of read_gb_per_s (0 when unknown).
  double weight_gb_per_s() const;
  double read_bw_fraction() const;
};

// llama-bench's field list (json/jsonl/csv), in its order; pagoda's fields follow.
const std::vector<std::string>& fields();

// The whole output of a run in the chosen format. `build_commit` fills that field.
std::string format_results(const std::vector<Result>& results, const Options& o, Format format,
                           const std::string& build_commit);

}  // namespace pagoda::cli::llb
