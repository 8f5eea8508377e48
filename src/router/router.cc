#include "router/router.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/log.h"
#include "gguf/gguf.h"
#include "openai/openai_api.h"
#include "router/proxy.h"
#include "tok/tokenizer.h"

namespace pagoda::router {

bool parse_policy(const std::string& name, Policy* out) {
  if (name == "prefix") *out = Policy::kPrefix;
  else if (name == "round-robin") *out = Policy::kRoundRobin;
  else if (name == "least-loaded") *out = Policy::kLeastLoaded;
  else return false;
  return true;
}

namespace {

using server::ApiError;
using server::HttpRequest;
using server::Responder;

std::string prom_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void Router::Impl::set_healthy(size_t r, bool ok, const std::string& why) {
  if (!ok) upstreams->clear_idle(r);  // its kept connections are likely dead too
  if (healthy[r].exchange(ok) != ok) {
    // Its index entries go with it, and come back from its replay buffer.
    if (kv && ok) kv->resync(static_cast<int>(r));
    if (kv && !ok) kv->drop(static_cast<int>(r));
    if (ok) PAGODA_LOG_INFO("replica %s is healthy: back on the ring", urls[r].text.c_str());
    else PAGODA_LOG_WARN("replica %s is unhealthy (%s): off the ring", urls[r].text.c_str(), why.c_str());
  }
}

void Router::Impl::check_health_once() {
  const double t = std::clamp(cfg.health_interval_s, 0.2, 2.0);
  for (size_t r = 0; r < urls.size(); ++r) {
    auto [status, body] = upstreams->get(r, "/health", t);
    set_healthy(r, status == 200, status == 0 ? body : "GET /health answered " + std::to_string(status));
  }
}

void Router::Impl::health_loop() {
  std::unique_lock<std::mutex> l(health_mu);
  while (!health_stop) {
    health_cv.wait_for(l, std::chrono::duration<double>(cfg.health_interval_s), [&] { return health_stop; });
    if (health_stop) break;
    l.unlock();
    check_health_once();
    l.lock();
  }
}

void Router::Impl::send_error(Responder& res, int status, const std::string& msg, const std::string& type,
                              const std::string& code) {
  {
    std::lock_guard<std::mutex> l(fail_mu);
    ++failures[status];
  }
  std::map<std::string, std::string> extra;
  if (status == 503) extra["Retry-After"] = "1";
  res.send(status, "application/json", server::error_body(ApiError{status, msg, type, "", code}), extra);
}

RouteChoice Router::Impl::pick(const RouteInput* in, const std::vector<bool>& tried) {
  std::lock_guard<std::mutex> l(route_mu);
  std::vector<bool> eligible(urls.size());
  for (size_t r = 0; r < urls.size(); ++r) eligible[r] = healthy[r].load() && !tried[r];
  RouteChoice c;
  const uint64_t turn = rr_counter++;
  if (cfg.policy == Policy::kRoundRobin) {
    c = choose_round_robin(eligible, turn);
  } else {
    const std::optional<uint64_t> key = cfg.policy == Policy::kPrefix && in ? in->key : std::nullopt;
    if (key && !in->matches.empty())
      c = choose_kv(in->matches,
                    {.tier_weight = cfg.kv_tier_weight, .min_blocks = cfg.kv_min_match,
                     .match_threshold = cfg.kv_match_threshold, .hold_imbalance = cfg.kv_max_imbalance},
                    *ring, *key, in->chain, in_flight, eligible, cfg.max_imbalance);
    if (c.replica < 0)
      c = key ? choose_affinity(*ring, *key, in_flight, eligible, cfg.max_imbalance)
              : choose_least_loaded(in_flight, eligible, turn);
  }
  if (c.replica >= 0) ++in_flight[static_cast<size_t>(c.replica)];
  return c;
}

void Router::Impl::handle(HttpRequest req, std::shared_ptr<Responder> res) {
  // serve's routes; the router answers /health and /metrics itself (about the
  // replicas and itself) and passes every other one to a replica.
  struct Route {
    const char* path;
    const char* method;
    bool proxied;
  };
  static const Route kRoutes[] = {{"/health", "GET", false},          {"/metrics", "GET", false},
                                  {"/v1/models", "GET", true},        {"/v1/completions", "POST", true},
                                  {"/v1/chat/completions", "POST", true}, {"/tokenize", "POST", true},
                                  {"/detokenize", "POST", true}};
  const auto it = std::find_if(std::begin(kRoutes), std::end(kRoutes),
                               [&](const Route& r) { return req.target == r.path; });
  const Route* route = it == std::end(kRoutes) ? nullptr : it;
  if (!route)
    return send_error(*res, 404, "no route for " + req.method + " " + req.target, "NotFoundError", "not_found");
  if (req.method != route->method && !(req.method == "HEAD" && std::string(route->method) == "GET")) {
    {
      std::lock_guard<std::mutex> l(fail_mu);
      ++failures[405];
    }
    ApiError e{405, "method " + req.method + " is not allowed on " + req.target + " (use " + route->method + ")",
               "invalid_request_error", "", "method_not_allowed"};
    return res->send(405, "application/json", server::error_body(e), {{"Allow", route->method}});
  }
  if (req.target == "/metrics") return res->send(200, "text/plain; version=0.0.4", render_metrics());
  const bool generate = req.target == "/v1/completions" || req.target == "/v1/chat/completions";
  if (!route->proxied) {  // /health
    int n = 0;
    for (const auto& h : healthy) n += h.load() ? 1 : 0;
    const std::string body = "{\"healthy_replicas\":" + std::to_string(n) + ",\"replicas\":" +
                             std::to_string(urls.size()) + "}";
    return res->send(n > 0 ? 200 : 503, "application/json", body);
  }
  // Everything else goes to a replica, asynchronously (proxy.h); a generation
  // is first read for its routing key on a worker.
  auto ex = std::make_shared<Exchange>(this, std::move(req), res);
  {
    std::lock_guard<std::mutex> l(live_mu);
    if (stopping)
      return send_error(*res, 503, "the router is stopping", "service_unavailable", "stopping");
    if (live.size() >= static_cast<size_t>(cfg.max_in_flight))
      return send_error(*res, 503,
                        "router is overloaded: " + std::to_string(cfg.max_in_flight) + " requests are in flight",
                        "service_unavailable", "overloaded");
    live.insert(ex);
  }
  res->on_disconnect([ex] { ex->cancel(); });
  auto run = [this, ex, res] {
    try {
      ex->begin();
    } catch (const std::exception& e) {
      PAGODA_LOG_ERROR("router: internal error: %s", e.what());
      res->send(500, "application/json",
                server::error_body(ApiError{500, std::string("internal error: ") + e.what(), "internal_error", "", ""}));
      finished(ex);
    }
  };
  if (!generate) return run();  // nothing to read: straight to the loop
  if (!workers->try_post(run)) {
    finished(ex);
    send_error(*res, 503, "router is overloaded: its queue is full", "service_unavailable", "overloaded");
  }
}

std::string Router::Impl::render_metrics() {
  std::string out;
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto line = [&](const char* name, const std::string& labels, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    out += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
  };
  std::vector<int> flight;
  {
    std::lock_guard<std::mutex> l(route_mu);
    flight = in_flight;
  }
  auto rep = [&](size_t r) { return "replica=\"" + prom_escape(urls[r].text) + "\""; };
  head("pagoda:router_requests_total", "counter", "Requests sent to each replica (retries included).");
  for (size_t r = 0; r < urls.size(); ++r) line("pagoda:router_requests_total", rep(r), double(requests[r].load()));
  head("pagoda:router_in_flight_requests", "gauge", "Requests each replica is answering now.");
  for (size_t r = 0; r < urls.size(); ++r) line("pagoda:router_in_flight_requests", rep(r), flight[r]);
  head("pagoda:router_replica_healthy", "gauge", "1 while the replica is on the ring (its /health answers), else 0.");
  for (size_t r = 0; r < urls.size(); ++r) line("pagoda:router_replica_healthy", rep(r), healthy[r].load() ? 1 : 0);
  head("pagoda:router_routing_decisions_total", "counter",
       "First routing decision of each generation request, by kind (affinity: the prompt's owner on the "
       "ring; fallback: a later replica on the ring, the owner being over the load bound; least_loaded: "
       "no whole block to hash or the least-loaded policy; round_robin: that policy; kv_events: the "
       "replica holding the longest prefix by the replicas' KV events).");
  for (RouteKind k : {RouteKind::kAffinity, RouteKind::kFallback, RouteKind::kLeastLoaded, RouteKind::kRoundRobin,
                      RouteKind::kKvEvents})
    line("pagoda:router_routing_decisions_total", std::string("kind=\"") + route_kind_name(k) + "\"",
         double(decisions[static_cast<size_t>(k)].load()));
  head("pagoda:router_upstream_connections_total", "counter",
       "Upstream calls by connection: opened (a new TCP connection) or reused (a kept-alive one).");
  for (size_t r = 0; r < urls.size(); ++r) {
    line("pagoda:router_upstream_connections_total", rep(r) + ",kind=\"opened\"", double(upstreams->opened(r)));
    line("pagoda:router_upstream_connections_total", rep(r) + ",kind=\"reused\"", double(upstreams->reused(r)));
  }
  head("pagoda:router_retries_total", "counter", "Requests sent again to another replica after one failed.");
  line("pagoda:router_retries_total", "", double(retries.load()));
  head("pagoda:router_stream_errors_total", "counter",
       "Streams ended with an error event because their replica failed after bytes were sent.");
  line("pagoda:router_stream_errors_total", "", double(stream_errors.load()));
  head("pagoda:router_request_failures_total", "counter", "Requests the router itself answered with an error.");
  {
    std::lock_guard<std::mutex> l(fail_mu);
    if (failures.empty()) line("pagoda:router_request_failures_total", "", 0);
    for (const auto& [status, n] : failures)
      line("pagoda:router_request_failures_total", "status=\"" + std::to_string(status) + "\"", double(n));
  }
  if (kv) {
    std::vector<std::string> labels;
    for (size_t r = 0; r < urls.size(); ++r) labels.push_back(rep(r));
    out += kv->render_metrics(labels);
  }
  return out;
}

Expected<std::unique_ptr<Router>> Router::create(const RouterConfig& config) {
  if (config.replicas.empty()) return make_error("at least one --replica URL is needed");
  if (config.block_size < 1) return make_error("--block-size must be at least 1");
  if (config.affinity_blocks < 1) return make_error("--affinity-blocks must be at least 1");
  if (!(config.max_imbalance >= 0)) return make_error("--max-imbalance must be >= 0");
  if (!(config.health_interval_s > 0)) return make_error("--health-interval must be > 0");
  if (config.workers < 1) return make_error("--workers must be at least 1");
  if (config.keepalive_per_replica < 0) return make_error("--upstream-keepalive must be >= 0");
  if (config.kv_events && config.kv_event_endpoints.size() > config.replicas.size())
    return make_error("--kv-events-endpoint is given " + std::to_string(config.kv_event_endpoints.size()) +
                      " times for " + std::to_string(config.replicas.size()) + " replicas");
  if (config.kv_events && config.kv_replay_endpoints.size() > config.replicas.size())
    return make_error("--kv-replay-endpoint is given " + std::to_string(config.kv_replay_endpoints.size()) +
                      " times for " + std::to_string(config.replicas.size()) + " replicas");
  if (config.kv_min_match < 1) return make_error("--kv-min-match must be at least 1");
  if (!(config.kv_match_threshold >= 0 && config.kv_match_threshold <= 1))
    return make_error("--kv-match-threshold must be in [0, 1]");
  if (!(config.kv_tier_weight >= 0 && config.kv_tier_weight <= 1)) return make_error("--kv-tier-weight must be in 0..1");
  std::unique_ptr<Router> router(new Router());
  router->impl_ = std::make_unique<Impl>();
  Impl* m = router->impl_.get();
  m->cfg = config;
  std::vector<std::string> names;
  for (const auto& u : config.replicas) {
    PAGODA_ASSIGN_OR_RETURN(ReplicaUrl parsed, parse_replica_url(u));
    if (std::find(names.begin(), names.end(), parsed.text) != names.end())
      return make_error("replica " + parsed.text + " is given twice");
    names.push_back(parsed.text);
    m->urls.push_back(std::move(parsed));
  }
  m->ring = std::make_unique<HashRing>(names);
  m->in_flight.assign(names.size(), 0);
  m->healthy = std::vector<std::atomic<bool>>(names.size());
  for (auto& h : m->healthy) h = true;
  m->requests = std::vector<std::atomic<uint64_t>>(names.size());
  m->upstreams = std::make_unique<Upstreams>(m->urls, static_cast<size_t>(config.keepalive_per_replica));
  if (config.kv_events) {
    std::vector<KvEventEndpoints> eps;
    for (size_t r = 0; r < m->urls.size(); ++r) {
      auto given = [&](const std::vector<std::string>& v) { return r < v.size() ? v[r] : std::string(); };
      KvEventEndpoints ep{given(config.kv_event_endpoints), given(config.kv_replay_endpoints)};
      if (ep.events.empty()) ep.events = "tcp://" + m->urls[r].host + ":5557";
      if (ep.replay.empty()) ep.replay = "tcp://" + m->urls[r].host + ":5558";
      if (ep.replay == "none") ep.replay.clear();
      PAGODA_LOG_INFO("router: kv events of %s from %s (replay %s)", m->urls[r].text.c_str(), ep.events.c_str(),
                      ep.replay.empty() ? "none" : ep.replay.c_str());
      eps.push_back(std::move(ep));
    }
    m->kv = std::make_unique<KvSubscriber>(std::move(eps), config.kv_replay_timeout_s);
  }
  m->workers = std::make_unique<server::WorkerPool>(config.workers, static_cast<size_t>(config.max_in_flight));
  if (!config.model_path.empty()) {
    PAGODA_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(config.model_path));
    PAGODA_ASSIGN_OR_RETURN(auto tk, tok::Tokenizer::from_gguf(*file));
    PAGODA_ASSIGN_OR_RETURN(m->codec, server::TextCodec::create(*tk));
    if (!m->codec->has_chat_template())
      PAGODA_LOG_WARN("router: %s has no usable chat template (%s): chat requests go to the least-loaded replica",
                      config.model_path.c_str(), m->codec->template_error().c_str());
  }
  m->http = std::make_unique<server::HttpServer>(config.http, [m](HttpRequest req, std::shared_ptr<Responder> res) {
    try {
      m->handle(std::move(req), res);
    } catch (const std::exception& e) {
      PAGODA_LOG_ERROR("router: internal error: %s", e.what());
      res->send(500, "application/json",
                server::error_body(ApiError{500, std::string("internal error: ") + e.what(), "internal_error", "", ""}));
    }
  });
  return router;
}

Router::~Router() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (!m.http) return;  // create() failed before the server (and any thread) existed
  m.http->stop();
  std::vector<std::shared_ptr<Exchange>> live;
  {
    std::lock_guard<std::mutex> l(m.live_mu);
    m.stopping = true;
    live.assign(m.live.begin(), m.live.end());
  }
  for (const auto& ex : live) ex->cancel();
  live.clear();
  {
    // The cancelled calls end on the loop, each answering its client (or not: gone).
    std::unique_lock<std::mutex> l(m.live_mu);
    m.live_cv.wait(l, [&] { return m.live.empty(); });
  }
  m.workers->stop();
  {
    std::lock_guard<std::mutex> l(m.health_mu);
    m.health_stop = true;
  }
  m.health_cv.notify_all();
  if (m.health_thread.joinable()) m.health_thread.join();
  m.upstreams->stop();
  m.kv.reset();
}

Expected<int> Router::start() {
  if (impl_->kv) PAGODA_TRY(impl_->kv->start());
  impl_->check_health_once();
  for (size_t r = 0; r < impl_->urls.size(); ++r)
    PAGODA_LOG_INFO("router: replica %s %s", impl_->urls[r].text.c_str(),
                    impl_->healthy[r].load() ? "is healthy" : "does not answer GET /health yet");
  std::string err;
  if (!impl_->http->start(&err)) return make_error(err);
  impl_->health_thread = std::thread([m = impl_.get()] { m->health_loop(); });
  return impl_->http->port();
}

void Router::run() { impl_->http->run(); }
void Router::stop() { impl_->http->stop(); }

}  // namespace pagoda::router
