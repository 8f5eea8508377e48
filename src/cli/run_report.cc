#include "cli/run_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "base/timer.h"
#include "loadgen/http_client.h"

namespace pagoda::cli {

namespace {
// Offline runs step hundreds of times a second: at most one point per this many
// seconds, and write() thins a long run to kMaxPoints, so reports stay small.
constexpr double kMinPeriodS = 0.01;
constexpr size_t kMaxPoints = 4000;
}  // namespace

RunRecorder::RunRecorder() : t0_(now_seconds()) {}

void RunRecorder::on_engine_stats(const engine::EngineStats& s) {
  const double t = now_seconds() - t0_;
  if (last_ >= 0 && t - last_ < kMinPeriodS) {
    tail_ = server::series_point(t, s);  // kept for write(): the run's end state
    has_tail_ = true;
    return;
  }
  last_ = t;
  has_tail_ = false;
  points_.push_back(server::series_point(t, s));
}

void RunRecorder::on_metrics(const std::string& text) {
  const double t = now_seconds() - t0_;
  last_ = t;
  auto get = [&](std::initializer_list<const char*> suffixes) {
    std::vector<std::string> v;
    for (const char* s : suffixes) v.emplace_back(s);
    return loadgen::scrape_metric(text, v);
  };
  auto count = [](double v) { return v < 0 ? int64_t{0} : static_cast<int64_t>(std::llround(v)); };
  server::SeriesPoint p;
  p.t = t;
  // Block counts when the server has them (pagoda), else usage in per mille (vLLM).
  const double total = get({":kv_cache_blocks_total"});
  const double usage = get({":kv_cache_usage_perc", ":gpu_cache_usage_perc"});
  p.blocks_total = total > 0 ? count(total) : 1000;
  p.blocks_used = count(std::max(0.0, usage) * static_cast<double>(p.blocks_total));
  p.blocks_cached = count(get({":kv_cache_blocks_cached"}));
  p.running = count(get({":num_requests_running"}));
  p.waiting = count(get({":num_requests_waiting"}));
  p.prefix_queries = count(get({":prefix_cache_queries_total", ":gpu_prefix_cache_queries_total"}));
  p.prefix_hits = count(get({":prefix_cache_hits_total", ":gpu_prefix_cache_hits_total"}));
  p.preemptions = count(get({":num_preemptions_total", ":num_preemptions"}));
  p.generation_tokens = count(get({":generation_tokens_total"}));
  p.prompt_tokens = count(get({":prompt_tokens_total"}));
  points_.push_back(p);
}

Status RunRecorder::write(const std::string& path, const std::string& title, const std::string& summary_json) const {
  std::vector<server::SeriesPoint> all = points_;
  if (has_tail_) all.push_back(tail_);
  std::vector<server::SeriesPoint> kept;
  const size_t stride = (all.size() + kMaxPoints - 1) / kMaxPoints;
  for (size_t i = 0; i < all.size(); i += std::max<size_t>(1, stride)) kept.push_back(all[i]);
  if (!all.empty() && kept.back().t != all.back().t) kept.push_back(all.back());  // the end state
  std::ofstream out(path, std::ios::binary);
  if (!out || !(out << server::report_html(title, kept, summary_json)) || !out.flush())
    return errorf("cannot write the report %s", path.c_str());
  return Status::Ok();
}

}  // namespace pagoda::cli
