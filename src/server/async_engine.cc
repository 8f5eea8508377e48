#include "server/async_engine.h"

#include "base/log.h"
#include "base/timer.h"

namespace pagoda::server {

AsyncEngine::AsyncEngine(std::unique_ptr<engine::Engine> engine, Metrics* metrics)
    : engine_(std::move(engine)), metrics_(metrics), info_(engine_->model_info()) {
  stats_ = engine_->stats();
  last_stats_ = stats_;
  publish_stats();  // the gauges (free blocks) are right before the first request, not 0
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { stop(); }

void AsyncEngine::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Ticket AsyncEngine::submit(engine::RequestParams params, EventFn on_event) {
  std::lock_guard<std::mutex> l(mu_);
  Ticket t = next_ticket_++;
  inbox_.push_back(Pending{t, std::move(params), std::move(on_event)});
  submit_times_[t] = now_seconds();
  cv_.notify_one();
  return t;
}

void AsyncEngine::abort(Ticket t) {
  std::lock_guard<std::mutex> l(mu_);
  aborts_.push_back(t);
  cv_.notify_one();
}

engine::EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

int AsyncEngine::num_pending() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(inbox_.size());
}

void AsyncEngine::publish_stats() {
  engine::EngineStats s = engine_->stats();
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_ = s;
  }
  if (!metrics_) return;
  metrics_->set_gauge("pagoda:kv_cache_usage_perc", s.kv_usage);
  metrics_->set_gauge("pagoda:num_requests_running", s.num_running);
  metrics_->set_gauge("pagoda:num_requests_waiting", s.num_waiting + num_pending());
  metrics_->set_gauge("pagoda:kv_cache_blocks_total", static_cast<double>(s.blocks_total));
  metrics_->set_gauge("pagoda:kv_cache_blocks_free", static_cast<double>(s.blocks_free));
  metrics_->set_gauge("pagoda:kv_cache_blocks_cached", static_cast<double>(s.blocks_cached));
  auto delta = [&](const char* name, int64_t now, int64_t before) {
    if (now > before) metrics_->inc_counter(name, static_cast<double>(now - before));
  };
  delta("pagoda:prefix_cache_queries_total", s.prefix_queries_tokens, last_stats_.prefix_queries_tokens);
  delta("pagoda:prefix_cache_hits_total", s.prefix_hits_tokens, last_stats_.prefix_hits_tokens);
  delta("pagoda:num_preemptions_total", s.num_preemptions, last_stats_.num_preemptions);
  delta("pagoda:prompt_tokens_total", s.prompt_tokens_total, last_stats_.prompt_tokens_total);
  delta("pagoda:generation_tokens_total", s.generation_tokens_total, last_stats_.generation_tokens_total);
  last_stats_ = s;
}

void AsyncEngine::loop() {
  for (;;) {
    std::deque<Pending> inbox;
    std::vector<Ticket> aborts;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !inbox_.empty() || !aborts_.empty() || engine_->has_unfinished(); });
      if (stop_) break;
      inbox.swap(inbox_);
      aborts.swap(aborts_);
    }
    for (auto& p : inbox) {
      double t_submit = 0;
      {
        std::lock_guard<std::mutex> l(mu_);
        t_submit = submit_times_[p.ticket];
        submit_times_.erase(p.ticket);
      }
      auto id = engine_->add_request(p.params);
      if (!id.ok()) {
        engine::TokenEvent ev;
        ev.finish = engine::FinishReason::kError;
        ev.error = id.message();
        if (metrics_) metrics_->inc_counter("pagoda:request_failure_total", 1, "400");
        p.on_event(ev);
        continue;
      }
      Live live;
      live.id = *id;
      live.on_event = std::move(p.on_event);
      live.t_submit = t_submit;
      live.n_choices = std::max(1, p.params.n);
      by_id_[*id] = p.ticket;
      live_[p.ticket] = std::move(live);
    }
    for (Ticket t : aborts) {
      auto it = live_.find(t);
      if (it == live_.end()) {
        // Maybe still in the inbox of a later drain: remove it there.
        std::lock_guard<std::mutex> l(mu_);
        for (auto pit = inbox_.begin(); pit != inbox_.end(); ++pit) {
          if (pit->ticket == t) { inbox_.erase(pit); break; }
        }
        continue;
      }
      engine_->abort(it->second.id);
      by_id_.erase(it->second.id);
      live_.erase(it);
      if (metrics_) metrics_->inc_counter("pagoda:request_success_total", 1, "abort");
    }
    if (engine_->has_unfinished()) {
      std::vector<engine::TokenEvent> events = engine_->step();
      double now = now_seconds();
      for (auto& ev : events) {
        auto bit = by_id_.find(ev.id);
        if (bit == by_id_.end()) continue;
        auto lit = live_.find(bit->second);
        if (lit == live_.end()) continue;
        Live& L = lit->second;
        if (!ev.tokens.empty() && metrics_) {
          if (L.t_first == 0) {
            L.t_first = now;
            metrics_->observe("pagoda:time_to_first_token_seconds", now - L.t_submit);
          } else {
            metrics_->observe("pagoda:inter_token_latency_seconds", (now - L.t_last) / ev.tokens.size());
          }
          L.t_last = now;
        }
        L.on_event(ev);
        if (ev.finish != engine::FinishReason::kNone) {
          if (ev.finish == engine::FinishReason::kError) L.any_error = true;
          if (++L.n_finished >= L.n_choices) {
            if (metrics_) {
              metrics_->observe("pagoda:e2e_request_latency_seconds", now - L.t_submit);
              metrics_->inc_counter("pagoda:request_success_total", 1, engine::finish_reason_name(ev.finish));
            }
            by_id_.erase(bit);
            live_.erase(lit);
          }
        }
      }
    }
    publish_stats();
  }
  // Shutdown: every live request gets an abort event so no client hangs.
  for (auto& [t, L] : live_) {
    engine::TokenEvent ev;
    ev.id = L.id;
    ev.finish = engine::FinishReason::kError;
    ev.error = "server is shutting down";
    L.on_event(ev);
  }
  live_.clear();
}

}  // namespace pagoda::server
