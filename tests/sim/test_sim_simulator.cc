// sim/simulator.h: the roofline step cost, workloads, and whole simulated runs
// through the real scheduler + KV manager.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "sim/simulator.h"

namespace pagoda::sim {
namespace {

PlanInput plan_for(const std::string& model, const std::string& gpu) {
  PlanInput in;
  in.model = load_model_preset(model).value();
  in.hw = load_hardware(gpu).value();
  in.kv_dtype = kv::kv_dtype_bf16();
  return in;
}

sched::StepPlan one_seq(int32_t start_pos, int32_t n) {
  sched::StepPlan p;
  sched::ScheduledSeq s;
  s.request_id = 1;
  s.start_pos = start_pos;
  s.token_ids.assign(static_cast<size_t>(n), 5);
  s.wants_logits = true;
  p.seqs.push_back(s);
  return p;
}

// Llama-3.1-8B: 8,030,261,248 parameters, two 128256 x 4096 tables (embedding, head).
constexpr double kLlama8bParams = 8030261248.0;
constexpr double kLlama8bTable = 128256.0 * 4096;
constexpr double kLlama8bBody = kLlama8bParams - 2 * kLlama8bTable;

TEST(SimCost, DecodeIsMemoryBoundAndExact) {
  const PlanInput in = plan_for("Llama-3.1-8B", "H100-80GB-SXM");
  const StepWork w = step_work(in, one_seq(1023, 1));
  EXPECT_EQ(w.num_tokens, 1);
  EXPECT_EQ(w.num_logits_rows, 1);
  EXPECT_DOUBLE_EQ(w.attended_keys, 1024);
  EXPECT_DOUBLE_EQ(w.kv_bytes_read, 1024.0 * 131072);
  EXPECT_DOUBLE_EQ(w.kv_bytes_written, 131072);
  const StepCost c = step_cost(in, w);
  // bf16 weights: the body, one embedding row, the whole head; then KV, then the logits row.
  const double weights = kLlama8bBody * 2 + 4096.0 * 2 + kLlama8bTable * 2;
  const double bytes = weights + 1024.0 * 131072 + 131072 + 128256.0 * 8;
  EXPECT_DOUBLE_EQ(c.weight_bytes, weights);
  EXPECT_DOUBLE_EQ(c.sampling_bytes, 128256.0 * 8);
  EXPECT_DOUBLE_EQ(c.bytes, bytes);
  EXPECT_DOUBLE_EQ(c.memory_s, bytes / (3.35e12 * 0.8));
  const double attn = 2.0 * 32 * (128 + 128) * 1024 * 32;  // heads x (qk + v) x keys x layers
  EXPECT_DOUBLE_EQ(c.head_flops, 2.0 * kLlama8bTable);
  EXPECT_DOUBLE_EQ(c.sampling_flops, 5.0 * 128256);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * kLlama8bBody + 2.0 * kLlama8bTable + 5.0 * 128256);
  EXPECT_DOUBLE_EQ(c.attention_flops, attn);
  EXPECT_DOUBLE_EQ(c.compute_s, c.flops / (989.4e12 * 0.6));
  // No "attention" efficiency in hardware.json: it defaults to the compute one.
  EXPECT_DOUBLE_EQ(c.attention_s, attn / (989.4e12 * 0.6));
  EXPECT_LT(c.compute_s, c.memory_s);
  EXPECT_DOUBLE_EQ(c.total_s, c.memory_s + c.attention_s + 0.002);
}

sched::ScheduledSeq slice(sched::RequestId id, int32_t start_pos, int32_t n, bool wants_logits) {
  sched::ScheduledSeq s;
  s.request_id = id;
  s.start_pos = start_pos;
  s.token_ids.assign(static_cast<size_t>(n), 5);
  s.wants_logits = wants_logits;
  return s;
}

// Issue #7: the output head runs on one row per sampling sequence, not on every
// scheduled token. A step with a 512-token prefill chunk and 8 decodes pays 9
// head rows (the chunk's last one only), or 8 when the chunk does not end its prompt.
TEST(SimCost, HeadIsChargedPerLogitsRowNotPerToken) {
  const PlanInput in = plan_for("Llama-3.1-8B", "H100-80GB-SXM");
  sched::StepPlan last_chunk, mid_chunk, chunk_only;
  last_chunk.seqs.push_back(slice(1, 0, 512, true));
  mid_chunk.seqs.push_back(slice(1, 0, 512, false));
  chunk_only.seqs.push_back(slice(1, 0, 512, false));
  for (sched::RequestId id = 2; id <= 9; ++id) {
    last_chunk.seqs.push_back(slice(id, 1023, 1, true));
    mid_chunk.seqs.push_back(slice(id, 1023, 1, true));
  }
  const StepWork wl = step_work(in, last_chunk), wm = step_work(in, mid_chunk), wc = step_work(in, chunk_only);
  EXPECT_EQ(wl.num_tokens, 520);
  EXPECT_EQ(wl.num_logits_rows, 9);
  EXPECT_EQ(wm.num_tokens, 520);
  EXPECT_EQ(wm.num_logits_rows, 8);
  EXPECT_EQ(wc.num_logits_rows, 0);
  const double attn_per_key = 2.0 * 32 * (128 + 128) * 32;
  const double attn = attn_per_key * (512.0 * 513 / 2 + 8 * 1024);
  const double kv_read = 131072.0 * (512 + 8 * 1024), kv_written = 131072.0 * 520;
  ASSERT_DOUBLE_EQ(wl.attended_keys, 512.0 * 513 / 2 + 8 * 1024);

  const StepCost l = step_cost(in, wl);
  EXPECT_DOUBLE_EQ(l.head_flops, 9 * 2.0 * kLlama8bTable);
  EXPECT_DOUBLE_EQ(l.flops, 520 * 2.0 * kLlama8bBody + 9 * 2.0 * kLlama8bTable + 9 * 5.0 * 128256);
  EXPECT_DOUBLE_EQ(l.attention_flops, attn);
  // Weights read once: body, 520 embedding rows, the head; 9 fp32 logits rows written and read.
  EXPECT_DOUBLE_EQ(l.bytes, kLlama8bBody * 2 + 520 * 4096.0 * 2 + kLlama8bTable * 2 + kv_read + kv_written +
                                9 * 128256.0 * 8);
  // Charged per token, the head alone would be 520 rows: 57.8x what the engine computes.
  EXPECT_LT(l.flops, 520 * 2.0 * (kLlama8bBody + kLlama8bTable));

  // One row fewer: exactly one head row and one row of sampling less; same weights read.
  const StepCost m = step_cost(in, wm);
  EXPECT_DOUBLE_EQ(l.flops - m.flops, 2.0 * kLlama8bTable + 5.0 * 128256);
  EXPECT_DOUBLE_EQ(l.bytes - m.bytes, 128256.0 * 8);
  EXPECT_DOUBLE_EQ(l.weight_bytes, m.weight_bytes);

  // No row at all: no head FLOPs, and the head's weights are not read.
  const StepCost c = step_cost(in, wc);
  EXPECT_DOUBLE_EQ(c.head_flops, 0);
  EXPECT_DOUBLE_EQ(c.sampling_flops, 0);
  EXPECT_DOUBLE_EQ(c.sampling_bytes, 0);
  EXPECT_DOUBLE_EQ(c.flops, 512 * 2.0 * kLlama8bBody);
  EXPECT_DOUBLE_EQ(c.attention_flops, attn_per_key * 512.0 * 513 / 2);
  EXPECT_DOUBLE_EQ(c.weight_bytes, kLlama8bBody * 2 + 512 * 4096.0 * 2);
}

// Tied embeddings (SmolLM2): the table is also the head; read whole only when a row samples.
TEST(SimCost, TiedTableIsReadWholeOnlyForLogits) {
  const PlanInput in = plan_for("SmolLM2-135M", "H100-80GB-SXM");
  const double table = 49152.0 * 576, body = static_cast<double>(in.model.params_total) - table;
  sched::StepPlan with, without;
  with.seqs.push_back(slice(1, 0, 100, true));
  without.seqs.push_back(slice(1, 0, 100, false));
  const StepCost a = step_cost(in, step_work(in, with)), b = step_cost(in, step_work(in, without));
  EXPECT_DOUBLE_EQ(a.weight_bytes, (body + table) * 2);
  EXPECT_DOUBLE_EQ(b.weight_bytes, (body + 100 * 576.0) * 2);
  EXPECT_DOUBLE_EQ(a.head_flops, 2.0 * table);
  EXPECT_DOUBLE_EQ(a.flops - b.flops, 2.0 * table + 5.0 * 49152);
}

// GGUF weights: the embedding and head tensors' own bytes (often another type than the body).
TEST(SimCost, FileWeightsUseTheTablesOwnBytes) {
  PlanInput in = plan_for("Llama-3.1-8B", "H100-80GB-SXM");
  in.weights_from_file = true;
  in.model.weights_file_bytes = 4'000'000'000;
  in.model.embed_file_bytes = 300'000'000;
  in.model.output_file_bytes = 400'000'000;
  sched::StepPlan decode, prefill;
  decode.seqs.push_back(slice(1, 99, 1, true));
  prefill.seqs.push_back(slice(1, 0, 100, false));
  const StepCost d = step_cost(in, step_work(in, decode)), p = step_cost(in, step_work(in, prefill));
  EXPECT_DOUBLE_EQ(d.weight_bytes, 3.3e9 + 300e6 / 128256 + 400e6);
  EXPECT_DOUBLE_EQ(p.weight_bytes, 3.3e9 + 100 * 300e6 / 128256);
}

// TP: the head is split over the ranks (vocab-parallel); sampling is not.
TEST(SimCost, TpSplitsTheHeadNotTheSampling) {
  PlanInput in = plan_for("Llama-3.1-8B", "H100-80GB-SXM");
  const StepWork w = step_work(in, one_seq(1023, 1));
  const StepCost one = step_cost(in, w);
  in.tp = 4;
  const StepCost four = step_cost(in, w);
  EXPECT_DOUBLE_EQ(four.head_flops * 4, one.head_flops);
  EXPECT_DOUBLE_EQ(four.sampling_flops, one.sampling_flops);
  EXPECT_DOUBLE_EQ(four.sampling_bytes, one.sampling_bytes);
  EXPECT_DOUBLE_EQ(four.weight_bytes * 4, one.weight_bytes);
}

TEST(SimCost, PrefillIsComputeBoundAndTpSplitsTheWork) {
  PlanInput in = plan_for("Llama-3.1-8B", "H100-80GB-SXM");
  const StepWork w = step_work(in, one_seq(0, 8192));
  EXPECT_DOUBLE_EQ(w.attended_keys, 8192.0 * 8193 / 2);
  const StepCost c1 = step_cost(in, w);
  EXPECT_GT(c1.compute_s, c1.memory_s);
  in.tp = 2;
  const StepCost c2 = step_cost(in, step_work(in, one_seq(0, 8192)));
  // Everything but the sampling of the one logits row is split over the ranks.
  EXPECT_DOUBLE_EQ(c2.sampling_flops, c1.sampling_flops);
  EXPECT_DOUBLE_EQ((c2.flops - c2.sampling_flops) * 2, c1.flops - c1.sampling_flops);
  EXPECT_DOUBLE_EQ(c2.attention_flops * 2, c1.attention_flops);
  EXPECT_NEAR(c2.compute_s * 2, c1.compute_s, c1.compute_s * 1e-6);
}

// TP > 1: two ring all-reduces of N x hidden bf16 activations per layer, each moving
// 2 (tp - 1) / tp of the buffer per rank, plus a fixed latency per collective.
TEST(SimCost, TensorParallelAllReducesPerLayer) {
  PlanInput in = plan_for("Llama-3.1-70B", "H100-80GB-SXM");
  const StepWork w = step_work(in, one_seq(0, 1000));
  const StepCost one = step_cost(in, w);
  EXPECT_EQ(one.comm_bytes, 0.0);
  EXPECT_EQ(one.comm_s, 0.0);
  EXPECT_DOUBLE_EQ(one.total_s, std::max(one.compute_s, one.memory_s) + one.attention_s + 0.002);
  in.tp = 4;
  const StepCost four = step_cost(in, step_work(in, one_seq(0, 1000)));
  const double bytes = 2.0 * 80 * (2.0 * 3 / 4) * 1000 * 8192 * 2;  // 80 layers, hidden 8192
  EXPECT_DOUBLE_EQ(four.comm_bytes, bytes);
  EXPECT_DOUBLE_EQ(four.comm_s, 2.0 * 80 * 1e-5 + bytes / 450e9);
  EXPECT_DOUBLE_EQ(four.total_s, std::max(four.compute_s, four.memory_s) + four.attention_s + four.comm_s + 0.002);
  // Twice the tokens: twice the bytes, the same latencies.
  const StepCost four2 = step_cost(in, step_work(in, one_seq(0, 2000)));
  EXPECT_DOUBLE_EQ(four2.comm_bytes, 2 * bytes);
  in.tp = 8;
  const StepCost eight = step_cost(in, step_work(in, one_seq(0, 1000)));
  EXPECT_DOUBLE_EQ(eight.comm_bytes, bytes / 0.75 * 0.875);
}

TEST(SimCost, SlidingWindowCapsAttendedKeys) {
  const PlanInput in = plan_for("Gemma-3-27B", "H100-80GB-SXM");
  const StepWork w = step_work(in, one_seq(4095, 1));
  EXPECT_DOUBLE_EQ(w.attended_keys, 4096);
  EXPECT_DOUBLE_EQ(w.attended_keys_local, 1024);
  const StepWork p = step_work(in, one_seq(1000, 100));  // positions 1000..1099 cross the window
  EXPECT_DOUBLE_EQ(p.attended_keys_local, (1001.0 + 1024) * 24 / 2 + 76.0 * 1024);
}

TEST(SimCost, MoeReadsOnlyTouchedExperts) {
  const PlanInput in = plan_for("Mixtral-8x7B", "H100-80GB-SXM");
  const double table = 32000.0 * 4096;  // embedding and head, one each
  const StepCost one = step_cost(in, step_work(in, one_seq(0, 1)));
  const StepCost many = step_cost(in, step_work(in, one_seq(0, 512)));
  // One token touches 2 of 8 experts: the active parameters without the
  // embedding table (one row of it), plus the head.
  EXPECT_NEAR(one.weight_bytes, (12879925248.0 - 2 * table) * 2 + 4096 * 2 + table * 2, 1e3);
  // 512 tokens touch every expert.
  EXPECT_GT(many.weight_bytes, (46702792704.0 - table) * 2 * 0.999);
  EXPECT_LT(many.weight_bytes, (46702792704.0 - table) * 2 + 512 * 4096 * 2 + 1);
}

// A random workload of `n` prompts of `in` tokens, each generating `out`.
WorkloadSpec random_workload(int32_t n, int32_t in, int32_t out, int32_t vocab = WorkloadSpec{}.vocab) {
  WorkloadSpec ws;
  ws.num_prompts = n;
  ws.input_len = in;
  ws.output_len = out;
  ws.vocab = vocab;
  return ws;
}

TEST(SimWorkload, RandomSharedPrefixAndRates) {
  WorkloadSpec ws = random_workload(10, 100, 20, 1000);
  auto a = make_workload(ws).value();
  auto b = make_workload(ws).value();
  ASSERT_EQ(a.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].prompt.size(), 100u);
    EXPECT_EQ(a[i].output_len, 20);
    EXPECT_EQ(a[i].arrival_s, 0.0);
    for (int32_t t : a[i].prompt) EXPECT_TRUE(t >= 1 && t < 1000);
  }
  EXPECT_NE(a[0].prompt, a[1].prompt);

  ws.kind = WorkloadKind::kSharedPrefix;
  ws.prefix_len = 64;
  ws.num_prefixes = 2;
  ws.request_rate = 4.0;
  auto s = make_workload(ws).value();
  EXPECT_TRUE(std::equal(s[0].prompt.begin(), s[0].prompt.begin() + 64, s[2].prompt.begin()));
  EXPECT_FALSE(std::equal(s[0].prompt.begin(), s[0].prompt.begin() + 64, s[1].prompt.begin()));
  EXPECT_NE(s[0].prompt, s[2].prompt);  // unique suffixes
  for (size_t i = 1; i < s.size(); ++i) EXPECT_GT(s[i].arrival_s, s[i - 1].arrival_s);

  ws.range_ratio = 0.5;
  const auto jittered = make_workload(ws).value();
  for (const auto& r : jittered) {
    EXPECT_GE(r.prompt.size(), 50u);
    EXPECT_LE(r.prompt.size(), 150u);
  }
  EXPECT_FALSE(parse_workload_kind("bursty").ok());
  EXPECT_EQ(parse_workload_kind("x/trace.jsonl").value(), WorkloadKind::kTrace);
}

