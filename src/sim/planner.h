// Capacity planner: how much of a device the KV cache gets after weights and
// runtime overhead, and what that budget holds (tokens, concurrent requests at
// a context length, context length at a concurrency, the smallest TP degree).
//
// Memory model per device (tensor parallel degree tp):
//   usable      = utilization x memory_bytes
//   weights     = params_total x bytes_per_param / tp      (every weight sharded, embeddings included)
//   reserve     = runtime_overhead_bytes (hardware.json)
//               + activations of one prefill chunk of `activation_tokens` tokens:
//                 tokens x (4 x hidden + 2 x mlp_width / tp) x 2 bytes (bf16 residual, norm,
//                 attention output and the gated-MLP intermediate of the chunk)
//               + logits of `logits_rows` sequences: rows x vocab / tp x 4 bytes (fp32)
//   kv budget   = usable - weights - reserve                (negative: does not fit)
// KV per token per device: kv::shard_for_tp (heads split, at least one per rank; MLA replicated).
// Per request at context L: kv::kv_bytes_for_sequence (sliding-window layers keep the window only)
// + the recurrent state of a hybrid model (ModelDesc::state_bytes, whatever L).
// Hybrid models (lfm2, qwen35): only the attention layers hold K/V per token;
// each sequence also holds its fixed-size recurrent state in blocks of the same
// pool. The pool (blocks, block bytes, state blocks per sequence, the longest
// sequence) is kv::plan_pool's, from the request the engine builds
// (pool_request), so `pagoda size`, `pagoda sim`, `pagoda inspect` and the
// engine's allocator size it with one arithmetic. With tp ranks each rank
// keeps its share of the state, as vLLM splits it (base/recurrent_state.h:
// lfm2's channels, qwen35's k and v heads divided by tp; a tp they do not
// divide is refused).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/pool_plan.h"
#include "kv/sizing.h"
#include "sim/hardware.h"
#include "sim/model_desc.h"

namespace pagoda::sim {

struct WeightsDtype {
  std::string name = "bf16";
  double bytes_per_param = 2.0;
};
// "f32", "bf16|fp16|f16" (2), "fp8|int8" (1), "q8_0" (34/32), "q4|q4_0" (18/32 = 0.5625).
Expected<WeightsDtype> parse_weights_dtype(const std::string& s);

struct PlanInput {
  ModelDesc model;
  HardwareDesc hw;                  // memory_bytes may come from --gpu-mem
  int32_t tp = 1;
  kv::KvDtype kv_dtype = kv::kv_dtype_bf16();
  WeightsDtype weights;
  bool weights_from_file = false;   // use model.weights_file_bytes instead of params x dtype
  int64_t context = 8192;           // L: tokens per request (prompt + output)
  int64_t concurrency = 1;          // C: requests resident at once
  double utilization = 0.9;
  int32_t block_size = 16;
  double watermark = 0.01;
  int64_t activation_tokens = 8192; // prefill chunk the activation reserve is sized for
  int64_t logits_rows = 256;        // sequences sampled per step
  uint64_t kv_cache_memory = 0;     // > 0: a given KV budget per device (weights/reserve ignored)
  // The engine's KV cache groups (kv::kv_group_layout); false: one full-context
  // group, as with --disable-hybrid-kv-cache-manager.
  bool hybrid_kv = true;
};

struct PlanReport {
  // Per token / request.
  uint64_t kv_bytes_per_token = 0;          // whole model, one copy, full context (all layers)
  uint64_t kv_bytes_per_token_per_gpu = 0;  // one TP rank
  uint64_t kv_bytes_per_request = 0;        // one rank, at `context` (window-aware), + the recurrent state
  // Hybrid models: one sequence's recurrent state, exact (ModelDesc::state_bytes)
  // and the pool blocks holding it (kv::plan_pool_layout: rows packed chunk by chunk).
  uint64_t state_bytes_per_sequence = 0;
  int32_t state_blocks_per_sequence = 0;
  uint64_t kv_bytes_per_block = 0;          // one rank: group_size layer slots x block_size tokens
  kv::KvGroupLayout kv_groups;              // the engine's groups for this model (and hybrid_kv)
  // Memory per device.
  uint64_t memory_bytes = 0;
  uint64_t usable_bytes = 0;
  uint64_t weights_bytes = 0;
  uint64_t activation_bytes = 0;
  uint64_t runtime_overhead_bytes = 0;
  int64_t kv_budget_bytes = 0;              // may be negative
  // Capacity.
  int64_t max_tokens_in_cache = 0;          // (kv budget - one state) / full-context bytes per token
  int64_t max_concurrency = 0;              // at `context` (bytes, no block rounding)
  int64_t longest_context = 0;              // at `concurrency`, capped at the model's max context
  bool longest_context_capped = false;
  uint64_t kv_bytes_needed = 0;             // concurrency x kv_bytes_per_request
  bool fits = false;                        // kv_bytes_needed <= kv budget (and context <= max)
  // The paged pool the engine would build with this budget (see kv/sizing.h).
  int64_t num_blocks = 0;
  int64_t blocks_per_request = 0;           // all groups, at `context` (kv::kv_blocks_for_sequence)
  int64_t pool_max_concurrency = 0;         // kv::max_concurrency(num_blocks, blocks_per_request, watermark)
  int64_t pool_max_tokens = 0;              // the longest sequence the pool holds (kv::plan_pool; 0: no pool)
  int32_t min_tp = 0;                       // smallest power of two <= 64 that fits; 0 = none
};

// The engine's kv::PoolRequest for this input on one rank (engine.cc builds
// the same from the model's config): the layers' windows, the recurrent state,
// hybrid grouping, block size, and a pool of budget_bytes.
kv::PoolRequest pool_request(const PlanInput& in, uint64_t budget_bytes);
// The recurrent state one rank keeps (ModelDesc::state_on_rank(tp); none when the
// state does not split across in.tp ranks, which validate_plan_input refuses).
StateRows rank_state(const PlanInput& in);
// KV bytes a request of L tokens takes on one rank: kv::kv_bytes_for_sequence + the recurrent state.
uint64_t request_bytes(const PlanInput& in, int64_t L);

Status validate_plan_input(const PlanInput& in);
// Precondition: validate_plan_input(in).ok().
PlanReport plan_capacity(const PlanInput& in);

// KV bytes per device for every (context, concurrency) cell, against the budget.
struct FitTable {
  std::vector<int64_t> contexts;
  std::vector<int64_t> concurrencies;
  std::vector<std::vector<uint64_t>> kv_bytes;  // [contexts][concurrencies]
  int64_t kv_budget_bytes = 0;
  int32_t max_context = 0;                      // contexts beyond it do not fit either
  bool fits(size_t i, size_t j) const;
};
std::vector<int64_t> default_table_contexts();      // 2k, 4k, ..., 128k
std::vector<int64_t> default_table_concurrencies(); // 1, 2, 4, ..., 256
FitTable fit_table(const PlanInput& in, const std::vector<int64_t>& contexts,
                   const std::vector<int64_t>& concurrencies);

// Human-readable report, markdown table and JSON (a string holding one object).
std::string format_report(const PlanInput& in, const PlanReport& r);
std::string format_fit_table(const FitTable& t);
std::string plan_to_json(const PlanInput& in, const PlanReport& r, const FitTable* table);

// SVG: KV memory per device vs concurrent requests, one line per context length,
// with the KV budget and the device memory as horizontal lines.
std::string kv_memory_plot_svg(const PlanInput& in, const std::vector<int64_t>& contexts,
                               int64_t max_concurrency);

}  // namespace pagoda::sim
