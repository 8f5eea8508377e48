// OpenAI's error shape, shared by every parser in openai/ (request fields,
// structured outputs, cache fields) and by the server and the router: the
// bottom of the module, so no parser includes another to name an error.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

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

// Dump JSON, replacing any invalid UTF-8 rather than throwing.
std::string dump_json(const json& j);

}  // namespace pagoda::server
