// Asynchronous HTTP/1.1 server (Boost.Beast over Asio): keep-alive, a body
// limit, and long-lived streaming responses (SSE over chunked encoding). No
// thread per connection: a small pool of I/O threads serves every socket, each
// session serialized on its own strand.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace pagoda::server {

struct HttpRequest {
  std::string method;                       // "GET", "POST", ...
  std::string target;                       // path without the query string
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Handed to the handler for one request. Exactly one of send() or
// start_stream() ... end_stream() must be called, from any thread.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, const std::string& content_type, std::string body,
                    std::map<std::string, std::string> extra_headers = {}) = 0;
  // Starts a text/event-stream response; then write() each chunk, then end().
  virtual void start_stream(int status) = 0;
  virtual void write(std::string data) = 0;
  virtual void end_stream() = 0;
  // Called at most once, on an I/O thread, if the client goes away before the
  // response ends (read EOF/reset or a failed write).
  virtual void on_disconnect(std::function<void()> fn) = 0;
};

using Handler = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t body_limit = 8u << 20;
  int io_threads = 2;
  int header_timeout_s = 30;
};

class HttpServer {
 public:
  HttpServer(HttpConfig config, Handler handler);
  ~HttpServer();
  // Binds; returns false with a message when the port cannot be bound.
  bool start(std::string* error);
  int port() const;  // the bound port (useful with port 0)
  void run();        // blocks until stop()
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

const char* http_status_text(int status);

}  // namespace pagoda::server
