#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "base/hash.h"
#include "model/arch.h"

namespace pagoda::model {

// ---- Workspace ---------------------------------------------------------------

namespace {
// Per-token floats of Workspace::conv: lfm2's in_proj rows, or the architecture's own.
int64_t conv_floats(const ModelConfig& c) {
  return std::max<int64_t>(c.n_recurrent_layers() > 0 && c.ssm_d_state == 0 ? 3 * int64_t{c.n_embd} : 0, c.scratch_floats);
}
}  // namespace

void Workspace::reserve(const ModelConfig& c, int32_t max_tokens) {
  if (max_tokens <= max_tokens_ && c.n_embd == embd_ && c.q_dim() == q_dim_ && c.kv_dim() == kv_dim_ &&
      c.n_ff == ff_ && conv_floats(c) == conv_) {
    return;
  }
  max_tokens_ = std::max(max_tokens, max_tokens_);
  embd_ = c.n_embd;
  q_dim_ = c.q_dim();
  kv_dim_ = c.kv_dim();
  ff_ = c.n_ff;
  conv_ = conv_floats(c);
  const auto t = static_cast<size_t>(max_tokens_);
  x.resize(t * static_cast<size_t>(embd_));
  xn.resize(t * static_cast<size_t>(embd_));
  q.resize(t * static_cast<size_t>(q_dim_));
  k.resize(t * static_cast<size_t>(kv_dim_));
  v.resize(t * static_cast<size_t>(kv_dim_));
  att.resize(t * static_cast<size_t>(q_dim_));
  proj.resize(t * static_cast<size_t>(embd_));
  gate.resize(t * static_cast<size_t>(ff_));
  up.resize(t * static_cast<size_t>(ff_));
  conv.resize(t * static_cast<size_t>(conv_));
}

// ---- Loading -----------------------------------------------------------------

namespace {

uint64_t compute_fingerprint(const gguf::GgufFile& f, const ModelConfig& c) {
  Hasher128 h(0x7061676f6461ull);  // "pagoda"
  h.update(c.arch.data(), c.arch.size());
  const int64_t ints[] = {c.n_layers, c.n_embd,    c.n_ff,      c.n_heads,    c.n_kv_heads,
                          c.head_dim, c.rope_dim,  c.n_vocab,   c.rope_neox,  c.attn_bias};
  h.update(ints, sizeof(ints));
  const float floats[] = {c.rms_eps, c.rope_base};
  h.update(floats, sizeof(floats));
  // The newer fields, hashed only when they differ from plain llama's, so that the
  // fingerprints of the existing models (and their stored prefixes) stay the same.
  const bool plain_layers = std::all_of(c.layers.begin(), c.layers.end(), [&](const LayerAttn& a) {
    return a.window == 0 && a.rope_base == c.rope_base && a.rope_freq_scale == 1.f;
  });
  if (c.qk_norm || c.post_norms || c.ffn_act != FfnAct::Silu || c.embd_scale != 1.f ||
      c.attn_scale != 1.0f / std::sqrt(static_cast<float>(c.head_dim)) || c.rope_attn_factor != 1.f || !plain_layers) {
    const int64_t flags[] = {c.qk_norm, c.post_norms, static_cast<int64_t>(c.ffn_act)};
    h.update(flags, sizeof(flags));
    const float scales[] = {c.embd_scale, c.attn_scale, c.rope_attn_factor};
    h.update(scales, sizeof(scales));
    for (const LayerAttn& a : c.layers) {
      h.update(&a.window, sizeof(a.window));
      h.update(&a.rope_base, sizeof(a.rope_base));
      h.update(&a.rope_freq_scale, sizeof(a.rope_freq_scale));
    }
  }
  if (c.rope_ext_factor != 0.f) {  // YaRN: hashed only when on, as above
    const float yarn[] = {c.rope_ext_factor, static_cast<float>(c.n_ctx_orig)};
    h.update(yarn, sizeof(yarn));
  }
  if (c.rope_long_factors) h.update("rope_factors_long", 17);  // phi3 at a context past n_ctx_orig
  for (const gguf::TensorInfo& t : f.tensors()) {
    h.update(t.name.data(), t.name.size());
    h.update(t.dims.data(), t.dims.size() * sizeof(uint64_t));
    const auto type = static_cast<uint32_t>(t.type);
    h.update(&type, sizeof(type));
    if (!t.data) continue;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(t.n_bytes, 256));
    h.update(t.data, n);
    h.update(t.data + (t.n_bytes - n), n);
  }
  return h.digest().lo;
}

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelLoadOptions& opt) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> f, gguf::GgufFile::open(path));
  return from_gguf(std::shared_ptr<const gguf::GgufFile>(std::move(f)), opt);
}

