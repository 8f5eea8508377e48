// Internal to sim/: reading JSON data files without letting nlohmann exceptions
// escape (errors are values).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace pagoda::sim::detail {

using nlohmann::json;

// Parses the file; the error names the path and the parser's message.
Expected<json> read_json_file(const std::string& path);

// Integer field (JSON integer, or a float with an integral value such as 1.5e9 for
// bytes); `def` when missing or null. Error on the wrong type or out of [lo, hi].
Expected<int64_t> get_int(const json& obj, const char* key, int64_t def, const std::string& ctx,
                          int64_t lo = 0, int64_t hi = INT64_MAX);
// Like get_int, but a missing or null field is an error naming it.
Expected<int64_t> get_required_int(const json& obj, const char* key, const std::string& ctx,
                                   int64_t lo = 0, int64_t hi = INT64_MAX);
Expected<double> get_number(const json& obj, const char* key, double def, const std::string& ctx);
Expected<std::string> get_string(const json& obj, const char* key, const std::string& def,
                                 const std::string& ctx);
bool get_bool(const json& obj, const char* key, bool def);

// Case-insensitive exact match, else the unique case-insensitive prefix match.
Expected<std::string> match_name(const std::vector<std::string>& names, const std::string& want,
                                 const char* what);

std::string lower(std::string s);

}  // namespace pagoda::sim::detail
