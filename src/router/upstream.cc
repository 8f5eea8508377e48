#include "router/upstream.h"

#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace pagoda::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
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

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// One TCP connection to a replica, on the loop.
struct Conn {
  explicit Conn(asio::io_context& ioc) : stream(ioc) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;  // bytes read past a response (kept with the connection)
  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  }
};

// Whether a call on a kept-alive connection failed because the replica had
// closed it while it was idle: the request may then be sent again.
bool stale_connection(UpstreamStage stage, const beast::error_code& ec) {
  if (stage == UpstreamStage::kWrite) return true;
  return stage == UpstreamStage::kHead &&
         (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == asio::error::broken_pipe);
}

class Call;

}  // namespace

struct Upstreams::Impl {
  std::vector<ReplicaUrl> urls;
  size_t keepalive = 0;
  asio::io_context ioc{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  std::vector<std::atomic<uint64_t>> opened, reused;
  // Loop thread only: each replica's idle connections (most recent last), the calls running.
  std::vector<std::vector<std::unique_ptr<Conn>>> idle;
  std::unordered_map<Call*, std::weak_ptr<Call>> live;
  bool stopping = false;  // loop thread: new calls end at once
  // Guards `joined` against posts racing the end of the loop.
  std::mutex run_mu;
  bool joined = false;

  // Runs fn on the loop; false (fn dropped) once the loop has ended.
  template <class Fn>
  bool post(Fn&& fn) {
    std::lock_guard<std::mutex> l(run_mu);
    if (joined) return false;
    asio::post(ioc, std::forward<Fn>(fn));
    return true;
  }
};

namespace {

class Call final : public UpstreamCall, public std::enable_shared_from_this<Call> {
 public:
  Call(std::shared_ptr<Upstreams::Impl> up, size_t replica, const UpstreamRequest& req, const UpstreamTimeouts& t,
       UpstreamHandlers h, bool pooled, bool counted = true)
      : up_(std::move(up)), r_(replica), t_(t), h_(std::move(h)), pooled_(pooled), counted_(counted),
        resolver_(up_->ioc) {
    const ReplicaUrl& url = up_->urls[r_];
    hreq_.method_string(req.method);
    hreq_.target(url.base_path + req.target);
    hreq_.version(11);
    hreq_.set(bhttp::field::host, url.host + ":" + url.port);
    for (const auto& [k, v] : req.headers) hreq_.set(k, v);
    if (!pooled_) hreq_.set(bhttp::field::connection, "close");  // HTTP/1.1 keeps it alive otherwise
    hreq_.body() = req.body;
    hreq_.prepare_payload();
  }

  void cancel() override {
    up_->post([self = shared_from_this()] { self->do_cancel(); });
  }

  // On the loop.
  void begin() {
    if (up_->stopping) {
      cancelled_ = true;
      return fail(UpstreamStage::kConnect, {}, "");
    }
    up_->live[this] = weak_from_this();
    registered_ = true;
    auto& idle = up_->idle[r_];
    if (pooled_ && !idle.empty()) {
      conn_ = std::move(idle.back());
      idle.pop_back();
      reused_ = true;
      ++up_->reused[r_];
      return write();
    }
    connect();
  }
  void do_cancel() {
    if (finished_ || cancelled_) return;
    cancelled_ = true;
    resolver_.cancel();
    if (conn_) {
      beast::error_code ignored;
      conn_->stream.socket().close(ignored);  // the pending operation completes with an error
    }
  }

