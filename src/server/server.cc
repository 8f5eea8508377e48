#include "server/server.h"

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <variant>

#include "base/log.h"
#include "base/log_control.h"
#include "base/rng.h"
#include "base/timer.h"
#include "grammar/cache.h"
#include "server/anthropic_api.h"
#include "server/anthropic_generation.h"
#include "server/async_engine.h"
#include "server/dashboard.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/process_memory.h"
#include "server/text.h"
#include "server/worker_pool.h"
#include "tok/tokenizer.h"

namespace pagoda::server {
namespace {

ApiError not_found(std::string msg, std::string code = "not_found") {
  return ApiError{404, std::move(msg), "NotFoundError", "", std::move(code)};
}

ApiError overloaded(std::string msg) { return ApiError{503, std::move(msg), "service_unavailable", "", "overloaded"}; }

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Compares every byte of the longer string; timing does not depend on where they differ.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// "Bearer KEY" with the scheme in any case (RFC 9110: auth schemes are
// case-insensitive) and any run of spaces after it; "" when absent or another scheme.
std::string bearer_token(const std::string& auth) {
  static const char kScheme[] = "bearer";
  if (auth.size() <= 6) return "";
  for (size_t i = 0; i < 6; ++i)
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kScheme[i]) return "";
  if (auth[6] != ' ' && auth[6] != '\t') return "";
  size_t i = 6;
  while (i < auth.size() && (auth[i] == ' ' || auth[i] == '\t')) ++i;
  return auth.substr(i);
}

// 128 bits of FNV-1a (two lanes) as hex: a tenant tag for the prefix cache salt. Not a
// MAC: it only has to make different keys give different salts, and keep the key
// itself out of the KV manager's memory.
std::string key_tag(const std::string& key) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : key) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ (c + 0x5bu)) * 0x100000001b3ull;
  }
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return buf;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  Rng r(static_cast<uint64_t>(now_seconds() * 1e9) ^ (counter++ * 0x9E3779B97F4A7C15ull));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%s%016llx", prefix, static_cast<unsigned long long>(r.next_u64()));
  return buf;
}

}  // namespace

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
    if (e.status == 503) extra["Retry-After"] = "1";
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

