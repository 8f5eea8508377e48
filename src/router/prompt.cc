#include "router/prompt.h"

#include <variant>

#include <nlohmann/json.hpp>

namespace pagoda::router {

std::vector<int32_t> routing_prompt(server::Endpoint ep, const std::string& body, const server::TextCodec* codec) {
  // Replicas may have larger limits than serve's defaults; a body over these only
  // loses its affinity (it goes to the least-loaded replica), it is not refused.
  server::RequestLimits limits;
  limits.max_prompts = 1u << 20;
  limits.max_choices = int64_t{1} << 40;
  limits.max_output_entries = int64_t{1} << 62;
  limits.max_stop_bytes = limits.max_cache_salt_bytes = 1u << 20;
  limits.max_stop_strings = 1u << 20;
  auto parsed = server::parse_request(ep, body, limits);
  auto* r = std::get_if<server::ParsedRequest>(&parsed);
  if (!r) return {};
  if (ep == server::Endpoint::kChat) {
    if (!codec) return {};
    auto ids = codec->encode_chat(r->messages, /*parse_special_in_content=*/false, r->constraint.tools.tools);
    return ids.ok() ? std::move(ids).value() : std::vector<int32_t>{};
  }
  if (r->prompt_is_tokens) return r->prompt_tokens.empty() ? std::vector<int32_t>{} : std::move(r->prompt_tokens[0]);
  if (r->prompt_texts.empty() || !codec) return {};
  return codec->encode_prompt(r->prompt_texts[0], /*add_special=*/true, /*parse_special=*/false);
}

std::optional<std::string> prompt_cache_key(const std::string& body) {
  if (body.find("prompt_cache_key") == std::string::npos) return std::nullopt;  // no second parse for most bodies
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto it = j.find("prompt_cache_key");
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace pagoda::router