 private:
  void connect() {
    conn_ = std::make_unique<Conn>(up_->ioc);
    reused_ = false;
    if (counted_) ++up_->opened[r_];  // health checks are not counted
    const ReplicaUrl& url = up_->urls[r_];
    resolver_.async_resolve(url.host, url.port, [self = shared_from_this()](beast::error_code ec,
                                                                          tcp::resolver::results_type results) {
      if (ec || self->cancelled_)
        return self->fail(UpstreamStage::kConnect, ec, "resolve " + self->up_->urls[self->r_].host + ": ");
      self->conn_->stream.expires_after(seconds(self->t_.connect_s));
      self->conn_->stream.async_connect(results, [self](beast::error_code ec2, const tcp::endpoint&) {
        if (ec2 || self->cancelled_) return self->fail(UpstreamStage::kConnect, ec2, "connect: ");
        beast::error_code ignored;
        self->conn_->stream.socket().set_option(tcp::no_delay(true), ignored);
        self->write();
      });
    });
  }
  void write() {
    conn_->stream.expires_after(seconds(t_.write_s));
    bhttp::async_write(conn_->stream, hreq_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || self->cancelled_) return self->fail(UpstreamStage::kWrite, ec, "write: ");
      self->read_head();
    });
  }
  void read_head() {
    parser_.emplace();
    parser_->body_limit(boost::none);  // the caller bounds what it keeps
    conn_->stream.expires_after(seconds(t_.read_s));
    bhttp::async_read_header(conn_->stream, conn_->buffer, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               if (ec || self->cancelled_) return self->fail(UpstreamStage::kHead, ec, "read head: ");
                               self->res_.status = static_cast<int>(self->parser_->get().result_int());
                               self->res_.content_type =
                                   std::string(self->parser_->get()[bhttp::field::content_type]);
                               if (self->h_.on_head && !self->h_.on_head(self->res_.status, self->res_.content_type))
                                 return self->fail(UpstreamStage::kBody, {}, "stopped by the caller");
                               self->read_body();
                             });
  }
  void read_body() {
    if (parser_->is_done()) return done();
    piece_.resize(16 * 1024);
    parser_->get().body().data = piece_.data();
    parser_->get().body().size = piece_.size();
    conn_->stream.expires_after(seconds(t_.read_s));
    bhttp::async_read_some(conn_->stream, conn_->buffer, *parser_, [self = shared_from_this()](beast::error_code ec,
                                                                                               size_t) {
      if (ec == bhttp::error::need_buffer) ec = {};
      const size_t n = self->piece_.size() - self->parser_->get().body().size;
      // Bytes that arrived with an error (a stream cut mid-event) are still handed
      // over: the caller decides what a partial event means.
      if (n > 0 && self->h_.on_body && !self->h_.on_body(std::string_view(self->piece_.data(), n)))
        return self->fail(UpstreamStage::kBody, {}, "stopped by the caller");
      if (ec || self->cancelled_) return self->fail(UpstreamStage::kBody, ec, "read body: ");
      self->read_body();
    });
  }
  void done() {
    res_.stage = UpstreamStage::kDone;
    auto& idle = up_->idle[r_];
    if (pooled_ && !cancelled_ && !up_->stopping && parser_->keep_alive() && idle.size() < up_->keepalive) {
      conn_->stream.expires_never();
      idle.push_back(std::move(conn_));
    } else {
      conn_->close();
    }
    conn_.reset();
    finish();
  }
  void fail(UpstreamStage stage, const beast::error_code& ec, const std::string& what) {
    if (conn_) conn_->close();
    if (reused_ && !cancelled_ && stale_connection(stage, ec)) return connect();  // once more, fresh
    conn_.reset();
    res_.stage = stage;
    res_.cancelled = cancelled_;
    res_.error = cancelled_ ? "cancelled" : ec ? what + ec.message() : what;
    finish();
  }
  void finish() {
    finished_ = true;
    if (registered_) up_->live.erase(this);
    auto on_done = std::move(h_.on_done);
    h_ = {};  // what the handlers hold (the router's exchange) goes now
    if (on_done) on_done(std::move(res_));
  }

  std::shared_ptr<Upstreams::Impl> up_;
  size_t r_;
  UpstreamTimeouts t_;
  UpstreamHandlers h_;
  bool pooled_;
  bool counted_;  // in opened (a proxied call, not a health check)
  tcp::resolver resolver_;
  bhttp::request<bhttp::string_body> hreq_;
  std::unique_ptr<Conn> conn_;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser_;
  std::vector<char> piece_;
  UpstreamResult res_;
  bool reused_ = false, cancelled_ = false, finished_ = false, registered_ = false;
};

}  // namespace

Upstreams::Upstreams(std::vector<ReplicaUrl> replicas, size_t keepalive) : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.keepalive = keepalive;
  m.opened = std::vector<std::atomic<uint64_t>>(replicas.size());
  m.reused = std::vector<std::atomic<uint64_t>>(replicas.size());
  m.idle.resize(replicas.size());
  m.urls = std::move(replicas);
  m.work.emplace(m.ioc.get_executor());
  m.thread = std::thread([&m] { m.ioc.run(); });
}

Upstreams::~Upstreams() { stop(); }

void Upstreams::stop() {
  Impl& m = *impl_;
  m.post([&m] {
    m.stopping = true;
    std::vector<std::shared_ptr<Call>> calls;
    for (auto& [p, w] : m.live)
      if (auto c = w.lock()) calls.push_back(std::move(c));
    for (auto& c : calls) c->do_cancel();
    for (auto& v : m.idle) {
      for (auto& c : v) c->close();
      v.clear();
    }
    m.work.reset();  // run() returns once the cancelled calls have ended
  });
  if (m.thread.joinable()) m.thread.join();
  {
    std::lock_guard<std::mutex> l(m.run_mu);
    m.joined = true;
  }
  // Whatever was posted while the loop was ending (a late cancel()) runs here,
  // so no handler (and no call it holds) outlives the loop.
  m.ioc.restart();
  m.ioc.poll();
}

std::shared_ptr<UpstreamCall> Upstreams::start(size_t replica, UpstreamRequest req, const UpstreamTimeouts& t,
                                               UpstreamHandlers handlers) {
  auto call = std::make_shared<Call>(impl_, replica, req, t, std::move(handlers), impl_->keepalive > 0);
  // The loop has ended: the call ends cancelled, here (begin() sees stopping).
  if (!impl_->post([call] { call->begin(); })) call->begin();
  return call;
}

std::pair<int, std::string> Upstreams::get(size_t replica, const std::string& path, double timeout_s) {
  UpstreamRequest req;
  req.target = path;
  auto body = std::make_shared<std::string>();
  auto done = std::make_shared<std::promise<UpstreamResult>>();
  auto fut = done->get_future();
  UpstreamHandlers h;
  h.on_body = [body](std::string_view p) {
    body->append(p);
    return body->size() < (1u << 20);
  };
  h.on_done = [done](UpstreamResult r) { done->set_value(std::move(r)); };
  auto call = std::make_shared<Call>(impl_, replica, req, UpstreamTimeouts{timeout_s, timeout_s, timeout_s},
                                     std::move(h), /*pooled=*/false, /*counted=*/false);
  if (!impl_->post([call] { call->begin(); })) return {0, "the router is stopping"};
  const UpstreamResult r = fut.get();
  if (r.stage != UpstreamStage::kDone) return {0, r.error};
  return {r.status, *body};
}

void Upstreams::clear_idle(size_t replica) {
  impl_->post([m = impl_.get(), replica] {
    for (auto& c : m->idle[replica]) c->close();
    m->idle[replica].clear();
  });
}

size_t Upstreams::num_replicas() const { return impl_->urls.size(); }
uint64_t Upstreams::opened(size_t r) const { return impl_->opened[r].load(); }
uint64_t Upstreams::reused(size_t r) const { return impl_->reused[r].load(); }

}  // namespace pagoda::router
