#include "http/http.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/log.h"

namespace pagoda::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string cors_allow_origin(const std::vector<std::string>& allowed, const std::string& origin) {
  if (origin.empty()) return "";
  for (const auto& a : allowed) {
    if (a == "*") return "*";
    if (a == origin) return origin;
  }
  return "";
}

const char* http_status_text(int s) {
  switch (s) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "";
  }
}

HeadScan scan_request_head(std::string_view b) {
  const size_t end = b.find("\r\n\r\n");
  const size_t limit = end == std::string_view::npos ? b.size() : end + 2;
  // A line break followed by a space or tab inside the head starts a continuation line.
  for (size_t i = b.find("\r\n"); i != std::string_view::npos && i + 2 < limit; i = b.find("\r\n", i + 2))
    if (b[i + 2] == ' ' || b[i + 2] == '\t') return HeadScan::kObsFold;
  return end == std::string_view::npos ? HeadScan::kIncomplete : HeadScan::kComplete;
}

std::string check_transfer_encoding(const std::vector<std::string>& values) {
  if (values.empty()) return "";
  if (values.size() > 1) return "Transfer-Encoding given more than once";
  std::string v = values[0];
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  size_t i = 0;
  while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
  v = v.substr(i);
  if (beast::iequals(v, "chunked")) return "";
  return "Transfer-Encoding '" + v.substr(0, 64) + "' is not supported (only 'chunked')";
}

