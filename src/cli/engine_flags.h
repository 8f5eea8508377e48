// Flags shared by every command that builds an Engine (serve, bench workloads),
// spelled as vLLM and llama.cpp users know them. Each flag may also come from a
// PAGODA_* environment variable (PAGODA_KV_CACHE_MEMORY for --kv-cache-memory).
#pragma once
#include <string>
#include <vector>

#include "engine/engine.h"

namespace pagoda::cli {

// The one argument parser of every subcommand: --name VALUE, --name=VALUE,
// boolean --name, positional arguments (the model path), and PAGODA_<NAME>
// environment variables for any flag. Flags are taken by name as a command asks
// for them; what nobody took is an error naming it (leftover()). A `--` flag may
// be spelled with underscores (--max_num_seqs, --n_prompt), as vLLM's and
// llama-bench's parsers allow.
class Args {
 public:
  Args(int argc, char** argv);
  // True if a boolean flag is present (or PAGODA_<NAME>=1/true).
  bool flag(const std::string& name, const std::string& alias = "");
  // Value of an option (or its PAGODA_* env var); empty if absent.
  bool value(const std::string& name, std::string* out, const std::string& alias = "");
  // Every value of a repeatable option (--stop A --stop B), in order; none from the environment.
  std::vector<std::string> values(const std::string& name);
  // Every value of a repeatable option under any of its spellings, in command-line
  // order (llama-bench's `-n 0,128 --n-gen 32` gives {"0,128", "32"}); when none is
  // given, PAGODA_<NAME> (of `name`) as the one value.
  std::vector<std::string> list(const std::string& name, const std::vector<std::string>& aliases = {});
  // A flag whose value is optional and one of `choices` (llama.cpp's `-fa [on|off|auto]`):
  // true when present; *out is the value, or "" when the flag came alone.
  bool optional_value(const std::string& name, const std::string& alias, const std::vector<std::string>& choices,
                      std::string* out);
  // The arguments not starting with '-' that no flag took as its value; call after
  // every flag was read. They are consumed.
  std::vector<std::string> positionals();
  // Error text for anything not consumed ("unknown flag --x", "unexpected argument
  // 'x'"); empty if all were used. flags_only: only unconsumed '-' arguments count.
  std::string leftover(bool flags_only = false) const;
  bool help() const { return help_; }
  bool version() const { return version_; }  // --version / -V

  // Engine-flag state that waits for the positional model path (finish_engine_flags).
  double gpu_memory_utilization = 0;  // --gpu-memory-utilization, applied once the model is known
  bool kv_size_given = false;         // --kv-cache-memory / --num-kv-blocks (win over the fraction)

 private:
  // value (choices == nullptr: the value is the next argument) and optional_value.
  bool take(const std::string& name, const std::string& alias, const std::vector<std::string>* choices,
            std::string* out);
  // values and list: every `NAME VALUE` / `NAME=VALUE` of any of `names`, in order.
  std::vector<std::string> take_all(const std::vector<std::string>& names);
  std::vector<std::string> a_;
  std::vector<bool> used_;
  bool help_ = false;
  bool version_ = false;
};

// Parses a byte size: "123", "512MiB", "2GiB", "1.5GB" (GB = 1e9, GiB = 2^30).
bool parse_bytes(const std::string& s, int64_t* out);

// pagoda's KV dtype names (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1;
// base/kv_dtype.h) and vLLM's "auto" (f16 here).
bool parse_kv_dtype_name(const std::string& s, KvDtype* out);

// llama.cpp's -ctk / -ctv (each f16 unless given; nullptr = not given) as the
// cache's K and V types. Returns "" or an error naming the flag of an unknown name.
std::string kv_dtype_from_ctk_ctv(const std::string* k, const std::string* v, KvTypes* out);

// Reads the engine flags into cfg. Returns "" or an error message. GPU flags of
// vLLM and llama.cpp are accepted: --gpu-memory-utilization F sizes the KV pool
// as F x RAM minus the weights; -ngl, -fa, --enforce-eager, --dtype and
// --tensor-parallel-size 1 are accepted with a one-line warning each.
std::string parse_engine_flags(Args& args, engine::EngineConfig* cfg);
// After every flag of the command was read: the positional model path (`pagoda
// serve MODEL`), the KV budget of --gpu-memory-utilization, and the leftover
// check. Returns "" or an error message.
std::string finish_engine_flags(Args& args, engine::EngineConfig* cfg);
// vLLM's and llama.cpp's GPU-only flags (part of parse_engine_flags; `run` calls it alone).
std::string parse_gpu_flags(Args& args);
// --log-level debug|info|warn|error|off and -v/--verbose (debug). "" or an error.
std::string parse_log_flags(Args& args);
extern const char* kEngineFlagsHelp;
extern const char* kLogFlagsHelp;

}  // namespace pagoda::cli