Expected<std::unique_ptr<Model>> Model::from_gguf(std::shared_ptr<const gguf::GgufFile> file,
                                                  const ModelLoadOptions& opt) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  PAGODA_ASSIGN_OR_RETURN(m->config_, config_from_gguf(*m->file_, opt));
  m->arch_ = find_arch(m->config_.arch);  // non-null: config_from_gguf checked the name
  PAGODA_ASSIGN_OR_RETURN(m->weights_, m->arch_->bind_weights(*m->file_, m->config_));
  m->fingerprint_ = compute_fingerprint(*m->file_, m->config_);
  m->weight_bytes_per_token_ = model::weight_bytes_per_token(m->weights_, m->config_);
  model::pack_decode_weights(*m->file_, m->weights_);  // after the fingerprint read the originals
  return m;
}

Status Model::forward(const kernels::BatchView& batch, std::span<const kernels::KvLayerView> kv_layers,
                      float* logits, Workspace& ws, KernelBackend backend) const {
  const ModelConfig& c = config_;
  const int64_t T = batch.n_tokens;
  // Check before mutating: nothing in the architecture's forward may fail once a
  // KV row is written.
  if (T <= 0) return errorf("forward: empty batch");
  if (kv_layers.size() != static_cast<size_t>(c.n_layers)) {
    return errorf("forward: %zu KV layers for a %d-layer model", kv_layers.size(), c.n_layers);
  }
  for (size_t l = 0; l < kv_layers.size(); ++l) {
    const kernels::KvLayerView& kv = kv_layers[l];
    if (c.layers[l].recurrent) continue;  // no K/V: its state comes in batch.state_rows
    if (kv.n_kv_heads != c.n_kv_heads || kv.head_dim != c.head_dim || !kv.k || !kv.v) {
      return errorf("forward: KV layer has %d heads x %d dims, model needs %d x %d", kv.n_kv_heads, kv.head_dim,
                    c.n_kv_heads, c.head_dim);
    }
  }
  if (batch.n_state_rows != c.n_state_rows || (c.n_state_rows > 0 && !batch.state_rows)) {
    return errorf("forward: %d recurrent state rows per sequence for a model with %d", batch.n_state_rows, c.n_state_rows);
  }
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.n_vocab) return errorf("forward: token id %d out of range [0, %d)", id, c.n_vocab);
  }
  if (batch.n_logits < 0 || batch.n_logits > T) {
    return errorf("forward: %d logit rows for %lld tokens", batch.n_logits, static_cast<long long>(T));
  }
  for (int32_t i = 0; i < batch.n_logits; ++i) {
    if (batch.logit_rows[i] < 0 || batch.logit_rows[i] >= T) {
      return errorf("forward: logit row %d outside the batch of %lld tokens", batch.logit_rows[i],
                    static_cast<long long>(T));
    }
  }
  ws.reserve(c, static_cast<int32_t>(T));
  arch_->forward(ForwardPass{kernels::backend(backend), c, weights_, batch, kv_layers, ws, logits});
  return Status::Ok();
}

}  // namespace pagoda::model
