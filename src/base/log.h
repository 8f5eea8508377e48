// Minimal leveled logging to stderr. PAGODA_LOG_LEVEL=debug|info|warn|error.
#pragma once
#include <cstdarg>

namespace pagoda {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace pagoda

#define PAGODA_LOG_DEBUG(...) ::pagoda::log_message(::pagoda::LogLevel::kDebug, __VA_ARGS__)
#define PAGODA_LOG_INFO(...) ::pagoda::log_message(::pagoda::LogLevel::kInfo, __VA_ARGS__)
#define PAGODA_LOG_WARN(...) ::pagoda::log_message(::pagoda::LogLevel::kWarn, __VA_ARGS__)
#define PAGODA_LOG_ERROR(...) ::pagoda::log_message(::pagoda::LogLevel::kError, __VA_ARGS__)
