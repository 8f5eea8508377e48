// `pagoda serve`: OpenAI-compatible routes over HttpServer + AsyncEngine.
#pragma once
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/http.h"

namespace pagoda::server {

struct ServerConfig {
  HttpConfig http;
  std::string api_key;            // empty: no auth
  std::string served_model_name;  // empty: the model file's stem
  int max_waiting = 1024;         // more waiting requests than this -> 503
};

class Server {
 public:
  static Expected<std::unique_ptr<Server>> create(const ServerConfig& config, std::unique_ptr<engine::Engine> engine);
  ~Server();
  // Binds the port (0 picks a free one). Returns the bound port.
  Expected<int> start();
  void run();   // blocks until stop()
  void stop();

 private:
  Server() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::server