std::optional<ApiError> Server::Impl::authorize(const HttpRequest& req, bool dashboard_route, std::string* key) const {
  key->clear();
  const bool admin = dashboard_route && !cfg.dashboard_admin_key.empty();
  if (cfg.api_keys.empty() && !admin) return std::nullopt;
  std::string given = bearer_token(req.header("authorization"));
  if (given.empty()) given = req.header("x-api-key");  // Anthropic's header
  bool ok = false;
  auto check = [&](const std::string& k) {
    // Every key is compared (no early exit), so timing does not say which one matched.
    if (constant_time_equal(given, k) && !ok) {
      ok = true;
      *key = k;
    }
  };
  if (admin) check(cfg.dashboard_admin_key);
  for (const auto& k : cfg.api_keys) check(k);
  if (ok) return std::nullopt;
  return ApiError{401, "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                  "authentication_error", "", "invalid_api_key"};
}

DashboardViewer Server::Impl::dashboard_viewer(const std::string& key) const {
  DashboardViewer v;
  if (cfg.prefix_cache_salt_per_key && !key.empty() && key != cfg.dashboard_admin_key) {
    v.all = false;
    v.salt_prefix = key_tag(key) + "/";  // every salt of this key's requests starts so (handle_generate)
  }
  return v;
}

// ---- Generation (worker thread) -------------------------------------------------

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> Server::Impl::constraint_grammar(
    ParsedRequest& r) {
  grammar::ConstraintSpec spec = r.constraint.spec;
  const ToolSetup& tools = r.constraint.tools;
  const bool forced_call = tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kNamed;
  if (forced_call) spec = tool_call_spec(tools, text->tool_syntax());
  if (spec.empty()) return std::shared_ptr<const grammar::CompiledGrammar>();
  std::call_once(grammars_once, [this] {
    auto ti = grammar::TokenIndex::from_tokenizer(text->tokenizer());
    if (!ti.ok()) {
      grammars_error = ti.message();
      return;
    }
    grammars = std::make_unique<grammar::GrammarCache>(std::move(ti).value(), cfg.grammar_limits,
                                                       static_cast<size_t>(std::max(1, cfg.grammar_cache_size)),
                                                       cfg.grammar_cache_bytes);
    grammars_ready.store(grammars.get(), std::memory_order_release);
  });
  if (!grammars)
    return ApiError{400, "structured output is not available for this vocabulary: " + grammars_error,
                    "invalid_request_error", "response_format", "invalid_value"};
  auto cg = grammars->get(spec);
  if (!cg.ok()) {
    // The message names the schema path ("#/properties/age/minimum: ...") or the limit.
    const char* field = forced_call                                             ? "tools"
                        : spec.kind == grammar::ConstraintKind::kRegex          ? "guided_regex"
                        : spec.kind == grammar::ConstraintKind::kChoice         ? "guided_choice"
                        : spec.kind == grammar::ConstraintKind::kGbnf           ? "guided_grammar"
                                                                                : "response_format";
    return ApiError{400, std::string(forced_call ? "tool call schema: " : "invalid output constraint: ") + cg.message(),
                    "invalid_request_error", field, "invalid_value"};
  }
  return std::move(cg).value();
}

void Server::Impl::warn_ignored(const std::vector<std::string>& fields) {
  constexpr size_t kMaxWarned = 256;
  for (const std::string& f : fields) {
    std::string name;  // printable and short: the name comes from the client
    for (char c : f.substr(0, 64)) name += (c >= 0x20 && c < 0x7f) ? c : '?';
    {
      std::lock_guard<std::mutex> l(warned_mu);
      if (warned_fields.size() >= kMaxWarned || !warned_fields.insert(name).second) continue;
    }
    PAGODA_LOG_WARN("request field '%s' is not supported and is ignored (warned once per field name)", name.c_str());
  }
}

void Server::Impl::handle_generate(Endpoint ep, const HttpRequest& req, const std::string& key,
                                   std::shared_ptr<Responder> res, double t_start, bool anthropic) {
  auto fail = [&](const ApiError& e) { send_error(*res, e, anthropic); };
  CacheBreakpoint breakpoint;  // anthropic: the last cache_control block
  std::variant<ParsedRequest, ApiError> parsed;
  if (anthropic) {
    auto m = parse_messages_request(req.body, cfg.limits);
    if (auto* e = std::get_if<ApiError>(&m)) return fail(*e);
    breakpoint = std::move(std::get<MessagesRequest>(m).cache);
    parsed = std::move(std::get<MessagesRequest>(m).base);
  } else {
    parsed = parse_request(ep, req.body, cfg.limits);
  }
  if (auto* e = std::get_if<ApiError>(&parsed)) return fail(*e);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);
  if (!r.ignored_fields.empty()) warn_ignored(r.ignored_fields);
  if (cfg.has_seed && !r.params.has_seed) {
    std::lock_guard<std::mutex> l(seed_mu);
    r.params.seed = seed_rng.next_u64();
    r.params.has_seed = true;
  }
  if (!r.model.empty() && r.model != model_name)
    return fail(not_found("The model `" + r.model + "` does not exist.", "model_not_found"));

  const engine::ModelInfo& info = engine->model_info();
  if (auto e = check_logit_bias(r.params, info.vocab_size)) return fail(*e);
  // Tokenize every prompt. What the engine validates (empty prompt, token ids,
  // context length, n) is not checked here: add_request's error becomes the 400.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_text;
  if (ep == Endpoint::kChat) {
    auto ids = text->encode_chat(r.messages, cfg.parse_special_in_prompts, r.constraint.tools.tools);
    if (!ids.ok()) return fail(ApiError{400, ids.message(), "invalid_request_error", "messages", ""});
    prompts.push_back(std::move(ids).value());
    if (breakpoint.present)
      r.params.pin_tokens = cache_prefix_tokens(*text, breakpoint, prompts.back(), cfg.parse_special_in_prompts);
  } else if (r.prompt_is_tokens) {
    prompts = std::move(r.prompt_tokens);
    if (r.echo)
      for (const auto& p : prompts) echo_text.push_back(text->decode(p));
  } else {
    for (auto& t : r.prompt_texts) {
      prompts.push_back(text->encode_prompt(t, /*add_special=*/true, cfg.parse_special_in_prompts));
      if (r.echo) echo_text.push_back(std::move(t));
    }
  }
  {
    auto g = constraint_grammar(r);
    if (auto* e = std::get_if<ApiError>(&g)) return fail(*e);
    r.params.grammar = std::get<0>(std::move(g));
  }
  if (r.params.max_tokens < 0) {
    // Chat without a limit runs to the context end (at least 1, so a too-long prompt
    // gets the engine's context-length message rather than one about max_tokens).
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    r.params.max_tokens = std::max(1, info.context_length - static_cast<int>(std::min<size_t>(longest, INT32_MAX)));
    if (auto e = check_output_cost(prompts.size(), r.params, r.params.max_tokens, cfg.limits)) return fail(*e);
  }
  if (num_waiting() > cfg.max_waiting) return fail(waiting_limit());
  if (cfg.prefix_cache_salt_per_key && !key.empty()) r.params.cache_salt = key_tag(key) + "/" + r.params.cache_salt;

  Submission sub;
  if (anthropic) {
    MessagesSetup ms;
    ms.id = random_id("msg_");
    ms.model = model_name;
    ms.stream = r.stream;
    ms.prompt_tokens = static_cast<int32_t>(std::min<size_t>(prompts[0].size(), INT32_MAX));
    ms.pin_tokens = r.params.pin_tokens;
    if (r.constraint.tools.active()) ms.tool_names = r.constraint.tools.names;
    ms.stop_sequences = r.params.stop.list();
    ms.log_access = cfg.log_requests;
    ms.t_start = t_start;
    auto gen = std::make_shared<MessagesGeneration>(std::move(ms), *text, metrics, res);
    r.params.prompt = std::move(prompts[0]);
    sub.prompts.push_back(std::move(r.params));
    sub.on_added = [gen](const std::string& error) { gen->on_added(error); };
    sub.on_event = [gen](size_t prompt, const engine::TokenEvent& ev) { gen->on_event(prompt, ev); };
    sub.tag = gen->id();
    AsyncEngine* eng = engine.get();
    const Ticket t = engine->submit(std::move(sub));
    res->on_disconnect([gen, eng, t] {
      if (gen->on_disconnect()) eng->abort(t);
    });
    return;
  }
  GenerationSetup gs;
  const std::string response_id = random_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  gs.meta = ResponseMeta{ep, response_id, model_name, static_cast<int64_t>(std::time(nullptr))};
  gs.stream = r.stream;
  gs.include_usage = r.include_usage;
  gs.echo = r.echo;
  gs.return_token_ids = r.return_token_ids;
  gs.n = r.params.n;
  if (r.constraint.tools.active()) gs.tool_names = r.constraint.tools.names;
  gs.echo_text = std::move(echo_text);
  gs.t_start = t_start;
  gs.log_access = cfg.log_requests;
  for (auto& p : prompts) gs.prompt_lens.push_back(static_cast<int32_t>(std::min<size_t>(p.size(), INT32_MAX)));
  if (gs.return_token_ids) gs.prompt_ids = prompts;  // the prompts themselves move into the engine
  auto gen = std::make_shared<Generation>(std::move(gs), *text, metrics, res);

  sub.prompts.reserve(prompts.size());
  for (auto& p : prompts) {
    engine::RequestParams params = r.params;  // the stop list is shared, not copied
    if (r.cache.pin_prompt) params.pin_tokens = static_cast<int32_t>(std::min<size_t>(p.size(), INT32_MAX));
    params.prompt = std::move(p);
    sub.prompts.push_back(std::move(params));
  }
  sub.on_added = [gen](const std::string& error) { gen->on_added(error); };
  sub.on_event = [gen](size_t prompt, const engine::TokenEvent& ev) { gen->on_event(prompt, ev); };
  sub.tag = response_id;
  const Ticket t = engine->submit(std::move(sub));
  // A client that goes away aborts every prompt of this HTTP call.
  AsyncEngine* eng = engine.get();
  res->on_disconnect([gen, eng, t] {
    if (gen->on_disconnect()) eng->abort(t);
  });
}

