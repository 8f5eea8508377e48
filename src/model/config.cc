#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "model/arch.h"

namespace pagoda::model {

namespace {

// Reads a positive int32 key; `def` < 0 means required.
Expected<int32_t> read_dim(const gguf::GgufFile& f, const std::string& key, int64_t def) {
  int64_t v = def;
  if (const gguf::Value* val = f.find(key)) {
    if (!val->is_int()) return errorf("metadata %s: expected an integer", key.c_str());
    v = val->as_int();
  } else if (def < 0) {
    return errorf("metadata %s: missing (required for this architecture)", key.c_str());
  }
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    return errorf("metadata %s: value %lld out of range", key.c_str(), static_cast<long long>(v));
  }
  return static_cast<int32_t>(v);
}

Expected<float> read_float(const gguf::GgufFile& f, const std::string& key, double def) {
  const gguf::Value* val = f.find(key);
  if (!val) return static_cast<float>(def);
  if (val->type != gguf::ValueType::FLOAT32 && val->type != gguf::ValueType::FLOAT64 && !val->is_int()) {
    return errorf("metadata %s: expected a number", key.c_str());
  }
  return static_cast<float>(val->as_float());
}

}  // namespace

Expected<int32_t> read_required_int(const gguf::GgufFile& f, const std::string& key, int64_t lo, int64_t hi,
                                    const std::string& arch) {
  const gguf::Value* v = f.find(key);
  if (!v) return errorf("metadata %s: missing (required for %s)", key.c_str(), arch.c_str());
  if (!v->is_int() || v->as_int() < lo || v->as_int() > hi)
    return errorf("metadata %s: expected an integer in %lld..%lld", key.c_str(), static_cast<long long>(lo),
                  static_cast<long long>(hi));
  return static_cast<int32_t>(v->as_int());
}

void yarn_corr_dims(int32_t rope_dim, int32_t n_ctx_orig, float base, float beta_fast, float beta_slow, float dims[2]) {
  // ggml_rope_yarn_corr_dim: the pair index whose wavelength spans n_ctx_orig / n_rot turns.
  const auto corr_dim = [&](float n_rot) {
    return static_cast<float>(rope_dim) *
           std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2 * std::numbers::pi_v<float>)) / (2 * std::log(base));
  };
  dims[0] = std::max(0.0f, std::floor(corr_dim(beta_fast)));
  dims[1] = std::min(static_cast<float>(rope_dim - 1), std::ceil(corr_dim(beta_slow)));
}

