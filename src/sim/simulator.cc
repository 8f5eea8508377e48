#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "kv/kv_manager.h"
#include "sched/scheduler.h"
#include "sim/svg_plot.h"

namespace pagoda::sim {

namespace {

// sum over x in [a, b] of min(x, w); 0 when a > b.
double sum_min(int64_t a, int64_t b, int64_t w) {
  if (a > b) return 0;
  auto tri = [](int64_t lo, int64_t hi) { return static_cast<double>(lo + hi) * static_cast<double>(hi - lo + 1) / 2.0; };
  if (b <= w) return tri(a, b);
  if (a > w) return static_cast<double>(b - a + 1) * static_cast<double>(w);
  return tri(a, w) + static_cast<double>(b - w) * static_cast<double>(w);
}

}  // namespace

StepWork step_work(const PlanInput& p, const sched::StepPlan& plan) {
  const kv::KvShape rank = kv::shard_for_tp(p.model.kv_shape(), p.tp);
  const double written_per_token = static_cast<double>(kv::kv_bytes_per_token(rank, p.kv_dtype));
  const double state_bytes = static_cast<double>(rank_state(p).bytes());  // one rank's share
  StepWork w;
  for (const sched::ScheduledSeq& s : plan.seqs) {
    const int64_t n = static_cast<int64_t>(s.token_ids.size());
    if (n == 0) continue;
    const int64_t end = s.start_pos + n;
    w.num_tokens += n;
    if (s.wants_logits) ++w.num_logits_rows;
    // New token at position i attends to keys 0..i: i + 1 keys.
    w.attended_keys += sum_min(s.start_pos + 1, end, std::numeric_limits<int64_t>::max());
    w.attended_keys_local += sum_min(s.start_pos + 1, end, rank.sliding_window > 0 ? rank.sliding_window : end);
    w.kv_bytes_read += static_cast<double>(kv::kv_bytes_for_sequence(rank, p.kv_dtype, end));
    w.kv_bytes_written += written_per_token * static_cast<double>(n);
    // A hybrid model's recurrent state: read and written once per step.
    w.kv_bytes_read += state_bytes;
    w.kv_bytes_written += state_bytes;
  }
  return w;
}

StepCost step_cost(const PlanInput& p, const StepWork& w) {
  const ModelDesc& m = p.model;
  const HardwareDesc& hw = p.hw;
  const double tp = p.tp;
  const double N = static_cast<double>(w.num_tokens);
  const double R = static_cast<double>(w.num_logits_rows);
  const double V = m.vocab;
  // Attention: QK^T and PV, 2 FLOPs per multiply-add.
  const bool mla = m.attention == kv::AttentionKind::kMLA;
  const double qk_dim = mla ? m.kv_lora_rank + m.qk_rope_head_dim : m.head_dim;
  const double v_dim = mla ? m.kv_lora_rank : (m.v_head_dim > 0 ? m.v_head_dim : m.head_dim);
  const kv::KvShape shape = m.kv_shape();
  const double attn_flops = 2.0 * m.num_heads * (qk_dim + v_dim) *
                            (w.attended_keys * shape.num_global_layers() + w.attended_keys_local * shape.num_local_layers());
  // The embedding table(s) are in the parameter counts: one when tied (it is also the head), else two.
  const double head_params = static_cast<double>(m.head_params());
  const double tables = m.tied_embeddings ? 1.0 : 2.0;
  const double body_active = std::max(0.0, static_cast<double>(m.params_active) - tables * head_params);
  const double body_total = std::max(0.0, static_cast<double>(m.params_total) - tables * head_params);
  StepCost c;
  c.head_flops = 2.0 * head_params * R / tp;
  c.sampling_flops = kSamplingFlopsPerLogit * V * R;
  c.flops = 2.0 * body_active * N / tp + c.head_flops + c.sampling_flops;
  c.attention_flops = attn_flops / tp;

  // Weights: bytes of the embedding table and the head (from the file when known, else at
  // the average bytes per parameter) and of the body.
  const double all_bytes = p.weights_from_file ? static_cast<double>(m.weights_file_bytes)
                                               : static_cast<double>(m.params_total) * p.weights.bytes_per_param;
  const double per_param = m.params_total > 0 ? all_bytes / static_cast<double>(m.params_total) : 0.0;
  const bool file_split = p.weights_from_file && m.embed_file_bytes > 0;
  const double embed_bytes = file_split ? static_cast<double>(m.embed_file_bytes) : head_params * per_param;
  const double head_bytes = m.tied_embeddings ? embed_bytes
                            : file_split && m.output_file_bytes > 0 ? static_cast<double>(m.output_file_bytes)
                                                                    : head_params * per_param;
  const double body_bytes = std::max(0.0, all_bytes - embed_bytes - (m.tied_embeddings ? 0.0 : head_bytes));
  // The body's share read this step: the dense part + the experts the tokens touch.
  double body_frac = 1.0;
  if (m.is_moe() && m.num_experts > m.experts_per_token && N > 0 && body_total > 0) {
    const double E = m.num_experts, k = m.experts_per_token;
    const double expert_params = static_cast<double>(m.params_total - m.params_active) * E / (E - k);
    const double touched = 1.0 - std::pow(1.0 - k / E, N);
    body_frac = std::max(0.0, (body_total - expert_params * (1.0 - touched)) / body_total);
  }
  // Looked-up embedding rows; a tied table the head reads whole holds them already.
  const double rows_bytes = V > 0 ? std::min(N, V) * embed_bytes / V : 0.0;
  const double table_bytes = R > 0 ? (m.tied_embeddings ? head_bytes : rows_bytes + head_bytes) : rows_bytes;
  c.weight_bytes = N > 0 ? (body_bytes * body_frac + table_bytes) / tp : 0.0;
  c.sampling_bytes = kSamplingBytesPerLogit * V * R;
  c.bytes = c.weight_bytes + w.kv_bytes_read + w.kv_bytes_written + c.sampling_bytes;

  const bool fp8_math = !p.weights_from_file && p.weights.bytes_per_param <= 1.0 && hw.peak_fp8_flops > 0;
  const double peak = fp8_math ? hw.peak_fp8_flops : hw.peak_bf16_flops;
  c.compute_s = peak > 0 ? c.flops / (peak * hw.compute_efficiency) : 0.0;
  c.memory_s = hw.mem_bandwidth > 0 ? c.bytes / (hw.mem_bandwidth * hw.bandwidth_efficiency) : 0.0;
  c.attention_s = hw.peak_bf16_flops > 0 ? c.attention_flops / (hw.peak_bf16_flops * hw.attention_efficiency) : 0.0;
  if (p.tp > 1 && N > 0 && hw.interconnect_bandwidth > 0) {
    const double collectives = 2.0 * m.num_layers;
    c.comm_bytes = collectives * 2.0 * (tp - 1.0) / tp * N * m.hidden * 2.0;
    c.comm_s = collectives * hw.interconnect_latency_s + c.comm_bytes / hw.interconnect_bandwidth;
  }
  c.total_s = std::max(c.compute_s, c.memory_s) + c.attention_s + c.comm_s + hw.step_overhead_s;
  return c;
}

namespace {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Linear interpolation between closest ranks (numpy's default).
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

struct Track {
  double arrival = 0;
  double first_token = -1;
  double last_token = -1;
  int32_t num_out = 0;
  int32_t num_in = 0;
};

}  // namespace

Expected<SimResult> simulate(const SimConfig& cfg, const std::vector<SimRequest>& requests) {
  // The activation reserve follows the scheduler's limits.
  PlanInput p = cfg.plan;
  p.activation_tokens = cfg.max_num_batched_tokens;
  p.logits_rows = cfg.max_num_seqs;
  PAGODA_TRY(validate_plan_input(p));
  if (!(p.hw.mem_bandwidth > 0) || !(p.hw.peak_bf16_flops > 0)) {
    return errorf("device %s has no bandwidth / FLOP/s data; pick --gpu from data/hardware.json", p.hw.name.c_str());
  }
  if (p.tp > 1 && !(p.hw.interconnect_bandwidth > 0)) {
    return errorf("device %s has no interconnect data (interconnect_bandwidth): --tp %d cannot be simulated on it",
                  p.hw.name.c_str(), p.tp);
  }
  if (p.block_size > 256) return errorf("--block-size %d: the KV manager takes at most 256", p.block_size);
  if (cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1) {
    return errorf("--max-num-seqs and --max-num-batched-tokens must be >= 1");
  }
  const PlanReport plan = plan_capacity(p);
  const int64_t blocks = std::min<int64_t>(plan.num_blocks, cfg.max_num_blocks);
  if (blocks < 2) {
    return errorf("no room for a KV pool: budget %lld bytes per GPU holds %lld blocks of %llu bytes",
                  static_cast<long long>(plan.kv_budget_bytes), static_cast<long long>(plan.num_blocks),
                  static_cast<unsigned long long>(plan.kv_bytes_per_block));
  }
  kv::KvConfig kc;
  kc.num_blocks = static_cast<int32_t>(blocks);
  kc.block_size = p.block_size;
  kc.watermark = p.watermark;
  kc.enable_prefix_caching = cfg.enable_prefix_caching;
  // The groups as the engine's KvManager has them (KvConfig::from_plan: the state group's blocks too).
  kv::PoolPlan pool;
  pool.layout = plan.kv_groups;
  pool.block_size = p.block_size;
  kc.groups = kv::KvConfig::from_plan(pool).groups;
  kc.state_checkpoint_interval = cfg.state_checkpoint_interval;
  kv::KvManager kvm(kc);
  sched::SchedulerConfig sc;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  sc.max_model_len = p.model.max_context;
  sc.vocab_size = std::max(2, p.model.vocab);  // the workload draws ids from [1, vocab)
  sc.policy = cfg.schedule_lpm ? sched::SchedulePolicy::kLpm : sched::SchedulePolicy::kFcfs;
  sched::Scheduler scheduler(sc, &kvm);

  SimResult res;
  SimMetrics& mt = res.metrics;
  mt.num_blocks = blocks;
  std::vector<Track> track(requests.size());
  std::vector<double> ttft, tpot;
  int64_t first_admit_cached = 0;  // over completed requests, for prefix_hit_rate
  const int32_t vocab = sc.vocab_size;
  const size_t limit = cfg.max_concurrency > 0 ? static_cast<size_t>(cfg.max_concurrency)
                                               : std::numeric_limits<size_t>::max();
  size_t next = 0, in_flight = 0;
  double t = requests.empty() ? 0.0 : requests.front().arrival_s;
  const double t0 = t;
  double last_done = t0;
  std::vector<sched::SeqOutput> outputs;
  int64_t trace_out = 0, trace_prompt = 0;  // cumulative, for the trace
  while (next < requests.size() || scheduler.has_unfinished()) {
    for (; next < requests.size() && requests[next].arrival_s <= t && in_flight < limit; ++next) {
      const SimRequest& r = requests[next];
      sched::NewRequest nr;
      nr.id = next + 1;
      nr.prompt.assign(r.prompt.begin(), r.prompt.end());
      nr.max_tokens = r.output_len;
      Status s = scheduler.add_request(std::move(nr));
      if (!s.ok()) return errorf("request %zu (%zu prompt + %d output tokens): %s", next, r.prompt.size(),
                                 r.output_len, s.message().c_str());
      // Open loop: TTFT from arrival; with a client limit, from submission (a slot was free).
      track[next].arrival = cfg.max_concurrency > 0 ? t : r.arrival_s;
      track[next].num_in = static_cast<int32_t>(r.prompt.size());
      trace_prompt += static_cast<int64_t>(r.prompt.size());
      ++in_flight;
    }
    if (!scheduler.has_unfinished()) {
      t = requests[next].arrival_s;  // idle until the next arrival
      continue;
    }
    const sched::StepPlan step = scheduler.schedule();
    if (step.seqs.empty()) {
      if (next < requests.size() && in_flight < limit) {
        t = std::max(t, requests[next].arrival_s);
        continue;
      }
      return errorf("the scheduler made no progress at t = %.3f s with %d waiting and %d running requests", t,
                    scheduler.num_waiting(), scheduler.num_running());
    }
    const StepCost cost = step_cost(p, step_work(p, step));
    t += cost.total_s;
    (cost.compute_s + cost.attention_s >= cost.memory_s ? mt.busy_compute_s : mt.busy_memory_s) += cost.total_s;
    ++mt.num_steps;

    outputs.clear();
    for (const sched::ScheduledSeq& s : step.seqs) {
      if (!s.wants_logits) continue;
      const size_t idx = static_cast<size_t>(s.request_id - 1);
      Track& tr = track[idx];
      if (tr.first_token < 0) tr.first_token = t;
      tr.last_token = t;
      ++tr.num_out;
      const int32_t pos = s.start_pos + static_cast<int32_t>(s.token_ids.size());
      // The simulated outputs have no stop token: each ends at its output length
      // (the caller decides a finish, as the engine's engine/finish.h does).
      const FinishReason finish = tr.num_out >= requests[idx].output_len ? FinishReason::kLength : FinishReason::kNone;
      const auto token = static_cast<sched::TokenId>(
          1 + (s.request_id * 7919u + static_cast<uint64_t>(pos)) % static_cast<uint64_t>(vocab - 1));
      outputs.push_back({s.request_id, token, finish});
    }
    const int32_t usable = kvm.num_usable_blocks();
    const double usage = usable > 0 ? static_cast<double>(usable - kvm.num_free_blocks()) / usable : 0.0;
    mt.peak_kv_usage = std::max(mt.peak_kv_usage, usage);
    mt.peak_running = std::max<int64_t>(mt.peak_running, scheduler.num_running());
    trace_out += static_cast<int64_t>(outputs.size());
    res.trace.push_back({t - t0, usage, scheduler.num_running(), scheduler.num_waiting(), kvm.prefix_query_tokens(),
                         kvm.prefix_hit_tokens(), scheduler.stats().num_preemptions, trace_out, trace_prompt});
    const std::vector<sched::FinishedRequest> finished = scheduler.update(step, outputs);
    // Hybrid models' state checkpoints taken this step: released as the engine does
    // right after its update (there is no state to copy here).
    kvm.flush_checkpoints([](kv::BlockId, kv::BlockId) {});
    for (const sched::FinishedRequest& f : finished) {
      const Track& tr = track[static_cast<size_t>(f.id - 1)];
      ++mt.num_requests;
      --in_flight;
      mt.input_tokens += tr.num_in;
      first_admit_cached += f.num_cached_tokens;
      mt.output_tokens += static_cast<int64_t>(f.output_tokens.size());
      ttft.push_back((tr.first_token - tr.arrival) * 1e3);
      if (f.output_tokens.size() > 1) {
        tpot.push_back((tr.last_token - tr.first_token) * 1e3 / static_cast<double>(f.output_tokens.size() - 1));
      }
      last_done = t;
    }
  }
  mt.duration_s = last_done - t0;
  if (mt.duration_s > 0) {
    mt.requests_per_s = static_cast<double>(mt.num_requests) / mt.duration_s;
    mt.output_tokens_per_s = static_cast<double>(mt.output_tokens) / mt.duration_s;
    mt.total_tokens_per_s = static_cast<double>(mt.input_tokens + mt.output_tokens) / mt.duration_s;
  }
  mt.ttft_p50_ms = percentile(ttft, 0.5);
  mt.ttft_p99_ms = percentile(ttft, 0.99);
  mt.ttft_mean_ms = mean(ttft);
  mt.tpot_p50_ms = percentile(tpot, 0.5);
  mt.tpot_p99_ms = percentile(tpot, 0.99);
  mt.tpot_mean_ms = mean(tpot);
  mt.num_preemptions = scheduler.stats().num_preemptions;
  const kv::KvStats ks = kvm.stats();
  mt.prefix_lookup_hit_rate =
      ks.prefix_query_tokens > 0
          ? static_cast<double>(ks.prefix_hit_tokens) / static_cast<double>(ks.prefix_query_tokens)
          : 0.0;
  mt.prefix_hit_rate =
      mt.input_tokens > 0 ? static_cast<double>(first_admit_cached) / static_cast<double>(mt.input_tokens) : 0.0;
  return res;
}

std::string format_metrics(const SimMetrics& m) {
  char b[2048];
  std::snprintf(b, sizeof b,
                "============ Serving Benchmark Result ============\n"
                "Successful requests:                     %lld\n"
                "Benchmark duration (s):                  %.2f\n"
                "Total input tokens:                      %lld\n"
                "Total generated tokens:                  %lld\n"
                "Request throughput (req/s):              %.2f\n"
                "Output token throughput (tok/s):         %.2f\n"
                "Total token throughput (tok/s):          %.2f\n"
                "---------------Time to First Token----------------\n"
                "Mean TTFT (ms):                          %.2f\n"
                "Median TTFT (ms):                        %.2f\n"
                "P99 TTFT (ms):                           %.2f\n"
                "-----Time per Output Token (excl. 1st token)------\n"
                "Mean TPOT (ms):                          %.2f\n"
                "Median TPOT (ms):                        %.2f\n"
                "P99 TPOT (ms):                           %.2f\n"
                "--------------------KV cache----------------------\n"
                "Peak KV cache usage (%%):                 %.1f\n"
                "Preemptions:                             %lld\n"
                "Prefix cache hit rate (%%):               %.1f\n"
                "  incl. readmissions, per lookup (%%):    %.1f\n"
                "==================================================\n",
                static_cast<long long>(m.num_requests), m.duration_s, static_cast<long long>(m.input_tokens),
                static_cast<long long>(m.output_tokens), m.requests_per_s, m.output_tokens_per_s, m.total_tokens_per_s,
                m.ttft_mean_ms, m.ttft_p50_ms, m.ttft_p99_ms, m.tpot_mean_ms, m.tpot_p50_ms, m.tpot_p99_ms,
                m.peak_kv_usage * 100, static_cast<long long>(m.num_preemptions), m.prefix_hit_rate * 100,
                m.prefix_lookup_hit_rate * 100);
  return b;
}

std::string metrics_to_json(const SimMetrics& m) {
  nlohmann::json j = {
      {"completed", m.num_requests}, {"num_steps", m.num_steps}, {"duration_s", m.duration_s},
      {"request_throughput", m.requests_per_s}, {"total_input_tokens", m.input_tokens},
      {"total_output_tokens", m.output_tokens}, {"output_throughput", m.output_tokens_per_s},
      {"total_token_throughput", m.total_tokens_per_s}, {"mean_ttft_ms", m.ttft_mean_ms},
      {"median_ttft_ms", m.ttft_p50_ms}, {"p99_ttft_ms", m.ttft_p99_ms}, {"mean_tpot_ms", m.tpot_mean_ms},
      {"median_tpot_ms", m.tpot_p50_ms}, {"p99_tpot_ms", m.tpot_p99_ms}, {"peak_kv_usage", m.peak_kv_usage},
      {"num_preemptions", m.num_preemptions}, {"prefix_cache_hit_rate", m.prefix_hit_rate},
      {"prefix_lookup_hit_rate", m.prefix_lookup_hit_rate},
      {"num_kv_blocks", m.num_blocks}, {"peak_running", m.peak_running}, {"compute_bound_s", m.busy_compute_s}, {"memory_bound_s", m.busy_memory_s}};
  return j.dump(2);
}

std::string sim_plot_svg(const SimConfig& cfg, const SimResult& r) {
  LinePlot p;
  p.title = cfg.plan.model.name + " on " + cfg.plan.hw.name + " x tp " + std::to_string(cfg.plan.tp) + ": simulated run";
  p.x_label = "time (s)";
  p.y_label = "percent (running: of --max-num-seqs)";
  p.x_min = 0;
  p.x_max = r.trace.empty() ? 1.0 : std::max(1e-3, r.trace.back().t_s);
  p.y_min = 0;
  p.y_max = 105;
  p.width = 900;
  PlotSeries kv_s, run_s;
  kv_s.label = "KV cache usage (%)";
  run_s.label = "running requests (%)";
  // At most ~2000 points per line: keep every k-th step.
  const size_t k = std::max<size_t>(1, r.trace.size() / 2000);
  for (size_t i = 0; i < r.trace.size(); i += k) {
    kv_s.points.push_back({r.trace[i].t_s, r.trace[i].kv_usage * 100});
    run_s.points.push_back({r.trace[i].t_s, 100.0 * r.trace[i].running / cfg.max_num_seqs});
  }
  p.series = {kv_s, run_s};
  p.hlines.push_back({"100%", 100});
  return render_svg(p);
}

}  // namespace pagoda::sim
