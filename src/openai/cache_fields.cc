#include "openai/cache_fields.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "openai/errors.h"

namespace pagoda::server {
namespace {
ApiError bad(std::string msg, std::string param) {
  return ApiError{400, std::move(msg), "invalid_request_error", std::move(param), "invalid_value"};
}
}  // namespace

std::optional<double> parse_duration_s(std::string_view s) {
  if (s.size() < 2 || s.size() > 12) return std::nullopt;
  double unit = 0;
  switch (s.back()) {
    case 's': unit = 1; break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: return std::nullopt;
  }
  int64_t n = 0;
  for (char c : s.substr(0, s.size() - 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');  // at most 11 digits: no overflow
  }
  const double v = static_cast<double>(n) * unit;
  if (n <= 0 || v > kMaxRetentionS) return std::nullopt;
  return v;
}

std::optional<ApiError> parse_priority(const nlohmann::json& body, int* priority) {
  auto it = body.find("priority");
  if (it == body.end() || it->is_null()) return std::nullopt;
  constexpr int64_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  // [lo, hi], as a literal: GCC 12's -Wrestrict misfires on "[" + std::to_string(..).
  const std::string range = "[-2147483648, 2147483647]";
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!(std::isfinite(d) && d == std::floor(d))) return bad("'priority' must be an integer", "priority");
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
      return bad("'priority' is outside " + range, "priority");
    *priority = static_cast<int>(d);
    return std::nullopt;
  }
  if (!it->is_number_integer()) return bad("'priority' must be an integer", "priority");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi))
    return bad("'priority' is outside " + range, "priority");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return bad("'priority' is " + std::to_string(v) + ", outside " + range, "priority");
  *priority = static_cast<int>(v);
  return std::nullopt;
}

std::optional<ApiError> parse_cache_fields(const nlohmann::json& body, CacheFields* out) {
  if (auto it = body.find("prompt_cache_retention"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      return bad("'prompt_cache_retention' must be a string: \"in_memory\", \"24h\" or a duration like \"30m\"",
                 "prompt_cache_retention");
    const std::string v = it->get<std::string>();
    std::optional<double> ttl = v == "in_memory" ? std::optional<double>(kInMemoryRetentionS) : parse_duration_s(v);
    if (!ttl)
      return bad("'prompt_cache_retention' is '" + v.substr(0, 32) +
                     "': expected \"in_memory\", \"24h\" or a duration like \"300s\", \"30m\", \"1h\" (at most 7d)",
                 "prompt_cache_retention");
    out->pin_prompt = true;
    out->pin_ttl_s = *ttl;
  }
  if (auto it = body.find("prompt_cache_key"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad("'prompt_cache_key' must be a string", "prompt_cache_key");
    out->prompt_cache_key = it->get<std::string>();
    if (out->prompt_cache_key.size() > kMaxPromptCacheKeyBytes)
      return bad("'prompt_cache_key' is " + std::to_string(out->prompt_cache_key.size()) + " bytes; the limit is " +
                     std::to_string(kMaxPromptCacheKeyBytes),
                 "prompt_cache_key");
  }
  return std::nullopt;
}

}  // namespace pagoda::server
