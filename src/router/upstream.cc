#include "router/upstream.h"

#include <chrono>
#include <optional>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace pagoda::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Expected<ReplicaUrl> parse_replica_url(const std::string& url) {
  static const std::string kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) return make_error("replica URL '" + url + "' must start with http://");
  std::string rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  std::string base = slash == std::string::npos ? "" : rest.substr(slash);
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, "/v1") == 0) base.resize(base.size() - 3);
  ReplicaUrl u;
  u.base_path = base;
  size_t colon = std::string::npos;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return make_error("replica URL '" + url + "': unclosed '['");
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return make_error("replica URL '" + url + "': bad port");
      colon = close + 1;
    }
  } else {
    colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
  }
  u.port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (u.host.empty()) return make_error("replica URL '" + url + "' has no host");
  if (u.port.empty() || u.port.size() > 5 || u.port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(u.port) < 1 || std::stoi(u.port) > 65535)
    return make_error("replica URL '" + url + "': the port must be 1..65535");
  const bool v6 = u.host.find(':') != std::string::npos;
  u.text = kScheme + (v6 ? "[" + u.host + "]" : u.host) + ":" + u.port + u.base_path;
  return u;
}

struct UpstreamConn {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;  // bytes read past a response head (kept with the connection)

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  }
  // Runs the io_context until `done`; a cancel() posted meanwhile closes the
  // socket, which completes the pending operation with an error.
  void run_until(const bool& done) {
    ioc.restart();
    while (!done && ioc.run_one()) {
    }
  }
  // Starts one asynchronous operation with a deadline of `seconds` and waits for it.
  template <class Start>
  beast::error_code await(double seconds, Start start) {
    bool done = false;
    beast::error_code ec;
    stream.expires_after(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds)));
    start([&](beast::error_code e, auto&&...) {
      ec = e;
      done = true;
    });
    run_until(done);
    if (!done && !ec) ec = asio::error::operation_aborted;
    return ec;
  }
};

UpstreamPool::UpstreamPool(size_t max_idle) : max_idle_(max_idle) {}
UpstreamPool::~UpstreamPool() = default;

std::unique_ptr<UpstreamConn> UpstreamPool::take() {
  std::lock_guard<std::mutex> l(mu_);
  if (idle_.empty()) return nullptr;
  auto c = std::move(idle_.back());
  idle_.pop_back();
  return c;
}

void UpstreamPool::give(std::unique_ptr<UpstreamConn> conn) {
  std::unique_lock<std::mutex> l(mu_);
  if (idle_.size() < max_idle_) {
    idle_.push_back(std::move(conn));
    return;
  }
  l.unlock();
  conn->close();
}

void UpstreamPool::clear() {
  std::vector<std::unique_ptr<UpstreamConn>> gone;
  {
    std::lock_guard<std::mutex> l(mu_);
    gone.swap(idle_);
  }
  for (auto& c : gone) c->close();
}

size_t UpstreamPool::idle() const {
  std::lock_guard<std::mutex> l(mu_);
  return idle_.size();
}

struct UpstreamCall::Impl {
  std::mutex mu;
  UpstreamConn* current = nullptr;  // the connection run() is using (guarded by mu)
  std::atomic<bool> cancelled{false};

  // Makes c the connection cancel() closes; false when cancelled already.
  bool attach(UpstreamConn* c) {
    std::lock_guard<std::mutex> l(mu);
    current = c;
    return !cancelled;
  }
  // Whether the connection may be used again (no cancel() can reach it after this).
  bool detach() {
    std::lock_guard<std::mutex> l(mu);
    current = nullptr;
    return !cancelled;
  }
};

UpstreamCall::UpstreamCall() : impl_(std::make_unique<Impl>()) {}
UpstreamCall::~UpstreamCall() = default;

void UpstreamCall::cancel() {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->cancelled = true;
  // Posted: the stream belongs to the thread in run(); io_context::post is
  // thread-safe. A connection that got this post is never reused (detach()).
  if (UpstreamConn* c = impl_->current) {
    asio::post(c->ioc, [c] {
      beast::error_code ec;
      c->stream.socket().close(ec);
    });
  }
}

namespace {

// Whether a call on a kept-alive connection failed because the replica had
// closed it while it was idle: the request may then be sent again.
bool stale_connection(UpstreamStage stage, const beast::error_code& ec) {
  if (stage == UpstreamStage::kWrite) return true;
  return stage == UpstreamStage::kHead &&
         (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == asio::error::broken_pipe);
}

}  // namespace