TEST(SimWorkload, TraceWithHashIds) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("pagoda_sim_trace_" + std::to_string(::getpid()) + ".jsonl")).string();
  std::ofstream(path) << R"({"timestamp": 2.0, "input_len": 40, "output_len": 5, "hash_ids": [7, 8]})" "\n"
                      << R"({"timestamp": 1.5, "input_length": 30, "output_length": 3, "hash_ids": [7, 9]})" "\n"
                      << "\n";
  WorkloadSpec ws;
  ws.kind = WorkloadKind::kTrace;
  ws.trace_path = path;
  ws.trace_block_tokens = 16;
  auto r = make_workload(ws);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_DOUBLE_EQ((*r)[0].arrival_s, 0.0);  // sorted and shifted to start at 0
  EXPECT_DOUBLE_EQ((*r)[1].arrival_s, 0.5);
  EXPECT_EQ((*r)[0].prompt.size(), 30u);
  EXPECT_EQ((*r)[1].prompt.size(), 40u);
  EXPECT_EQ((*r)[1].output_len, 5);
  // Block 7 is the same 16 tokens in both; blocks 8 and 9 differ.
  EXPECT_TRUE(std::equal((*r)[0].prompt.begin(), (*r)[0].prompt.begin() + 16, (*r)[1].prompt.begin()));
  EXPECT_FALSE(std::equal((*r)[0].prompt.begin() + 16, (*r)[0].prompt.begin() + 30, (*r)[1].prompt.begin() + 16));
  std::ofstream(path) << R"({"input_len": 0, "output_len": 5})" "\n";
  auto bad = make_workload(ws);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find(":1:"), std::string::npos) << bad.message();
  std::remove(path.c_str());
}

