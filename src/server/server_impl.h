// Server::Impl, shared by the files of `pagoda serve` (server.cc: routing,
// generation, start-up; server_routes.cc: the token and admin routes). Internal
// to server/: nothing outside includes it.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "base/log.h"
#include "base/rng.h"
#include "grammar/cache.h"
#include "http/http.h"
#include "http/worker_pool.h"
#include "openai/anthropic_api.h"
#include "openai/openai_api.h"
#include "openai/text.h"
#include "server/async_engine.h"
#include "server/dashboard.h"
#include "server/metrics.h"
#include "server/server.h"

namespace pagoda::server {

inline ApiError not_found(std::string msg, std::string code = "not_found") {
  return ApiError{404, std::move(msg), "NotFoundError", "", std::move(code)};
}

inline ApiError overloaded(std::string msg) {
  return ApiError{503, std::move(msg), "service_unavailable", "", "overloaded"};
}

struct Server::Impl {
  // Declaration order is destruction order reversed: the worker pool and the engine
  // (whose callbacks hold Responders, which hold sessions on the io_context) go
  // before the HTTP server; text and metrics, which both reference, go last.
  ServerConfig cfg;
  Metrics metrics;
  std::unique_ptr<TextCodec> text;
  std::string model_name;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<WorkerPool> workers;
  // The live cache dashboard (/dashboard*): it asks the engine for snapshots, so it
  // goes (and stops) before the engine.
  std::unique_ptr<DashboardHub> dashboard;
  // Built on the first constrained request (a vocabulary trie: unconstrained
  // serving never pays for it).
  std::once_flag grammars_once;
  std::unique_ptr<grammar::GrammarCache> grammars;
  std::atomic<const grammar::GrammarCache*> grammars_ready{nullptr};  // grammars, for other threads once built
  std::string grammars_error;

  // --seed: the stream unseeded requests draw from.
  std::mutex seed_mu;
  Rng seed_rng{0};
  // Request fields already warned about (once per name; bounded, so hostile bodies
  // with ever new names cannot grow it or flood the log).
  std::mutex warned_mu;
  std::set<std::string> warned_fields;

  void handle(HttpRequest req, std::shared_ptr<Responder> res);
  // POST /reset_prefix_cache (vLLM's route; issue 36): ?force=true (or vLLM's
  // reset_running_requests=true) preempts running requests first, else 409
  // while any runs; ?tiers=true (vLLM's reset_external) also clears this
  // engine's entries from the disk/Redis tiers and answers the count per tier
  // ({"status":"ok","tiers":{"disk":N,"redis":M}}). With a dashboard admin key
  // configured, only that key may reset (one tenant must not empty everyone's cache).
  void handle_reset_prefix_cache(const HttpRequest& req, std::shared_ptr<Responder> res, const std::string& key);
  void warn_ignored(const std::vector<std::string>& fields);
  // anthropic: the error in Anthropic's shape and status (/v1/messages*).
  void send_error(Responder& res, const ApiError& e, bool anthropic = false) {
    const int status = anthropic ? anthropic_status(e) : e.status;
    PAGODA_LOG_INFO("status=%d error=%s", status, e.message.substr(0, 200).c_str());
    metrics.inc_counter("pagoda:request_failure_total", 1, std::to_string(status));
    std::map<std::string, std::string> extra;
    if (e.status == 503) extra.emplace("Retry-After", "1");  // (operator[]= trips GCC 12's -Wrestrict here)
    res.send(status, "application/json", anthropic ? anthropic_error_body(e) : error_body(e), extra);
  }
  // nullopt: authorized (the matched key in *key, "" without auth); else the error.
  // The dashboard's routes also take the admin key.
  std::optional<ApiError> authorize(const HttpRequest& req, bool dashboard_route, std::string* key) const;
  // The dashboard picture for the key a request was authorized with.
  DashboardViewer dashboard_viewer(const std::string& key) const;
  // Requests waiting: to be parsed, to be added to the engine, and in its queue.
  int64_t num_waiting() const {
    return static_cast<int64_t>(workers->num_queued()) + engine->num_pending() + engine->stats().num_waiting;
  }
  ApiError waiting_limit() const {
    return overloaded("server is overloaded: more than " + std::to_string(cfg.max_waiting) + " requests are waiting");
  }
  // anthropic: /v1/messages (ep is kChat).
  void handle_generate(Endpoint ep, const HttpRequest& req, const std::string& key, std::shared_ptr<Responder> res,
                       double t_start, bool anthropic = false);
  void handle_count_tokens(const HttpRequest& req, Responder& res);
  // The compiled grammar of a request's constraint (nullptr when unconstrained).
  std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> constraint_grammar(ParsedRequest& r);
  void handle_tokenize(const HttpRequest& req, Responder& res);
  void handle_detokenize(const HttpRequest& req, Responder& res);
};

}  // namespace pagoda::server
