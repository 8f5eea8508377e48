#include "loadgen/report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "base/hash.h"
#include "base/human_bytes.h"

namespace pagoda::loadgen {

// ---- Metrics -----------------------------------------------------------------

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void stats_ms(const std::vector<double>& sec, double* m, double* p50, double* p99) {
  *m = mean(sec) * 1e3;
  *p50 = percentile(sec, 50) * 1e3;
  *p99 = percentile(sec, 99) * 1e3;
}

}  // namespace

namespace {

// vLLM's peak output rate: tokens (chunks) bucketed by the whole second after the first
// submission they arrived in; the busiest bucket, and the most requests in flight in any.
void peak_rates(const std::vector<RequestResult>& results, Summary* s) {
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  for (const RequestResult& r : results) {
    if (!r.ok) continue;
    t0 = std::min(t0, r.start);
    t1 = std::max(t1, r.start + r.e2e);
  }
  if (!(t1 >= t0)) return;
  const size_t n = static_cast<size_t>(std::ceil(t1 - t0)) + 1;
  std::vector<double> tokens(n, 0);
  std::vector<int64_t> in_flight(n, 0);
  auto bucket = [&](double t) { return std::min(n - 1, static_cast<size_t>(std::max(0.0, t - t0))); };
  for (const RequestResult& r : results) {
    if (!r.ok) continue;
    double t = r.start + r.ttft;
    tokens[bucket(t)] += 1;
    for (double gap : r.itl) tokens[bucket(t += gap)] += 1;
    for (size_t b = bucket(r.start); b <= bucket(r.start + r.e2e); ++b) ++in_flight[b];
  }
  s->max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
  s->max_concurrent_requests = *std::max_element(in_flight.begin(), in_flight.end());
}

}  // namespace

Summary summarize(const std::vector<RequestResult>& results, const RunExtras& extras) {
  Summary s;
  s.num_prompts = static_cast<int>(results.size());
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t cached = 0, cached_prompt = 0;
  bool cached_known = true, ids_known = true;
  std::vector<uint8_t> id_bytes, text_bytes;
  auto put = [](std::vector<uint8_t>* b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b->insert(b->end(), c, c + n);
  };
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error;
      const uint32_t marker = 0xFFFFFFFFu;  // a failed request still moves the hash
      put(&id_bytes, &marker, 4);
      const uint64_t tmark = ~0ull;
      put(&text_bytes, &tmark, 8);
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2el.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / static_cast<double>(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    if (r.cached_tokens >= 0) {
      cached += r.cached_tokens;
      cached_prompt += r.prompt_tokens;
    } else {
      cached_known = false;
    }
    ids_known = ids_known && r.ids_known;
    const uint32_t count = static_cast<uint32_t>(r.output_ids.size());
    put(&id_bytes, &count, 4);
    put(&id_bytes, r.output_ids.data(), r.output_ids.size() * sizeof(int32_t));
    const uint64_t size = r.text.size();
    put(&text_bytes, &size, 8);
    put(&text_bytes, r.text.data(), r.text.size());
  }
  s.duration_s = extras.duration;
  if (s.duration_s > 0) {
    s.request_throughput = s.completed / s.duration_s;
    s.output_tokens_per_s = static_cast<double>(s.total_output_tokens) / s.duration_s;
    s.total_tokens_per_s = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / s.duration_s;
  }
  if (extras.steady_decode_time > 0) s.steady_decode_tokens_per_s = extras.steady_decode_tokens / extras.steady_decode_time;
  stats_ms(ttft, &s.ttft_ms_mean, &s.ttft_ms_p50, &s.ttft_ms_p99);
  stats_ms(tpot, &s.tpot_ms_mean, &s.tpot_ms_p50, &s.tpot_ms_p99);
  stats_ms(itl, &s.itl_ms_mean, &s.itl_ms_p50, &s.itl_ms_p99);
  stats_ms(e2el, &s.e2el_ms_mean, &s.e2el_ms_p50, &s.e2el_ms_p99);
  s.ttfts = std::move(ttft);
  s.tpots = std::move(tpot);
  s.itls = std::move(itl);
  s.e2els = std::move(e2el);
  peak_rates(results, &s);
  if (cached_known && s.completed > 0 && cached_prompt > 0)
    s.prefix_hit_rate = static_cast<double>(cached) / static_cast<double>(cached_prompt);
  s.peak_kv_usage = extras.peak_kv_usage;
  s.num_preemptions = extras.num_preemptions;
  s.output_hash_known = ids_known;
  s.output_hash = xxh3_64(id_bytes.data(), id_bytes.size());
  s.output_text_hash = xxh3_64(text_bytes.data(), text_bytes.size());
  return s;
}

