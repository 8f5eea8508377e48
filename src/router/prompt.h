// What the router routes on: the token ids of a request's prompt, read the way
// `pagoda serve` reads them (server::parse_request, then TextCodec), so that two
// requests a replica would see as sharing a prefix share it here too.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "openai/openai_api.h"
#include "openai/text.h"

namespace pagoda::router {

// Completions: the first prompt (text is tokenized with BOS as serve does; token
// ids are taken as they are). Chat: the messages (and tools) rendered by the
// model's chat template with the generation prompt, then tokenized, exactly as
// serve does: the routing key covers the template's header and system prompt too.
// Empty when the body does not parse, the endpoint needs a tokenizer and `codec`
// is null, or the template fails: the request then goes to the least-loaded
// replica, which answers it (or its error) itself.
std::vector<int32_t> routing_prompt(server::Endpoint ep, const std::string& body, const server::TextCodec* codec);

// The request's `prompt_cache_key` (OpenAI's field: requests sharing it share a
// cache, issue 36) when the body is a JSON object holding it as a non-empty
// string; it is then the ring's affinity key instead of the prompt's first blocks.
std::optional<std::string> prompt_cache_key(const std::string& body);

}  // namespace pagoda::router