// ---- Anthropic count_tokens (worker thread) ----------------------------------------

void Server::Impl::handle_count_tokens(const HttpRequest& req, Responder& res) {
  auto parsed = parse_messages_request(req.body, cfg.limits, /*count_only=*/true);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e, true);
  ParsedRequest& r = std::get<MessagesRequest>(parsed).base;
  if (!r.model.empty() && r.model != model_name)
    return send_error(res, not_found("The model `" + r.model + "` does not exist.", "model_not_found"), true);
  // The prompt /v1/messages would run: the same messages, tools and template.
  auto ids = text->encode_chat(r.messages, cfg.parse_special_in_prompts, r.constraint.tools.tools);
  if (!ids.ok()) return send_error(res, ApiError{400, ids.message(), "invalid_request_error", "messages", ""}, true);
  res.send(200, "application/json", dump_json(json{{"input_tokens", ids->size()}}));
}

// ---- Tokenize (worker thread) ---------------------------------------------------

void Server::Impl::handle_tokenize(const HttpRequest& req, Responder& res) {
  auto parsed = parse_tokenize(req.body, cfg.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto& r = std::get<TokenizeRequest>(parsed);
  std::vector<int32_t> ids;
  if (r.has_messages) {
    auto e = text->encode_chat(r.messages, cfg.parse_special_in_prompts);
    if (!e.ok()) return send_error(res, ApiError{400, e.message(), "invalid_request_error", "messages", ""});
    ids = std::move(e).value();
  } else {
    ids = text->encode_prompt(r.prompt, r.add_special_tokens, cfg.parse_special_in_prompts);
  }
  // Written directly: a JSON tree would cost 16 bytes per token on top of the ids
  // (an 8 MB body is ~2M tokens). Same shape as {"tokens": [...], "count", "max_model_len"}.
  std::string out;
  out.reserve(ids.size() * 7 + 64);
  out += "{\"tokens\":[";
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    const int n = std::snprintf(buf, sizeof(buf), "%d", ids[i]);
    out.append(buf, static_cast<size_t>(n));
  }
  out += "],\"count\":" + std::to_string(ids.size()) +
         ",\"max_model_len\":" + std::to_string(engine->model_info().context_length) + "}";
  ids = {};  // freed before the send copies nothing more
  res.send(200, "application/json", std::move(out));
}

