// SimConfig::max_concurrency: the simulator with a client keeping at most C requests in
// flight (`pagoda sim --max-concurrency C`, as `pagoda bench --max-concurrency C`).
#include <gtest/gtest.h>

#include "sim/simulator.h"
#include "sim/calibrate.h"

namespace pagoda {
namespace {
// sim::simulate with SimConfig::max_concurrency set (0: open loop).
Expected<sim::SimResult> simulate_limited(sim::SimConfig cfg, const std::vector<sim::SimRequest>& reqs, int limit) {
  cfg.max_concurrency = limit;
  return sim::simulate(cfg, reqs);
}

sim::SimConfig smol_config() {
  sim::SimConfig cfg;
  cfg.plan.model = sim::load_model_preset("SmolLM2-135M").value();
  cfg.plan.hw = sim::load_hardware("cpu-local").value();
  cfg.plan.hw.compute_efficiency = 0.5;
  cfg.plan.hw.bandwidth_efficiency = 0.5;
  cfg.plan.hw.step_overhead_s = 0.001;
  cfg.plan.kv_dtype = kv::kv_dtype_f16();
  cfg.plan.kv_cache_memory = 256u << 20;
  cfg.max_num_seqs = 64;
  cfg.max_num_batched_tokens = 2048;
  return cfg;
}

std::vector<sim::SimRequest> random_requests(int n, int in, int out) {
  sim::WorkloadSpec ws;
  ws.num_prompts = n;
  ws.input_len = in;
  ws.output_len = out;
  ws.vocab = 49152;
  return sim::make_workload(ws).value();
}

void expect_same(const sim::SimMetrics& a, const sim::SimMetrics& b) {
  EXPECT_EQ(a.num_requests, b.num_requests);
  EXPECT_EQ(a.num_steps, b.num_steps);
  EXPECT_DOUBLE_EQ(a.duration_s, b.duration_s);
  EXPECT_DOUBLE_EQ(a.output_tokens_per_s, b.output_tokens_per_s);
  EXPECT_DOUBLE_EQ(a.ttft_p50_ms, b.ttft_p50_ms);
  EXPECT_DOUBLE_EQ(a.ttft_p99_ms, b.ttft_p99_ms);
  EXPECT_DOUBLE_EQ(a.tpot_mean_ms, b.tpot_mean_ms);
  EXPECT_DOUBLE_EQ(a.peak_kv_usage, b.peak_kv_usage);
  EXPECT_EQ(a.num_preemptions, b.num_preemptions);
  EXPECT_DOUBLE_EQ(a.prefix_hit_rate, b.prefix_hit_rate);
  EXPECT_EQ(a.num_blocks, b.num_blocks);
}

TEST(SimClientLimit, NoLimitIsTheOpenLoopSimulation) {
  const sim::SimConfig cfg = smol_config();
  const auto reqs = random_requests(40, 128, 32);
  const auto open = sim::simulate(cfg, reqs);
  ASSERT_TRUE(open.ok()) << open.message();
  for (int limit : {0, 40, 1000}) {
    SCOPED_TRACE(limit);
    const auto r = simulate_limited(cfg, reqs, limit);
    ASSERT_TRUE(r.ok()) << r.message();
    expect_same(r->metrics, open->metrics);
  }
  // A small pool preempts the same way in both.
  sim::SimConfig small = cfg;
  small.plan.kv_cache_memory = 0;
  small.plan.hw.memory_bytes = 1u << 30;
  small.max_num_blocks = 40;
  const auto reqs2 = random_requests(16, 256, 128);
  const auto open2 = sim::simulate(small, reqs2);
  ASSERT_TRUE(open2.ok()) << open2.message();
  EXPECT_GT(open2->metrics.num_preemptions, 0);
  const auto r2 = simulate_limited(small, reqs2, 16);
  ASSERT_TRUE(r2.ok()) << r2.message();
  expect_same(r2->metrics, open2->metrics);
}

TEST(SimClientLimit, OneAtATimeIsPrefillThenDecodes) {
  const sim::SimConfig cfg = smol_config();
  const auto reqs = random_requests(3, 100, 5);
  const auto r = simulate_limited(cfg, reqs, 1);
  ASSERT_TRUE(r.ok()) << r.message();
  // Each request alone: one 100-token prefill step (it samples token 1), then 4 decode steps.
  const double prefill = sim::step_cost(cfg.plan, sim::work_of(cfg.plan, {{0, 100}})).total_s;
  double decodes = 0;
  for (int k = 0; k < 4; ++k) decodes += sim::step_cost(cfg.plan, sim::work_of(cfg.plan, {{100 + k, 1}})).total_s;
  EXPECT_EQ(r->metrics.num_steps, 15);
  EXPECT_NEAR(r->metrics.duration_s, 3 * (prefill + decodes), 1e-12);
  // TTFT counts from submission, not from t = 0: the same for all three.
  EXPECT_NEAR(r->metrics.ttft_p50_ms, prefill * 1e3, 1e-9);
  EXPECT_NEAR(r->metrics.ttft_p99_ms, prefill * 1e3, 1e-9);
  EXPECT_NEAR(r->metrics.tpot_mean_ms, decodes / 4 * 1e3, 1e-9);
  for (const sim::SimTracePoint& p : r->trace) EXPECT_LE(p.running + p.waiting, 1);
}

TEST(SimClientLimit, TheLimitCapsRequestsInFlight) {
  const sim::SimConfig cfg = smol_config();
  const auto reqs = random_requests(32, 128, 64);
  const auto open = sim::simulate(cfg, reqs).value();
  const auto r = simulate_limited(cfg, reqs, 8);
  ASSERT_TRUE(r.ok()) << r.message();
  int peak = 0;
  for (const sim::SimTracePoint& p : r->trace) {
    EXPECT_LE(p.running + p.waiting, 8);
    peak = std::max(peak, p.running);
  }
  EXPECT_EQ(peak, 8);
  EXPECT_EQ(r->metrics.num_requests, 32);
  EXPECT_EQ(r->metrics.output_tokens, 32 * 64);
  // Fewer in flight: slower overall, but no request waits behind 24 others for its first token.
  EXPECT_GT(r->metrics.duration_s, open.metrics.duration_s);
  EXPECT_LT(r->metrics.ttft_p99_ms, open.metrics.ttft_p99_ms);
}

}  // namespace
}  // namespace pagoda
