// The router's HTTP/1.1 client for its replicas, asynchronous (issue 37): one
// event loop (a Boost.Asio io_context over epoll, run by one thread) drives
// every call to every replica, so the router's thread count does not grow
// with the requests in flight. Each replica has a pool of idle keep-alive
// connections: a call takes one when there is one, and gives it back when the
// response was read whole and the replica keeps it open. A kept connection
// the replica closed meanwhile fails before any byte of the answer; the call
// is then sent once more on a fresh connection. The response body is handed
// over piece by piece as it arrives, which is what passes a replica's SSE
// stream through without buffering it.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace pagoda::router {

// http://HOST:PORT[/BASE]; HOST a name or an IPv4 address ([v6] in brackets).
struct ReplicaUrl {
  std::string host;
  std::string port;       // "80" when absent
  std::string base_path;  // "" or "/base" (no trailing '/')
  std::string text;       // normalized: http://host:port/base
};
Expected<ReplicaUrl> parse_replica_url(const std::string& url);

struct UpstreamRequest {
  std::string method = "GET";
  std::string target;  // "/v1/completions" (the replica's base path is prepended)
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

struct UpstreamTimeouts {
  double connect_s = 3;
  double write_s = 30;
  // For the response head and for each later piece of the body: a non-streaming
  // generation sends its head only when it is done, so this bounds a whole request.
  double read_s = 600;
};

// Where a call stopped. Before kBody nothing of the response reached on_body.
enum class UpstreamStage { kConnect, kWrite, kHead, kBody, kDone };

struct UpstreamResult {
  UpstreamStage stage = UpstreamStage::kConnect;  // kDone: the whole response was read
  int status = 0;                                 // set from kBody on
  std::string content_type;
  std::string error;                              // why it stopped before kDone
  bool cancelled = false;
};

// What a call reports, always on the loop's thread. on_head(status,
// content_type) when the head is read; on_body with each piece of the decoded
// body (chunked framing removed); either may return false to stop the call.
// on_done exactly once, last (also after cancel()).
struct UpstreamHandlers {
  std::function<bool(int status, const std::string& content_type)> on_head;
  std::function<bool(std::string_view piece)> on_body;
  std::function<void(UpstreamResult)> on_done;
};

// A call in progress. cancel() from any thread, any time: the call ends as soon
// as the loop sees it, with cancelled = true (nothing when it ended already).
class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  virtual void cancel() = 0;
};

class Upstreams {
 public:
  // keepalive: idle connections kept per replica (0: one connection per call,
  // closed after it).
  Upstreams(std::vector<ReplicaUrl> replicas, size_t keepalive);
  ~Upstreams();  // stops the loop: calls still running end cancelled first
  Upstreams(const Upstreams&) = delete;
  Upstreams& operator=(const Upstreams&) = delete;

  // Starts `req` to `replica` on the loop and returns at once.
  std::shared_ptr<UpstreamCall> start(size_t replica, UpstreamRequest req, const UpstreamTimeouts& t,
                                      UpstreamHandlers handlers);
  // GET path on a fresh connection with the whole body read, waiting for it:
  // (status, body); status 0 on failure (body: why). Not from the loop's thread.
  std::pair<int, std::string> get(size_t replica, const std::string& path, double timeout_s);
  // Drops the replica's idle connections (it failed: they are likely dead too).
  void clear_idle(size_t replica);

  size_t num_replicas() const;
  uint64_t opened(size_t replica) const;  // connections made for proxied calls (not health checks)
  uint64_t reused(size_t replica) const;  // calls that ran on an idle connection
  void stop();                            // idempotent; ends every call (cancelled), joins the loop

  struct Impl;  // opaque (upstream.cc); public so that the calls there can hold it

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace pagoda::router