namespace {

// A 400 body naming the offending part of the request (HTTP framing: a header).
std::string bad_request_body(const std::string& message, const std::string& param) {
  std::string m;
  for (char c : message) {
    if (c == '"' || c == '\\') m += '\\';
    m += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return "{\"error\":{\"message\":\"" + m + "\",\"type\":\"invalid_request_error\",\"param\":" +
         (param.empty() ? std::string("null") : "\"" + param + "\"") + ",\"code\":null}}";
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `open` counts open client sockets: +1 here, -1 when this one closes.
  Session(tcp::socket socket, const HttpConfig& cfg, const Handler& handler, std::atomic<int>* open)
      : stream_(std::move(socket)), cfg_(cfg), handler_(handler), open_(open) {
    open_->fetch_add(1);
  }
  ~Session() {
    if (!closed_) open_->fetch_sub(1);  // the socket closes with the object
  }

  void run() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // ---- Responder operations (called through ResponderImpl, any thread) ----
  void post(std::function<void()> fn) { asio::post(stream_.get_executor(), std::move(fn)); }

  void send_full(int status, const std::string& ctype, std::string body, std::map<std::string, std::string> extra) {
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + http_status_text(status) + "\r\n";
    if (status != 204) {  // RFC 9110: a 204 carries neither
      out += "Content-Type: " + ctype + "\r\n";
      out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    for (auto& [k, v] : extra) out += k + ": " + v + "\r\n";
    enqueue_response(std::move(out), std::move(body), /*last=*/true);
  }
  void start_stream(int status) {
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + http_status_text(status) + "\r\n";
    out += "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    enqueue_response(std::move(out), "", false);
  }
  void write_chunk(std::string data) {
    if (data.empty()) return;
    char hex[32];
    std::snprintf(hex, sizeof(hex), "%zx\r\n", data.size());
    enqueue(std::string(hex) + data + "\r\n", false);
  }
  void end_stream() { enqueue("0\r\n\r\n", true); }
  void set_disconnect(std::function<void()> fn) {
    if (disconnected_) {
      if (fn) fn();
      return;
    }
    on_disconnect_ = std::move(fn);
  }

 private:
  void do_read() {
    head_ = false;  // until this request says otherwise (a 400/413 below is not HEAD's)
    cors_origin_.clear();
    parser_.emplace();
    parser_->body_limit(cfg_.body_limit);
    parser_->header_limit(kHeaderLimit);
    stream_.expires_after(std::chrono::seconds(cfg_.header_timeout_s));
    read_head();
  }

  // Reads until the head is whole (or over the header limit, which the parser then
  // reports) so its raw lines can be checked for obs-fold, then lets Beast parse it
  // and read the body from the same buffer.
  void read_head() {
    const auto data = buffer_.data();
    const std::string_view bytes(static_cast<const char*>(data.data()), data.size());
    const HeadScan scan = scan_request_head(bytes.substr(0, kHeaderLimit));
    if (scan == HeadScan::kObsFold)
      return reject(400, bad_request_body("malformed HTTP request: obs-fold (a header line starting with a space "
                                          "or tab) is not accepted", "header"));
    if (scan == HeadScan::kComplete || bytes.size() >= kHeaderLimit) {
      http::async_read(stream_, buffer_, *parser_,
                       [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
      return;
    }
    stream_.async_read_some(buffer_.prepare(8192), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->on_read(ec);
      self->buffer_.commit(n);
      self->read_head();
    });
  }

  // Answers a request that cannot be read further and closes after it.
  void reject(int status, std::string body) {
    keep_alive_ = false;
    in_response_ = true;
    send_full(status, "application/json", std::move(body), {});
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || closed_)
      return close();
    if (ec == http::error::body_limit) {
      return reject(413, "{\"error\":{\"message\":\"request body exceeds the limit of " +
                             std::to_string(cfg_.body_limit) +
                             " bytes\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"payload_too_large\"}}");
    }
    // Malformed HTTP: answer 400 and close.
    if (ec) return reject(400, bad_request_body("malformed HTTP request: " + ec.message(), ""));
    auto msg = parser_->release();
    {
      std::vector<std::string> te;
      for (const auto& f : msg)
        if (f.name() == http::field::transfer_encoding) te.emplace_back(f.value());
      const std::string bad = check_transfer_encoding(te);
      if (!bad.empty()) return reject(400, bad_request_body(bad, "Transfer-Encoding"));
    }
    HttpRequest req;
    req.method = std::string(msg.method_string());
    std::string target(msg.target());
    auto q = target.find('?');
    req.target = q == std::string::npos ? target : target.substr(0, q);
    if (q != std::string::npos) req.query = target.substr(q + 1);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(f.value());
    }
    req.body = std::move(msg.body());
    keep_alive_ = msg.keep_alive();
    head_ = msg.method() == http::verb::head;
    in_response_ = true;
    cors_origin_ = cors_allow_origin(cfg_.allowed_origins, req.header("origin"));
    if (req.method == "OPTIONS" && !cfg_.allowed_origins.empty() &&
        !req.header("access-control-request-method").empty()) {
      // CORS preflight: answered here, with no key (browsers send none on a preflight).
      const std::string headers = req.header("access-control-request-headers");
      return send_full(204, "", "",
                       {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                        {"Access-Control-Allow-Headers", headers.empty() ? "Authorization, Content-Type" : headers},
                        {"Access-Control-Max-Age", "600"}});
    }
    stream_.expires_never();
    watch_disconnect();
    handler_(std::move(req), make_responder());
  }

  std::shared_ptr<Responder> make_responder();

  // While a response is pending, a readable socket with no bytes means the
  // peer closed: report the disconnect so the request can be aborted.
  void watch_disconnect() { arm_disconnect_watch(++response_gen_); }

  void arm_disconnect_watch(uint64_t gen) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
      if (!self->in_response_ || gen != self->response_gen_ || self->closed_) return;
      if (ec) return self->mark_disconnected();
      // A wakeup can be stale (keep-alive: the next request was already read), so
      // peek: 0 bytes means the peer closed; EAGAIN means alive, watch again.
      char c;
      ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return self->mark_disconnected();
      if (n < 0) return self->arm_disconnect_watch(gen);
      if (n == 0) {
        // EOF: the client shut down its sending side. A half-closed client (shutdown
        // after a full request) still reads, so it still gets its answer; a client
        // that closed entirely is found by the first write that fails (or the send
        // timeout). Either way no further request can come: close after this one.
        self->keep_alive_ = false;
        return;
      }
      // Pipelined bytes from a live client: stop watching; they are read after this response.
    });
  }

  void mark_disconnected() {
    if (disconnected_) return;
    disconnected_ = true;
    close();
    if (on_disconnect_) {
      auto fn = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      fn();
    }
  }

  void enqueue(std::string data, bool last) {
    post([self = shared_from_this(), data = std::move(data), last]() mutable { self->push(std::move(data), last); });
  }
  // `head`: the status line and headers but Connection. The strand finishes it, since
  // keep_alive_ (a half-close turns it off) and head_ are strand state.
  void enqueue_response(std::string head, std::string body, bool last) {
    post([self = shared_from_this(), head = std::move(head), body = std::move(body), last]() mutable {
      if (!self->cors_origin_.empty())
        head += "Access-Control-Allow-Origin: " + self->cors_origin_ + "\r\nVary: Origin\r\n";
      head += self->keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      if (!self->head_) head += body;  // HEAD: the GET's headers (Content-Length included), no body
      self->push(std::move(head), last);
    });
  }
  // On the strand.
  void push(std::string data, bool last) {
    if (closed_) return;
    queued_bytes_ += data.size();
    queue_.push_back({std::move(data), last});
    if (queued_bytes_ > cfg_.max_queued_output && queue_.size() > 1) {
      // The client is not reading (a stream outpacing it): drop it rather than
      // buffer without bound; the disconnect aborts its request.
      PAGODA_LOG_WARN("dropping a client that stopped reading (%zu bytes queued)", queued_bytes_);
      return mark_disconnected();
    }
    if (!writing_) write_next();
  }

  void write_next() {
    if (queue_.empty()) {
      writing_ = false;
      return;
    }
    writing_ = true;
    auto& front = queue_.front();
    // A client that takes no bytes for send_timeout_s fails this write (timeout).
    stream_.expires_after(std::chrono::seconds(cfg_.send_timeout_s));
    asio::async_write(stream_, asio::buffer(front.first),
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    if (closed_ || queue_.empty()) return;  // dropped meanwhile (queue bound, disconnect)
    stream_.expires_never();  // waiting for the engine's next tokens is not a client timeout
    bool last = queue_.front().second;
    queued_bytes_ -= queue_.front().first.size();
    queue_.pop_front();
    if (ec) {
      mark_disconnected();
      return close();
    }
    if (last) {
      in_response_ = false;
      ++response_gen_;
      on_disconnect_ = nullptr;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // the disconnect watcher; the socket may be closed already
      if (!keep_alive_) return close();
      writing_ = false;
      queue_.clear();
      queued_bytes_ = 0;
      return do_read();
    }
    write_next();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    open_->fetch_sub(1);
    queue_.clear();
    queued_bytes_ = 0;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  static constexpr size_t kHeaderLimit = 64 * 1024;
  beast::tcp_stream stream_;
  const HttpConfig& cfg_;
  const Handler& handler_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::atomic<int>* open_;
  std::deque<std::pair<std::string, bool>> queue_;  // (bytes, ends the response)
  size_t queued_bytes_ = 0;
  bool head_ = false;
  bool writing_ = false;
  bool keep_alive_ = true;
  std::string cors_origin_;  // this request's Access-Control-Allow-Origin ("": none)
  bool closed_ = false;
  bool in_response_ = false;
  bool disconnected_ = false;
  uint64_t response_gen_ = 0;
  std::function<void()> on_disconnect_;
};

class ResponderImpl : public Responder {
 public:
  explicit ResponderImpl(std::shared_ptr<Session> s) : s_(std::move(s)) {}
  void send(int status, const std::string& ct, std::string body, std::map<std::string, std::string> extra) override {
    if (done_.exchange(true)) return;
    s_->send_full(status, ct, std::move(body), std::move(extra));
  }
  void start_stream(int status) override { s_->start_stream(status); }
  void write(std::string data) override {
    if (done_) return;
    s_->write_chunk(std::move(data));
  }
  void end_stream() override {
    if (done_.exchange(true)) return;
    s_->end_stream();
  }
  void on_disconnect(std::function<void()> fn) override {
    s_->post([s = s_, fn = std::move(fn)]() mutable { s->set_disconnect(std::move(fn)); });
  }

 private:
  std::shared_ptr<Session> s_;
  std::atomic<bool> done_{false};
};

std::shared_ptr<Responder> Session::make_responder() { return std::make_shared<ResponderImpl>(shared_from_this()); }

}  // namespace

