// Small helpers every subcommand needs: number parsing, byte sizes for people,
// the default thread count and the usual -h / parse-error exit. One copy here
// instead of one per cmd_*.cc.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/human_bytes.h"  // human_bytes: "512 B", "1.5 KiB", "12.34 MiB", "1.25 GiB"
#include "base/kv_dtype.h"

namespace pagoda::cli {

class Args;  // cli/engine_flags.h

// A whole decimal integer in [lo, hi]. False (and *out untouched) on empty
// text, trailing characters, overflow or a value out of range.
bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out);
// The same over the whole int64 range.
bool parse_i64(const char* s, int64_t* out);
// A decimal floating-point number (strtod syntax); false on empty text or trailing characters.
bool parse_f64(const std::string& s, double* out);

// An integer option NAME of `args` in [lo, hi] into *out (left alone when the
// option is absent). Returns "" or "NAME must be an integer in LO..HI, got 'V'".
std::string int_option(Args& args, const char* name, int64_t lo, int64_t hi, int64_t* out);
std::string int_option(Args& args, const char* name, int64_t lo, int64_t hi, int* out);

// The KV dtype flags of `run` and `bench`: --kv-dtype / --kv-cache-dtype, and
// llama.cpp's -ctk / -ctv, which are resolved together once all are read.
class KvDtypeFlags {
 public:
  // True when `flag` is one of them (its value taken; *ok false on a bad name).
  bool take(const std::string& flag, const char* value, bool* ok);
  // After the last flag: "" or an error; *out gets the dtype asked for, and
  // stays as it is when none was.
  std::string resolve(KvTypes* out) const;

 private:
  std::optional<KvDtype> dtype_;
  std::optional<std::string> k_, v_;  // -ctk, -ctv
};

// Reads --kv-dtype / --kv-cache-dtype / -ctk / -ctv from `args` (through KvDtypeFlags)
// into *out, left as it is when none is given. Returns "" or an error naming the flag.
std::string read_kv_dtype_flags(Args& args, KvTypes* out);

// The whole file at `path` into *out (bytes as they are); false when it cannot be read.
bool read_file(const std::string& path, std::string* out);

// The -t / --threads default: `requested` when > 0, else every hardware thread (at least 1).
int threads_or_all(int64_t requested);

// -h: `usage` then `more` (e.g. kEngineFlagsHelp) on stdout; returns 0, the exit code.
int print_usage(const char* usage, const char* more = "");

// What every subcommand does after parsing its arguments: with -h, the usage on
// stdout and exit 0; on a parse error, "pagoda CMD: ERROR" and the usage on
// stderr and exit 2. nullopt: go on.
std::optional<int> help_or_usage_error(const char* cmd, bool help, const std::string& err, const char* usage);

// serve's and router's main loop: SIGINT/SIGTERM call `stop` (from a watcher
// thread, outside signal context), SIGPIPE is ignored, `run` blocks until the
// server stops. Returns 0, the exit code.
int run_until_signal(const std::function<void()>& run, const std::function<void()>& stop);

}  // namespace pagoda::cli
