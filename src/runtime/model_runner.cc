#include "runtime/model_runner.h"

namespace pagoda::runtime {

void RunnerOptions::use_pool(const kv::PoolPlan& plan) {
  num_blocks = plan.num_blocks;
  block_size = plan.block_size;
  const kv::KvGroupLayout& layout = plan.layout;
  if (layout.num_groups() > 1 || layout.group_size != layout.num_layers()) {
    num_kv_groups = layout.num_groups();
    n_layer_slots = layout.group_size;
    layer_group = layout.layer_group;
    layer_slot = layout.layer_slot;
  } else {
    num_kv_groups = 1;
    n_layer_slots = 0;
    layer_group.clear();
    layer_slot.clear();
  }
}

KvStorageSpec kv_storage_spec(const model::ModelConfig& c, const RunnerOptions& options) {
  return KvStorageSpec{.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim,
                       .num_blocks = options.num_blocks, .block_size = options.block_size,
                       .dtype = options.kv_dtype, .n_layer_slots = options.n_layer_slots,
                       .layer_group = options.layer_group, .layer_slot = options.layer_slot};
}

Expected<std::unique_ptr<ModelRunner>> ModelRunner::create(const model::Model& model,
                                                           const RunnerOptions& options) {
  const model::ModelConfig& c = model.config();
  const KvStorageSpec spec = kv_storage_spec(c, options);
  for (int32_t g : options.layer_group) {
    if (g >= options.num_kv_groups) return errorf("runner: layer in KV group %d of %d", g, options.num_kv_groups);
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, options));
  PAGODA_ASSIGN_OR_RETURN(r->kv_, KvStorage::create(spec));
  if (options.max_tokens_per_step > 0) r->ws_.reserve(c, options.max_tokens_per_step);
  return r;
}

Expected<StepLogits> ModelRunner::execute(const sched::StepPlan& plan) {
  const KvStorageSpec& spec = kv_->spec();
  for (const auto& [src, dst] : plan.block_copies) {
    if (src < 0 || src >= spec.num_blocks || dst < 0 || dst >= spec.num_blocks) {
      return errorf("runner: block copy %d -> %d outside %d blocks", src, dst, spec.num_blocks);
    }
  }
  // Validate the whole plan before the first copy so an error mutates nothing.
  PAGODA_TRY(plan::build_batch(plan, spec.block_size, spec.num_blocks, &batch_, options_.num_kv_groups));
  for (const auto& [src, dst] : plan.block_copies) kv_->copy_block(src, dst);

  const int32_t n_vocab = model_.config().n_vocab;
  StepLogits out;
  out.n_vocab = n_vocab;
  if (batch_.n_tokens() == 0) return out;
  logits_.resize(static_cast<size_t>(batch_.n_logits()) * static_cast<size_t>(n_vocab));
  PAGODA_TRY(model_.forward(batch_.view(), kv_->layers(), logits_.data(), ws_, options_.backend));
  out.seq_indices = batch_.logit_seqs;
  out.data = logits_;
  return out;
}

}  // namespace pagoda::runtime
