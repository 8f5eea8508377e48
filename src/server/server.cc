#include "server/server.h"

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "base/log.h"
#include "base/rng.h"
#include "base/timer.h"
#include "server/async_engine.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/text.h"

namespace pagoda::server {
namespace {

ApiError not_found(std::string msg, std::string code = "not_found") {
  ApiError e;
  e.status = 404;
  e.message = std::move(msg);
  e.type = "NotFoundError";
  e.code = std::move(code);
  return e;
}

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

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  Rng r(static_cast<uint64_t>(now_seconds() * 1e9) ^ (counter++ * 0x9E3779B97F4A7C15ull));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%s%016llx", prefix, static_cast<unsigned long long>(r.next_u64()));
  return buf;
}

json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// One choice's accumulated output.
struct Choice {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<engine::TokenLogprob> logprobs;
  engine::FinishReason finish = engine::FinishReason::kNone;
  bool role_sent = false;
};

}  // namespace

struct Server::Impl {
  ServerConfig cfg;
  Metrics metrics;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<HttpServer> http;
  std::string model_name;

  void handle(const HttpRequest& req, std::shared_ptr<Responder> res);
  void send_error(Responder& res, const ApiError& e) {
    metrics.inc_counter("pagoda:request_failure_total", 1, std::to_string(e.status));
    std::map<std::string, std::string> extra;
    if (e.status == 503) extra["Retry-After"] = "1";
    res.send(e.status, "application/json", error_body(e), extra);
  }
  void handle_generate(Endpoint ep, const HttpRequest& req, std::shared_ptr<Responder> res);
  void handle_tokenize(const HttpRequest& req, Responder& res);
  void handle_detokenize(const HttpRequest& req, Responder& res);
  json logprobs_json(Endpoint ep, const std::vector<engine::TokenLogprob>& lps, size_t text_offset0) const;
};

// ---- Generation --------------------------------------------------------------

namespace {

// Shared state of one HTTP generation request (possibly several prompts x n choices).
struct GenState {
  Endpoint ep;
  bool stream = false, include_usage = false, echo = false;
  bool return_token_ids = false;
  std::string id, model;
  int64_t created = 0;
  int n = 1;
  std::vector<std::string> echo_text;   // per prompt
  std::vector<int32_t> prompt_lens;     // per prompt
  std::vector<std::vector<int32_t>> prompt_ids;  // per prompt, kept only for return_token_ids
  std::vector<Choice> choices;          // [prompt * n + i]
  std::vector<Ticket> tickets;
  int32_t cached_tokens = 0;
  int pending_choices = 0;
  bool failed = false;
  std::mutex mu;
};

}  // namespace

