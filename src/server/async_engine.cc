#include "server/async_engine.h"

#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "base/timer.h"

namespace pagoda::server {

AsyncEngine::AsyncEngine(std::unique_ptr<engine::Engine> engine, Metrics* metrics, double log_stats_interval_s)
    : engine_(std::move(engine)), driver_(*engine_), metrics_(metrics), info_(engine_->model_info()),
      log_stats_interval_s_(log_stats_interval_s) {
  stats_ = engine_->stats();
  // Counters start from zero, not from the engine's state now: what the engine did while it
  // was built (the start-up AllBlocksCleared message, a tier's start-up announcements) counts.
  last_stats_ = engine::EngineStats{};
  log_window_stats_ = stats_;
  log_window_start_ = now_seconds();
  publish_stats();  // the gauges (free blocks) are right before the first request, not 0
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { stop(); }

void AsyncEngine::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Ticket AsyncEngine::submit(Submission s) {
  std::lock_guard<std::mutex> l(mu_);
  Ticket t = next_ticket_++;
  inbox_.push_back(Pending{t, std::move(s), now_seconds()});
  cv_.notify_one();
  return t;
}

void AsyncEngine::abort(Ticket t) {
  std::lock_guard<std::mutex> l(mu_);
  aborts_.push_back(t);
  cv_.notify_one();
}

void AsyncEngine::control(std::function<Reply(engine::Engine&)> fn) {
  std::lock_guard<std::mutex> l(mu_);
  controls_.push_back(std::move(fn));
  cv_.notify_one();
}

void AsyncEngine::inspect(std::function<void(const EngineView&)> fn) {
  std::lock_guard<std::mutex> l(mu_);
  inspections_.push_back(std::move(fn));
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
  int pending = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_ = s;
    pending = static_cast<int>(inbox_.size());
  }
  if (!metrics_) return;
  metrics_->set_gauge("pagoda:kv_cache_usage_perc", s.kv_usage);
  metrics_->set_gauge("pagoda:gpu_cache_usage_perc", s.kv_usage);
  metrics_->set_gauge("pagoda:num_requests_running", s.num_running);
  metrics_->set_gauge("pagoda:num_requests_waiting", s.num_waiting + pending);
  metrics_->set_gauge("pagoda:kv_cache_blocks_total", static_cast<double>(s.blocks_total));
  metrics_->set_gauge("pagoda:kv_cache_blocks_free", static_cast<double>(s.blocks_free));
  metrics_->set_gauge("pagoda:kv_cache_blocks_cached", static_cast<double>(s.blocks_cached));
  for (size_t g = 0; g < s.group_blocks_used.size(); ++g) {  // per KV cache group (metrics.cc)
    metrics_->set_gauge("pagoda:kv_group_blocks_used{group=\"" + std::to_string(g) + "\"}",
                        static_cast<double>(s.group_blocks_used[g]));
  }
  auto delta = [&](const char* name, int64_t now, int64_t before) {
    if (now > before) metrics_->inc_counter(name, static_cast<double>(now - before));
  };
  delta("pagoda:prefix_cache_queries_total", s.prefix_queries_tokens, last_stats_.prefix_queries_tokens);
  delta("pagoda:prefix_cache_hits_total", s.prefix_hits_tokens, last_stats_.prefix_hits_tokens);
  delta("pagoda:num_preemptions_total", s.num_preemptions, last_stats_.num_preemptions);
  metrics_->set_gauge("pagoda:state_checkpoints", static_cast<double>(s.checkpoints));
  delta("pagoda:state_checkpoints_stored_total", s.checkpoints_stored, last_stats_.checkpoints_stored);
  delta("pagoda:state_checkpoints_hit_total", s.checkpoints_hit, last_stats_.checkpoints_hit);
  delta("pagoda:state_checkpoints_evicted_total", s.checkpoints_evicted, last_stats_.checkpoints_evicted);
  delta("pagoda:kv_events_published_batches_total", s.kv_events_batches, last_stats_.kv_events_batches);
  delta("pagoda:kv_events_published_total", s.kv_events_events, last_stats_.kv_events_events);
  delta("pagoda:kv_events_dropped_batches_total", s.kv_events_dropped_batches, last_stats_.kv_events_dropped_batches);
  delta("pagoda:kv_events_dropped_total", s.kv_events_dropped_events, last_stats_.kv_events_dropped_events);
  delta("pagoda:prompt_tokens_total", s.prompt_tokens_total, last_stats_.prompt_tokens_total);
  delta("pagoda:generation_tokens_total", s.generation_tokens_total, last_stats_.generation_tokens_total);
  // Each loop turn runs at most one step: the computed-token delta is that step's size.
  if (s.computed_tokens_total > last_stats_.computed_tokens_total)
    metrics_->observe("pagoda:iteration_tokens_total",
                      static_cast<double>(s.computed_tokens_total - last_stats_.computed_tokens_total));
  // KV tiers (issue 16): counters per tier, latency histograms per tier.
  for (size_t i = 0; i < s.kv_tiers.size(); ++i) {
    const engine::KvTierStats& t = s.kv_tiers[i];
    const engine::KvTierStats before = i < last_stats_.kv_tiers.size() ? last_stats_.kv_tiers[i] : engine::KvTierStats{};
    auto tier_delta = [&](const char* name, int64_t now, int64_t was) {
      if (now > was) metrics_->inc_counter(name, static_cast<double>(now - was), t.kind);
    };
    tier_delta("pagoda:kv_tier_lookups_total", t.lookups, before.lookups);
    tier_delta("pagoda:kv_tier_hits_total", t.hits, before.hits);
    tier_delta("pagoda:kv_tier_hit_tokens_total", t.hit_tokens, before.hit_tokens);
    tier_delta("pagoda:kv_tier_checkpoint_hits_total", t.checkpoint_hits, before.checkpoint_hits);
    tier_delta("pagoda:kv_tier_checkpoint_stores_total", t.checkpoint_stores, before.checkpoint_stores);
    tier_delta("pagoda:kv_tier_bytes_read_total", t.bytes_read, before.bytes_read);
    tier_delta("pagoda:kv_tier_bytes_written_total", t.bytes_written, before.bytes_written);
    tier_delta("pagoda:kv_tier_stores_total", t.stores, before.stores);
    tier_delta("pagoda:kv_tier_stores_dropped_total", t.stores_dropped, before.stores_dropped);
    tier_delta("pagoda:kv_tier_expired_total", t.expired, before.expired);
    tier_delta("pagoda:kv_tier_cleared_total", t.cleared, before.cleared);
    tier_delta("pagoda:kv_tier_corrupt_total", t.corrupt, before.corrupt);
    tier_delta("pagoda:kv_tier_rejected_total", t.rejected, before.rejected);
    tier_delta("pagoda:kv_tier_errors_total", t.errors, before.errors);
    std::vector<uint64_t> buckets = t.load_latency_buckets;
    for (size_t b = 0; b < buckets.size() && b < before.load_latency_buckets.size(); ++b)
      buckets[b] -= before.load_latency_buckets[b];
    metrics_->add_histogram_counts("pagoda:kv_tier_" + t.kind + "_load_latency_seconds",
                                   "Histogram of KV tier block load latency in seconds (verified hits).",
                                   engine::kKvTierLoadLatencyBounds, buckets, t.load_latency_sum - before.load_latency_sum);
  }
  add_spec_decode_metrics(metrics_, s, last_stats_);  // metrics.cc
  add_pin_metrics(metrics_, s, last_stats_);          // metrics.cc
  last_stats_ = s;
}

void AsyncEngine::maybe_log_stats(double now) {
  if (log_stats_interval_s_ <= 0 || now - log_window_start_ < log_stats_interval_s_) return;
  const engine::EngineStats s = last_stats_;
  const engine::EngineStats& b = log_window_stats_;
  const double dt = now - log_window_start_;
  const int64_t prompt = s.prompt_tokens_total - b.prompt_tokens_total;
  const int64_t gen = s.generation_tokens_total - b.generation_tokens_total;
  int pending = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    pending = static_cast<int>(inbox_.size());
  }
  const int waiting = s.num_waiting + pending;
  // Only intervals in which something happened: an idle server stays quiet.
  if (prompt > 0 || gen > 0 || s.num_running > 0 || waiting > 0) {
    const int64_t queries = s.prefix_queries_tokens - b.prefix_queries_tokens;
    const int64_t hits = s.prefix_hits_tokens - b.prefix_hits_tokens;
    PAGODA_LOG_INFO(
        "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
        "Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
        static_cast<double>(prompt) / dt, static_cast<double>(gen) / dt, s.num_running, waiting, 100.0 * s.kv_usage,
        queries > 0 ? 100.0 * static_cast<double>(hits) / static_cast<double>(queries) : 0.0);
  }
  log_window_start_ = now;
  log_window_stats_ = s;
}

