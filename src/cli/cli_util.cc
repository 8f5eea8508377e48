#include "cli/cli_util.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/engine_flags.h"

namespace pagoda::cli {

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_i64(const char* s, int64_t* out) { return parse_int(s, INT64_MIN, INT64_MAX, out); }

bool parse_f64(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end) return false;
  *out = v;
  return true;
}

std::string int_option(Args& args, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  std::string v;
  if (!args.value(name, &v)) return "";
  if (!parse_int(v, lo, hi, out)) {
    return std::string(name) + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
           ", got '" + v + "'";
  }
  return "";
}

std::string int_option(Args& args, const char* name, int64_t lo, int64_t hi, int* out) {
  int64_t n = *out;
  std::string err = int_option(args, name, lo, hi, &n);
  if (err.empty()) *out = static_cast<int>(n);
  return err;
}

bool KvDtypeFlags::take(const std::string& flag, const char* value, bool* ok) {
  if (flag == "--kv-dtype" || flag == "--kv-cache-dtype") {
    KvDtype d{};
    *ok = parse_kv_dtype_name(value, &d);
    if (*ok) dtype_ = d;
  } else if (flag == "-ctk" || flag == "--cache-type-k") {
    k_ = value;
  } else if (flag == "-ctv" || flag == "--cache-type-v") {
    v_ = value;
  } else {
    return false;
  }
  return true;
}

std::string KvDtypeFlags::resolve(KvTypes* out) const {
  if (dtype_) *out = *dtype_;
  if (!k_ && !v_) return "";
  return kv_dtype_from_ctk_ctv(k_ ? &*k_ : nullptr, v_ ? &*v_ : nullptr, out);
}

std::string read_kv_dtype_flags(Args& args, KvTypes* out) {
  KvDtypeFlags kv_flags;
  std::string v;
  for (const char* name : {"--kv-dtype", "--kv-cache-dtype", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v"}) {
    bool ok = true;
    if (args.value(name, &v) && kv_flags.take(name, v.c_str(), &ok) && !ok) return "bad value '" + v + "' for " + name;
  }
  return kv_flags.resolve(out);
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

int threads_or_all(int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int print_usage(const char* usage, const char* more) {
  std::fputs(usage, stdout);
  std::fputs(more, stdout);
  return 0;
}

std::optional<int> help_or_usage_error(const char* cmd, bool help, const std::string& err, const char* usage) {
  if (help) return print_usage(usage);
  if (err.empty()) return std::nullopt;
  std::fprintf(stderr, "pagoda %s: %s\n\n%s", cmd, err.c_str(), usage);
  return 2;
}

namespace {
// The handler only sets this flag (a lock-free atomic store is async-signal-safe);
// a watcher thread polls it and stops the server outside signal context.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
void on_signal(int sig) { g_signal.store(sig); }
}  // namespace

int run_until_signal(const std::function<void()>& run, const std::function<void()>& stop) {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load() && g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_signal.load() != 0) stop();
  });
  run();
  done = true;
  watcher.join();
  return 0;
}

}  // namespace pagoda::cli
