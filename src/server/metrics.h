// Prometheus text-format metrics: counters, gauges and histograms with an
// optional single label. Thread-safe (one mutex; metrics are updated per event,
// not per FLOP).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace pagoda::engine { struct EngineStats; }

namespace pagoda::server {

class Metrics {
 public:
  Metrics();
  void inc_counter(const std::string& name, double v = 1, const std::string& label = "");
  void set_gauge(const std::string& name, double v);
  void observe(const std::string& name, double v);
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
  mutable std::mutex mu_;
  std::map<std::string, Help> help_;
  std::map<std::string, std::map<std::string, double>> counters_;  // name -> label value -> v
  std::map<std::string, double> gauges_;
  std::map<std::string, Histogram> histograms_;
};

// Speculative decoding (vLLM's spec_decode_* counters): adds what the engine
// counted between two stats snapshots, per draft position too.
void add_spec_decode_metrics(Metrics* m, const engine::EngineStats& now, const engine::EngineStats& before);

}  // namespace pagoda::server
