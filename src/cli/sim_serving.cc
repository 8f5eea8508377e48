#include "cli/sim_serving.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kv/kv_manager.h"
#include "sched/scheduler.h"

namespace pagoda::cli {

namespace {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
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
  double submitted = 0;
  double first_token = -1;
  double last_token = -1;
  int32_t num_in = 0;
};

}  // namespace

Expected<sim::SimResult> simulate_with_client_limit(const sim::SimConfig& cfg,
                                                    const std::vector<sim::SimRequest>& requests,
                                                    int max_concurrency) {
  // Pool and limits exactly as sim::simulate builds them.
  sim::PlanInput p = cfg.plan;
  p.activation_tokens = cfg.max_num_batched_tokens;
  p.logits_rows = cfg.max_num_seqs;
  PAGODA_TRY(sim::validate_plan_input(p));
  if (!(p.hw.mem_bandwidth > 0) || !(p.hw.peak_bf16_flops > 0)) {
    return errorf("device %s has no bandwidth / FLOP/s data; pick --gpu from data/hardware.json", p.hw.name.c_str());
  }
  if (p.block_size > 256) return errorf("--block-size %d: the KV manager takes at most 256", p.block_size);
  if (cfg.max_num_seqs < 1 || cfg.max_num_batched_tokens < 1) {
    return errorf("--max-num-seqs and --max-num-batched-tokens must be >= 1");
  }
  const sim::PlanReport plan = sim::plan_capacity(p);
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
  kv::KvManager kvm(kc);
  sched::SchedulerConfig sc;
  sc.max_num_seqs = cfg.max_num_seqs;
  sc.max_num_batched_tokens = cfg.max_num_batched_tokens;
  sc.max_model_len = p.model.max_context;
  sched::Scheduler scheduler(sc, &kvm);

  const size_t limit = max_concurrency > 0 ? static_cast<size_t>(max_concurrency) : std::numeric_limits<size_t>::max();
  sim::SimResult res;
  sim::SimMetrics& mt = res.metrics;
  mt.num_blocks = blocks;
  std::vector<Track> track(requests.size());
  std::vector<double> ttft, tpot;
  const int32_t vocab = std::max(2, p.model.vocab);
  size_t next = 0, in_flight = 0;
  double t = requests.empty() ? 0.0 : requests.front().arrival_s;
  const double t0 = t;
  double last_done = t0;
  std::vector<sched::SeqOutput> outputs;
  while (next < requests.size() || scheduler.has_unfinished()) {
    for (; next < requests.size() && requests[next].arrival_s <= t && in_flight < limit; ++next) {
      const sim::SimRequest& r = requests[next];
      sched::NewRequest nr;
      nr.id = next + 1;
      nr.prompt.assign(r.prompt.begin(), r.prompt.end());
      nr.max_tokens = r.output_len;
      Status s = scheduler.add_request(std::move(nr));
      if (!s.ok()) return errorf("request %zu (%zu prompt + %d output tokens): %s", next, r.prompt.size(),
                                 r.output_len, s.message().c_str());
      track[next].submitted = t;  // the client submits when the request arrives and a slot is free
      track[next].num_in = static_cast<int32_t>(r.prompt.size());
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
    const sim::StepCost cost = sim::step_cost(p, sim::step_work(p, step));
    t += cost.total_s;
    (cost.compute_s >= cost.memory_s ? mt.busy_compute_s : mt.busy_memory_s) += cost.total_s;
    ++mt.num_steps;

    outputs.clear();
    for (const sched::ScheduledSeq& s : step.seqs) {
      if (!s.wants_logits) continue;
      Track& tr = track[static_cast<size_t>(s.request_id - 1)];
      if (tr.first_token < 0) tr.first_token = t;
      tr.last_token = t;
      const int32_t pos = s.start_pos + static_cast<int32_t>(s.token_ids.size());
      // Synthetic ids, as sim::simulate emits them (only prefix-cache equality depends on them).
      outputs.push_back({s.request_id,
                         static_cast<sched::TokenId>(1 + (s.request_id * 7919u + static_cast<uint64_t>(pos)) %
                                                             static_cast<uint64_t>(vocab - 1)),
                         false});
    }
    const int32_t usable = kvm.num_usable_blocks();
    const double usage = usable > 0 ? static_cast<double>(usable - kvm.num_free_blocks()) / usable : 0.0;
    mt.peak_kv_usage = std::max(mt.peak_kv_usage, usage);
    res.trace.push_back({t - t0, usage, scheduler.num_running(), scheduler.num_waiting()});
    for (const sched::FinishedRequest& f : scheduler.update(step, outputs)) {
      const Track& tr = track[static_cast<size_t>(f.id - 1)];
      ++mt.num_requests;
      --in_flight;
      mt.input_tokens += tr.num_in;
      mt.output_tokens += static_cast<int64_t>(f.output_tokens.size());
      ttft.push_back((tr.first_token - tr.submitted) * 1e3);
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
  mt.prefix_hit_rate = ks.prefix_query_tokens > 0
                           ? static_cast<double>(ks.prefix_hit_tokens) / static_cast<double>(ks.prefix_query_tokens)
                           : 0.0;
  return res;
}

}  // namespace pagoda::cli