SimConfig small_config() {
  SimConfig cfg;
  cfg.plan = plan_for("SmolLM2-135M", "H100-80GB-SXM");
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 512;
  return cfg;
}

TEST(SimRun, RandomWorkloadCompletesDeterministically) {
  const SimConfig cfg = small_config();
  WorkloadSpec ws = random_workload(24, 128, 32, cfg.plan.model.vocab);
  const auto reqs = make_workload(ws).value();
  auto r = simulate(cfg, reqs);
  ASSERT_TRUE(r.ok()) << r.message();
  const SimMetrics& m = r->metrics;
  EXPECT_EQ(m.num_requests, 24);
  EXPECT_EQ(m.input_tokens, 24 * 128);
  EXPECT_EQ(m.output_tokens, 24 * 32);
  EXPECT_EQ(m.num_preemptions, 0);
  EXPECT_EQ(m.prefix_hit_rate, 0.0);
  EXPECT_GT(m.ttft_p50_ms, 0.0);
  EXPECT_GE(m.ttft_p99_ms, m.ttft_p50_ms);
  EXPECT_GT(m.tpot_p50_ms, 2.0);  // at least the 2 ms step overhead per token
  EXPECT_DOUBLE_EQ(m.duration_s, r->trace.back().t_s);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, m.output_tokens / m.duration_s);
  EXPECT_GT(m.peak_kv_usage, 0.0);
  EXPECT_EQ(static_cast<int64_t>(r->trace.size()), m.num_steps);
  // 24 requests, at most 16 running: the first 16 get their first token before the last 8.
  auto again = simulate(cfg, reqs);
  EXPECT_EQ(again->metrics.duration_s, m.duration_s);
  EXPECT_EQ(again->metrics.ttft_p99_ms, m.ttft_p99_ms);
  EXPECT_EQ(again->metrics.num_steps, m.num_steps);
  // A faster device finishes sooner.
  SimConfig fast = cfg;
  fast.plan.hw = load_hardware("B200").value();
  EXPECT_LT(simulate(fast, reqs)->metrics.duration_s, m.duration_s);
}

