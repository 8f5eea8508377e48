// Prometheus text-format metrics: counters, gauges and histograms with an
// optional label. Thread-safe (one mutex; metrics are updated per event, not
// per FLOP).
//
// Series are registered and updated under their pagoda names ("pagoda:..."). The
// exposition renames them: set_exposition("vllm", model) makes every series read
// "vllm:..." and carry model_name="model" (vLLM's names and label, so its Grafana
// dashboards work unchanged; `--metrics-name-prefix`).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace pagoda::engine { struct EngineStats; }

namespace pagoda::server {

class Metrics {
 public:
  Metrics();
  // Prefix written instead of "pagoda" (a Prometheus metric-name prefix: letters,
  // digits, '_' and ':' only; checked by the caller), and the model_name label
  // ("" : no label).
  void set_exposition(const std::string& prefix, const std::string& model_name);
  void inc_counter(const std::string& name, double v = 1, const std::string& label = "");
  // A labelled gauge is set as "name{label=\"v\"}" (its name registered with a label name).
  void set_gauge(const std::string& name, double v);
  void observe(const std::string& name, double v);
  // Adds per-bucket counts (non-cumulative, last = +Inf) and their sum to a
  // histogram, creating it with these bounds (for counts kept elsewhere, such
  // as the KV tiers' load latencies). Counts of other bounds are ignored.
  void add_histogram_counts(const std::string& name, const std::string& help, std::span<const double> bounds,
                            const std::vector<uint64_t>& counts, double sum);
  // Prometheus exposition format 0.0.4.
  std::string render() const;
  double counter(const std::string& name, const std::string& label = "") const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bucket (non-cumulative), last = +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  struct Help { std::string type, help, label_name; };
  // `name` (a pagoda name) as exposed, with the model_name label and `labels`
  // ("" or 'k="v",...') in braces.
  std::string series(const std::string& name, const std::string& suffix, const std::string& labels) const;
  mutable std::mutex mu_;
  std::string prefix_ = "pagoda";
  std::string model_label_;  // 'model_name="..."' or ""
  std::map<std::string, Help> help_;
  std::map<std::string, std::map<std::string, double>> counters_;  // name -> label value -> v
  std::map<std::string, double> gauges_;
  std::map<std::string, Histogram> histograms_;
};

// Text for a Prometheus label value: backslash, double quote and newline escaped.
std::string prometheus_label_value(const std::string& v);

// Speculative decoding (vLLM's spec_decode_* counters): adds what the engine
// counted between two stats snapshots, per draft position too.
void add_spec_decode_metrics(Metrics* m, const engine::EngineStats& now, const engine::EngineStats& before);
// Pins and per-priority request counts (issue 36); priorities in five buckets
// (priority_bucket: "negative", "0", "1-9", "10-99", "100+").
const char* priority_bucket(int32_t priority);
void add_pin_metrics(Metrics* m, const engine::EngineStats& now, const engine::EngineStats& before);

}  // namespace pagoda::server
