#include "cli/speculative_flags.h"

#include <nlohmann/json.hpp>

namespace pagoda::cli {

namespace {
std::string finish(engine::SpeculativeConfig* out, const engine::SpeculativeConfig& c) {
  if (std::string e = engine::check_speculative_config(c); !e.empty()) return "--speculative-config: " + e;
  *out = c;
  return "";
}
}  // namespace

std::string parse_speculative_config_json(const std::string& json, engine::SpeculativeConfig* out) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return "--speculative-config must be a JSON object, got '" + json + "'";
  engine::SpeculativeConfig c;
  bool have_min = false, have_max = false, have_k = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "method") {
      if (!v.is_string() || v.get<std::string>() != "ngram")
        return "--speculative-config: method " + v.dump() + " is not supported (pagoda has \"ngram\", prompt lookup)";
      continue;
    }
    if (key == "adaptive_length") {  // pagoda's: false drafts every proposed token (no timing)
      if (!v.is_boolean()) return "--speculative-config: adaptive_length must be true or false, got " + v.dump();
      c.adaptive_length = v.get<bool>();
      continue;
    }
    int* dst = key == "num_speculative_tokens" ? &c.num_speculative_tokens
               : key == "prompt_lookup_max"    ? &c.prompt_lookup_max
               : key == "prompt_lookup_min"    ? &c.prompt_lookup_min
                                               : nullptr;
    if (!dst) return "--speculative-config: unknown key \"" + key + "\"";
    if (!v.is_number_integer()) return "--speculative-config: " + key + " must be an integer, got " + v.dump();
    const auto n = v.get<long long>();
    if (n < 0 || n > 1 << 20) return "--speculative-config: " + key + " out of range: " + v.dump();
    *dst = static_cast<int>(n);
    (key == "num_speculative_tokens" ? have_k : key == "prompt_lookup_max" ? have_max : have_min) = true;
  }
  if (!j.contains("method")) return "--speculative-config needs \"method\": \"ngram\"";
  if (!have_k) return "--speculative-config needs num_speculative_tokens";
  if (have_max && !have_min) c.prompt_lookup_min = c.prompt_lookup_max;
  if (have_min && !have_max) c.prompt_lookup_max = c.prompt_lookup_min;
  return finish(out, c);
}

std::string parse_speculative_ngram(const std::string& value, engine::SpeculativeConfig* out) {
  engine::SpeculativeConfig c;
  char* end = nullptr;
  const long k = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end || k < 0 || k > engine::kMaxSpeculativeTokens)
    return "--speculative-ngram must be an integer in 0.." + std::to_string(engine::kMaxSpeculativeTokens) +
           ", got '" + value + "'";
  c.num_speculative_tokens = static_cast<int>(k);
  return finish(out, c);
}

std::string parse_speculative_flags(Args& args, engine::SpeculativeConfig* c) {
  std::string json, k;
  const bool have_json = args.value("--speculative-config", &json);
  const bool have_k = args.value("--speculative-ngram", &k);
  if (have_json && have_k) return "give either --speculative-config or --speculative-ngram, not both";
  if (have_json) return parse_speculative_config_json(json, c);
  if (have_k) return parse_speculative_ngram(k, c);
  return "";
}

}  // namespace pagoda::cli
