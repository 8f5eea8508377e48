#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pagoda {
namespace {
LogLevel initial_level() {
  const char* e = std::getenv("PAGODA_LOG_LEVEL");
  if (!e) return LogLevel::kInfo;
  if (!std::strcmp(e, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(e, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(e, "error")) return LogLevel::kError;
  if (!std::strcmp(e, "off")) return LogLevel::kOff;
  return LogLevel::kInfo;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};
std::mutex g_mu;
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) < g_level.load()) return;
  static const char* names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "[pagoda %s] ", names[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

}  // namespace pagoda
