#include "runtime/model_runner.h"

namespace pagoda::runtime {

void RunnerOptions::use_pool(const kv::PoolPlan& plan) {
  num_blocks = plan.num_blocks;
  block_size = plan.block_size;
  const kv::KvGroupLayout& layout = plan.layout;
  state_group = -1;
  state_blocks = layout.state_blocks;
  for (int32_t g = 0; g < layout.num_groups(); ++g)
    if (layout.windows[static_cast<size_t>(g)] == kv::kStateWindow) state_group = g;
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
  if ((c.n_state_rows > 0) != (options.state_group > 0) || (c.n_state_rows > 0 && options.state_blocks <= 0))
    return errorf("runner: the model has %d recurrent state rows, the KV layout state group %d of %d blocks",
                  c.n_state_rows, options.state_group, options.state_blocks);
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, options));
  PAGODA_ASSIGN_OR_RETURN(r->kv_, KvStorage::create(spec));
  if (c.n_state_rows > 0) {
    const size_t rb = static_cast<size_t>(c.state_row_floats) * sizeof(float);
    const size_t bs = static_cast<size_t>(spec.block_size);
    if ((bs * spec.row_bytes()) % alignof(float) != 0 || (bs * spec.v_row_bytes()) % alignof(float) != 0)
      return errorf("runner: the recurrent state needs K and V blocks of whole floats (block size %d)", spec.block_size);
    const int64_t per_block = r->kv_->state_rows_per_block(rb);
    if (per_block <= 0 || static_cast<int64_t>(options.state_blocks) * per_block < c.n_state_rows)
      return errorf("runner: %d state blocks of %lld rows cannot hold %d recurrent state rows", options.state_blocks,
                    static_cast<long long>(per_block), c.n_state_rows);
  }
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
  PAGODA_TRY(plan::build_batch(plan, spec.block_size, spec.num_blocks, &batch_, options_.num_kv_groups,
                               options_.state_group));
  const model::ModelConfig& mc = model_.config();
  const int32_t n_rows = mc.n_state_rows;
  state_rows_.clear();
  if (n_rows > 0) {  // each sequence's state rows, from its state group's table
    const size_t rb = static_cast<size_t>(mc.state_row_floats) * sizeof(float);
    for (const sched::ScheduledSeq& s : plan.seqs) {
      const auto& t = s.group_block_ids[static_cast<size_t>(options_.state_group - 1)];
      if (static_cast<int32_t>(t.size()) != options_.state_blocks)
        return errorf("runner: request %llu has %zu recurrent state blocks, the layout %d",
                      static_cast<unsigned long long>(s.request_id), t.size(), options_.state_blocks);
      for (int32_t r = 0; r < n_rows; ++r) state_rows_.push_back(kv_->state_row(t, r, rb));
    }
  }
  for (const auto& [src, dst] : plan.block_copies) kv_->copy_block(src, dst);

  const int32_t n_vocab = model_.config().n_vocab;
  StepLogits out;
  out.n_vocab = n_vocab;
  if (batch_.n_tokens() == 0) return out;
  logits_.resize(static_cast<size_t>(batch_.n_logits()) * static_cast<size_t>(n_vocab));
  kernels::BatchView view = batch_.view();
  view.n_state_rows = n_rows;
  view.state_rows = state_rows_.empty() ? nullptr : state_rows_.data();
  PAGODA_TRY(model_.forward(view, kv_->layers(), logits_.data(), ws_, options_.backend));
  out.seq_indices = batch_.logit_seqs;
  out.data = logits_;
  return out;
}

}  // namespace pagoda::runtime
