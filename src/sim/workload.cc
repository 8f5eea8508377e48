#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "base/rng.h"
#include "sim/json_util.h"

namespace pagoda::sim {

Expected<WorkloadKind> parse_workload_kind(const std::string& s) {
  if (s == "random") return WorkloadKind::kRandom;
  if (s == "shared-prefix" || s == "shared_prefix") return WorkloadKind::kSharedPrefix;
  if (s.size() > 6 && s.compare(s.size() - 6, 6, ".jsonl") == 0) return WorkloadKind::kTrace;
  return errorf("unknown workload '%s' (random, shared-prefix, or a .jsonl trace)", s.c_str());
}

namespace {

int32_t jitter(Rng& rng, int32_t len, double ratio) {
  if (ratio <= 0) return len;
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1.0 - ratio))));
  const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1.0 + ratio))));
  return static_cast<int32_t>(rng.uniform_int(lo, hi));
}

int32_t random_token(Rng& rng, int32_t vocab) { return static_cast<int32_t>(rng.uniform_int(1, std::max(2, vocab) - 1)); }

// The deterministic tokens of trace block `hash_id`.
void append_block(uint64_t hash_id, int32_t n, int32_t vocab, std::vector<int32_t>* out) {
  Rng rng(hash_id * 0x9E3779B97F4A7C15ull + 7);
  for (int32_t i = 0; i < n; ++i) out->push_back(random_token(rng, vocab));
}

void assign_poisson_arrivals(std::vector<SimRequest>* reqs, double rate, Rng& rng) {
  double t = 0;
  for (auto& r : *reqs) {
    if (std::isfinite(rate) && rate > 0) t += rng.exponential(rate);
    r.arrival_s = std::isfinite(rate) ? t : 0.0;
  }
}

Expected<std::vector<SimRequest>> read_trace(const WorkloadSpec& spec, Rng& rng) {
  std::ifstream f(spec.trace_path);
  if (!f) return errorf("%s: cannot open", spec.trace_path.c_str());
  std::vector<SimRequest> reqs;
  bool have_times = false, missing_times = false;
  std::string line;
  for (int line_no = 1; std::getline(f, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string ctx = spec.trace_path + ":" + std::to_string(line_no);
    detail::json j;
    try {
      j = detail::json::parse(line);
    } catch (const detail::json::exception& e) {
      return errorf("%s: invalid JSON: %s", ctx.c_str(), e.what());
    }
    if (!j.is_object()) return errorf("%s: expected an object", ctx.c_str());
    PAGODA_ASSIGN_OR_RETURN(int64_t in_alt, detail::get_int(j, "input_length", -1, ctx, -1, 1 << 24));
    PAGODA_ASSIGN_OR_RETURN(int64_t in_len, detail::get_int(j, "input_len", in_alt, ctx, -1, 1 << 24));
    PAGODA_ASSIGN_OR_RETURN(int64_t out_alt, detail::get_int(j, "output_length", -1, ctx, -1, 1 << 24));
    PAGODA_ASSIGN_OR_RETURN(int64_t out_len, detail::get_int(j, "output_len", out_alt, ctx, -1, 1 << 24));
    if (in_len < 1 || out_len < 1) return errorf("%s: needs input_len >= 1 and output_len >= 1", ctx.c_str());
    SimRequest r;
    r.output_len = static_cast<int32_t>(out_len);
    if (auto h = j.find("hash_ids"); h != j.end() && h->is_array()) {
      for (const auto& id : *h) {
        if (!id.is_number_integer() && !id.is_number_unsigned()) return errorf("%s: hash_ids must be integers", ctx.c_str());
        const int32_t room = static_cast<int32_t>(in_len) - static_cast<int32_t>(r.prompt.size());
        if (room <= 0) break;
        append_block(id.get<uint64_t>(), std::min(room, spec.trace_block_tokens), spec.vocab, &r.prompt);
      }
    }
    while (static_cast<int64_t>(r.prompt.size()) < in_len) r.prompt.push_back(random_token(rng, spec.vocab));
    PAGODA_ASSIGN_OR_RETURN(double ts, detail::get_number(j, "timestamp", -1, ctx));
    PAGODA_ASSIGN_OR_RETURN(double ts_ms, detail::get_number(j, "timestamp_ms", -1, ctx));
    if (ts < 0 && ts_ms >= 0) ts = ts_ms / 1000.0;
    (ts >= 0 ? have_times : missing_times) = true;
    r.arrival_s = ts;
    reqs.push_back(std::move(r));
  }
  if (reqs.empty()) return errorf("%s: no requests", spec.trace_path.c_str());
  if (have_times && missing_times) return errorf("%s: either every line has a timestamp or none", spec.trace_path.c_str());
  if (!have_times) assign_poisson_arrivals(&reqs, spec.request_rate, rng);
  // Traces start at their first request.
  const double t0 = std::min_element(reqs.begin(), reqs.end(), [](auto& a, auto& b) { return a.arrival_s < b.arrival_s; })->arrival_s;
  for (auto& r : reqs) r.arrival_s -= t0;
  std::stable_sort(reqs.begin(), reqs.end(), [](const SimRequest& a, const SimRequest& b) { return a.arrival_s < b.arrival_s; });
  return reqs;
}

}  // namespace

Expected<std::vector<SimRequest>> make_workload(const WorkloadSpec& spec) {
  Rng rng(spec.seed);
  if (spec.kind == WorkloadKind::kTrace) return read_trace(spec, rng);
  if (spec.num_prompts < 1) return errorf("--num-prompts must be >= 1 (got %d)", spec.num_prompts);
  if (spec.input_len < 1 || spec.output_len < 1) {
    return errorf("--input-len and --output-len must be >= 1 (got %d, %d)", spec.input_len, spec.output_len);
  }
  if (!(spec.range_ratio >= 0 && spec.range_ratio < 1)) return errorf("--range-ratio must be in [0, 1)");
  if (!(spec.request_rate > 0)) return errorf("--request-rate must be > 0 (inf: all at once)");
  std::vector<std::vector<int32_t>> prefixes;
  if (spec.kind == WorkloadKind::kSharedPrefix) {
    const int32_t plen = spec.prefix_len > 0 ? spec.prefix_len : std::max(1, spec.input_len / 2);
    if (spec.num_prefixes < 1) return errorf("--num-prefixes must be >= 1");
    for (int32_t p = 0; p < spec.num_prefixes; ++p) {
      std::vector<int32_t> pre;
      for (int32_t i = 0; i < plen; ++i) pre.push_back(random_token(rng, spec.vocab));
      prefixes.push_back(std::move(pre));
    }
  }
  std::vector<SimRequest> reqs(static_cast<size_t>(spec.num_prompts));
  for (int32_t i = 0; i < spec.num_prompts; ++i) {
    SimRequest& r = reqs[static_cast<size_t>(i)];
    const int32_t in_len = jitter(rng, spec.input_len, spec.range_ratio);
    r.output_len = jitter(rng, spec.output_len, spec.range_ratio);
    if (!prefixes.empty()) r.prompt = prefixes[static_cast<size_t>(i) % prefixes.size()];
    // Shared prefix + unique suffix (at least one unique token per request).
    if (static_cast<int32_t>(r.prompt.size()) >= in_len) r.prompt.resize(static_cast<size_t>(std::max(1, in_len - 1)));
    while (static_cast<int32_t>(r.prompt.size()) < in_len) r.prompt.push_back(random_token(rng, spec.vocab));
  }
  assign_poisson_arrivals(&reqs, spec.request_rate, rng);
  return reqs;
}

}  // namespace pagoda::sim