UpstreamResult UpstreamCall::run(const ReplicaUrl& url, const UpstreamRequest& req, const UpstreamTimeouts& t,
                                 const std::function<bool(int, const std::string&)>& on_head,
                                 const std::function<bool(std::string_view)>& on_body, UpstreamPool* pool) {
  Impl& m = *impl_;
  http::request<http::string_body> hreq;
  hreq.method_string(req.method);
  hreq.target(url.base_path + req.target);
  hreq.version(11);
  hreq.set(http::field::host, url.host + ":" + url.port);
  for (const auto& [k, v] : req.headers) hreq.set(k, v);
  if (!pool) hreq.set(http::field::connection, "close");  // HTTP/1.1 keeps it alive otherwise
  hreq.body() = req.body;
  hreq.prepare_payload();

  std::unique_ptr<UpstreamConn> conn = pool ? pool->take() : nullptr;
  bool reused = conn != nullptr;
  UpstreamResult res;
  bool keep = false;
  for (;;) {
    if (!conn) {
      conn = std::make_unique<UpstreamConn>();
      if (pool) ++pool->opened_;
    } else {
      ++pool->reused_;
    }
    beast::error_code last_ec;
    res = UpstreamResult{};
    auto fail = [&](UpstreamStage stage, const beast::error_code& ec, const std::string& what) {
      res.stage = stage;
      res.cancelled = m.cancelled.load();
      res.error = res.cancelled ? "cancelled" : ec ? what + ec.message() : what;
      last_ec = ec;
      conn->close();
    };
    UpstreamConn& c = *conn;
    [&] {
      if (!m.attach(&c)) return fail(UpstreamStage::kConnect, {}, "");
      beast::error_code ec;
      if (!reused) {
        // Resolve (loopback names and literal addresses answer at once) and connect.
        tcp::resolver resolver(c.ioc);
        auto endpoints = resolver.resolve(url.host, url.port, ec);
        if (ec) return fail(UpstreamStage::kConnect, ec, "resolve " + url.host + ": ");
        ec = c.await(t.connect_s, [&](auto handler) { c.stream.async_connect(endpoints, std::move(handler)); });
        if (ec || m.cancelled) return fail(UpstreamStage::kConnect, ec, "connect: ");
        beast::error_code ignored;
        c.stream.socket().set_option(tcp::no_delay(true), ignored);
      }
      ec = c.await(t.write_s, [&](auto handler) { http::async_write(c.stream, hreq, std::move(handler)); });
      if (ec || m.cancelled) return fail(UpstreamStage::kWrite, ec, "write: ");

      http::response_parser<http::buffer_body> parser;
      parser.body_limit(boost::none);  // the caller bounds what it keeps
      ec = c.await(t.read_s,
                   [&](auto handler) { http::async_read_header(c.stream, c.buffer, parser, std::move(handler)); });
      if (ec || m.cancelled) return fail(UpstreamStage::kHead, ec, "read head: ");
      res.status = static_cast<int>(parser.get().result_int());
      res.content_type = std::string(parser.get()[http::field::content_type]);
      if (on_head && !on_head(res.status, res.content_type))
        return fail(UpstreamStage::kBody, {}, "stopped by the caller");

      std::vector<char> piece(64 * 1024);
      while (!parser.is_done()) {
        parser.get().body().data = piece.data();
        parser.get().body().size = piece.size();
        ec = c.await(t.read_s,
                     [&](auto handler) { http::async_read_some(c.stream, c.buffer, parser, std::move(handler)); });
        if (ec == http::error::need_buffer) ec = {};
        const size_t n = piece.size() - parser.get().body().size;
        // Bytes that arrived with an error (a stream cut mid-event) are still handed
        // over: the caller decides what a partial event means.
        if (n > 0 && on_body && !on_body(std::string_view(piece.data(), n)))
          return fail(UpstreamStage::kBody, {}, "stopped by the caller");
        if (ec || m.cancelled) return fail(UpstreamStage::kBody, ec, "read body: ");
      }
      res.stage = UpstreamStage::kDone;
      keep = pool != nullptr && parser.keep_alive();
    }();
    const bool usable = m.detach();
    if (reused && usable && res.stage != UpstreamStage::kDone && stale_connection(res.stage, last_ec)) {
      conn.reset();  // closed by the replica while idle: once more on a fresh connection
      reused = false;
      continue;
    }
    if (res.stage == UpstreamStage::kDone && keep && usable) {
      pool->give(std::move(conn));
    } else if (res.stage == UpstreamStage::kDone) {
      conn->close();
    }
    return res;
  }
}

std::pair<int, std::string> upstream_get(const ReplicaUrl& url, const std::string& path, double timeout_s) {
  UpstreamCall call;
  UpstreamRequest req;
  req.target = path;
  UpstreamTimeouts t{timeout_s, timeout_s, timeout_s};
  std::string body;
  auto r = call.run(url, req, t, nullptr, [&](std::string_view p) {
    body.append(p);
    return body.size() < (1u << 20);
  });
  if (r.stage != UpstreamStage::kDone) return {0, r.error};
  return {r.status, body};
}

}  // namespace pagoda::router