void Server::Impl::handle_detokenize(const HttpRequest& req, Responder& res) {
  auto parsed = parse_detokenize(req.body, engine->model_info().vocab_size, cfg.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto& ids = std::get<std::vector<int32_t>>(parsed);
  // "prompt" is vLLM's key, "content" llama-server's.
  const std::string text_out = text->decode(ids);
  res.send(200, "application/json", dump_json(json{{"prompt", text_out}, {"content", text_out}}));
}

void Server::Impl::handle_reset_prefix_cache(const HttpRequest& req, std::shared_ptr<Responder> res,
                                             const std::string& key) {
  if (!cfg.dashboard_admin_key.empty() && key != cfg.dashboard_admin_key) {
    return send_error(*res, ApiError{403, "/reset_prefix_cache needs the admin key (--dashboard-admin-key)",
                                     "permission_error", "", "forbidden"});
  }
  // A boolean query parameter: absent = false; anything but true/false/1/0 is a 400 naming it.
  auto flag = [&](const char* name, bool* out) -> bool {
    const std::string v = query_param(req.query, name);
    if (v.empty() || v == "false" || v == "0") return true;
    if (v == "true" || v == "1") {
      *out = true;
      return true;
    }
    send_error(*res, ApiError{400, std::string("query parameter '") + name + "' must be true or false, got '" + v + "'",
                              "invalid_request_error", name, ""});
    return false;
  };
  bool force = false, tiers = false;
  if (!flag("force", &force) || !flag("reset_running_requests", &force) || !flag("tiers", &tiers) ||
      !flag("reset_external", &tiers)) {
    return;
  }
  engine->control([this, res, force, tiers](engine::Engine& e) -> AsyncEngine::Reply {
    std::vector<std::pair<std::string, int64_t>> cleared;
    const Status st = e.reset_prefix_cache(force, tiers, &cleared);
    if (st.ok()) {
      PAGODA_LOG_INFO("prefix cache reset%s%s", force ? " (force)" : "", tiers ? " (with the KV tiers)" : "");
      json body{{"status", "ok"}};
      if (tiers) {  // entries removed per tier ({} when the engine has none)
        json t = json::object();
        for (const auto& [kind, n] : cleared) t[kind] = n;
        body["tiers"] = t;
      }
      return [res, text = dump_json(body)] { res->send(200, "application/json", text); };
    }
    return [this, res, msg = st.message()] {
      send_error(*res, ApiError{409, msg, "invalid_request_error", "force", "requests_running"});
    };
  });
}

// ---- Routing (I/O thread) -------------------------------------------------------

void Server::Impl::handle(HttpRequest req, std::shared_ptr<Responder> res) {
  struct Route { const char* path; const char* method; };
  static const Route routes[] = {{"/health", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"},
                                 {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                                 {"/tokenize", "POST"}, {"/detokenize", "POST"}, {"/version", "GET"},
                                 {"/v1/messages", "POST"}, {"/v1/messages/count_tokens", "POST"},
                                 {"/dashboard", "GET"}, {"/dashboard/events", "GET"},
                                 {"/dashboard/snapshot", "GET"}, {"/dashboard/block", "GET"},
                                 {"/dashboard/kv_blocks", "GET"}, {"/reset_prefix_cache", "POST"}};
  const Route* route = nullptr;
  for (const auto& r : routes)
    if (req.target == r.path) route = &r;
  const bool anthropic = req.target.rfind("/v1/messages", 0) == 0;  // errors in Anthropic's shape
  if (!route) return send_error(*res, not_found("no route for " + req.method + " " + req.target), anthropic);
  if (req.method != route->method && !(req.method == "HEAD" && std::string(route->method) == "GET")) {
    ApiError e{405, "method " + req.method + " is not allowed on " + req.target + " (use " + route->method + ")",
               "invalid_request_error", "", "method_not_allowed"};
    metrics.inc_counter("pagoda:request_failure_total", 1, "405");
    return res->send(405, "application/json", anthropic ? anthropic_error_body(e) : error_body(e),
                     {{"Allow", route->method}});
  }
  // Liveness carries no data: always open, so probes need no key.
  if (req.target == "/health") return res->send(200, "application/json", "{}");
  // Like /health, says nothing about the data: open.
  if (req.target == "/version") return res->send(200, "application/json", dump_json(json{{"version", version_string()}}));
  std::string key;
  const bool dashboard_route = req.target.rfind("/dashboard", 0) == 0;
  // A browser's EventSource cannot send headers: the dashboard's routes take the
  // key as ?key=KEY too (only they: a key in a URL ends up in access logs).
  if (dashboard_route && req.header("authorization").empty()) {
    const std::string qkey = dashboard_query_key(req.query);
    if (!qkey.empty()) req.headers["authorization"] = "Bearer " + qkey;
  }
  if (!(req.target == "/metrics" && cfg.metrics_without_key)) {
    if (auto e = authorize(req, dashboard_route, &key)) return send_error(*res, *e, anthropic);
  }
  if (req.target == "/metrics") {
    if (const grammar::GrammarCache* g = grammars_ready.load(std::memory_order_acquire))
      metrics.set_gauge("pagoda:grammar_cache_bytes", static_cast<double>(g->bytes()));
    return res->send(200, "text/plain; version=0.0.4", metrics.render() + process_metrics_text());
  }
  if (dashboard_route) return dashboard->handle(req, res, dashboard_viewer(key));
  if (req.target == "/reset_prefix_cache") return handle_reset_prefix_cache(req, res, key);
  if (req.target == "/v1/models") {
    const auto& info = engine->model_info();
    json m = {{"id", model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "pagoda"},
              {"max_model_len", info.context_length}};
    return res->send(200, "application/json", dump_json(json{{"object", "list"}, {"data", json::array({m})}}));
  }
  // Everything else parses a body: off the I/O thread.
  const double t_start = now_seconds();
  auto job = [this, req = std::make_shared<HttpRequest>(std::move(req)), key, res, t_start, anthropic] {
    try {
      if (req->target == "/v1/completions") return handle_generate(Endpoint::kCompletions, *req, key, res, t_start);
      if (req->target == "/v1/chat/completions") return handle_generate(Endpoint::kChat, *req, key, res, t_start);
      if (req->target == "/v1/messages") return handle_generate(Endpoint::kChat, *req, key, res, t_start, true);
      if (req->target == "/v1/messages/count_tokens") return handle_count_tokens(*req, *res);
      if (req->target == "/tokenize") return handle_tokenize(*req, *res);
      if (req->target == "/detokenize") return handle_detokenize(*req, *res);
    } catch (const std::exception& e) {
      // A bug must not take the server down: answer 500 and keep serving.
      PAGODA_LOG_ERROR("internal error on %s %s: %s", req->method.c_str(), req->target.c_str(), e.what());
      const ApiError err{500, std::string("internal error: ") + e.what(), "internal_error", "", ""};
      res->send(500, "application/json", anthropic ? anthropic_error_body(err) : error_body(err));
    }
  };
  // A request waiting to be parsed is a waiting request: the one limit is max_waiting
  // (the queue holds one more, so it is never full first).
  if (num_waiting() > cfg.max_waiting || !workers->try_post(std::move(job)))
    send_error(*res, waiting_limit(), anthropic);
}

// ---- Server ------------------------------------------------------------------

Expected<std::unique_ptr<Server>> Server::create(const ServerConfig& config, std::unique_ptr<engine::Engine> eng) {
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>();
  Impl* impl = s->impl_.get();
  impl->cfg = config;
  impl->model_name = config.served_model_name.empty() ? eng->model_info().name : config.served_model_name;
  // The server's own copy: I/O and worker threads never reach into the engine's.
  PAGODA_ASSIGN_OR_RETURN(impl->text, TextCodec::create(eng->tokenizer(), config.chat_template));
  // Say at start, in one line, whether chat will work: a template that cannot render
  // a basic conversation would otherwise fail only on the first chat request.
  if (!impl->text->has_chat_template()) {
    PAGODA_LOG_WARN("chat template: none usable (%s); /v1/chat/completions answers 400",
                    impl->text->template_error().c_str());
  } else {
    const std::vector<tok::ChatMessage> probe = {{"system", "You are helpful."}, {"user", "Hello"}};
    auto ids = impl->text->encode_chat(probe, false);
    if (ids.ok()) {
      PAGODA_LOG_INFO("chat template: renders a system + user conversation (%zu tokens)", ids->size());
    } else {
      PAGODA_LOG_WARN("chat template: cannot render a system + user conversation: %s", ids.message().c_str());
    }
  }
  impl->http = std::make_unique<HttpServer>(config.http, [impl](HttpRequest req, std::shared_ptr<Responder> res) {
    try {
      impl->handle(std::move(req), res);
    } catch (const std::exception& e) {
      PAGODA_LOG_ERROR("internal error: %s", e.what());
      res->send(500, "application/json", error_body(ApiError{500, std::string("internal error: ") + e.what(),
                                                              "internal_error", "", ""}));
    }
  });
  impl->seed_rng = Rng(config.seed);
  {
    const engine::ModelInfo& info = eng->model_info();
    impl->metrics.set_exposition(config.metrics_name_prefix, impl->model_name);
    // vLLM's cache_config_info: value 1, the configuration in its labels
    // (cache_dtype "q8_0/q4_0" when K and V differ; cache_type_k / _v each).
    impl->metrics.set_gauge(
        "pagoda:cache_config_info{block_size=\"" + std::to_string(info.block_size) + "\",cache_dtype=\"" +
            kv_types_name(info.kv_dtype) + "\",cache_type_k=\"" + kv_dtype_name(info.kv_dtype.k) +
            "\",cache_type_v=\"" + kv_dtype_name(info.kv_dtype.v) + "\",num_gpu_blocks=\"" + std::to_string(info.num_kv_blocks) +
            "\",num_cpu_blocks=\"0\",kv_cache_bytes=\"" + std::to_string(info.kv_cache_bytes) + "\"}",
        1);
  }
  impl->engine = std::make_unique<AsyncEngine>(std::move(eng), &impl->metrics, config.log_stats_interval_s);
  const int64_t queue = config.worker_queue > 0 ? config.worker_queue : int64_t{config.max_waiting} + 1;
  impl->workers = std::make_unique<WorkerPool>(config.worker_threads, static_cast<size_t>(std::max<int64_t>(1, queue)),
                                               config.heap_trim_threshold);
  impl->dashboard = std::make_unique<DashboardHub>(impl->engine.get(), impl->text.get());
  return s;
}

Server::~Server() {
  if (!impl_) return;
  // Order matters: no new connections or jobs, then no job that could submit, then
  // the engine thread (its last callbacks only post to the stopped io_context).
  impl_->http->stop();
  impl_->workers->stop();
  impl_->dashboard->stop();
  impl_->engine->stop();
}

Expected<int> Server::start() {
  std::string err;
  if (!impl_->http->start(&err)) return make_error(err);
  return impl_->http->port();
}

void Server::run() { impl_->http->run(); }
void Server::stop() { impl_->http->stop(); }

}  // namespace pagoda::server
