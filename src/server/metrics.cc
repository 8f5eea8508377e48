#include "server/metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/engine.h"

namespace pagoda::server {
namespace {
std::string fmt_double(double v) {
  // Shortest of %.15g / %.17g that reads back exactly.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
}  // namespace

Metrics::Metrics() {
  auto counter = [&](const char* n, const char* h, const char* label = "") {
    help_[n] = {"counter", h, label};
    counters_[n];
  };
  auto gauge = [&](const char* n, const char* h) {
    help_[n] = {"gauge", h, ""};
    gauges_[n] = 0;
  };
  auto hist = [&](const char* n, const char* h, std::vector<double> b) {
    help_[n] = {"histogram", h, ""};
    Histogram hg;
    hg.bounds = std::move(b);
    hg.counts.assign(hg.bounds.size() + 1, 0);
    histograms_[n] = hg;
  };
  gauge("pagoda:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  gauge("pagoda:num_requests_running", "Number of requests in model execution batches.");
  gauge("pagoda:num_requests_waiting", "Number of requests waiting to be processed.");
  gauge("pagoda:grammar_cache_bytes", "Heap bytes of the cached compiled grammars and their token masks.");
  gauge("pagoda:kv_cache_blocks_total", "Usable KV blocks: free + cached + in use.");
  gauge("pagoda:kv_cache_blocks_free", "Free KV blocks that hold no reusable prefix.");
  gauge("pagoda:kv_cache_blocks_cached", "Free KV blocks that still hold a reusable prefix (evictable).");
  // One series per KV cache group, set as set_gauge("<name>{group=\"g\"}", v):
  // the blocks each group's tables hold (sliding-window groups: their window).
  help_["pagoda:kv_group_blocks_used"] = {"gauge", "KV blocks held by each KV cache group.", "group"};
  counter("pagoda:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.");
  counter("pagoda:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
  // Why a request's prefix hit ended (kv/prefix_miss.h), at its first admission;
  // bounded labels, every one exposed from the start.
  counter("pagoda:prefix_cache_miss_total", "Requests whose prefix-cache hit ended before their last block, by cause.",
          "cause");
  for (const char* c : {"never_seen", "evicted", "salt", "tier_miss", "diverged"})
    counters_["pagoda:prefix_cache_miss_total"][c] = 0;
  counter("pagoda:num_preemptions_total", "Cumulative number of preemptions.");
  // Recurrent-state checkpoints of hybrid models (kv/state_checkpoint.cc, issue 38).
  gauge("pagoda:state_checkpoints", "Recurrent-state checkpoints held in the prefix cache (hybrid models).");
  counter("pagoda:state_checkpoints_stored_total", "Recurrent-state checkpoints taken at block boundaries.");
  counter("pagoda:state_checkpoints_hit_total", "Prefix hits that restored a recurrent-state checkpoint.");
  counter("pagoda:state_checkpoints_evicted_total", "Recurrent-state checkpoints evicted for reuse of their blocks.");
  counter("pagoda:kv_events_published_batches_total", "KV event messages published (one per engine step with events).");
  counter("pagoda:kv_events_published_total", "KV events published.");
  counter("pagoda:kv_events_dropped_batches_total", "KV event messages dropped by the publisher's full queue.");
  counter("pagoda:kv_events_dropped_total", "KV events dropped by the publisher's full queue.");
  counter("pagoda:prompt_tokens_total", "Number of prefill tokens processed.");
  counter("pagoda:generation_tokens_total", "Number of generation tokens processed.");
  counter("pagoda:request_success_total", "Count of successfully processed requests.", "finished_reason");
  counter("pagoda:request_failure_total", "Count of requests answered with an error.", "status");
  // KV tiers below RAM (issue 16), one series per tier ("disk", "redis"); the
  // load latency histograms are pagoda:kv_tier_<tier>_load_latency_seconds
  // (add_histogram_counts, made when a tier reports).
  counter("pagoda:kv_tier_lookups_total", "KV tier block lookups (loads asked of the tier).", "tier");
  counter("pagoda:kv_tier_hits_total", "KV tier blocks loaded and verified.", "tier");
  counter("pagoda:kv_tier_hit_tokens_total", "Prompt tokens of the KV tier blocks loaded and verified.", "tier");
  counter("pagoda:kv_tier_checkpoint_hits_total", "KV tier recurrent-state checkpoints loaded and verified (hybrid models).", "tier");
  counter("pagoda:kv_tier_checkpoint_stores_total", "KV tier recurrent-state checkpoints written (hybrid models; also in stores_total).", "tier");
  counter("pagoda:kv_tier_bytes_read_total", "Bytes read from the KV tier.", "tier");
  counter("pagoda:kv_tier_bytes_written_total", "Bytes written to the KV tier.", "tier");
  counter("pagoda:kv_tier_stores_total", "KV tier entries written.", "tier");
  counter("pagoda:kv_tier_stores_dropped_total", "KV tier writes dropped by a full queue.", "tier");
  counter("pagoda:kv_tier_expired_total", "KV tier entries dropped by their expiry (a pinned prefix's TTL).", "tier");
  counter("pagoda:kv_tier_cleared_total", "KV tier entries removed by POST /reset_prefix_cache?tiers=true.", "tier");
  counter("pagoda:kv_tier_corrupt_total", "KV tier entries failing the size or MAC check, or rejected unread (dropped).", "tier");
  counter("pagoda:kv_tier_rejected_total", "KV tier values larger than an entry or not regular files, dropped unread.", "tier");
  counter("pagoda:kv_tier_errors_total", "KV tier I/O and connection errors.", "tier");
  // Speculative decoding (vLLM's names); acceptance rate = accepted / draft tokens.
  counter("pagoda:spec_decode_num_drafts_total", "Number of spec decoding drafts.");
  counter("pagoda:spec_decode_num_draft_tokens_total", "Number of draft tokens.");
  counter("pagoda:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.");
  counter("pagoda:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", "position");
  // Pins and priorities (issue 36; add_pin_metrics).
  gauge("pagoda:kv_pins", "Live pinned prefixes (cache_control / prompt_cache_retention).");
  gauge("pagoda:kv_pinned_blocks", "KV blocks held by pins (counted as used; never evicted before their TTL).");
  gauge("pagoda:kv_pinned_blocks_cap", "Most KV blocks pins may hold (--kv-pinned-fraction of the pool).");
  counter("pagoda:kv_pins_created_total", "Pins created.");
  counter("pagoda:kv_pins_renewed_total", "Pin TTL renewals (a hit on a pinned prefix, or the same pin asked again).");
  counter("pagoda:kv_pins_expired_total", "Pins released by their TTL.");
  counter("pagoda:kv_pins_demoted_total", "Pins released early: over the cap, or to admit a request.");
  counter("pagoda:kv_pins_cleared_total", "Pins released by POST /reset_prefix_cache.");
  counter("pagoda:kv_pins_checkpoints_added_total",
          "Recurrent-state checkpoints made or imported inside a live pin, pinned with it (hybrid models).");
  counter("pagoda:kv_pins_checkpoints_over_cap_total",
          "Recurrent-state checkpoints inside a live pin left unpinned: the pin cap had no room (hybrid models).");
  counter("pagoda:prefix_cache_resets_total", "POST /reset_prefix_cache calls that cleared the cache.");
  help_["pagoda:num_requests_waiting_by_priority"] = {"gauge", "Waiting requests by priority bucket.", "priority"};
  help_["pagoda:num_requests_running_by_priority"] = {"gauge", "Running requests by priority bucket.", "priority"};
  std::vector<double> lat = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                             2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  hist("pagoda:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lat);
  hist("pagoda:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lat);
  hist("pagoda:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", lat);
  // vLLM's names that its example Grafana dashboard reads (tests/cli/test_metric_names.py).
  // pagoda keeps no swap space and no CPU cache: those two read 0. gpu_cache_usage_perc
  // is vLLM's older name of kv_cache_usage_perc (the pool lives in RAM here).
  gauge("pagoda:num_requests_swapped", "Number of requests swapped to CPU (pagoda never swaps: 0).");
  gauge("pagoda:gpu_cache_usage_perc", "KV-cache usage (vLLM's older name of kv_cache_usage_perc). 1 means 100 percent.");
  gauge("pagoda:cpu_cache_usage_perc", "CPU swap-space KV usage (pagoda has none: 0).");
  // One series, value 1, whose labels are the cache configuration (set by the server).
  help_["pagoda:cache_config_info"] = {"gauge", "Information of the KV cache configuration.", "info"};
  hist("pagoda:time_per_output_token_seconds", "Histogram of time per output token in seconds.", lat);
  // Queue: submitted -> the first engine step after it reached the engine. Prefill:
  // that step -> first token (so waiting inside the scheduler for KV space counts as
  // prefill). Decode: first -> last token. Inference: prefill + decode.
  std::vector<double> phase = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  hist("pagoda:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", phase);
  hist("pagoda:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", phase);
  hist("pagoda:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", phase);
  hist("pagoda:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", phase);
  std::vector<double> tokens;  // 1, 2, 5, 10, ... 5e6 (vLLM's 1-2-5 series)
  for (double d = 1; d <= 5e6; d *= 10)
    for (double m : {1.0, 2.0, 5.0}) tokens.push_back(d * m);
  hist("pagoda:request_prompt_tokens", "Number of prefill tokens processed.", tokens);
  hist("pagoda:request_generation_tokens", "Number of generation tokens processed.", tokens);
  hist("pagoda:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
       tokens);
  hist("pagoda:request_params_n", "Histogram of the n request parameter.", {1, 2, 5, 10, 20});
  hist("pagoda:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
       {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384});
}

void Metrics::set_exposition(const std::string& prefix, const std::string& model_name) {
  std::lock_guard<std::mutex> l(mu_);
  prefix_ = prefix;
  model_label_ = model_name.empty() ? "" : "model_name=\"" + prometheus_label_value(model_name) + "\"";
}

std::string prometheus_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

std::string Metrics::series(const std::string& name, const std::string& suffix, const std::string& labels) const {
  static const std::string kOwn = "pagoda:";
  std::string out = name.rfind(kOwn, 0) == 0 ? prefix_ + ":" + name.substr(kOwn.size()) : name;
  out += suffix;
  if (model_label_.empty() && labels.empty()) return out;
  out += '{';
  out += model_label_;
  if (!model_label_.empty() && !labels.empty()) out += ',';
  out += labels;
  out += '}';
  return out;
}

void Metrics::inc_counter(const std::string& name, double v, const std::string& label) {
  std::lock_guard<std::mutex> l(mu_);
  counters_[name][label] += v;
}

void Metrics::set_gauge(const std::string& name, double v) {
  std::lock_guard<std::mutex> l(mu_);
  gauges_[name] = v;
}

void Metrics::observe(const std::string& name, double v) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = histograms_.find(name);
  if (it == histograms_.end()) return;
  Histogram& h = it->second;
  size_t i = 0;
  while (i < h.bounds.size() && v > h.bounds[i]) ++i;
  h.counts[i]++;
  h.sum += v;
  h.count++;
}

void Metrics::add_histogram_counts(const std::string& name, const std::string& help, std::span<const double> bounds,
                                   const std::vector<uint64_t>& counts, double sum) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = histograms_.find(name);
  if (it == histograms_.end()) {
    help_[name] = {"histogram", help, ""};
    Histogram hg;
    hg.bounds.assign(bounds.begin(), bounds.end());
    hg.counts.assign(bounds.size() + 1, 0);
    it = histograms_.emplace(name, std::move(hg)).first;
  }
  Histogram& h = it->second;
  if (!std::ranges::equal(h.bounds, bounds) || counts.size() != h.counts.size()) return;
  for (size_t i = 0; i < counts.size(); ++i) {
    h.counts[i] += counts[i];
    h.count += counts[i];
  }
  h.sum += sum;
}

double Metrics::counter(const std::string& name, const std::string& label) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = counters_.find(name);
  if (it == counters_.end()) return 0;
  auto jt = it->second.find(label);
  return jt == it->second.end() ? 0 : jt->second;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  for (const auto& [name, h] : help_) {
    const std::string shown = series(name, "", "");
    const std::string bare = shown.substr(0, shown.find('{'));
    out += "# HELP " + bare + " " + h.help + "\n# TYPE " + bare + " " + h.type + "\n";
    if (h.type == "counter") {
      const auto& m = counters_.at(name);
      if (m.empty()) out += shown + " 0\n";
      for (const auto& [label, v] : m) {
        const bool plain = label.empty() || h.label_name.empty();
        out += series(name, "", plain ? "" : h.label_name + "=\"" + label + "\"") + " " + fmt_double(v) + "\n";
      }
    } else if (h.type == "gauge" && !h.label_name.empty()) {
      // Labelled series are stored under "name{label=...}", right after "name" in map order.
      for (auto it = gauges_.lower_bound(name + "{"); it != gauges_.end() && it->first.rfind(name + "{", 0) == 0; ++it) {
        const std::string& key = it->first;
        const std::string labels = key.substr(name.size() + 1, key.size() - name.size() - 2);
        out += series(name, "", labels) + " " + fmt_double(it->second) + "\n";
      }
    } else if (h.type == "gauge") {
      out += shown + " " + fmt_double(gauges_.at(name)) + "\n";
    } else {
      const Histogram& hg = histograms_.at(name);
      uint64_t cum = 0;
      for (size_t i = 0; i < hg.bounds.size(); ++i) {
        cum += hg.counts[i];
        out += series(name, "_bucket", "le=\"" + fmt_double(hg.bounds[i]) + "\"") + " " + std::to_string(cum) + "\n";
      }
      cum += hg.counts.back();
      out += series(name, "_bucket", "le=\"+Inf\"") + " " + std::to_string(cum) + "\n";
      out += series(name, "_sum", "") + " " + fmt_double(hg.sum) + "\n";
      out += series(name, "_count", "") + " " + std::to_string(hg.count) + "\n";
    }
  }
  return out;
}

const char* priority_bucket(int32_t priority) {
  if (priority < 0) return "negative";
  if (priority == 0) return "0";
  if (priority < 10) return "1-9";
  if (priority < 100) return "10-99";
  return "100+";
}

void add_pin_metrics(Metrics* m, const engine::EngineStats& now, const engine::EngineStats& before) {
  m->set_gauge("pagoda:kv_pins", static_cast<double>(now.pins));
  m->set_gauge("pagoda:kv_pinned_blocks", static_cast<double>(now.blocks_pinned));
  m->set_gauge("pagoda:kv_pinned_blocks_cap", static_cast<double>(now.blocks_pinned_cap));
  auto delta = [&](const char* name, int64_t a, int64_t b) {
    if (a > b) m->inc_counter(name, static_cast<double>(a - b));
  };
  delta("pagoda:kv_pins_created_total", now.pins_created, before.pins_created);
  delta("pagoda:kv_pins_renewed_total", now.pins_renewed, before.pins_renewed);
  delta("pagoda:kv_pins_expired_total", now.pins_expired, before.pins_expired);
  delta("pagoda:kv_pins_demoted_total", now.pins_demoted, before.pins_demoted);
  delta("pagoda:kv_pins_cleared_total", now.pins_cleared, before.pins_cleared);
  delta("pagoda:kv_pins_checkpoints_added_total", now.pins_checkpoints_added, before.pins_checkpoints_added);
  delta("pagoda:kv_pins_checkpoints_over_cap_total", now.pins_checkpoints_over_cap, before.pins_checkpoints_over_cap);
  delta("pagoda:prefix_cache_resets_total", now.prefix_cache_resets, before.prefix_cache_resets);
  // Five fixed buckets (bounded label cardinality), every one set each time.
  static const char* const kBuckets[] = {"negative", "0", "1-9", "10-99", "100+"};
  auto publish = [&](const char* name, const std::vector<std::pair<int32_t, int32_t>>& counts) {
    for (const char* b : kBuckets) {
      int64_t n = 0;
      for (const auto& [prio, c] : counts) n += std::string(priority_bucket(prio)) == b ? c : 0;
      m->set_gauge(std::string(name) + "{priority=\"" + b + "\"}", static_cast<double>(n));
    }
  };
  publish("pagoda:num_requests_waiting_by_priority", now.waiting_by_priority);
  publish("pagoda:num_requests_running_by_priority", now.running_by_priority);
}

void add_spec_decode_metrics(Metrics* m, const engine::EngineStats& now, const engine::EngineStats& before) {
  auto delta = [&](const char* name, int64_t a, int64_t b, const std::string& label = "") {
    if (a > b) m->inc_counter(name, static_cast<double>(a - b), label);
  };
  delta("pagoda:spec_decode_num_drafts_total", now.spec_num_drafts, before.spec_num_drafts);
  delta("pagoda:spec_decode_num_draft_tokens_total", now.spec_num_draft_tokens, before.spec_num_draft_tokens);
  delta("pagoda:spec_decode_num_accepted_tokens_total", now.spec_num_accepted_tokens, before.spec_num_accepted_tokens);
  for (size_t j = 0; j < now.spec_accepted_per_pos.size(); ++j) {
    const int64_t was = j < before.spec_accepted_per_pos.size() ? before.spec_accepted_per_pos[j] : 0;
    delta("pagoda:spec_decode_num_accepted_tokens_per_pos", now.spec_accepted_per_pos[j], was, std::to_string(j));
  }
}

}  // namespace pagoda::server
