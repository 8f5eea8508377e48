// Asynchronous HTTP/1.1 server (Boost.Beast over Asio): keep-alive, a body
// limit, and long-lived streaming responses (SSE over chunked encoding). No
// thread per connection: a small pool of I/O threads serves every socket, each
// session serialized on its own strand.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::server {

struct HttpRequest {
  std::string method;                       // "GET", "POST", ...
  std::string target;                       // path without the query string
  std::string query;                        // after '?' (raw, not decoded; "" when none)
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

// Runs on an I/O thread: must return quickly (post heavy work elsewhere).
using Handler = std::function<void(HttpRequest, std::shared_ptr<Responder>)>;

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t body_limit = 8u << 20;
  int io_threads = 2;
  int header_timeout_s = 30;
  // Open connections beyond this are answered 503 and closed at once. 0: sized to
  // the descriptor limit (RLIMIT_NOFILE minus a reserve for the process's own files),
  // so accept() itself rarely meets EMFILE; when it does, accepting backs off.
  int max_connections = 0;
  // A client that accepts no bytes for this long while a response is being written
  // is dropped (and its request aborted).
  int send_timeout_s = 30;
  // Output queued for one client beyond this (a streaming client that stopped
  // reading) drops it. A single response larger than this is still sent.
  size_t max_queued_output = 16u << 20;
  // CORS: origins browsers may call from ("*": any; empty: no CORS headers, and an
  // OPTIONS preflight gets the router's 404/405). A request whose Origin matches
  // gets Access-Control-Allow-Origin on its response; a preflight (OPTIONS with
  // Access-Control-Request-Method) is answered 204 here, before any route or key.
  std::vector<std::string> allowed_origins = {"*"};
};
// The Access-Control-Allow-Origin value for a request's Origin header: "*" when
// any origin is allowed, the origin itself when listed, "" when not allowed.
std::string cors_allow_origin(const std::vector<std::string>& allowed, const std::string& origin);
// What max_connections = 0 resolves to for the current RLIMIT_NOFILE.
int default_max_connections();

// The request head at the front of `bytes` (RFC 9112 section 5.2: a server must reject
// obs-fold, a header line continued by one starting with a space or tab; Beast would
// join it silently). kIncomplete: no empty line yet.
enum class HeadScan { kIncomplete, kComplete, kObsFold };
HeadScan scan_request_head(std::string_view bytes);
// A request's Transfer-Encoding is accepted only as exactly "chunked" (any case, one
// field): "gzip, chunked" would otherwise be read as plain chunked and the coding
// ignored. "" when fine, else the 400's message.
std::string check_transfer_encoding(const std::vector<std::string>& values);

class HttpServer {
 public:
  HttpServer(HttpConfig config, Handler handler);
  ~HttpServer();
  // Binds; returns false with a message when the port cannot be bound.
  bool start(std::string* error);
  int port() const;  // the bound port (useful with port 0)
  int max_connections() const;  // resolved by start()
  int num_connections() const;  // open client sockets now
  void run();        // blocks until stop()
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

const char* http_status_text(int status);

}  // namespace pagoda::server
