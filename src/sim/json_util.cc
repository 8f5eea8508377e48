#include "sim/json_util.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "sim/model_desc.h"

namespace pagoda::sim::detail {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Expected<json> read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return errorf("%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    return errorf("%s: invalid JSON: %s", path.c_str(), e.what());
  }
}

Expected<int64_t> get_int(const json& obj, const char* key, int64_t def, const std::string& ctx,
                          int64_t lo, int64_t hi) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  int64_t v = 0;
  if (it->is_number_integer() || it->is_number_unsigned()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return errorf("%s: %s is too large", ctx.c_str(), key);
    }
    v = it->get<int64_t>();
  } else if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!(std::fabs(d) < 9.2e18) || d != std::floor(d)) {
      return errorf("%s: %s = %g is not an integer", ctx.c_str(), key, d);
    }
    v = static_cast<int64_t>(d);
  } else if (it->is_boolean()) {
    v = it->get<bool>() ? 1 : 0;
  } else {
    return errorf("%s: %s must be an integer", ctx.c_str(), key);
  }
  if (v < lo || v > hi) {
    return errorf("%s: %s = %lld out of range [%lld, %lld]", ctx.c_str(), key, static_cast<long long>(v),
                  static_cast<long long>(lo), static_cast<long long>(hi));
  }
  return v;
}

Expected<int64_t> get_required_int(const json& obj, const char* key, const std::string& ctx,
                                   int64_t lo, int64_t hi) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return errorf("%s: %s is missing", ctx.c_str(), key);
  return get_int(obj, key, 0, ctx, lo, hi);
}

Expected<double> get_number(const json& obj, const char* key, double def, const std::string& ctx) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_number()) return errorf("%s: %s must be a number", ctx.c_str(), key);
  return it->get<double>();
}

Expected<std::string> get_string(const json& obj, const char* key, const std::string& def,
                                 const std::string& ctx) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_string()) return errorf("%s: %s must be a string", ctx.c_str(), key);
  return it->get<std::string>();
}

bool get_bool(const json& obj, const char* key, bool def) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_boolean()) return def;
  return it->get<bool>();
}

Expected<std::string> match_name(const std::vector<std::string>& names, const std::string& want,
                                 const char* what) {
  const std::string w = lower(want);
  std::vector<std::string> prefix;
  for (const auto& n : names) {
    const std::string l = lower(n);
    if (l == w) return n;
    if (!w.empty() && l.compare(0, w.size(), w) == 0) prefix.push_back(n);
  }
  if (prefix.size() == 1) return prefix[0];
  std::string all;
  for (const auto& n : (prefix.empty() ? names : prefix)) all += (all.empty() ? "" : ", ") + n;
  if (prefix.size() > 1) return errorf("%s '%s' is ambiguous: %s", what, want.c_str(), all.c_str());
  return errorf("unknown %s '%s' (known: %s)", what, want.c_str(), all.c_str());
}

namespace {

Expected<json> read_section(const char* file, const char* section) {
  const std::string path = data_dir() + "/" + file;
  PAGODA_ASSIGN_OR_RETURN(json j, read_json_file(path));
  if (!j.is_object() || !j.contains(section) || !j[section].is_object()) {
    return errorf("%s: expected an object with a \"%s\" object", path.c_str(), section);
  }
  return std::move(j[section]);
}

std::vector<std::string> keys(const json& table) {
  std::vector<std::string> names;
  for (auto it = table.begin(); it != table.end(); ++it) names.push_back(it.key());
  return names;
}

}  // namespace

std::vector<std::string> list_entries(const char* file, const char* section) {
  auto t = read_section(file, section);
  return t.ok() ? keys(t.value()) : std::vector<std::string>{};
}

Expected<Entry> find_entry(const char* file, const char* section, const std::string& name, const char* what) {
  PAGODA_ASSIGN_OR_RETURN(json t, read_section(file, section));
  PAGODA_ASSIGN_OR_RETURN(std::string key, match_name(keys(t), name, what));
  if (!t[key].is_object()) return errorf("%s %s: expected an object", file, key.c_str());
  return Entry{key, std::move(t[key])};
}

}  // namespace pagoda::sim::detail