json Server::Impl::logprobs_json(Endpoint ep, const std::vector<engine::TokenLogprob>& lps, size_t off0) const {
  const tok::Tokenizer& tk = engine->tokenizer();
  if (ep == Endpoint::kChat) {
    json content = json::array();
    for (const auto& lp : lps) {
      std::string piece = token_piece(tk, lp.token);
      json top = json::array();
      for (const auto& [t, l] : lp.top) {
        std::string p = token_piece(tk, t);
        top.push_back({{"token", p}, {"logprob", l}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", lp.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  size_t off = off0;
  for (const auto& lp : lps) {
    std::string piece = token_piece(tk, lp.token);
    tokens.push_back(piece);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [t, l] : lp.top) top[token_piece(tk, t)] = l;
    tops.push_back(top);
    offsets.push_back(off);
    off += piece.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

void Server::Impl::handle_generate(Endpoint ep, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = parse_request(ep, req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);
  if (!r.model.empty() && r.model != model_name)
    return send_error(*res, not_found("The model `" + r.model + "` does not exist.", "model_not_found"));

  const engine::ModelInfo& info = engine->model_info();
  const tok::Tokenizer& tk = engine->tokenizer();
  // Tokenize every prompt.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_text;
  if (ep == Endpoint::kChat) {
    auto ids = encode_chat(tk, r.messages);
    if (!ids.ok()) return send_error(*res, ApiError{400, ids.message(), "invalid_request_error", "messages", ""});
    prompts.push_back(std::move(ids).value());
  } else if (r.prompt_is_tokens) {
    for (auto& p : r.prompt_tokens) {
      for (int32_t t : p)
        if (t >= info.vocab_size)
          return send_error(*res, ApiError{400, "token id " + std::to_string(t) + " is not in the vocabulary (size " +
                                                    std::to_string(info.vocab_size) + ")",
                                           "invalid_request_error", "prompt", "invalid_value"});
      prompts.push_back(p);
      echo_text.push_back(decode_tokens(tk, p));
    }
  } else {
    for (auto& t : r.prompt_texts) {
      prompts.push_back(encode_prompt(tk, t));
      echo_text.push_back(t);
    }
  }
  for (auto& p : prompts) {
    if (p.empty()) return send_error(*res, ApiError{400, "the prompt is empty", "invalid_request_error", "prompt", ""});
    const int64_t plen = static_cast<int64_t>(p.size());
    int64_t max_tokens = r.params.max_tokens;
    if (max_tokens < 0) max_tokens = info.context_length - plen;  // chat without a limit
    if (plen + std::max<int64_t>(max_tokens, 1) > info.context_length) {
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                    "(%lld in the prompt, %lld for the completion). Please reduce the prompt or max_tokens.",
                    info.context_length, static_cast<long long>(plen + std::max<int64_t>(max_tokens, 0)),
                    static_cast<long long>(plen), static_cast<long long>(std::max<int64_t>(max_tokens, 0)));
      return send_error(*res, ApiError{400, buf, "invalid_request_error", r.max_tokens_given ? "max_tokens" : "prompt",
                                       "context_length_exceeded"});
    }
  }
  engine::EngineStats st = engine->stats();
  if (st.num_waiting + engine->num_pending() > cfg.max_waiting) {
    ApiError e{503, "server is overloaded: more than " + std::to_string(cfg.max_waiting) + " requests are waiting",
               "service_unavailable", "", "overloaded"};
    return send_error(*res, e);
  }

  auto gs = std::make_shared<GenState>();
  gs->ep = ep;
  gs->stream = r.stream;
  gs->include_usage = r.include_usage;
  gs->echo = r.echo;
  gs->return_token_ids = r.return_token_ids;
  gs->id = random_id(ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  gs->model = model_name;
  gs->created = static_cast<int64_t>(std::time(nullptr));
  gs->n = r.params.n;
  gs->echo_text = echo_text;
  gs->choices.resize(prompts.size() * gs->n);
  gs->pending_choices = static_cast<int>(gs->choices.size());
  for (auto& p : prompts) gs->prompt_lens.push_back(static_cast<int32_t>(p.size()));
  if (gs->return_token_ids) gs->prompt_ids = prompts;  // explicit copy: prompts are moved into the engine below

  const char* object = ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [gs, object](json choices, json prompt_token_ids = json()) {
    json j = {{"id", gs->id}, {"object", object}, {"created", gs->created}, {"model", gs->model}, {"choices", choices}};
    if (!prompt_token_ids.is_null()) j["prompt_token_ids"] = std::move(prompt_token_ids);
    return "data: " + dump_json(j) + "\n\n";
  };
  auto usage_json = [gs]() {
    int64_t pt = 0, ct = 0;
    for (size_t p = 0; p < gs->prompt_lens.size(); ++p) pt += gs->prompt_lens[p];
    for (auto& c : gs->choices) ct += static_cast<int64_t>(c.tokens.size());
    return json{{"prompt_tokens", pt}, {"completion_tokens", ct}, {"total_tokens", pt + ct},
                {"prompt_tokens_details", {{"cached_tokens", gs->cached_tokens}}}};
  };

  if (gs->stream) res->start_stream(200);

  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    engine::RequestParams params = r.params;
    params.prompt = std::move(prompts[pi]);
    if (params.max_tokens < 0) params.max_tokens = info.context_length - static_cast<int>(params.prompt.size());
    Impl* self = this;
    auto on_event = [self, gs, res, pi, chunk, usage_json](const engine::TokenEvent& ev) {
      std::lock_guard<std::mutex> l(gs->mu);
      if (gs->failed) return;
      if (ev.finish == engine::FinishReason::kError) {
        gs->failed = true;
        for (Ticket t : gs->tickets) self->engine->abort(t);
        ApiError e{400, ev.error.empty() ? "request failed" : ev.error, "invalid_request_error", "", ""};
        if (gs->stream) {
          res->write("data: " + error_body(e) + "\n\n");
          res->write("data: [DONE]\n\n");
          res->end_stream();
        } else {
          self->send_error(*res, e);
        }
        return;
      }
      const size_t ci = pi * gs->n + ev.index;
      if (ci >= gs->choices.size()) return;
      Choice& c = gs->choices[ci];
      if (ev.index == 0 && ev.num_cached_tokens > 0 && c.tokens.empty()) gs->cached_tokens += ev.num_cached_tokens;
      const size_t text_off0 = c.text.size();
      c.text += ev.text;
      c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      c.finish = ev.finish;
      if (gs->stream) {
        json lp = ev.logprobs.empty() ? json() : self->logprobs_json(gs->ep, ev.logprobs, text_off0);
        json fr = ev.finish == engine::FinishReason::kNone ? json() : json(engine::finish_reason_name(ev.finish));
        const bool first = !c.role_sent;
        c.role_sent = true;
        if (gs->ep == Endpoint::kChat) {
          json delta = json::object();
          if (first) delta["role"] = "assistant";
          if (!ev.text.empty() || first) delta["content"] = ev.text;
          json choice = {{"index", ci}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fr}};
          if (gs->return_token_ids) choice["token_ids"] = ev.tokens;
          json prompt_ids = gs->return_token_ids && first && ci == 0 ? json(gs->prompt_ids[pi]) : json();
          res->write(chunk(json::array({choice}), std::move(prompt_ids)));
        } else {
          std::string text = ev.text;
          if (gs->echo && first) text = gs->echo_text[pi] + text;
          json choice = {{"index", ci}, {"text", text}, {"logprobs", lp}, {"finish_reason", fr}};
          if (gs->return_token_ids) {
            if (first) choice["prompt_token_ids"] = gs->prompt_ids[pi];
            choice["token_ids"] = ev.tokens;
          }
          res->write(chunk(json::array({choice})));
        }
      }
      if (ev.finish == engine::FinishReason::kNone) return;
      if (--gs->pending_choices > 0) return;
      // All choices done.
      if (gs->stream) {
        if (gs->include_usage) {
          json j = {{"id", gs->id}, {"object", gs->ep == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
                    {"created", gs->created}, {"model", gs->model}, {"choices", json::array()},
                    {"usage", usage_json()}};
          res->write("data: " + dump_json(j) + "\n\n");
        }
        res->write("data: [DONE]\n\n");
        res->end_stream();
        return;
      }
      json choices = json::array();
      for (size_t i = 0; i < gs->choices.size(); ++i) {
        Choice& ch = gs->choices[i];
        json lp = ch.logprobs.empty() ? json() : self->logprobs_json(gs->ep, ch.logprobs, 0);
        json choice;
        if (gs->ep == Endpoint::kChat) {
          choice = {{"index", i}, {"message", {{"role", "assistant"}, {"content", ch.text}}},
                    {"logprobs", lp}, {"finish_reason", engine::finish_reason_name(ch.finish)}};
        } else {
          std::string text = gs->echo ? gs->echo_text[i / gs->n] + ch.text : ch.text;
          choice = {{"index", i}, {"text", text}, {"logprobs", lp},
                    {"finish_reason", engine::finish_reason_name(ch.finish)}};
          if (gs->return_token_ids) choice["prompt_token_ids"] = gs->prompt_ids[i / gs->n];
        }
        if (gs->return_token_ids) choice["token_ids"] = ch.tokens;
        choices.push_back(std::move(choice));
      }
      json j = {{"id", gs->id}, {"object", gs->ep == Endpoint::kChat ? "chat.completion" : "text_completion"},
                {"created", gs->created}, {"model", gs->model}, {"choices", choices}, {"usage", usage_json()}};
      if (gs->return_token_ids && gs->ep == Endpoint::kChat) j["prompt_token_ids"] = gs->prompt_ids[0];
      res->send(200, "application/json", dump_json(j));
    };
    Ticket t = engine->submit(std::move(params), on_event);
    std::lock_guard<std::mutex> l(gs->mu);
    gs->tickets.push_back(t);
  }
  // A client that goes away aborts every request of this HTTP call.
  res->on_disconnect([this, gs] {
    std::lock_guard<std::mutex> l(gs->mu);
    gs->failed = true;
    for (Ticket t : gs->tickets) engine->abort(t);
  });
}

// ---- Tokenize ----------------------------------------------------------------

void Server::Impl::handle_tokenize(const HttpRequest& req, Responder& res) {
  auto parsed = parse_tokenize(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto& r = std::get<TokenizeRequest>(parsed);
  std::vector<int32_t> ids;
  if (r.has_messages) {
    auto e = encode_chat(engine->tokenizer(), r.messages);
    if (!e.ok()) return send_error(res, ApiError{400, e.message(), "invalid_request_error", "messages", ""});
    ids = std::move(e).value();
  } else {
    ids = encode_prompt(engine->tokenizer(), r.prompt, r.add_special_tokens);
  }
  json j = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine->model_info().context_length}};
  res.send(200, "application/json", dump_json(j));
}

void Server::Impl::handle_detokenize(const HttpRequest& req, Responder& res) {
  auto parsed = parse_detokenize(req.body, engine->model_info().vocab_size);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  auto& ids = std::get<std::vector<int32_t>>(parsed);
  res.send(200, "application/json", dump_json(json{{"prompt", decode_tokens(engine->tokenizer(), ids)}}));
}

// ---- Routing -----------------------------------------------------------------

void Server::Impl::handle(const HttpRequest& req, std::shared_ptr<Responder> res) {
  struct Route { const char* path; const char* method; };
  static const Route routes[] = {{"/health", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"},
                                 {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
                                 {"/tokenize", "POST"}, {"/detokenize", "POST"}};
  const Route* route = nullptr;
  for (const auto& r : routes)
    if (req.target == r.path) route = &r;
  if (!route) return send_error(*res, not_found("no route for " + req.method + " " + req.target));
  if (req.method != route->method && !(req.method == "HEAD" && std::string(route->method) == "GET")) {
    ApiError e{405, "method " + req.method + " is not allowed on " + req.target + " (use " + route->method + ")",
               "invalid_request_error", "", "method_not_allowed"};
    metrics.inc_counter("pagoda:request_failure_total", 1, "405");
    return res->send(405, "application/json", error_body(e), {{"Allow", route->method}});
  }
  if (req.target == "/health") return res->send(200, "application/json", "{}");
  if (req.target == "/metrics") return res->send(200, "text/plain; version=0.0.4", metrics.render());

  if (!cfg.api_key.empty() && req.target.rfind("/v1/", 0) == 0) {
    std::string auth = req.header("authorization");
    std::string key = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : std::string();
    if (!constant_time_equal(key, cfg.api_key)) {
      return send_error(*res, ApiError{401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                                       "authentication_error", "", "invalid_api_key"});
    }
  }
  if (req.target == "/v1/models") {
    const auto& info = engine->model_info();
    json m = {{"id", model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "pagoda"},
              {"max_model_len", info.context_length}};
    return res->send(200, "application/json", dump_json(json{{"object", "list"}, {"data", json::array({m})}}));
  }
  if (req.target == "/v1/completions") return handle_generate(Endpoint::kCompletions, req, res);
  if (req.target == "/v1/chat/completions") return handle_generate(Endpoint::kChat, req, res);
  if (req.target == "/tokenize") return handle_tokenize(req, *res);
  if (req.target == "/detokenize") return handle_detokenize(req, *res);
}

// ---- Server ------------------------------------------------------------------

Expected<std::unique_ptr<Server>> Server::create(const ServerConfig& config, std::unique_ptr<engine::Engine> eng) {
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>();
  Impl* impl = s->impl_.get();
  impl->cfg = config;
  impl->model_name = config.served_model_name.empty() ? eng->model_info().name : config.served_model_name;
  impl->engine = std::make_unique<AsyncEngine>(std::move(eng), &impl->metrics);
  impl->http = std::make_unique<HttpServer>(config.http, [impl](const HttpRequest& req, std::shared_ptr<Responder> res) {
    try {
      impl->handle(req, res);
    } catch (const std::exception& e) {
      // A bug must not take the server down: answer 500 and keep serving.
      PAGODA_LOG_ERROR("internal error on %s %s: %s", req.method.c_str(), req.target.c_str(), e.what());
      res->send(500, "application/json", error_body(ApiError{500, std::string("internal error: ") + e.what(),
                                                              "internal_error", "", ""}));
    }
  });
  return s;
}

Server::~Server() {
  if (impl_) {
    impl_->http->stop();
    impl_->engine->stop();
  }
}

Expected<int> Server::start() {
  std::string err;
  if (!impl_->http->start(&err)) return make_error(err);
  return impl_->http->port();
}

void Server::run() { impl_->http->run(); }
void Server::stop() { impl_->http->stop(); }

}  // namespace pagoda::server
