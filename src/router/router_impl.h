// Router::Impl, shared by router.cc (routes, health, metrics, start-up) and
// proxy.cc (the exchange of one proxied request). Internal to router/.
#pragma once
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "http/http.h"
#include "http/worker_pool.h"
#include "openai/errors.h"
#include "openai/text.h"
#include "router/kv_subscriber.h"
#include "router/ring.h"
#include "router/router.h"
#include "router/upstream.h"

namespace pagoda::router {

class Exchange;

struct Router::Impl {
  RouterConfig cfg;
  std::vector<ReplicaUrl> urls;
  std::unique_ptr<HashRing> ring;
  std::unique_ptr<server::TextCodec> codec;  // null without --model
  // The event loop every upstream call runs on, with the keep-alive pools.
  std::unique_ptr<Upstreams> upstreams;
  std::unique_ptr<server::HttpServer> http;

  // Replica state. The choice and the in-flight increment happen under route_mu,
  // so a burst of requests sees each other's load.
  std::mutex route_mu;
  std::vector<int> in_flight;            // guarded by route_mu
  std::vector<std::atomic<bool>> healthy;
  uint64_t rr_counter = 0;               // guarded by route_mu
  // Counters for /metrics.
  std::vector<std::atomic<uint64_t>> requests;  // per replica, retries included
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> stream_errors{0};
  std::array<std::atomic<uint64_t>, kNumRouteKinds> decisions{};  // by RouteKind
  std::unique_ptr<KvSubscriber> kv;  // --kv-events
  std::mutex fail_mu;
  std::map<int, uint64_t> failures;      // router-made error answers by status

  // Routing keys (parse the body, tokenize, render the chat template) are CPU
  // work: a few worker threads, not the I/O or the upstream loop's.
  std::unique_ptr<server::WorkerPool> workers;
  // The requests being proxied, to cancel at stop.
  std::mutex live_mu;
  std::condition_variable live_cv;
  bool stopping = false;                 // guarded by live_mu
  std::set<std::shared_ptr<Exchange>> live;

  std::thread health_thread;
  std::mutex health_mu;
  std::condition_variable health_cv;
  bool health_stop = false;

  void handle(server::HttpRequest req, std::shared_ptr<server::Responder> res);
  // What a generation request is routed on: the ring's affinity key and, with
  // --kv-events, how much of its prompt each replica holds.
  struct RouteInput {
    std::optional<uint64_t> key;
    std::vector<PrefixMatch> matches;
    std::vector<uint64_t> chain;  // router_chain of the prompt (event routing's tie order)
  };
  RouteChoice pick(const RouteInput* in, const std::vector<bool>& tried);
  void release(int replica) {
    std::lock_guard<std::mutex> l(route_mu);
    --in_flight[static_cast<size_t>(replica)];
  }
  bool is_stopping() {
    std::lock_guard<std::mutex> l(live_mu);
    return stopping;
  }
  // An exchange has answered (or has nobody left to answer): it leaves `live`.
  void finished(const std::shared_ptr<Exchange>& ex) {
    std::lock_guard<std::mutex> l(live_mu);
    live.erase(ex);
    live_cv.notify_all();
  }
  void set_healthy(size_t r, bool ok, const std::string& why);
  void check_health_once();
  void health_loop();
  void send_error(server::Responder& res, int status, const std::string& msg, const std::string& type,
                  const std::string& code);
  std::string render_metrics();
};

}  // namespace pagoda::router
