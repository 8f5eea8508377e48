// OpenAI-compatible request parsing and response formatting. Pure functions over
// JSON: no sockets, no engine state. Every malformed input maps to an ApiError
// with the HTTP status and OpenAI's error shape. Parsing checks the shape of the
// request and the server's cost limits; what the engine can check (empty prompt,
// max_tokens vs context, token ids, n) is left to add_request, the one validator.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/generation.h"
#include "openai/cache_fields.h"
#include "openai/errors.h"
#include "openai/structured.h"
#include "sample/request_params.h"
#include "tok/chat_template.h"

namespace pagoda::tok { class Tokenizer; }

namespace pagoda::server {

using tok::ChatMessage;

// Per-request cost bounds: whatever a request asks, the memory it makes the server
// hold is O(its body + its tokens). Defaults are documented in `pagoda serve --help`.
struct RequestLimits {
  size_t max_stop_bytes = 1024;        // each stop string
  size_t max_stop_strings = 16;
  size_t max_cache_salt_bytes = 256;
  int max_json_depth = 32;             // nesting of arrays/objects in a body
  size_t max_prompts = 64;             // completions: prompts in one request
  int64_t max_choices = 256;           // prompts x n
  // prompts x n x max_tokens x (1 + top logprobs): the output a request can make
  // the server accumulate (tokens, logprob entries) before it is sent. A top-logprob
  // entry costs ~100 bytes as JSON, so the default bounds one response near 100 MB;
  // it still admits n = 16 x 4k tokens with 15 alternatives, or one 8k chat with 20.
  int64_t max_output_entries = int64_t{1} << 20;
  size_t max_logit_bias = 1024;        // entries of one logit_bias map
};

enum class Endpoint { kCompletions, kChat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                               // as given ("" if absent)
  // Completions: one entry per prompt; each is text or token ids.
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_tokens;  // used where prompt_is_tokens
  bool prompt_is_tokens = false;
  std::vector<ChatMessage> messages;               // chat
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool max_tokens_given = false;
  bool chat_logprobs = false;                      // chat: logprobs=true
  bool return_token_ids = false;                   // vLLM extension: "token_ids" / "prompt_token_ids" in choices
  sample::RequestParams params;                    // sampling; prompt filled in later
  OutputConstraint constraint;                     // structured output / tools (compiled by the server)
  // prompt_cache_retention / prompt_cache_key (issue 36); with pin_prompt the server
  // sets params.pin_tokens to each prompt's length (params.pin_ttl_s is set here).
  CacheFields cache;
  // Top-level fields the body has and pagoda does not implement (user, a
  // misspelt name, ...): accepted, ignored, and named in a
  // warning by the server (once per field name).
  std::vector<std::string> ignored_fields;
};

// Parses and validates a body for the endpoint. Does not tokenize.
std::variant<ParsedRequest, ApiError> parse_request(Endpoint ep, const std::string& body,
                                                   const RequestLimits& limits = {});
// The output bound, checked once prompts are tokenized (chat without max_tokens runs
// to the context end): nullopt when prompts x n x max_tokens x (1 + logprobs) fits.
std::optional<ApiError> check_output_cost(size_t num_prompts, const sample::RequestParams& p, int64_t max_tokens,
                                          const RequestLimits& limits);
// 400 naming logit_bias when one of its ids is outside the model's vocabulary.
std::optional<ApiError> check_logit_bias(const sample::RequestParams& p, int vocab_size);
// True when arrays/objects in `body` nest deeper than max_depth (strings skipped).
// Linear, no allocation: runs before the JSON parser builds anything.
bool json_too_deep(const std::string& body, int max_depth);

// True when `field` is a request field parse_request reads for the endpoint.
bool is_known_field(Endpoint ep, const std::string& field);

// Fields for /tokenize and /detokenize. /tokenize takes vLLM's {"prompt"} or
// {"messages"} and llama-server's {"content"} (and "add_special").
struct TokenizeRequest {
  std::string prompt;
  std::vector<ChatMessage> messages;
  bool has_messages = false;
  bool add_special_tokens = true;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize(const std::string& body, const RequestLimits& limits = {});
std::variant<std::vector<int32_t>, ApiError> parse_detokenize(const std::string& body, int vocab_size,
                                                              const RequestLimits& limits = {});

// ---- Response formatting -------------------------------------------------------

// What every response object of one request repeats.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  std::string model;
  int64_t created = 0;  // unix seconds
};

// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions:
// {tokens, token_logprobs, top_logprobs, text_offset} with offsets from text_offset0.
json logprobs_json(Endpoint ep, const tok::Tokenizer& tk, const std::vector<TokenLogprob>& lps,
                   size_t text_offset0);
json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
// One streamed object ("chat.completion.chunk" / "text_completion") holding `choices`.
json chunk_json(const ResponseMeta& m, json choices);
// The final non-streamed object ("chat.completion" / "text_completion").
json response_json(const ResponseMeta& m, json choices, json usage);
// A streamed choice: chat {index, delta{role?, content}, logprobs, finish_reason},
// completions {index, text, logprobs, finish_reason}. `first` adds the chat role.
json stream_choice_json(Endpoint ep, size_t index, const std::string& text, bool first, json logprobs,
                        FinishReason finish);
// A whole choice: chat {index, message{role, content}, ...}, completions {index, text, ...}.
json final_choice_json(Endpoint ep, size_t index, const std::string& text, json logprobs,
                       FinishReason finish);
// Server-sent event framing: "data: <json>\n\n"; sse_done() is "data: [DONE]\n\n".
std::string sse(const json& j);
std::string sse_done();

}  // namespace pagoda::server