void AsyncEngine::observe_finished(const engine::DrivenRequest& r, const Route& route, const engine::TokenEvent& ev,
                                   double now) {
  // queue + prefill + decode = e2e: one clock, consecutive timestamps (submit, first
  // scheduled, first token, last event).
  const double t_sched = r.scheduled >= 0 ? r.scheduled : r.submitted;
  const double t_first = r.first_token >= 0 ? r.first_token : now;
  PAGODA_LOG_DEBUG("request %llu (submission %llu, prompt %zu): queue=%.6fs prefill=%.6fs decode=%.6fs e2e=%.6fs",
                   static_cast<unsigned long long>(ev.id), static_cast<unsigned long long>(route.ticket), route.prompt,
                   t_sched - r.submitted, t_first - t_sched, now - t_first, now - r.submitted);
  metrics_->observe("pagoda:e2e_request_latency_seconds", now - r.submitted);
  metrics_->observe("pagoda:request_queue_time_seconds", t_sched - r.submitted);
  metrics_->observe("pagoda:request_prefill_time_seconds", t_first - t_sched);
  metrics_->observe("pagoda:request_decode_time_seconds", now - t_first);
  metrics_->observe("pagoda:request_inference_time_seconds", now - t_sched);
  metrics_->observe("pagoda:request_prompt_tokens", ev.num_prompt_tokens);
  metrics_->observe("pagoda:request_generation_tokens", static_cast<double>(r.output_tokens));
  metrics_->observe("pagoda:request_max_num_generation_tokens", r.max_tokens);
  metrics_->observe("pagoda:request_params_n", r.n);
}

