// OpenAI-compatible request parsing/validation and response formatting. Pure
// functions over JSON text: no sockets, no engine. Every malformed input maps to
// an ApiError with the HTTP status and OpenAI's error shape.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace pagoda::server {

using json = nlohmann::json;

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
};
// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

struct ChatMessage {
  std::string role;
  std::string content;
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
  engine::RequestParams params;                    // sampling; prompt filled in later
};

// Parses and validates a body for the endpoint. Does not tokenize.
std::variant<ParsedRequest, ApiError> parse_request(Endpoint ep, const std::string& body);

// Fields for /tokenize and /detokenize.
struct TokenizeRequest {
  std::string prompt;
  std::vector<ChatMessage> messages;
  bool has_messages = false;
  bool add_special_tokens = true;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize(const std::string& body);
std::variant<std::vector<int32_t>, ApiError> parse_detokenize(const std::string& body, int vocab_size);

// Dump JSON, replacing any invalid UTF-8 rather than throwing.
std::string dump_json(const json& j);

}  // namespace pagoda::server
