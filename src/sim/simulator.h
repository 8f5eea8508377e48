// `pagoda sim`: the real sched::Scheduler and kv::KvManager driven step by step
// by a roofline cost model instead of a model, on hardware that is not here.
//
// Cost of one engine step on one TP rank (tp ranks work in parallel). N = new
// tokens computed (prefill chunks + decodes), R = logits rows (sequences that
// sample this step: the engine runs the output head on the last token of each
// such sequence only, so a prefill chunk that does not reach the end of the
// prompt costs no head at all), V = vocab, h = hidden:
//   compute = dense FLOPs / (peak x compute_efficiency)
//     dense FLOPs = (2 x body_params x N + 2 x V x h x R) / tp + sampling FLOPs
//             body_params = active params without the embedding table(s): the
//             lookup is no matmul and the head is charged per row
//             sampling FLOPs = kSamplingFlopsPerLogit x V x R (a few linear passes over each row)
//   attention = attention FLOPs / tp / (bf16 peak x attention_efficiency)
//     attention FLOPs = 2 x heads x (qk_dim + v_dim) x (keys each new token attends to), per layer
//             (sliding-window layers attend to at most the window)
//   memory  = bytes / (bandwidth x bandwidth_efficiency)
//     bytes = weights read / tp + KV read + KV written + sampling bytes
//             (a hybrid model's recurrent state: read and written once per scheduled sequence)
//             weights read = body weights (MoE: E x (1 - (1 - k/E)^N) of E experts touched)
//                          + the N embedding rows looked up
//                          + the head's V x h weights when R > 0 (tied: the same table, counted once)
//             sampling bytes = R x V x 4 x 2 (fp32 logits written by the head, read back by the sampler)
//   tp comm = 2 x layers x (interconnect_latency + 2 (tp - 1) / tp x N x h x 2 bytes / interconnect_bandwidth)
//             when tp > 1: two ring all-reduces of the bf16 activations per layer (after the
//             attention output projection and after the MLP down projection), not overlapped
//   step    = max(compute, memory) + attention + tp comm + step_overhead_s
// Attention runs as its own kernels between the linear layers, so its math is added, not
// overlapped; its KV reads stay in `memory`, which on a GPU's decode is what dominates it.
// On a CPU attention (f16 -> f32 conversion, exp, short dot products) reaches a much lower
// fraction of peak than the int8/VNNI matmuls: `pagoda sim --calibrate` fits it separately.
// peak = fp8 peak when the weights are fp8/int8 and the device has one, else bf16.
// Sampling is not split over TP ranks (every rank, or the driver, sees whole rows).
// Not modelled: the logits all-gather of a vocab-parallel head, overlap of communication
// with compute, achieved vs datasheet link bandwidth (the catalog's figure is used as is),
// the O(V log V) sorts of top-k / top-p and
// the penalties (the sampling charge is greedy/softmax-like linear passes), host <-> device
// copies and syncs, kernel-launch variation, CPU stalls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "sched/step_plan.h"
#include "sim/planner.h"
#include "sim/workload.h"

