#include "server/metrics.h"

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
  gauge("pagoda:kv_cache_blocks_total", "Usable KV blocks: free + cached + in use.");
  gauge("pagoda:kv_cache_blocks_free", "Free KV blocks that hold no reusable prefix.");
  gauge("pagoda:kv_cache_blocks_cached", "Free KV blocks that still hold a reusable prefix (evictable).");
  // One series per KV cache group, set as set_gauge("<name>{group=\"g\"}", v):
  // the blocks each group's tables hold (sliding-window groups: their window).
  help_["pagoda:kv_group_blocks_used"] = {"gauge", "KV blocks held by each KV cache group.", "group"};
  counter("pagoda:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.");
  counter("pagoda:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
  counter("pagoda:num_preemptions_total", "Cumulative number of preemptions.");
  counter("pagoda:prompt_tokens_total", "Number of prefill tokens processed.");
  counter("pagoda:generation_tokens_total", "Number of generation tokens processed.");
  counter("pagoda:request_success_total", "Count of successfully processed requests.", "finished_reason");
  counter("pagoda:request_failure_total", "Count of requests answered with an error.", "status");
  // Speculative decoding (vLLM's names); acceptance rate = accepted / draft tokens.
  counter("pagoda:spec_decode_num_drafts_total", "Number of spec decoding drafts.");
  counter("pagoda:spec_decode_num_draft_tokens_total", "Number of draft tokens.");
  counter("pagoda:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.");
  counter("pagoda:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", "position");
  std::vector<double> lat = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                             2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  hist("pagoda:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lat);
  hist("pagoda:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lat);
  hist("pagoda:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", lat);
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
    out += "# HELP " + name + " " + h.help + "\n# TYPE " + name + " " + h.type + "\n";
    if (h.type == "counter") {
      const auto& m = counters_.at(name);
      if (m.empty()) out += name + " 0\n";
      for (const auto& [label, v] : m) {
        if (label.empty() || h.label_name.empty()) {
          out += name + " " + fmt_double(v) + "\n";
        } else {
          out += name + "{" + h.label_name + "=\"" + label + "\"} " + fmt_double(v) + "\n";
        }
      }
    } else if (h.type == "gauge" && !h.label_name.empty()) {
      // Labelled series are stored under "name{label=...}", right after "name" in map order.
      for (auto it = gauges_.lower_bound(name + "{"); it != gauges_.end() && it->first.rfind(name + "{", 0) == 0; ++it) {
        out += it->first + " " + fmt_double(it->second) + "\n";
      }
    } else if (h.type == "gauge") {
      out += name + " " + fmt_double(gauges_.at(name)) + "\n";
    } else {
      const Histogram& hg = histograms_.at(name);
      uint64_t cum = 0;
      for (size_t i = 0; i < hg.bounds.size(); ++i) {
        cum += hg.counts[i];
        out += name + "_bucket{le=\"" + fmt_double(hg.bounds[i]) + "\"} " + std::to_string(cum) + "\n";
      }
      cum += hg.counts.back();
      out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
      out += name + "_sum " + fmt_double(hg.sum) + "\n";
      out += name + "_count " + std::to_string(hg.count) + "\n";
    }
  }
  return out;
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
