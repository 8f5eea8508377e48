// What the commands set about logging and what they report about the build: kept
// apart from base/log.h, which nearly every file includes, so that these rarely
// used declarations do not make every file depend on them.
#pragma once
#include <string>

#include "base/log.h"

namespace pagoda {

// "debug" (or "trace"), "info", "warn" (or "warning"), "error" (or "critical"),
// "off" -> level; false (and *out untouched) otherwise.
bool parse_log_level(const std::string& name, LogLevel* out);

// pagoda's version, "0.1.0 (commit abc1234)": the release number and the commit
// configured (for --version and GET /version).
const char* version_string();

}  // namespace pagoda
