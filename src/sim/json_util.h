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

// The named tables of data_dir() (models.json's "models", hardware.json's
// "hardware"): `file` holds an object whose `section` is an object of entries.
struct Entry {
  std::string key;  // the entry's name as the file spells it
  json obj;
};
// The entry names in file order; empty when the file is missing or malformed.
std::vector<std::string> list_entries(const char* file, const char* section);
// The entry whose name matches `name` (match_name; `what` names the table in errors).
Expected<Entry> find_entry(const char* file, const char* section, const std::string& name, const char* what);

}  // namespace pagoda::sim::detail