namespace pagoda::sim {

struct SimConfig {
  PlanInput plan;                      // model, device, tp, dtypes, utilization, block size, watermark
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  bool enable_prefix_caching = true;
  bool schedule_lpm = false;           // admission: longest cached prefix first (else arrival order)
  // Hybrid models: a copy of the recurrent state every this many blocks, as the
  // engine's --state-checkpoint-interval (kv::KvConfig; 0: none, and no prefix caching).
  int32_t state_checkpoint_interval = 4;
  int32_t max_num_blocks = 1 << 22;    // cap on the simulated pool (bookkeeping memory)
  // Client-side limit, as `pagoda bench --max-concurrency C`: at most C requests in
  // flight; the next is submitted when one finishes and its TTFT counts from that
  // submission. 0: open loop (TTFT from arrival).
  int32_t max_concurrency = 0;
};

// FLOPs per logit of sampling one row (max, exp, sum, scale, draw: linear passes).
inline constexpr double kSamplingFlopsPerLogit = 5.0;
// Bytes per logit of sampling one row: fp32 written by the head, read by the sampler.
inline constexpr double kSamplingBytesPerLogit = 8.0;

struct StepCost {
  double flops = 0;           // per rank, dense: head and sampling included, attention not
  double bytes = 0;           // per rank, all of the below included
  double head_flops = 0;      // output head: 2 x vocab x hidden per logits row, / tp
  double sampling_flops = 0;  // kSamplingFlopsPerLogit x vocab per logits row
  double weight_bytes = 0;    // weights read, per rank
  double sampling_bytes = 0;  // kSamplingBytesPerLogit x vocab per logits row
  double attention_flops = 0; // per rank, not in `flops`
  double compute_s = 0;       // dense math
  double memory_s = 0;
  double attention_s = 0;     // attention math
  double comm_bytes = 0;      // per rank, sent over the interconnect (tp > 1)
  double comm_s = 0;          // tensor-parallel all-reduces
  double total_s = 0;         // max(compute, memory) + attention + comm + overhead
};

// The work of one step, as the cost model needs it.
struct StepWork {
  int64_t num_tokens = 0;          // new tokens computed (prefill chunks + decodes)
  int64_t num_logits_rows = 0;     // sequences that sample this step (wants_logits)
  double attended_keys = 0;        // sum over new tokens of keys attended, global layers
  double attended_keys_local = 0;  // same, capped at the window, local layers
  double kv_bytes_read = 0;        // per rank
  double kv_bytes_written = 0;     // per rank
};

// Cost of a step from its work (exposed for tests).
StepCost step_cost(const PlanInput& p, const StepWork& w);
// The work of a StepPlan (seq lengths come from start_pos and token counts).
StepWork step_work(const PlanInput& p, const sched::StepPlan& plan);

struct SimMetrics {
  int64_t num_requests = 0;        // completed
  int64_t num_steps = 0;
  double duration_s = 0;           // first arrival to last completion
  double requests_per_s = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;   // (input + output) / duration
  double ttft_p50_ms = 0, ttft_p99_ms = 0, ttft_mean_ms = 0;
  double tpot_p50_ms = 0, tpot_p99_ms = 0, tpot_mean_ms = 0;  // per output token after the first
  double peak_kv_usage = 0;        // max over steps of used blocks / usable blocks
  int64_t peak_running = 0;        // max over steps of the requests the scheduler runs at once
  int64_t num_preemptions = 0;
  // Prompt tokens served from the prefix cache at each request's first
  // admission / prompt tokens, over completed requests: what `pagoda bench`
  // reports (OpenAI usage.prompt_tokens_details.cached_tokens).
  double prefix_hit_rate = 0;
  // The KV manager's own ratio, hit tokens / looked-up tokens over every
  // lookup, readmissions after preemption included (vLLM's prefix cache hit
  // rate): higher than prefix_hit_rate when preempted requests find their own
  // freed blocks still cached.
  double prefix_lookup_hit_rate = 0;
  int64_t num_blocks = 0;          // simulated pool (incl. the null block)
  double busy_compute_s = 0;       // time of compute-bound steps
  double busy_memory_s = 0;        // time of memory-bound steps
};

struct SimTracePoint {
  double t_s = 0;
  double kv_usage = 0;    // used / usable blocks
  int32_t running = 0;
  int32_t waiting = 0;
  // Cumulative counters for `pagoda sim --report` (the dashboard's series).
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t output_tokens = 0, prompt_tokens = 0;
};

struct SimResult {
  SimMetrics metrics;
  std::vector<SimTracePoint> trace;  // one point per step
};

// Runs the workload to completion. Errors: no KV budget, a request the pool can never hold.
Expected<SimResult> simulate(const SimConfig& config, const std::vector<SimRequest>& requests);

// The metrics block (`pagoda bench` prints the same one), text and JSON.
std::string format_metrics(const SimMetrics& m);
std::string metrics_to_json(const SimMetrics& m);
// SVG: KV usage and running requests over time.
std::string sim_plot_svg(const SimConfig& config, const SimResult& r);

}  // namespace pagoda::sim
