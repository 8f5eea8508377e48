#include "router/proxy.h"

#include <algorithm>
#include <map>

#include "base/hash.h"
#include "openai/openai_api.h"
#include "router/prompt.h"

namespace pagoda::router {

namespace {

// What the SSE stream of a request that lost its replica ends with.
std::string stream_error_events(bool at_event_boundary, const std::string& replica, const std::string& why) {
  server::json err = {{"error",
                       {{"message", "the replica " + replica + " failed mid-stream: " + why},
                        {"type", "upstream_error"},
                        {"param", nullptr},
                        {"code", 502}}}};
  // A partial event (cut mid-line) is closed first, so the error is an event of its own.
  return std::string(at_event_boundary ? "" : "\n\n") + server::sse(err) + server::sse_done();
}

}  // namespace

Exchange::Exchange(Router::Impl* m, server::HttpRequest req, std::shared_ptr<server::Responder> res)
    : m_(m), req_(std::move(req)), res_(std::move(res)) {}

void Exchange::begin() {
  if (m_->is_stopping()) {
    m_->send_error(*res_, 503, "the router is stopping", "service_unavailable", "stopping");
    return end();
  }
  generate_ = req_.target == "/v1/completions" || req_.target == "/v1/chat/completions";
  if (generate_) {
    const std::vector<int32_t> prompt = routing_prompt(
        req_.target == "/v1/chat/completions" ? server::Endpoint::kChat : server::Endpoint::kCompletions, req_.body,
        m_->codec.get());
    const std::optional<std::string> cache_key = prompt_cache_key(req_.body);
    if (cache_key) route_.key = xxh3_64(cache_key->data(), cache_key->size());
    else route_.key = prefix_key(prompt, m_->cfg.block_size, m_->cfg.affinity_blocks);
    if (m_->kv && m_->cfg.policy == Policy::kPrefix) {
      // Ties among equal matches follow the prompt past them, unless a cache key names the home.
      route_.matches = m_->kv->match(prompt, cache_key ? nullptr : &route_.chain);
    }
  }
  up_.method = req_.method == "HEAD" ? "GET" : req_.method;
  up_.target = req_.target;
  up_.body = std::move(req_.body);
  for (const char* h : {"content-type", "authorization", "accept"})
    if (auto v = req_.header(h); !v.empty()) up_.headers.emplace_back(h, v);
  tried_.assign(m_->urls.size(), false);
  attempt();
}

void Exchange::cancel() {
  std::shared_ptr<UpstreamCall> c;
  {
    std::lock_guard<std::mutex> l(mu_);
    cancelled_ = true;
    c = call_;
  }
  if (c) c->cancel();
}

void Exchange::attempt() {
  const RouteChoice c =
      attempts_ < m_->urls.size() ? m_->pick(generate_ ? &route_ : nullptr, tried_) : RouteChoice{};
  if (c.replica < 0) {
    // Every replica was tried (or none is healthy).
    if (last_5xx_) {
      std::map<std::string, std::string> extra;
      if (last_5xx_->status == 503) extra["Retry-After"] = "1";  // serve's busy answer carries it
      res_->send(last_5xx_->status,
                 last_5xx_->content_type.empty() ? "application/json" : last_5xx_->content_type,
                 std::move(last_5xx_->body), extra);
    } else {
      m_->send_error(*res_, 503, "no replica could answer (" + last_error_ + ")", "service_unavailable",
                     "no_replica");
    }
    return end();
  }
  replica_ = c.replica;
  const size_t r = static_cast<size_t>(c.replica);
  tried_[r] = true;
  ++m_->requests[r];
  if (attempts_ > 0) ++m_->retries;
  else if (generate_) ++m_->decisions[static_cast<size_t>(c.kind)];
  ++attempts_;
  got_ = Answer{};
  streaming_ = started_ = false;
  boundary_ = true;
  tail_.clear();
  bool cancelled = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    cancelled = cancelled_;
  }
  if (cancelled) {
    // The client went away (nobody to answer) or the router is stopping.
    m_->release(replica_);
    if (m_->is_stopping()) m_->send_error(*res_, 503, "the router is stopping", "service_unavailable", "stopping");
    return end();
  }
  auto self = shared_from_this();
  UpstreamHandlers h;
  h.on_head = [self](int status, const std::string& ctype) {
    self->got_.status = status;
    self->got_.content_type = ctype;
    self->streaming_ = status == 200 && ctype.rfind("text/event-stream", 0) == 0;
    return true;
  };
  h.on_body = [self](std::string_view piece) { return self->on_body(piece); };
  h.on_done = [self](UpstreamResult res) { self->on_done(std::move(res)); };
  // Started outside mu_ (a call whose loop has ended reports at once, on this thread).
  auto call = m_->upstreams->start(r, up_, m_->cfg.timeouts, std::move(h));
  bool cancel_now = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    call_ = call;
    cancel_now = cancelled_;
  }
  if (cancel_now) call->cancel();  // cancel() ran before call_ was set
}