TEST(SimRun, SharedPrefixHitsTheCacheOnlyWhenEnabled) {
  SimConfig cfg = small_config();
  cfg.plan.hw = load_hardware("cpu-local").value();  // prefill is compute-bound here: hits save time
  WorkloadSpec ws;
  ws.kind = WorkloadKind::kSharedPrefix;
  ws.num_prompts = 20;
  ws.input_len = 320;
  ws.prefix_len = 256;
  ws.output_len = 8;
  ws.request_rate = 50;  // spaced arrivals: later requests find the prefix committed
  ws.vocab = cfg.plan.model.vocab;
  const auto reqs = make_workload(ws).value();
  auto on = simulate(cfg, reqs);
  ASSERT_TRUE(on.ok()) << on.message();
  EXPECT_GT(on->metrics.prefix_hit_rate, 0.5);  // up to 256 of 320 tokens from the 2nd request on
  EXPECT_LE(on->metrics.prefix_hit_rate, 256.0 / 320.0);
  cfg.enable_prefix_caching = false;
  auto off = simulate(cfg, reqs);
  ASSERT_TRUE(off.ok()) << off.message();
  EXPECT_EQ(off->metrics.prefix_hit_rate, 0.0);
  EXPECT_EQ(off->metrics.prefix_lookup_hit_rate, 0.0);
  EXPECT_GT(off->metrics.ttft_mean_ms, on->metrics.ttft_mean_ms);
  EXPECT_GE(on->metrics.duration_s, reqs.back().arrival_s - reqs.front().arrival_s);
}

