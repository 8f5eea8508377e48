#include "openai/errors.h"

namespace pagoda::server {

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", e.param.empty() ? json() : json(e.param)},
              {"code", e.code.empty() ? json() : json(e.code)}};
  return dump_json(json{{"error", err}});
}

}  // namespace pagoda::server