namespace {

void line(std::string* out, const char* label, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%-40s %s\n", label, value.c_str());
  *out += buf;
}
std::string f2(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.2f", v);
  return b;
}
std::string i64(int64_t v) { return std::to_string(v); }
std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%016" PRIx64, v);
  return b;
}
// "====== title ======" centred in 50 columns, like vLLM.
std::string banner(const char* title, char fill) {
  const size_t n = 50, len = std::strlen(title);
  const size_t left = len >= n ? 0 : (n - len) / 2, right = len >= n ? 0 : n - len - left;
  return std::string(left, fill) + title + std::string(right, fill) + "\n";
}

}  // namespace

namespace {

// One latency metric as vLLM reports it (ms): mean, median, population std, percentiles.
struct MetricStats {
  const char* name = "";   // "ttft"
  const char* label = "";  // "TTFT"
  const char* title = "";  // the section banner
  double mean = 0, median = 0, std = 0;
  std::vector<std::pair<double, double>> percentiles;  // (p, ms)
};

MetricStats metric_stats(const Summary& s, const std::string& name, const std::vector<double>& ps) {
  static const struct {
    const char* name;
    const char* label;
    const char* title;
    std::vector<double> Summary::*samples;
  } kMetrics[] = {
      {"ttft", "TTFT", "Time to First Token", &Summary::ttfts},
      {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &Summary::tpots},
      {"itl", "ITL", "Inter-token Latency", &Summary::itls},
      {"e2el", "E2EL", "End-to-end Latency", &Summary::e2els},
  };
  for (const auto& m : kMetrics) {
    if (name != m.name) continue;
    const std::vector<double>& v = s.*m.samples;
    MetricStats st;
    st.name = m.name;
    st.label = m.label;
    st.title = m.title;
    st.mean = mean(v) * 1e3;
    st.median = percentile(v, 50) * 1e3;
    double sq = 0;
    for (double x : v) sq += (x * 1e3 - st.mean) * (x * 1e3 - st.mean);
    st.std = v.empty() ? 0 : std::sqrt(sq / static_cast<double>(v.size()));
    for (double p : ps) st.percentiles.emplace_back(p, percentile(v, p) * 1e3);
    return st;
  }
  return MetricStats{};
}

}  // namespace

std::string percentile_word(double p) {
  char b[32];
  if (p == std::floor(p)) std::snprintf(b, sizeof b, "p%.0f", p);
  else std::snprintf(b, sizeof b, "p%g", p);
  return b;
}

