// The request fields that ask the cache and the scheduler for something (issue 36):
// vLLM's `priority`, OpenAI's `prompt_cache_retention` and `prompt_cache_key`.
// Pure parsing over JSON; the scheduler and the KV manager honour what lands in
// sample::RequestParams (priority, pin_tokens, pin_ttl_s).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace pagoda::server {

struct ApiError;

// prompt_cache_retention "in_memory" (OpenAI's default policy): the prompt stays
// pinned for this long after its last use, as Anthropic's default ephemeral cache.
inline constexpr double kInMemoryRetentionS = 300;
// The longest retention a request may ask for: 7 days.
inline constexpr double kMaxRetentionS = 7 * 24 * 3600.0;
inline constexpr size_t kMaxPromptCacheKeyBytes = 1024;

// "300s", "30m", "1h", "24h", "2d" (a positive integer and one unit) -> seconds;
// nullopt for anything else (no unit, a fraction, zero, past kMaxRetentionS).
std::optional<double> parse_duration_s(std::string_view s);

struct CacheFields {
  bool pin_prompt = false;        // prompt_cache_retention given: pin the whole prompt
  double pin_ttl_s = 0;
  std::string prompt_cache_key;   // "" when absent
};

// `priority`: an integer in [INT32_MIN, INT32_MAX] (lower is served first) -> *priority.
std::optional<ApiError> parse_priority(const nlohmann::json& body, int* priority);
// prompt_cache_retention ("in_memory", "24h" or a duration) and prompt_cache_key (a
// string of at most kMaxPromptCacheKeyBytes). Errors name the field.
std::optional<ApiError> parse_cache_fields(const nlohmann::json& body, CacheFields* out);

}  // namespace pagoda::server
