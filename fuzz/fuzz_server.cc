// libFuzzer target for server/'s request parsing: the input is an HTTP body. It is
// parsed as a completions, chat, /tokenize and /detokenize request under small
// limits. Checks: no crash or throw; an accepted request respects every limit
// (stop strings, cache_salt, prompts, prompts x n, output entries); a body nested
// deeper than the limit is always refused; error bodies are valid JSON.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>

#include "fuzz_check.h"
#include "openai/openai_api.h"

using namespace pagoda::server;

namespace {

void check(bool ok, const char* what) { pagoda::fuzz::check(ok, "fuzz_server", what); }

void check_error(const ApiError& e) {
  check(e.status >= 400 && e.status < 600, "error status");
  check(!e.message.empty(), "empty error message");
  auto j = json::parse(error_body(e), nullptr, false);
  check(!j.is_discarded() && j.contains("error"), "error body is not JSON");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  // Small limits, so that short inputs reach every refusal.
  const RequestLimits lim{.max_stop_bytes = 8, .max_stop_strings = 4, .max_cache_salt_bytes = 8,
                          .max_json_depth = 6, .max_prompts = 4, .max_choices = 8, .max_output_entries = 4096};
  const bool too_deep = json_too_deep(body, lim.max_json_depth);
  for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
    auto r = parse_request(ep, body, lim);
    if (auto* e = std::get_if<ApiError>(&r)) {
      check_error(*e);
      continue;
    }
    check(!too_deep, "a too-deep body was accepted");
    const ParsedRequest& p = std::get<ParsedRequest>(r);
    check(p.params.stop.size() <= lim.max_stop_strings, "stop count");
    for (const auto& s : p.params.stop.list()) check(!s.empty() && s.size() <= lim.max_stop_bytes, "stop length");
    check(p.params.cache_salt.size() <= lim.max_cache_salt_bytes, "cache_salt length");
    const size_t prompts = ep == Endpoint::kChat ? 1 : p.prompt_texts.size() + p.prompt_tokens.size();
    check(prompts >= 1 && prompts <= lim.max_prompts, "prompt count");
    check(static_cast<int64_t>(prompts) * p.params.n <= lim.max_choices, "choices");
    if (p.params.max_tokens > 0)
      check(!check_output_cost(prompts, p.params, p.params.max_tokens, lim).has_value(), "output entries");
    if (ep == Endpoint::kChat) check(!p.messages.empty(), "chat without messages");
  }
  auto t = parse_tokenize(body, lim);
  if (auto* e = std::get_if<ApiError>(&t)) check_error(*e);
  else check(!too_deep, "a too-deep /tokenize body was accepted");
  auto d = parse_detokenize(body, 512, lim);
  if (auto* e = std::get_if<ApiError>(&d)) {
    check_error(*e);
  } else {
    for (int32_t id : std::get<std::vector<int32_t>>(d)) check(id >= 0 && id < 512, "detokenize id range");
  }
  return 0;
}