// Hands every prompt of one submission to the engine; all or none stay live.
// The verdict (on_added) is returned, not called: the loop publishes the stats
// first, so a client that has its 200 (or 400) finds its request counted in /metrics.
std::function<void()> AsyncEngine::admit(Pending& p) {
  std::vector<engine::RequestId> ids;
  std::string error;
  for (const auto& params : p.sub.prompts) {
    // TTFT, queue and e2e times count from the HTTP request's submit(), not from here.
    auto id = driver_.submit(params, p.t_submit);
    if (!id.ok()) {
      error = id.message();
      break;
    }
    ids.push_back(*id);
  }
  if (!error.empty()) {
    for (engine::RequestId id : ids) driver_.abort(id);
    if (metrics_) metrics_->inc_counter("pagoda:request_failure_total", 1, "400");
    return [fn = std::move(p.sub.on_added), error] { fn(error); };
  }
  for (size_t i = 0; i < ids.size(); ++i) routes_[ids[i]] = Route{p.ticket, i};
  // The prompts' token ids are in the engine now; free the submission's copy early.
  p.sub.prompts.clear();
  p.sub.prompts.shrink_to_fit();
  groups_[p.ticket] = Group{std::move(ids), std::move(p.sub.on_event), std::move(p.sub.tag)};
  return [fn = std::move(p.sub.on_added)] { fn(""); };
}

void AsyncEngine::deliver(const engine::DriverStep& st) {
  const double now = st.end;
  for (const engine::DrivenEvent& de : st.driven) {  // events of the engine's requests, then dropped ones
    const engine::TokenEvent& ev = *de.event;
    auto rit = routes_.find(ev.id);
    if (rit == routes_.end()) continue;  // its submission failed earlier in this step
    const Route route = rit->second;
    auto git = groups_.find(route.ticket);
    if (git == groups_.end()) continue;
    const engine::DrivenRequest& r = *de.request;
    if (!ev.tokens.empty() && metrics_) {
      if (de.first_token) {
        metrics_->observe("pagoda:time_to_first_token_seconds", r.first_token - r.submitted);
      } else {
        const double itl = de.gap / static_cast<double>(ev.tokens.size());
        metrics_->observe("pagoda:inter_token_latency_seconds", itl);
        metrics_->observe("pagoda:time_per_output_token_seconds", itl);
      }
    }
    // A request's metrics are recorded before its client can see it end, so a
    // scrape after a response always counts that response.
    if (metrics_ && de.done && ev.finish != engine::FinishReason::kError) {
      observe_finished(r, route, ev, now);
      metrics_->inc_counter("pagoda:request_success_total", 1, engine::finish_reason_name(ev.finish));
    }
    if (metrics_ && ev.finish == engine::FinishReason::kError)
      metrics_->inc_counter("pagoda:request_success_total", 1, "error");
    git->second.on_event(route.prompt, ev);
    if (ev.finish == engine::FinishReason::kError) {
      // One failed prompt fails the whole HTTP request: stop its siblings too (the
      // driver has ended the failed request itself, every choice of it).
      for (engine::RequestId other : git->second.ids) {
        if (driver_.find(other)) driver_.abort(other);
        routes_.erase(other);
      }
      groups_.erase(git);
      continue;
    }
    if (!de.done) continue;
    auto& ids = git->second.ids;
    ids.erase(std::remove(ids.begin(), ids.end(), ev.id), ids.end());
    if (ids.empty()) groups_.erase(git);
    routes_.erase(ev.id);
  }
}