TEST(SimRun, SmallPoolPreemptsButFinishesEverything) {
  SimConfig cfg = small_config();
  // 48 blocks of 16 tokens (incl. the null block) for 8 requests that grow to 160 tokens (10 blocks) each.
  cfg.plan.kv_cache_memory = 48 * kv::kv_bytes_per_block(cfg.plan.model.kv_shape(), cfg.plan.kv_dtype, 16);
  WorkloadSpec ws = random_workload(8, 32, 128, cfg.plan.model.vocab);
  auto r = simulate(cfg, make_workload(ws).value());
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->metrics.num_blocks, 48);
  EXPECT_GT(r->metrics.num_preemptions, 0);
  EXPECT_EQ(r->metrics.num_requests, 8);
  EXPECT_EQ(r->metrics.output_tokens, 8 * 128);
  EXPECT_GT(r->metrics.peak_kv_usage, 0.9);
  // Random prompts share nothing: no request finds cached tokens at its first
  // admission (what `pagoda bench` reports), but readmitted requests find
  // their own freed blocks, which the KV manager's per-lookup ratio counts.
  EXPECT_EQ(r->metrics.prefix_hit_rate, 0.0);
  EXPECT_GT(r->metrics.prefix_lookup_hit_rate, 0.0);
  EXPECT_LE(r->metrics.prefix_lookup_hit_rate, 1.0);
}