std::string format_report(const Summary& s, const MetricSelection& sel) {
  std::string o = banner(" Serving Benchmark Result ", '=');
  line(&o, "Successful requests:", i64(s.completed));
  line(&o, "Failed requests:", i64(s.failed));
  if (s.max_concurrency > 0) line(&o, "Maximum request concurrency:", i64(s.max_concurrency));
  line(&o, "Request rate configured (RPS):", std::isfinite(s.request_rate) ? f2(s.request_rate) : "inf");
  line(&o, "Benchmark duration (s):", f2(s.duration_s));
  line(&o, "Total input tokens:", i64(s.total_input_tokens));
  line(&o, "Total generated tokens:", i64(s.total_output_tokens));
  line(&o, "Request throughput (req/s):", f2(s.request_throughput));
  line(&o, "Output token throughput (tok/s):", f2(s.output_tokens_per_s));
  line(&o, "Peak output token throughput (tok/s):", f2(s.max_output_tokens_per_s));
  line(&o, "Peak concurrent requests:", f2(static_cast<double>(s.max_concurrent_requests)));
  line(&o, "Total token throughput (tok/s):", f2(s.total_tokens_per_s));
  line(&o, "Steady decode throughput (tok/s):",
       s.steady_decode_tokens_per_s >= 0 ? f2(s.steady_decode_tokens_per_s) : "n/a");
  // vLLM's latency sections: a banner, then mean, median and the chosen percentiles in ms.
  for (const std::string& name : sel.metrics) {
    const MetricStats m = metric_stats(s, name, sel.percentiles);
    o += banner(m.title, '-');
    line(&o, ("Mean " + std::string(m.label) + " (ms):").c_str(), f2(m.mean));
    line(&o, ("Median " + std::string(m.label) + " (ms):").c_str(), f2(m.median));
    for (const auto& [p, v] : m.percentiles) {
      std::string word = percentile_word(p);
      word[0] = 'P';
      line(&o, (word + " " + m.label + " (ms):").c_str(), f2(v));
    }
  }
  o += banner("KV cache", '-');
  if (s.kv_cache_blocks >= 0)
    line(&o, "KV pool (blocks):", i64(s.kv_cache_blocks) + " (" + human_bytes(static_cast<double>(s.kv_cache_bytes)) + ")");
  line(&o, "Peak KV cache usage (%):", s.peak_kv_usage >= 0 ? f2(s.peak_kv_usage * 100) : "n/a");
  line(&o, "Prefix cache hit rate (%):", s.prefix_hit_rate >= 0 ? f2(s.prefix_hit_rate * 100) : "n/a");
  line(&o, "Preemptions:", s.num_preemptions >= 0 ? i64(s.num_preemptions) : "n/a");
  line(&o, "Output hash (token ids):", s.output_hash_known ? hex(s.output_hash) : "n/a");
  line(&o, "Output hash (text):", hex(s.output_text_hash));
  o += std::string(50, '=') + "\n";
  return o;
}

