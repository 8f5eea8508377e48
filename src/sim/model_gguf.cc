// ModelDesc from GGUF metadata. Only the header and tensor table are read; the
// parameter count and weight bytes are the sums over the tensor table.
#include <algorithm>
#include <filesystem>

#include "gguf/gguf.h"
#include "sim/model_desc.h"

namespace pagoda::sim {

namespace {

// An integer key, or the largest element of a per-layer integer array
// (some architectures store head counts per layer). `def` when missing.
Expected<int64_t> int_or_array_max(const gguf::GgufFile& f, const std::string& key, int64_t def) {
  const gguf::Value* v = f.find(key);
  if (!v) return def;
  if (v->is_int()) return v->as_int();
  if (v->type == gguf::ValueType::ARRAY && !v->arr.empty()) {
    int64_t best = 0;
    for (const auto& e : v->arr) {
      if (!e.is_int()) return errorf("metadata %s: expected integers", key.c_str());
      best = std::max(best, e.as_int());
    }
    return best;
  }
  return errorf("metadata %s: expected an integer", key.c_str());
}

Expected<int32_t> dim(const gguf::GgufFile& f, const std::string& key, int64_t def, int64_t lo) {
  PAGODA_ASSIGN_OR_RETURN(int64_t v, int_or_array_max(f, key, def));
  if (v < lo || v > INT32_MAX) {
    if (v == -1 && def == -1) return errorf("metadata %s: missing", key.c_str());
    return errorf("metadata %s: value %lld out of range", key.c_str(), static_cast<long long>(v));
  }
  return static_cast<int32_t>(v);
}

// Hybrid models: which layers are recurrent and the shape of their state, read
// as model/lfm2.cc and model/qwen35.cc read them (sim/ plans without model/);
// the state's rows then follow from base/recurrent_state.h, the formula the
// model uses (tests/engine_capacity checks the two agree on the synth presets).
//   lfm2:   a per-layer head_count_kv of 0 marks a short-conv layer of
//           shortconv.l_cache taps over n_embd channels.
//   qwen35: attention.recurrent_layers (a flag per layer), else every layer but
//           each full_attention_interval-th (default 4) is a Gated DeltaNet one
//           of ssm.conv_kernel taps, ssm.group_count k heads and
//           ssm.time_step_rank v heads of ssm.state_size.
//   mamba2: every layer (no attention), ssm.conv_kernel taps over ssm.inner_size
//           + 2 ssm.group_count ssm.state_size channels, ssm.time_step_rank heads.
Status read_recurrent_state(const gguf::GgufFile& f, const std::string& p, ModelDesc* m) {
  const auto n = static_cast<size_t>(m->num_layers);
  if (m->arch == "lfm2") {
    const gguf::Value* kvh = f.find(p + "attention.head_count_kv");
    if (!kvh || kvh->type != gguf::ValueType::ARRAY) return Status::Ok();  // no short-conv layer
    if (kvh->arr.size() != n) return errorf("metadata %sattention.head_count_kv: %zu entries for %zu layers", p.c_str(), kvh->arr.size(), n);
    m->recurrent_layers.assign(n, false);
    for (size_t l = 0; l < n; ++l) m->recurrent_layers[l] = kvh->arr[l].is_int() && kvh->arr[l].as_int() == 0;
    PAGODA_ASSIGN_OR_RETURN(const int32_t l_cache, dim(f, p + "shortconv.l_cache", -1, 2));
    m->recurrent = {.kind = RecurrentKind::kShortConv, .conv_kernel = l_cache, .channels = m->hidden};
    m->qk_norm = true;
  } else if (m->arch == "qwen35") {
    m->recurrent_layers.assign(n, false);
    if (const gguf::Value* rl = f.find(p + "attention.recurrent_layers")) {
      if (rl->type != gguf::ValueType::ARRAY || rl->arr.size() != n)
        return errorf("metadata %sattention.recurrent_layers: expected %zu flags", p.c_str(), n);
      for (size_t l = 0; l < n; ++l) m->recurrent_layers[l] = rl->arr[l].is_int() && rl->arr[l].as_int() != 0;
    } else {
      PAGODA_ASSIGN_OR_RETURN(const int32_t interval, dim(f, p + "full_attention_interval", 4, 1));
      for (size_t l = 0; l < n; ++l) m->recurrent_layers[l] = (l + 1) % static_cast<size_t>(interval) != 0;
    }
    PAGODA_ASSIGN_OR_RETURN(const int32_t conv_kernel, dim(f, p + "ssm.conv_kernel", -1, 2));
    PAGODA_ASSIGN_OR_RETURN(const int32_t S, dim(f, p + "ssm.state_size", -1, 1));
    PAGODA_ASSIGN_OR_RETURN(const int32_t k_heads, dim(f, p + "ssm.group_count", -1, 1));
    PAGODA_ASSIGN_OR_RETURN(const int32_t v_heads, dim(f, p + "ssm.time_step_rank", -1, 1));
    m->recurrent = {.kind = RecurrentKind::kGatedDeltaNet, .conv_kernel = conv_kernel, .k_heads = k_heads,
                    .v_heads = v_heads, .head_dim = S};
    m->qk_norm = true;
    m->attn_output_gate = true;
  } else if (m->arch == "mamba2") {
    // No attention layer (head_count 0): every layer a Mamba-2 mixer of
    // ssm.conv_kernel taps over ssm.inner_size + 2 ssm.group_count ssm.state_size
    // channels; load_gguf_model gives the pool's token rows the model's layout.
    m->recurrent_layers.assign(n, true);
    PAGODA_ASSIGN_OR_RETURN(const int32_t conv_kernel, dim(f, p + "ssm.conv_kernel", -1, 2));
    PAGODA_ASSIGN_OR_RETURN(const int32_t d_inner, dim(f, p + "ssm.inner_size", -1, 1));
    PAGODA_ASSIGN_OR_RETURN(const int32_t N, dim(f, p + "ssm.state_size", -1, 1));
    PAGODA_ASSIGN_OR_RETURN(const int32_t groups, dim(f, p + "ssm.group_count", -1, 1));
    PAGODA_ASSIGN_OR_RETURN(const int32_t heads, dim(f, p + "ssm.time_step_rank", -1, 1));
    if (d_inner % N != 0)
      return errorf("metadata %sssm.inner_size %d: not a multiple of ssm.state_size %d", p.c_str(), d_inner, N);
    m->recurrent = {.kind = RecurrentKind::kMamba2, .conv_kernel = conv_kernel, .channels = d_inner, .k_heads = groups,
                    .v_heads = heads, .head_dim = N};
  } else {
    return Status::Ok();
  }
  return set_recurrent_state(*m);
}

}  // namespace

Expected<ModelDesc> load_gguf_model(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::open(path));
  const gguf::GgufFile& f = *file;
  ModelDesc m;
  m.source = "gguf:" + path;
  PAGODA_ASSIGN_OR_RETURN(m.arch, f.get_string("general.architecture"));
  // general.name is often just the architecture ("llama"); the file name says more then.
  m.name = f.get_string_or("general.name", "");
  if (m.name.empty() || m.name == m.arch) m.name = std::filesystem::path(path).stem().string();
  const std::string p = m.arch + ".";
  PAGODA_ASSIGN_OR_RETURN(m.num_layers, dim(f, p + "block_count", -1, 1));
  PAGODA_ASSIGN_OR_RETURN(m.hidden, dim(f, p + "embedding_length", -1, 1));
  if (m.arch == "mamba2") {
    // Attention-free: one K/V "head" one state row (ssm.state_size) wide lays out
    // the pool's token blocks, as model/mamba2.cc sets it (no layer attends).
    m.num_heads = m.num_kv_heads = 1;
    PAGODA_ASSIGN_OR_RETURN(m.head_dim, dim(f, p + "ssm.state_size", -1, 1));
  } else {
    PAGODA_ASSIGN_OR_RETURN(m.num_heads, dim(f, p + "attention.head_count", -1, 1));
    PAGODA_ASSIGN_OR_RETURN(m.num_kv_heads, dim(f, p + "attention.head_count_kv", m.num_heads, 1));
    PAGODA_ASSIGN_OR_RETURN(m.head_dim, dim(f, p + "attention.key_length", m.hidden / m.num_heads, 1));
  }
  PAGODA_ASSIGN_OR_RETURN(int32_t v_len, dim(f, p + "attention.value_length", m.head_dim, 1));
  m.v_head_dim = v_len == m.head_dim ? 0 : v_len;
  PAGODA_ASSIGN_OR_RETURN(m.ffn, dim(f, p + "feed_forward_length", 0, 0));
  PAGODA_ASSIGN_OR_RETURN(m.max_context, dim(f, p + "context_length", 2048, 1));