TEST(SimRun, RejectsWhatCannotRun) {
  SimConfig cfg = small_config();
  WorkloadSpec ws = random_workload(1, 9000, 1);  // beyond SmolLM2's 8192 context
  auto r = simulate(cfg, make_workload(ws).value());
  ASSERT_FALSE(r.ok());
  ws.input_len = 10;
  ASSERT_TRUE(simulate(cfg, make_workload(ws).value()).ok());
  SimConfig tp2 = cfg;
  tp2.plan.hw.interconnect_bandwidth = 0;  // e.g. cpu-local: no interconnect data
  tp2.plan.tp = 2;
  auto t = simulate(tp2, make_workload(ws).value());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("interconnect"), std::string::npos) << t.message();
  cfg.plan.hw = generic_device(80ull << 30);  // no bandwidth data
  EXPECT_FALSE(simulate(cfg, make_workload(ws).value()).ok());
}

TEST(SimRun, MetricsBlockAndPlot) {
  const SimConfig cfg = small_config();
  WorkloadSpec ws = random_workload(4, 64, 4);
  auto r = simulate(cfg, make_workload(ws).value());
  ASSERT_TRUE(r.ok());
  const std::string text = format_metrics(r->metrics);
  EXPECT_NE(text.find("Successful requests:                     4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Total generated tokens:                  16\n"), std::string::npos) << text;
  EXPECT_NE(metrics_to_json(r->metrics).find("\"total_output_tokens\": 16"), std::string::npos);
  const std::string svg = sim_plot_svg(cfg, *r);
  EXPECT_NE(svg.find("KV cache usage (%)"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::sim