bool Exchange::on_body(std::string_view piece) {
  if (!streaming_) {
    got_.body.append(piece);
    return got_.body.size() <= m_->cfg.max_response_bytes;
  }
  // Started at the first byte, not at the head: a replica that fails between
  // its head and its first event is retried like one that never answered.
  if (!started_) res_->start_stream(200);
  started_ = true;
  tail_ += piece.substr(piece.size() - std::min<size_t>(2, piece.size()));
  tail_.erase(0, tail_.size() - std::min<size_t>(2, tail_.size()));
  boundary_ = tail_ == "\n\n";
  res_->write(std::string(piece));
  return true;
}

void Exchange::on_done(UpstreamResult result) {
  m_->release(replica_);
  const size_t r = static_cast<size_t>(replica_);
  if (result.cancelled) {
    // Client gone: nobody to answer. Router stopping: end what was started.
    if (m_->is_stopping()) {
      if (started_) {
        res_->write(stream_error_events(boundary_, m_->urls[r].text, "the router is stopping"));
        res_->end_stream();
      } else {
        m_->send_error(*res_, 503, "the router is stopping", "service_unavailable", "stopping");
      }
    }
    return end();
  }
  if (result.stage == UpstreamStage::kDone) {
    if (streaming_) {
      if (!started_) res_->start_stream(200);  // an empty stream (no event at all) stays empty
      res_->end_stream();
      return end();
    }
    if (got_.status >= 500) {
      last_error_ = m_->urls[r].text + " answered " + std::to_string(got_.status);
      last_5xx_ = std::move(got_);
      return attempt();  // overloaded or broken: another replica may do better
    }
    res_->send(got_.status, got_.content_type.empty() ? "application/json" : got_.content_type,
               std::move(got_.body));
    return end();
  }
  if (got_.body.size() > m_->cfg.max_response_bytes) {
    m_->send_error(*res_, 502, "the replica's answer exceeds " + std::to_string(m_->cfg.max_response_bytes) + " bytes",
                   "upstream_error", "response_too_large");
    return end();
  }
  // The replica failed (refused, reset, died mid-answer, timed out): off the ring
  // until its /health answers again.
  m_->set_healthy(r, false, result.error);
  if (started_) {
    ++m_->stream_errors;
    res_->write(stream_error_events(boundary_, m_->urls[r].text, result.error));
    res_->end_stream();
    return end();
  }
  last_error_ = m_->urls[r].text + ": " + result.error;
  attempt();
}

void Exchange::end() {
  // The responder holds the client's session, which refers to the HTTP server:
  // dropped before the router's books let its destructor take the server down.
  res_.reset();
  {
    std::lock_guard<std::mutex> l(mu_);
    call_.reset();
  }
  m_->finished(shared_from_this());
}

}  // namespace pagoda::router