void AsyncEngine::loop() {
  for (;;) {
    std::deque<Pending> inbox;
    std::vector<Ticket> aborts;
    std::vector<std::function<void(const EngineView&)>> inspections;
    std::vector<std::function<Reply(engine::Engine&)>> controls;
    {
      std::unique_lock<std::mutex> l(mu_);
      auto ready = [&] { return stop_ || !inbox_.empty() || !aborts_.empty() || !inspections_.empty() || !controls_.empty() || engine_->has_unfinished(); };
      // Idle, the loop still wakes: at least once a second, so the stats are published
      // (the KV tiers' write-through finishes on their own threads after the last
      // step), and once per stats-log interval, so the last busy interval gets its line.
      double wait_s = 1.0;
      if (log_stats_interval_s_ > 0) wait_s = std::min(wait_s, log_stats_interval_s_);
      cv_.wait_for(l, std::chrono::duration<double>(wait_s), ready);
      if (stop_) break;
      inbox.swap(inbox_);
      aborts.swap(aborts_);
      inspections.swap(inspections_);
      controls.swap(controls_);
    }
    std::vector<Reply> replies;
    for (auto& fn : controls) replies.push_back(fn(*engine_));
    if (!controls.empty()) publish_stats();  // before the replies: /metrics read after one shows its change
    for (auto& r : replies)
      if (r) r();
    std::vector<std::function<void()>> verdicts;
    for (auto& p : inbox) verdicts.push_back(admit(p));
    if (!verdicts.empty()) publish_stats();  // before the verdicts: see admit()
    for (auto& v : verdicts) v();
    for (Ticket t : aborts) {
      auto it = groups_.find(t);
      if (it == groups_.end()) {
        // Not admitted yet (still in the shared inbox) or already finished.
        std::lock_guard<std::mutex> l(mu_);
        for (auto pit = inbox_.begin(); pit != inbox_.end(); ++pit) {
          if (pit->ticket == t) { inbox_.erase(pit); break; }
        }
        continue;
      }
      for (engine::RequestId id : it->second.ids) {
        driver_.abort(id);
        routes_.erase(id);
        if (metrics_) metrics_->inc_counter("pagoda:request_success_total", 1, "abort");
      }
      groups_.erase(it);
    }
    if (!inspections.empty()) {
      const EngineView view{*engine_, [this](engine::RequestId id) {
                              auto lit = routes_.find(id);
                              if (lit == routes_.end()) return std::string();
                              auto git = groups_.find(lit->second.ticket);
                              return git == groups_.end() ? std::string() : git->second.tag;
                            }};
      for (auto& fn : inspections) fn(view);
    }
    if (driver_.has_unfinished()) {
      const engine::DriverStep& st = driver_.step();
      publish_stats();  // the step's counters, before any client sees its tokens
      deliver(st);
    } else {
      publish_stats();  // no step this turn (idle wake-up, aborts): a step publishes right after it runs
    }
    maybe_log_stats(now_seconds());
  }
  // Shutdown: every request gets an ending so no client hangs.
  std::deque<Pending> inbox;
  {
    std::lock_guard<std::mutex> l(mu_);
    inbox.swap(inbox_);
  }
  for (auto& p : inbox) p.sub.on_added("server is shutting down");
  for (auto& [id, route] : routes_) {
    auto git = groups_.find(route.ticket);
    if (git == groups_.end()) continue;
    engine::TokenEvent ev;
    ev.id = id;
    ev.finish = engine::FinishReason::kError;
    ev.error = "server is shutting down";
    git->second.on_event(route.prompt, ev);  // a kError ends the whole submission
    groups_.erase(git);
  }
  routes_.clear();
  groups_.clear();
}

}  // namespace pagoda::server
