#include "base/log.h"
#include "base/log_control.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifndef PAGODA_VERSION
#define PAGODA_VERSION "0.0.0 (unknown commit)"
#endif

namespace pagoda {
namespace {
LogLevel initial_level() {
  const char* e = std::getenv("PAGODA_LOG_LEVEL");
  LogLevel l = LogLevel::kInfo;
  if (e) parse_log_level(e, &l);
  return l;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};

// One logger, made on first use (no static-initialization order to care about).
// stderr without colour codes: the lines are read by people and by tests alike.
spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto lg = std::make_shared<spdlog::logger>("pagoda", sink);
    lg->set_pattern("%Y-%m-%d %H:%M:%S.%e %-7l %v");  // 2026-12-02 05:50:44.123 info    message
    lg->set_level(spdlog::level::trace);                // the level check is ours (g_level)
    lg->flush_on(spdlog::level::trace);
    return lg;
  }();
  return *l;
}
}  // namespace

bool parse_log_level(const std::string& name, LogLevel* out) {
  if (name == "debug" || name == "trace") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warn" || name == "warning") *out = LogLevel::kWarn;
  else if (name == "error" || name == "critical") *out = LogLevel::kError;
  else if (name == "off") *out = LogLevel::kOff;
  else return false;
  return true;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) < g_level.load() || level == LogLevel::kOff) return;
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  std::string text;
  if (n >= static_cast<int>(sizeof small)) {
    std::vector<char> big(static_cast<size_t>(n) + 1);
    std::vsnprintf(big.data(), big.size(), fmt, ap2);
    text.assign(big.data(), static_cast<size_t>(n));
  } else if (n > 0) {
    text.assign(small, static_cast<size_t>(n));
  }
  va_end(ap2);
  static const spdlog::level::level_enum kLevels[] = {spdlog::level::debug, spdlog::level::info, spdlog::level::warn,
                                                      spdlog::level::err};
  logger().log(kLevels[static_cast<int>(level)], "{}", text);
}

const char* version_string() { return PAGODA_VERSION; }

}  // namespace pagoda
