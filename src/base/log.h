// Leveled logging to stderr with timestamps (spdlog underneath; one line per
// message, flushed at once so a supervisor or a test sees it immediately).
// The level comes from PAGODA_LOG_LEVEL=debug|info|warn|error|off or
// set_log_level (`--log-level` of the commands).
#pragma once
#include <cstdarg>
#include <string>

namespace pagoda {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
void set_log_level(LogLevel level);
LogLevel log_level();
// "debug", "info", "warn" (or "warning"), "error", "off" -> level; false otherwise.
bool parse_log_level(const std::string& name, LogLevel* out);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// pagoda's version ("0.1.0 (commit abc1234)"), for --version and GET /version.
const char* version_string();

}  // namespace pagoda

#define PAGODA_LOG_DEBUG(...) ::pagoda::log_message(::pagoda::LogLevel::kDebug, __VA_ARGS__)
#define PAGODA_LOG_INFO(...) ::pagoda::log_message(::pagoda::LogLevel::kInfo, __VA_ARGS__)
#define PAGODA_LOG_WARN(...) ::pagoda::log_message(::pagoda::LogLevel::kWarn, __VA_ARGS__)
#define PAGODA_LOG_ERROR(...) ::pagoda::log_message(::pagoda::LogLevel::kError, __VA_ARGS__)
