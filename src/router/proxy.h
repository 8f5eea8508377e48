// One proxied request (issue 37: no thread of its own). It is read for its
// routing key on a worker, then lives as callbacks on the upstream loop: each
// attempt is an asynchronous call to one replica, streamed back to the client
// as it arrives. A replica that fails before any byte of the answer was sent
// (refused, reset, a 5xx) is retried on another; one that fails after ends
// the stream with an SSE error event. Every exchange is answered once, or
// ends without an answer only when its client went away.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "router/router_impl.h"

namespace pagoda::router {

class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(Router::Impl* m, server::HttpRequest req, std::shared_ptr<server::Responder> res);
  // Computes the routing input (a generation's prompt: CPU work, run it on a
  // worker) and starts the first attempt.
  void begin();
  // The client went away or the router stops: the call running ends now. Any thread.
  void cancel();

 private:
  struct Answer {
    int status = 0;
    std::string content_type, body;
  };
  void attempt();                    // the next replica, or the final answer
  void on_done(UpstreamResult r);    // upstream loop
  bool on_body(std::string_view piece);
  void end();                        // once: the exchange leaves the router's books

  Router::Impl* m_;
  server::HttpRequest req_;
  std::shared_ptr<server::Responder> res_;
  bool generate_ = false;
  Router::Impl::RouteInput route_;
  UpstreamRequest up_;
  std::vector<bool> tried_;
  size_t attempts_ = 0;
  std::optional<Answer> last_5xx_;   // the answer when no replica does better
  std::string last_error_ = "no healthy replica";
  // The attempt running (written before its call starts, then on the loop only).
  int replica_ = -1;
  Answer got_;
  bool streaming_ = false, started_ = false, boundary_ = true;
  std::string tail_;                 // the last two bytes forwarded: between events or not
  std::mutex mu_;
  std::shared_ptr<UpstreamCall> call_;  // guarded by mu_
  bool cancelled_ = false;              // guarded by mu_
};

}  // namespace pagoda::router
