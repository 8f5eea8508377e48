// A small blocking HTTP/1.1 client for the router's calls to its replicas
// (Boost.Beast). One UpstreamCall is one request, run on the calling thread over
// its connection's private io_context, so every step has a deadline and
// cancel() from any other thread (a client that went away, the router stopping)
// ends it at once. The response body is handed over piece by piece as it
// arrives, which is what passes a replica's SSE stream through without
// buffering it. With an UpstreamPool the connection is kept alive: taken from
// the replica's idle connections when one is there, given back when the
// response was read whole and the replica keeps the connection open.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
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

// One TCP connection to a replica with its own io_context (opaque).
struct UpstreamConn;

// The idle keep-alive connections to one replica: at most max_idle kept, the
// most recently used taken first. Thread-safe.
class UpstreamPool {
 public:
  explicit UpstreamPool(size_t max_idle);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;
  std::unique_ptr<UpstreamConn> take();            // nullptr when none is idle
  void give(std::unique_ptr<UpstreamConn> conn);   // closed and dropped beyond max_idle
  void clear();                                    // drops every idle connection (the replica failed)
  size_t idle() const;
  uint64_t opened() const { return opened_.load(); }  // connections made for calls through this pool
  uint64_t reused() const { return reused_.load(); }  // calls that ran on an idle connection

 private:
  friend class UpstreamCall;
  size_t max_idle_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<UpstreamConn>> idle_;
  std::atomic<uint64_t> opened_{0}, reused_{0};
};

class UpstreamCall {
 public:
  UpstreamCall();
  ~UpstreamCall();
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  // Runs the request once. on_head(status, content_type) comes when the head is
  // read; on_body gets each piece of the decoded body (chunked framing removed).
  // Either may return false to stop reading (the result then has an error).
  // pool: keep-alive connections to url's replica (nullptr: a fresh connection,
  // closed at the end). A kept connection the replica closed meanwhile fails
  // before any byte of the answer; the request is then sent once more on a
  // fresh connection.
  UpstreamResult run(const ReplicaUrl& url, const UpstreamRequest& req, const UpstreamTimeouts& t,
                     const std::function<bool(int status, const std::string& content_type)>& on_head,
                     const std::function<bool(std::string_view piece)>& on_body, UpstreamPool* pool = nullptr);
  // Any thread, any time (before, during or after run): the call fails as soon as
  // possible with cancelled = true.
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GET url/path with the whole body read: (status, body); status 0 on failure.
std::pair<int, std::string> upstream_get(const ReplicaUrl& url, const std::string& path, double timeout_s);

}  // namespace pagoda::router