Expected<ModelConfig> config_from_gguf(const gguf::GgufFile& f, const ModelLoadOptions& opt) {
  ModelConfig c;
  if (opt.context_length < 0) return errorf("context length %d must not be negative", opt.context_length);
  PAGODA_ASSIGN_OR_RETURN(c.arch, f.get_string("general.architecture"));
  const ArchDef* def = find_arch(c.arch);
  if (!def) {
    return errorf("general.architecture '%s' is not supported (%s)", c.arch.c_str(), arch_names().c_str());
  }
  const std::string p = c.arch + ".";
  PAGODA_ASSIGN_OR_RETURN(c.n_layers, read_dim(f, p + "block_count", -1));
  PAGODA_ASSIGN_OR_RETURN(c.n_embd, read_dim(f, p + "embedding_length", -1));
  std::vector<bool> recurrent(static_cast<size_t>(c.n_layers), false);
  if (!def->attention_free) {  // mamba2: read_hparams sets the head counts (model/arch.h)
    PAGODA_ASSIGN_OR_RETURN(c.n_ff, read_dim(f, p + "feed_forward_length", -1));
    PAGODA_ASSIGN_OR_RETURN(c.n_heads, read_dim(f, p + "attention.head_count", -1));
    // head_count_kv: one value, or (a hybrid architecture) one per layer, 0 for
    // a recurrent layer; the attention layers must then agree on one value.
    if (const gguf::Value* kvh = f.find(p + "attention.head_count_kv"); kvh && kvh->type == gguf::ValueType::ARRAY) {
      if (!def->recurrent_layers) return errorf("%sattention.head_count_kv: per-layer arrays are not supported for %s", p.c_str(), c.arch.c_str());
      if (kvh->arr.size() != static_cast<size_t>(c.n_layers))
        return errorf("%sattention.head_count_kv: %zu entries for %d layers", p.c_str(), kvh->arr.size(), c.n_layers);
      for (size_t l = 0; l < kvh->arr.size(); ++l) {
        const gguf::Value& e = kvh->arr[l];
        if (!e.is_int() || e.as_int() < 0 || e.as_int() > c.n_heads)
          return errorf("%sattention.head_count_kv[%zu]: expected an integer in 0..%d", p.c_str(), l, c.n_heads);
        recurrent[l] = e.as_int() == 0;
        if (e.as_int() == 0) continue;
        if (c.n_kv_heads != 0 && c.n_kv_heads != e.as_int())
          return errorf("%sattention.head_count_kv[%zu] = %lld: every attention layer must have %d", p.c_str(), l,
                        static_cast<long long>(e.as_int()), c.n_kv_heads);
        c.n_kv_heads = static_cast<int32_t>(e.as_int());
      }
      if (c.n_kv_heads == 0) return errorf("%sattention.head_count_kv: no attention layer", p.c_str());
    } else {
      PAGODA_ASSIGN_OR_RETURN(c.n_kv_heads, read_dim(f, p + "attention.head_count_kv", c.n_heads));
    }
    if (c.n_embd % c.n_heads != 0 && !f.find(p + "attention.key_length")) {
      return errorf("%sembedding_length %d is not a multiple of attention.head_count %d", p.c_str(),
                    c.n_embd, c.n_heads);
    }
    PAGODA_ASSIGN_OR_RETURN(c.head_dim, read_dim(f, p + "attention.key_length", c.n_embd / c.n_heads));
    if (const gguf::Value* vl = f.find(p + "attention.value_length")) {
      if (!vl->is_int() || vl->as_int() != c.head_dim) {
        return errorf("%sattention.value_length must equal key_length (%d)", p.c_str(), c.head_dim);
      }
    }
    PAGODA_ASSIGN_OR_RETURN(c.rope_dim, read_dim(f, p + "rope.dimension_count", c.head_dim));
  }
  PAGODA_ASSIGN_OR_RETURN(c.n_ctx_train, read_dim(f, p + "context_length", 2048));
  PAGODA_ASSIGN_OR_RETURN(c.rms_eps, read_float(f, p + "attention.layer_norm_rms_epsilon", 1e-5));
  PAGODA_ASSIGN_OR_RETURN(c.rope_base, read_float(f, p + "rope.freq_base", 10000.0));
  // Linear rope scaling (llama.cpp: rope.scaling.factor, else the older rope.scale_linear).
  float rope_factor = 0.f;
  PAGODA_ASSIGN_OR_RETURN(rope_factor, read_float(f, p + "rope.scaling.factor", 0.0));
  if (rope_factor == 0.f) {
    PAGODA_ASSIGN_OR_RETURN(rope_factor, read_float(f, p + "rope.scale_linear", 0.0));
  }
  if (rope_factor < 0.f) return errorf("%srope.scaling.factor %g must be positive", p.c_str(), static_cast<double>(rope_factor));
  PAGODA_ASSIGN_OR_RETURN(c.n_ctx_orig, read_dim(f, p + "rope.scaling.original_context_length", c.n_ctx_train));
  c.n_ctx = opt.context_length > 0 ? opt.context_length : c.n_ctx_train;
  bool yarn = false;
  if (f.find(p + "rope.scaling.type")) {
    // As llama.cpp, the factor applies whatever the type; llama3 and longrope scaling
    // also come as frequency-factor tensors (the architecture binds them).
    PAGODA_ASSIGN_OR_RETURN(const std::string t, f.get_string(p + "rope.scaling.type"));
    if (t != "none" && t != "linear" && t != "longrope" && t != "yarn") {
      return errorf("%srope.scaling.type '%s' is not supported (none, linear, longrope, yarn)", p.c_str(), t.c_str());
    }
    if (t == "none") rope_factor = 0.f;  // llama.cpp: never scale if the type is none
    yarn = t == "yarn";
  }
  PAGODA_ASSIGN_OR_RETURN(c.rope_attn_factor, read_float(f, p + "rope.scaling.attn_factor", 1.0));
  if (yarn) {
    if (f.find(p + "rope.scaling.yarn_log_multiplier")) {
      // DeepSeek's mscale_all_dims changes the attention factor (llama.cpp's get_mscale ratio).
      return errorf("%srope.scaling.yarn_log_multiplier is not supported", p.c_str());
    }
    c.rope_ext_factor = 1.0f;
  }
  c.layers.assign(static_cast<size_t>(c.n_layers),
                  LayerAttn{.window = 0, .rope_base = c.rope_base, .rope_freq_scale = rope_factor > 0.f ? 1.f / rope_factor : 1.f});
  for (size_t l = 0; l < recurrent.size(); ++l) c.layers[l].recurrent = recurrent[l];
  if (def->read_hparams) PAGODA_TRY(def->read_hparams(f, p, c));
  if (c.rope_ext_factor != 0.f) {
    for (LayerAttn& a : c.layers) {  // after read_hparams: a layer's own base (gemma3's local layers)
      float dims[2];
      yarn_corr_dims(c.rope_dim, c.n_ctx_orig, a.rope_base, 32.0f, 1.0f, dims);
      a.yarn_low = dims[0];
      a.yarn_high = dims[1];
    }
  }
  if (c.attn_scale == 0.f) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  if (c.n_heads % c.n_kv_heads != 0) {
    return errorf("attention.head_count %d is not a multiple of attention.head_count_kv %d", c.n_heads,
                  c.n_kv_heads);
  }
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return errorf("rope.dimension_count %d must be even and <= head dim %d", c.rope_dim, c.head_dim);
  }
  if (!(c.rms_eps > 0.f) || !(c.rope_base > 0.f)) {
    return errorf("layer_norm_rms_epsilon (%g) and rope.freq_base (%g) must be positive",
                  static_cast<double>(c.rms_eps), static_cast<double>(c.rope_base));
  }
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const LayerAttn& a = c.layers[l];
    if (a.window < 0 || !(a.rope_base > 0.f) || !(a.rope_freq_scale > 0.f)) {
      return errorf("layer %zu: sliding window %d, rope base %g and rope scale %g must be positive", l, a.window,
                    static_cast<double>(a.rope_base), static_cast<double>(a.rope_freq_scale));
    }
  }
  if (!(c.attn_scale > 0.f) || !(c.embd_scale > 0.f) || !(c.rope_attn_factor > 0.f)) {
    return errorf("attention scale (%g), embedding scale (%g) and rope.scaling.attn_factor (%g) must be positive",
                  static_cast<double>(c.attn_scale), static_cast<double>(c.embd_scale),
                  static_cast<double>(c.rope_attn_factor));
  }
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) return errorf("tensor token_embd.weight: missing");
  if (emb->dims.size() != 2 || emb->dims[0] != static_cast<uint64_t>(c.n_embd) || emb->dims[1] == 0 ||
      emb->dims[1] > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return errorf("tensor token_embd.weight: expected [%d, n_vocab], found %s", c.n_embd,
                  emb->dims.size() == 2 ? (std::to_string(emb->dims[0]) + ", " + std::to_string(emb->dims[1])).c_str()
                                        : "a tensor of other rank");
  }
  c.n_vocab = static_cast<int32_t>(emb->dims[1]);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace pagoda::model