namespace {

// Answers 503 on a socket the server has no room for and closes it, without any
// per-connection state: a best-effort non-blocking send of a fixed response.
void reject_busy(tcp::socket& socket) {
  static const char kBusy[] =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
      "Connection: close\r\nContent-Length: 121\r\n\r\n"
      "{\"error\":{\"message\":\"too many open connections\",\"type\":\"service_unavailable\","
      "\"param\":null,\"code\":\"too_many_connections\"}}";
  const int fd = socket.native_handle();
  // Read what already arrived: closing with unread bytes would send RST, and the
  // client could lose the 503 before reading it.
  char sink[4096];
  while (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
  (void)::send(fd, kBusy, sizeof(kBusy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

bool is_fd_exhaustion(const beast::error_code& ec) {
  return ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
         ec == asio::error::no_memory;
}

}  // namespace

int default_max_connections() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 4096;
  const int64_t limit = static_cast<int64_t>(std::min<rlim_t>(rl.rlim_cur, 1 << 20));
  // The reserve covers the process's own descriptors (stdio, epoll, eventfds, timers,
  // the model file while loading, logs) and room to accept-and-reject beyond the limit.
  const int64_t reserve = std::max<int64_t>(32, limit / 8);
  return static_cast<int>(std::clamp<int64_t>(limit - reserve, 1, 65536));
}

struct HttpServer::Impl {
  // Sessions reference cfg, handler and open_connections; sessions still queued in
  // the io_context die with it, so these are declared (and outlive it) before it.
  HttpConfig cfg;
  Handler handler;
  std::atomic<int> open_connections{0};
  asio::io_context ioc;
  // The acceptor, its backoff timer and stop()'s close run on one strand: accept
  // handlers and stop() may otherwise touch the acceptor from two I/O threads at once.
  tcp::acceptor acceptor{asio::make_strand(ioc)};
  asio::steady_timer accept_backoff{acceptor.get_executor()};
  std::chrono::milliseconds backoff{0};
  std::vector<std::thread> threads;
  int bound_port = 0;

  void do_accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (!acceptor.is_open()) return;
      if (ec && is_fd_exhaustion(ec)) {
        // Out of descriptors: the pending connection stays in the kernel's backlog, so
        // accepting again at once fails again (a 100% CPU loop). Wait, doubling up to
        // 200 ms, which bounds both the CPU spent and the delay once a descriptor frees.
        backoff = std::min(std::chrono::milliseconds(200), std::max(std::chrono::milliseconds(10), backoff * 2));
        if (backoff == std::chrono::milliseconds(10))
          PAGODA_LOG_WARN("accept: %s; backing off until a descriptor frees", ec.message().c_str());
        accept_backoff.expires_after(backoff);
        accept_backoff.async_wait([this](beast::error_code) { do_accept(); });
        return;
      }
      backoff = std::chrono::milliseconds(0);
      if (!ec) {
        if (open_connections.load() >= cfg.max_connections) {
          reject_busy(socket);
        } else {
          beast::error_code ignore;
          socket.set_option(tcp::no_delay(true), ignore);
          std::make_shared<Session>(std::move(socket), cfg, handler, &open_connections)->run();
        }
      }
      do_accept();
    });
  }
};


HttpServer::HttpServer(HttpConfig config, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(config);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

bool HttpServer::start(std::string* error) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(impl_->cfg.host, ec);
  if (ec) {
    *error = "invalid --host '" + impl_->cfg.host + "': " + ec.message();
    return false;
  }
  tcp::endpoint ep(addr, static_cast<unsigned short>(impl_->cfg.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    *error = "cannot listen on " + impl_->cfg.host + ":" + std::to_string(impl_->cfg.port) + ": " + ec.message();
    return false;
  }
  impl_->bound_port = a.local_endpoint().port();
  if (impl_->cfg.max_connections <= 0) impl_->cfg.max_connections = default_max_connections();
  impl_->do_accept();
  return true;
}

int HttpServer::port() const { return impl_->bound_port; }
int HttpServer::max_connections() const { return impl_->cfg.max_connections; }
int HttpServer::num_connections() const { return impl_->open_connections.load(); }

void HttpServer::run() {
  int n = std::max(1, impl_->cfg.io_threads);
  for (int i = 1; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

void HttpServer::stop() {
  asio::post(impl_->acceptor.get_executor(), [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->accept_backoff.cancel();
  });
  impl_->ioc.stop();
}

}  // namespace pagoda::server