std::string format_vllm_result(const Summary& s, const MetricSelection& sel, const ResultMeta& meta,
                               const std::vector<RequestResult>& results) {
  using json = nlohmann::ordered_json;  // vLLM's key order
  auto null_if = [](bool null, json v) { return null ? json() : v; };
  json j;
  j["date"] = meta.date;
  j["endpoint_type"] = meta.backend;
  j["backend"] = meta.backend;
  j["label"] = null_if(meta.label.empty(), meta.label);
  j["model_id"] = meta.model_id;
  j["tokenizer_id"] = meta.tokenizer_id;
  j["num_prompts"] = meta.num_prompts;
  j["request_rate"] = std::isfinite(s.request_rate) ? json(s.request_rate) : json("inf");
  j["burstiness"] = 1.0;
  j["max_concurrency"] = null_if(s.max_concurrency <= 0, s.max_concurrency);
  j["duration"] = s.duration_s;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["request_throughput"] = s.request_throughput;
  j["request_goodput"] = nullptr;
  j["output_throughput"] = s.output_tokens_per_s;
  j["total_token_throughput"] = s.total_tokens_per_s;
  if (meta.detailed) {
    json in = json::array(), out = json::array(), ttfts = json::array(), itls = json::array(), texts = json::array(),
         errors = json::array();
    for (const RequestResult& r : results) {
      in.push_back(r.prompt_tokens);
      out.push_back(r.ok ? r.output_tokens : 0);
      ttfts.push_back(r.ttft);
      itls.push_back(r.itl);
      texts.push_back(r.text);
      errors.push_back(r.error);
    }
    j["input_lens"] = std::move(in);
    j["output_lens"] = std::move(out);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["generated_texts"] = std::move(texts);
    j["errors"] = std::move(errors);
  }
  j["max_output_tokens_per_s"] = s.max_output_tokens_per_s;
  j["max_concurrent_requests"] = s.max_concurrent_requests;
  for (const std::string& name : sel.metrics) {
    const MetricStats m = metric_stats(s, name, sel.percentiles);
    j["mean_" + name + "_ms"] = m.mean;
    j["median_" + name + "_ms"] = m.median;
    j["std_" + name + "_ms"] = m.std;
    for (const auto& [p, v] : m.percentiles) j[percentile_word(p) + "_" + name + "_ms"] = v;
  }
  // pagoda's: what the server's cache did, and the outputs' hashes.
  j["prefix_hit_rate"] = null_if(s.prefix_hit_rate < 0, s.prefix_hit_rate);
  j["peak_kv_usage"] = null_if(s.peak_kv_usage < 0, s.peak_kv_usage);
  j["num_preemptions"] = null_if(s.num_preemptions < 0, s.num_preemptions);
  j["output_hash"] = null_if(!s.output_hash_known, hex(s.output_hash));
  j["output_text_hash"] = hex(s.output_text_hash);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string time_string(const char* format, bool utc) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  if (utc) gmtime_r(&t, &tm);
  else localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string default_result_filename(const std::string& label, double request_rate, int max_concurrency,
                                    const std::string& model_id, const std::string& date) {
  char rate[64];
  // Python's str(float): "inf", "4.0", "0.5".
  if (!std::isfinite(request_rate)) std::snprintf(rate, sizeof rate, "inf");
  else if (request_rate == std::floor(request_rate)) std::snprintf(rate, sizeof rate, "%.1f", request_rate);
  else std::snprintf(rate, sizeof rate, "%g", request_rate);
  const size_t slash = model_id.find_last_of('/');
  const std::string base = slash == std::string::npos ? model_id : model_id.substr(slash + 1);
  std::string name = label + "-" + rate + "qps";
  if (max_concurrency > 0) name += "-concurrency" + std::to_string(max_concurrency);
  return name + "-" + base + "-" + date + ".json";
}

std::string format_json(const Summary& s) {
  using json = nlohmann::ordered_json;  // fields in the documented order
  auto opt = [](bool known, json v) { return known ? v : json(); };
  json j = {
      {"mode", s.mode},
      {"workload", s.workload},
      {"model", s.model},
      {"num_prompts", s.num_prompts},
      {"max_concurrency", opt(s.max_concurrency > 0, s.max_concurrency)},
      {"request_rate", opt(std::isfinite(s.request_rate), s.request_rate)},
      {"seed", s.seed},
      {"completed", s.completed},
      {"failed", s.failed},
      {"first_error", opt(!s.first_error.empty(), s.first_error)},
      {"duration_s", s.duration_s},
      {"total_input_tokens", s.total_input_tokens},
      {"total_output_tokens", s.total_output_tokens},
      {"request_throughput", s.request_throughput},
      {"output_tokens_per_s", s.output_tokens_per_s},
      {"total_tokens_per_s", s.total_tokens_per_s},
      {"steady_decode_tokens_per_s", opt(s.steady_decode_tokens_per_s >= 0, s.steady_decode_tokens_per_s)},
      {"ttft_ms_mean", s.ttft_ms_mean}, {"ttft_ms_p50", s.ttft_ms_p50}, {"ttft_ms_p99", s.ttft_ms_p99},
      {"tpot_ms_mean", s.tpot_ms_mean}, {"tpot_ms_p50", s.tpot_ms_p50}, {"tpot_ms_p99", s.tpot_ms_p99},
      {"itl_ms_mean", s.itl_ms_mean}, {"itl_ms_p50", s.itl_ms_p50}, {"itl_ms_p99", s.itl_ms_p99},
      {"e2el_ms_mean", s.e2el_ms_mean}, {"e2el_ms_p50", s.e2el_ms_p50}, {"e2el_ms_p99", s.e2el_ms_p99},
      {"prefix_hit_rate", opt(s.prefix_hit_rate >= 0, s.prefix_hit_rate)},
      {"peak_kv_usage", opt(s.peak_kv_usage >= 0, s.peak_kv_usage)},
      {"kv_cache_blocks", opt(s.kv_cache_blocks >= 0, s.kv_cache_blocks)},
      {"kv_cache_bytes", opt(s.kv_cache_bytes >= 0, s.kv_cache_bytes)},
      {"num_preemptions", opt(s.num_preemptions >= 0, s.num_preemptions)},
      {"output_hash", opt(s.output_hash_known, hex(s.output_hash))},
      {"output_text_hash", hex(s.output_text_hash)},
  };
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace pagoda::loadgen
