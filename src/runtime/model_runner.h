// ModelRunner: executes one engine step. StepPlan -> block copies -> plan/
// BatchView -> Model::forward -> the logits of every sequence that wants them.
// It owns the KV storage, the forward workspace and the step's batch arrays, so
// a step allocates nothing once the buffers have grown to the step size.
//
// Thread-safety: one thread drives a runner (the engine loop); kernels use their
// own thread pool inside a step.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "kernels/api.h"
#include "kernels/backend.h"
#include "kv/pool_plan.h"
#include "model/model.h"
#include "plan/batch.h"
#include "runtime/kv_storage.h"
#include "sched/step_plan.h"

namespace pagoda::runtime {

struct RunnerOptions {
  int32_t num_blocks = 0;           // KV blocks including the reserved null block 0
  int32_t block_size = 16;          // tokens per KV block
  KvTypes kv_dtype = kernels::KvDtype::F32;  // K and V types
  int32_t max_tokens_per_step = 512;  // workspace reserved up front (grows if a step is larger)
  kernels::BackendKind backend = kernels::BackendKind::Cpu;  // the kernel table every step calls
  // KV cache groups (kv::KvGroupLayout): G layer slots, each layer's group and
  // slot. Empty: one group of every layer.
  int32_t num_kv_groups = 1;
  int32_t n_layer_slots = 0;
  std::vector<int32_t> layer_group;  // [n_layers]
  std::vector<int32_t> layer_slot;   // [n_layers]
  // Hybrid models: the recurrent state group (-1: none), whose tables
  // (ScheduledSeq::group_block_ids) hold each sequence's state_blocks blocks of
  // state rows (model::ModelConfig::n_state_rows; KvStorage::state_row).
  int32_t state_group = -1;
  int32_t state_blocks = 0;
  // The KV storage's blocks, block size and groups from the engine's pool plan
  // (kv::plan_pool): the same plan the KvManager is built from. A plan of one
  // group of every layer leaves the groups empty (slot l for layer l).
  void use_pool(const kv::PoolPlan& plan);
};

// The storage a runner of `options` allocates for a model of `config`.
KvStorageSpec kv_storage_spec(const model::ModelConfig& config, const RunnerOptions& options);

// Blocks needed to hold `n_ctx` tokens of one sequence, plus the null block.
inline int32_t blocks_for_context(int64_t n_ctx, int32_t block_size) {
  return static_cast<int32_t>((n_ctx + block_size - 1) / block_size) + 1;
}

// The logits of one step. Valid until the next execute().
struct StepLogits {
  int32_t n_vocab = 0;
  std::span<const int32_t> seq_indices;  // [L] index into StepPlan::seqs of each row
  std::span<const float> data;           // [L, n_vocab]
  int32_t size() const { return static_cast<int32_t>(seq_indices.size()); }
  std::span<const float> row(int32_t i) const {
    return data.subspan(static_cast<size_t>(i) * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
  }
};

class ModelRunner {
 public:
  // Precondition: `model` outlives the runner.
  static Expected<std::unique_ptr<ModelRunner>> create(const model::Model& model, const RunnerOptions& options);

  // Runs one step. The whole plan is validated first: an error (bad plan, token
  // out of range, block outside the storage) leaves the KV storage untouched.
  Expected<StepLogits> execute(const sched::StepPlan& plan);

  const model::Model& model() const { return model_; }
  const RunnerOptions& options() const { return options_; }
  KvStorage& kv() { return *kv_; }
  const KvStorage& kv() const { return *kv_; }

 private:
  ModelRunner(const model::Model& m, const RunnerOptions& o) : model_(m), options_(o) {}
  const model::Model& model_;
  RunnerOptions options_;
  std::unique_ptr<KvStorage> kv_;
  model::Workspace ws_;
  plan::StepBatch batch_;
  std::vector<float> logits_;  // [L, n_vocab]
  std::vector<float*> state_rows_;  // [n_seqs * n_state_rows] this step's recurrent state rows
};

}  // namespace pagoda::runtime
