// The token routes (/tokenize, /detokenize, Anthropic's count_tokens) and the
// admin route /reset_prefix_cache of `pagoda serve`, moved out of server.cc as
// they were (issue 34: one concern per file).
#include <cstdio>
#include <variant>

#include "base/log.h"
#include "server/server_impl.h"
#include "tok/tokenizer.h"

namespace pagoda::server {

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

}  // namespace pagoda::server
