// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens; issue 36):
// request parsing onto the chat path's ParsedRequest (the same template, the same
// tool machinery), cache_control breakpoints, and the response / SSE / error shapes.
// Pure functions over JSON, except cache_prefix_tokens, which renders through the
// server's TextCodec. Every malformed input maps to a 400 naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "openai/openai_api.h"

namespace pagoda::server {

class TextCodec;

// Where the last block carrying cache_control ends the prefix to keep: the
// conversation cut right after that block (tools, then system, then messages:
// Anthropic's prefix order), rendered without a generation prompt.
struct CacheBreakpoint {
  bool present = false;
  double ttl_s = 0;                   // 300 ("5m", the default) or 3600 ("1h")
  std::vector<ChatMessage> messages;  // the chat messages up to the block (the last one cut after it)
  nlohmann::ordered_json tools;       // the tools up to the block (all when it is past them; null: none)
  std::string field;                  // e.g. "messages[2].content[0].cache_control"
};

struct MessagesRequest {
  ParsedRequest base;      // endpoint kChat: messages, params, constraint (tools), stream, model
  CacheBreakpoint cache;
  std::string user_id;     // metadata.user_id (accepted; in the access line only as given length)
};

// count_only: /v1/messages/count_tokens (max_tokens and sampling fields not needed).
std::variant<MessagesRequest, ApiError> parse_messages_request(const std::string& body, const RequestLimits& limits,
                                                               bool count_only = false);

// The token position where the breakpoint's prefix ends in `prompt` (the full
// rendering's ids): the cut conversation's ids when they are a token prefix of
// `prompt`; else (a template whose turn does not end where the next begins, or a
// cut inside a message) the longest common token prefix of the two. 0 when the
// cut conversation does not render. *exact: whether it was a prefix.
int32_t cache_prefix_tokens(const TextCodec& text, const CacheBreakpoint& bp, const std::vector<int32_t>& prompt,
                            bool parse_special, bool* exact = nullptr);

// Anthropic's usage from the engine's counts: cache_read = the prompt tokens the
// engine read from its prefix cache; cache_creation = the tokens up to the
// cache_control breakpoint (pin_tokens) that were not read; input = the rest. The
// three sum to the prompt length.
struct MessagesUsage {
  int64_t input_tokens = 0, cache_creation_input_tokens = 0, cache_read_input_tokens = 0, output_tokens = 0;
};
MessagesUsage messages_usage(int64_t prompt_tokens, int64_t cached_tokens, int64_t pin_tokens, int64_t output_tokens);
nlohmann::json usage_json(const MessagesUsage& u);

// The error as Anthropic shapes it, and its HTTP status (503 -> 529 overloaded).
int anthropic_status(const ApiError& e);
// {"type": "error", "error": {"type": "invalid_request_error" | ..., "message"}}
std::string anthropic_error_body(const ApiError& e);
// "event: NAME\ndata: JSON\n\n"
std::string anthropic_sse(const char* event, const nlohmann::json& data);

}  // namespace pagoda::server