  // Vocabulary: the embedding's second dim, else the tokenizer's token list.
  if (const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight"); emb && emb->dims.size() == 2) {
    m.vocab = static_cast<int32_t>(std::min<uint64_t>(emb->dims[1], INT32_MAX));
  } else if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens"); toks && toks->type == gguf::ValueType::ARRAY) {
    m.vocab = static_cast<int32_t>(std::min<size_t>(toks->arr.size(), INT32_MAX));
  }
  PAGODA_ASSIGN_OR_RETURN(m.vocab, dim(f, p + "vocab_size", m.vocab, 1));
  m.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  m.attn_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;

  // Mixture of experts.
  PAGODA_ASSIGN_OR_RETURN(m.num_experts, dim(f, p + "expert_count", 0, 0));
  if (m.num_experts > 0) {
    PAGODA_ASSIGN_OR_RETURN(m.experts_per_token, dim(f, p + "expert_used_count", 0, 0));
    PAGODA_ASSIGN_OR_RETURN(m.num_shared_experts, dim(f, p + "expert_shared_count", 0, 0));
    PAGODA_ASSIGN_OR_RETURN(m.moe_ffn, dim(f, p + "expert_feed_forward_length", 0, 0));
    PAGODA_ASSIGN_OR_RETURN(m.first_dense_layers, dim(f, p + "leading_dense_block_count", 0, 0));
  }

  // MLA (deepseek2): key_length = nope + rope, rope.dimension_count = rope.
  PAGODA_ASSIGN_OR_RETURN(m.kv_lora_rank, dim(f, p + "attention.kv_lora_rank", 0, 0));
  if (m.kv_lora_rank > 0) {
    m.attention = kv::AttentionKind::kMLA;
    PAGODA_ASSIGN_OR_RETURN(m.q_lora_rank, dim(f, p + "attention.q_lora_rank", 0, 0));
    PAGODA_ASSIGN_OR_RETURN(m.qk_rope_head_dim, dim(f, p + "rope.dimension_count", 64, 0));
    m.qk_nope_head_dim = std::max(0, m.head_dim - m.qk_rope_head_dim);
  } else if (m.num_kv_heads == 1) {
    m.attention = kv::AttentionKind::kMQA;
  } else {
    m.attention = m.num_kv_heads == m.num_heads ? kv::AttentionKind::kMHA : kv::AttentionKind::kGQA;
  }

  // Sliding window: gemma2 alternates 1:1, gemma3 has 5 local per global.
  PAGODA_ASSIGN_OR_RETURN(m.sliding_window, dim(f, p + "attention.sliding_window", 0, 0));
  if (m.sliding_window >= m.max_context) m.sliding_window = 0;
  if (m.sliding_window > 0) {
    int64_t period = m.arch == "gemma2" ? 2 : m.arch == "gemma3" ? 6 : 0;
    PAGODA_ASSIGN_OR_RETURN(period, int_or_array_max(f, p + "attention.sliding_window_pattern", period));
    m.swa_period = static_cast<int32_t>(std::clamp<int64_t>(period, 0, INT32_MAX));
  }

  PAGODA_TRY(read_recurrent_state(f, p, &m));

  int64_t params = 0;
  uint64_t bytes = 0;
  for (const auto& t : f.tensors()) {
    params += static_cast<int64_t>(t.n_elements);
    bytes += t.n_bytes;
    if (t.name == "token_embd.weight") m.embed_file_bytes = t.n_bytes;
    if (t.name == "output.weight") m.output_file_bytes = t.n_bytes;
  }
  m.weights_file_bytes = bytes;
  const ParamEstimate e = estimate_params(m);
  m.params_total = params > 0 ? params : e.total;
  // Active share of an MoE from the shape; the tensor table gives the total.
  m.params_active = m.is_moe() && e.total > 0
                        ? static_cast<int64_t>(static_cast<double>(m.params_total) * e.active / e.total)
                        : m.params_total;
  PAGODA_TRY(validate_model(m));
  return m;
}

}  // namespace pagoda::sim
