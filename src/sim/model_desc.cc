#include "sim/model_desc.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "sim/json_util.h"

namespace pagoda::sim {

using detail::json;

int32_t ModelDesc::num_recurrent_layers() const {
  int32_t n = 0;
  for (bool r : recurrent_layers) n += r ? 1 : 0;
  return n;
}

kv::KvShape ModelDesc::kv_shape() const {
  return kv::KvShape{.kind = attention, .num_layers = num_layers - num_recurrent_layers(), .num_kv_heads = num_kv_heads, .head_dim = head_dim,
                     .v_head_dim = v_head_dim, .kv_lora_rank = kv_lora_rank, .qk_rope_head_dim = qk_rope_head_dim,
                     .sliding_window = sliding_window, .swa_period = swa_period};
}

Expected<StateRows> ModelDesc::state_on_rank(int32_t tp) const {
  return recurrent_state_rows(recurrent, num_recurrent_layers(), tp);
}

Status set_recurrent_state(ModelDesc& m) {
  PAGODA_ASSIGN_OR_RETURN(const StateRows st, recurrent_state_rows(m.recurrent, m.num_recurrent_layers()));
  m.state_rows = st.rows;
  m.state_row_floats = st.row_floats;
  if (st.rows == 0) {
    m.recurrent_layers.clear();
    m.recurrent = {};
  }
  return Status::Ok();
}

std::vector<int32_t> ModelDesc::layer_windows() const {
  const kv::KvShape shape = kv_shape();
  std::vector<int32_t> w;
  int32_t attn = 0;  // the attention layer's index in kv_shape()
  for (int32_t l = 0; l < num_layers; ++l) {
    if (static_cast<size_t>(l) < recurrent_layers.size() && recurrent_layers[static_cast<size_t>(l)]) {
      w.push_back(kv::kStateWindow);
    } else {
      w.push_back(attn < shape.num_layers && shape.is_local_layer(attn) ? shape.sliding_window : 0);
      ++attn;
    }
  }
  return w;
}

ParamEstimate estimate_params(const ModelDesc& m) {
  const int64_t h = m.hidden, L = m.num_layers, H = m.num_heads, kvh = m.num_kv_heads;
  const int64_t hd = m.head_dim, vd = m.v_head_dim > 0 ? m.v_head_dim : m.head_dim;
  int64_t attn = 0;
  if (m.attention == kv::AttentionKind::kMLA) {
    const int64_t rope = m.qk_rope_head_dim, nope = m.qk_nope_head_dim > 0 ? m.qk_nope_head_dim : hd - rope;
    const int64_t q = m.q_lora_rank > 0 ? h * m.q_lora_rank + m.q_lora_rank + int64_t{m.q_lora_rank} * H * (nope + rope)
                                        : h * H * (nope + rope);
    const int64_t kv_a = h * (m.kv_lora_rank + rope) + m.kv_lora_rank;  // + latent norm
    const int64_t kv_b = int64_t{m.kv_lora_rank} * H * (nope + vd);
    attn = q + kv_a + kv_b + H * vd * h;
  } else {
    attn = h * H * hd * (m.attn_output_gate ? 2 : 1) + h * kvh * hd + h * kvh * vd + H * vd * h;
    if (m.attn_bias) attn += H * hd + kvh * hd + kvh * vd;
    if (m.qk_norm) attn += 2 * hd;
  }
  // Hybrids: a recurrent layer has its own mixer instead of the attention.
  const int64_t rec_layers = m.num_recurrent_layers();
  const RecurrentShape& r = m.recurrent;
  int64_t mixer = 0;
  if (r.kind == RecurrentKind::kShortConv) {  // in_proj (B | C | x), out_proj, the taps of each channel
    mixer = 3 * h * r.channels + int64_t{r.channels} * h + int64_t{r.channels} * r.conv_kernel;
  } else if (r.kind == RecurrentKind::kGatedDeltaNet) {
    // qkv, z (gate), beta, alpha projections; conv taps of q | k | v; dt bias and A per v head;
    // the output norm (one head's S); out_proj.
    const int64_t S = r.head_dim, conv_dim = (2 * int64_t{r.k_heads} + r.v_heads) * S, vdim = int64_t{r.v_heads} * S;
    mixer = h * conv_dim + h * vdim + 2 * h * r.v_heads + conv_dim * r.conv_kernel + 2 * int64_t{r.v_heads} + S +
            vdim * h;
  } else if (r.kind == RecurrentKind::kMamba2) {
    // in_proj (z | x B C | dt), conv taps and bias, dt bias, A and D per head, the grouped norm, out_proj.
    const int64_t conv_dim = r.channels + 2 * int64_t{r.k_heads} * r.head_dim;
    mixer = h * (r.channels + conv_dim + r.v_heads) + conv_dim * (r.conv_kernel + 1) + 3 * int64_t{r.v_heads} +
            r.channels + int64_t{r.channels} * h;
  }
  const int64_t mixers = (L - rec_layers) * attn + rec_layers * mixer;
  const int64_t dense_layers = m.is_moe() ? m.first_dense_layers : L;
  const int64_t moe_layers = L - dense_layers;
  const int64_t dense_mlp = 3 * h * m.ffn;
  const int64_t expert = 3 * h * (m.moe_ffn > 0 ? m.moe_ffn : m.ffn);
  const int64_t router = h * m.num_experts;
  const int64_t moe_total = (int64_t{m.num_experts} + m.num_shared_experts) * expert + router;
  const int64_t moe_active = (int64_t{m.experts_per_token} + m.num_shared_experts) * expert + router;
  const int64_t embed = int64_t{m.vocab} * h * (m.tied_embeddings ? 1 : 2);
  const int64_t common = mixers + L * 2 * h + embed + h;
  ParamEstimate e;
  e.total = common + dense_layers * dense_mlp + moe_layers * moe_total;
  e.active = common + dense_layers * dense_mlp + moe_layers * moe_active;
  return e;
}

Status validate_model(const ModelDesc& m) {
  const std::string n = "model " + m.name;
  if (m.num_layers <= 0) return errorf("%s: layers must be positive (got %d)", n.c_str(), m.num_layers);
  if (m.hidden <= 0) return errorf("%s: hidden must be positive (got %d)", n.c_str(), m.hidden);
  if (m.num_heads <= 0) return errorf("%s: heads must be positive (got %d)", n.c_str(), m.num_heads);
  if (m.vocab <= 0) return errorf("%s: vocab must be positive (got %d)", n.c_str(), m.vocab);
  if (m.max_context <= 0) return errorf("%s: max_context must be positive (got %d)", n.c_str(), m.max_context);
  if (m.attention != kv::AttentionKind::kMLA) {
    if (m.num_kv_heads <= 0 || m.num_kv_heads > m.num_heads || m.num_heads % m.num_kv_heads != 0) {
      return errorf("%s: kv_heads %d must divide heads %d", n.c_str(), m.num_kv_heads, m.num_heads);
    }
  }
  if (m.is_moe() && (m.experts_per_token <= 0 || m.experts_per_token > m.num_experts)) {
    return errorf("%s: experts_per_token %d must be in [1, experts %d]", n.c_str(), m.experts_per_token,
                  m.num_experts);
  }
  if (m.params_total <= 0 || m.params_active <= 0 || m.params_active > m.params_total) {
    return errorf("%s: params %lld / active %lld must be positive with active <= total", n.c_str(),
                  static_cast<long long>(m.params_total), static_cast<long long>(m.params_active));
  }
  if (!m.recurrent_layers.empty()) {
    const int32_t rec = m.num_recurrent_layers();
    // Every layer recurrent: an attention-free model (mamba2); its pool keeps a token group of its own (kv/sizing.h).
    if (m.recurrent_layers.size() != static_cast<size_t>(m.num_layers) ||
        (rec == m.num_layers && m.recurrent.kind != RecurrentKind::kMamba2))
      return errorf("%s: recurrent layers must flag each of the %d layers and leave an attention layer", n.c_str(), m.num_layers);
    if ((rec > 0) != (m.state_rows > 0 && m.state_row_floats > 0))
      return errorf("%s: %d recurrent layers but a state of %lld rows of %d floats", n.c_str(), rec,
                    static_cast<long long>(m.state_rows), m.state_row_floats);
  } else if (m.state_rows != 0) {
    return errorf("%s: a recurrent state but no recurrent layer", n.c_str());
  }
  Status s = kv::validate_kv_shape(m.kv_shape());
  if (!s.ok()) return errorf("%s: %s", n.c_str(), s.message().c_str());
  return Status::Ok();
}

std::string data_dir() {
  if (const char* e = std::getenv("PAGODA_DATA_DIR"); e && *e) return e;
#ifdef PAGODA_SOURCE_DIR
  return std::string(PAGODA_SOURCE_DIR) + "/data";
#else
  return "data";
#endif
}

namespace {

kv::AttentionKind infer_kind(int32_t heads, int32_t kv_heads) {
  if (kv_heads == 1) return kv::AttentionKind::kMQA;
  if (kv_heads == heads) return kv::AttentionKind::kMHA;
  return kv::AttentionKind::kGQA;
}

// Fills params from the estimate when the source does not give them.
void fill_params(ModelDesc& m) {
  if (m.params_total > 0 && m.params_active > 0) return;
  const ParamEstimate e = estimate_params(m);
  if (m.params_total <= 0) m.params_total = e.total;
  if (m.params_active <= 0) m.params_active = m.is_moe() ? e.active : m.params_total;
}

// The int32 fields of a ModelDesc, with their names in models.json and in a
// Hugging Face config.json (nullptr: that reader handles the field by hand).
// One table for both readers, so a new field is one row. Defaults that depend on
// other fields (kv_heads: heads, head_dim: hidden / heads) need those fields
// earlier in the table. A defaulted field must be >= 1 unless it defaults to 0.
enum class Default : uint8_t { kRequired, kZero, kHeads, kHiddenPerHead, k2048 };
// Which fields a reader takes in one call (a bit set): the Hugging Face reader
// takes the MoE fields only for a MoE model and the MLA fields only with MLA.
enum Part : unsigned { kCore = 1, kMoe = 2, kMla = 4, kWindow = 8, kAll = 15 };
struct IntField {
  const char* preset_key;
  const char* hf_key;
  int32_t ModelDesc::*dst;
  Default preset_def;
  Default hf_def;
  Part part;
};
constexpr IntField kIntFields[] = {
    {"layers", "num_hidden_layers", &ModelDesc::num_layers, Default::kRequired, Default::kRequired, kCore},
    {"hidden", "hidden_size", &ModelDesc::hidden, Default::kRequired, Default::kRequired, kCore},
    {"heads", "num_attention_heads", &ModelDesc::num_heads, Default::kRequired, Default::kRequired, kCore},
    {"kv_heads", "num_key_value_heads", &ModelDesc::num_kv_heads, Default::kHeads, Default::kHeads, kCore},
    {"head_dim", "head_dim", &ModelDesc::head_dim, Default::kHiddenPerHead, Default::kHiddenPerHead, kCore},
    {"ffn", "intermediate_size", &ModelDesc::ffn, Default::kZero, Default::kZero, kCore},
    {"vocab", "vocab_size", &ModelDesc::vocab, Default::kRequired, Default::kRequired, kCore},
    {"max_context", "max_position_embeddings", &ModelDesc::max_context, Default::kRequired, Default::k2048, kCore},
    {"kv_lora_rank", "kv_lora_rank", &ModelDesc::kv_lora_rank, Default::kZero, Default::kZero, kCore},
    {"experts", nullptr, &ModelDesc::num_experts, Default::kZero, Default::kZero, kMoe},
    {"shared_experts", "n_shared_experts", &ModelDesc::num_shared_experts, Default::kZero, Default::kZero, kMoe},
    {"experts_per_token", "num_experts_per_tok", &ModelDesc::experts_per_token, Default::kZero, Default::kZero, kMoe},
    {"moe_ffn", "moe_intermediate_size", &ModelDesc::moe_ffn, Default::kZero, Default::kZero, kMoe},
    {"first_dense_layers", "first_k_dense_replace", &ModelDesc::first_dense_layers, Default::kZero, Default::kZero,
     kMoe},
    {"v_head_dim", "v_head_dim", &ModelDesc::v_head_dim, Default::kZero, Default::kZero, kMla},
    {"q_lora_rank", "q_lora_rank", &ModelDesc::q_lora_rank, Default::kZero, Default::kZero, kMla},
    {"qk_rope_head_dim", "qk_rope_head_dim", &ModelDesc::qk_rope_head_dim, Default::kZero, Default::kZero, kMla},
    {"qk_nope_head_dim", "qk_nope_head_dim", &ModelDesc::qk_nope_head_dim, Default::kZero, Default::kZero, kMla},
    {"sliding_window", nullptr, &ModelDesc::sliding_window, Default::kZero, Default::kZero, kWindow},
    {"swa_period", nullptr, &ModelDesc::swa_period, Default::kZero, Default::kZero, kWindow},
};

constexpr int64_t kI32 = INT32_MAX;

// Reads the table's fields of `parts` from `o` into m, by the preset or the HF names.
Status read_int_fields(const json& o, const std::string& ctx, bool hf, unsigned parts, ModelDesc& m) {
  for (const IntField& f : kIntFields) {
    const char* key = hf ? f.hf_key : f.preset_key;
    if (!(f.part & parts) || key == nullptr) continue;
    const Default d = hf ? f.hf_def : f.preset_def;
    int64_t v = 0;
    if (d == Default::kRequired) {
      PAGODA_ASSIGN_OR_RETURN(v, detail::get_required_int(o, key, ctx, 1, kI32));
    } else {
      const int64_t def = d == Default::kHeads           ? m.num_heads
                          : d == Default::kHiddenPerHead ? m.hidden / m.num_heads
                          : d == Default::k2048          ? 2048
                                                         : 0;
      PAGODA_ASSIGN_OR_RETURN(v, detail::get_int(o, key, def, ctx, d == Default::kZero ? 0 : 1, kI32));
    }
    m.*f.dst = static_cast<int32_t>(v);
  }
  return Status::Ok();
}

// Flags the layers from a list of layer kinds ("layer_types" of a Hugging Face
// config): `recurrent_kind` marks a recurrent layer, "full_attention" an attention one.
Status layers_from_types(const json& types, const std::string& ctx, const char* recurrent_kind, ModelDesc& m) {
  if (!types.is_array() || types.size() != static_cast<size_t>(m.num_layers))
    return errorf("%s: layer_types must list the kind of each of the %d layers", ctx.c_str(), m.num_layers);
  m.recurrent_layers.assign(static_cast<size_t>(m.num_layers), false);
  for (size_t l = 0; l < types.size(); ++l) {
    const std::string t = types[l].is_string() ? types[l].get<std::string>() : "";
    if (t != recurrent_kind && t != "full_attention")
      return errorf("%s: layer_types[%zu] is '%s' (expected \"%s\" or \"full_attention\")", ctx.c_str(), l,
                    types[l].dump().c_str(), recurrent_kind);
    m.recurrent_layers[l] = t == recurrent_kind;
  }
  return Status::Ok();
}

// Flags every layer recurrent but those listed (indices of the attention layers).
Status layers_from_attention_list(const json& idx, const std::string& ctx, const char* key, ModelDesc& m) {
  if (!idx.is_array()) return errorf("%s: %s must be an array of layer indices", ctx.c_str(), key);
  m.recurrent_layers.assign(static_cast<size_t>(m.num_layers), true);
  for (const auto& v : idx) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= m.num_layers)
      return errorf("%s: %s: %s is not a layer index below %d", ctx.c_str(), key, v.dump().c_str(), m.num_layers);
    m.recurrent_layers[static_cast<size_t>(v.get<int64_t>())] = false;
  }
  return Status::Ok();
}

// Every layer but each interval-th (1-based) is recurrent (Qwen3.5's full_attention_interval).
void layers_from_interval(int64_t interval, ModelDesc& m) {
  m.recurrent_layers.assign(static_cast<size_t>(m.num_layers), false);
  for (int64_t l = 0; l < m.num_layers; ++l) m.recurrent_layers[static_cast<size_t>(l)] = (l + 1) % interval != 0;
}

// A preset's recurrent shape (data/models.json): "recurrent" "short_conv" (lfm2),
// "gated_delta_net" (qwen35) or "mamba2" (every layer; "ssm_inner", "ssm_groups",
// "ssm_heads", "ssm_state"), "attention_layers" (the attention layers'
// indices) or "full_attention_interval", "conv_kernel", and for a Gated
// DeltaNet "linear_k_heads", "linear_v_heads", "linear_head_dim".
Status read_preset_recurrent(const json& o, const std::string& ctx, ModelDesc& m) {
  PAGODA_ASSIGN_OR_RETURN(const std::string kind, detail::get_string(o, "recurrent", "", ctx));
  m.attn_output_gate = detail::get_bool(o, "attn_output_gate", false);
  m.qk_norm = detail::get_bool(o, "qk_norm", false);
  if (kind.empty()) return Status::Ok();
  if (kind != "short_conv" && kind != "gated_delta_net" && kind != "mamba2")
    return errorf("%s: recurrent '%s' (expected short_conv, gated_delta_net or mamba2)", ctx.c_str(), kind.c_str());
  if (kind == "mamba2") {  // every layer (no attention); heads / kv_heads / head_dim lay out the pool's token rows
    PAGODA_ASSIGN_OR_RETURN(const int64_t k, detail::get_required_int(o, "conv_kernel", ctx, 2, 64));
    PAGODA_ASSIGN_OR_RETURN(const int64_t inner, detail::get_required_int(o, "ssm_inner", ctx, 1, kI32));
    PAGODA_ASSIGN_OR_RETURN(const int64_t groups, detail::get_required_int(o, "ssm_groups", ctx, 1, 1024));
    PAGODA_ASSIGN_OR_RETURN(const int64_t heads, detail::get_required_int(o, "ssm_heads", ctx, 1, 65536));
    PAGODA_ASSIGN_OR_RETURN(const int64_t state, detail::get_required_int(o, "ssm_state", ctx, 1, 1024));
    if (inner % state != 0 || m.num_heads != 1 || m.num_kv_heads != 1 || m.head_dim != state)
      return errorf("%s: mamba2 needs ssm_inner a multiple of ssm_state, and heads 1, kv_heads 1, head_dim ssm_state "
                    "(the pool's token rows, a state row wide)", ctx.c_str());
    m.recurrent_layers.assign(static_cast<size_t>(m.num_layers), true);
    m.recurrent = {.kind = RecurrentKind::kMamba2, .conv_kernel = static_cast<int32_t>(k),
                   .channels = static_cast<int32_t>(inner), .k_heads = static_cast<int32_t>(groups),
                   .v_heads = static_cast<int32_t>(heads), .head_dim = static_cast<int32_t>(state)};
    return set_recurrent_state(m);
  }
  if (o.contains("attention_layers")) {
    PAGODA_TRY(layers_from_attention_list(o["attention_layers"], ctx, "attention_layers", m));
  } else {
    PAGODA_ASSIGN_OR_RETURN(const int64_t interval,
                            detail::get_required_int(o, "full_attention_interval", ctx, 1, m.num_layers));
    layers_from_interval(interval, m);
  }
  PAGODA_ASSIGN_OR_RETURN(const int64_t k, detail::get_required_int(o, "conv_kernel", ctx, 2, 64));
  if (kind == "short_conv") {
    m.recurrent = {.kind = RecurrentKind::kShortConv, .conv_kernel = static_cast<int32_t>(k), .channels = m.hidden};
  } else {
    PAGODA_ASSIGN_OR_RETURN(const int64_t kh, detail::get_required_int(o, "linear_k_heads", ctx, 1, 1024));
    PAGODA_ASSIGN_OR_RETURN(const int64_t vh, detail::get_required_int(o, "linear_v_heads", ctx, 1, 1024));
    PAGODA_ASSIGN_OR_RETURN(const int64_t hd, detail::get_required_int(o, "linear_head_dim", ctx, 1, 1024));
    m.recurrent = {.kind = RecurrentKind::kGatedDeltaNet, .conv_kernel = static_cast<int32_t>(k),
                   .k_heads = static_cast<int32_t>(kh), .v_heads = static_cast<int32_t>(vh),
                   .head_dim = static_cast<int32_t>(hd)};
  }
  return set_recurrent_state(m);
}

// The recurrent layers of a Hugging Face config, as transformers reads them:
//  - LFM2 (model_type "lfm2", layer_types "conv" / "full_attention", or the older
//    full_attn_idxs): short convolutions of conv_L_cache taps over hidden_size
//    channels. Its MLP width is block_ff_dim (else intermediate_size), which
//    block_auto_adjust_ff_dim (default true) turns into int(2/3 x width) x
//    block_ffn_dim_multiplier rounded up to block_multiple_of (Lfm2MLP); the
//    output is tied unless tie_embedding / tie_word_embeddings says otherwise.
//  - Qwen3.5 (model_type "qwen3_5" with a text_config "qwen3_5_text", the MoE
//    "qwen3_5_moe", "qwen3_next", or any config whose layer_types hold
//    "linear_attention"): Gated DeltaNet layers of linear_num_key_heads /
//    linear_num_value_heads heads of linear_key_head_dim (= linear_value_head_dim)
//    with a convolution of linear_conv_kernel_dim taps; layer_types, else every
//    full_attention_interval-th (default 4) layer is a full-attention one, gated
//    (attn_output_gate, default true).
Status read_hf_recurrent(const json& o, const json& top, const std::string& ctx, ModelDesc& m) {
  const auto lt = o.find("layer_types");
  const bool has_types = lt != o.end() && lt->is_array();
  const auto lists = [&](const char* kind) {
    if (!has_types) return false;
    for (const auto& t : *lt)
      if (t.is_string() && t.get<std::string>() == kind) return true;
    return false;
  };
  const std::string& a = m.arch;
  const bool lfm2 = a == "lfm2" || lists("conv");
  const bool gdn = a == "qwen3_5" || a == "qwen3_5_text" || a == "qwen3_5_moe" || a == "qwen3_5_moe_text" ||
                   a == "qwen3_next" || lists("linear_attention");
  if (!lfm2 && !gdn) return Status::Ok();
  m.qk_norm = true;
  if (lfm2) {
    m.arch = "lfm2";
    if (has_types) {
      PAGODA_TRY(layers_from_types(*lt, ctx, "conv", m));
    } else if (o.contains("full_attn_idxs")) {
      PAGODA_TRY(layers_from_attention_list(o["full_attn_idxs"], ctx, "full_attn_idxs", m));
    } else {
      return errorf("%s: layer_types is missing (lfm2 needs the kind of each layer, or full_attn_idxs)", ctx.c_str());
    }
    PAGODA_ASSIGN_OR_RETURN(const int64_t l_cache, detail::get_required_int(o, "conv_L_cache", ctx, 2, 64));
    m.recurrent = {.kind = RecurrentKind::kShortConv, .conv_kernel = static_cast<int32_t>(l_cache), .channels = m.hidden};
    m.tied_embeddings = detail::get_bool(o, "tie_embedding", detail::get_bool(o, "tie_word_embeddings", true));
    PAGODA_ASSIGN_OR_RETURN(int64_t ff, detail::get_int(o, "block_ff_dim", m.ffn, ctx, 0, kI32));
    if (detail::get_bool(o, "block_auto_adjust_ff_dim", true)) {
      ff = 2 * ff / 3;
      PAGODA_ASSIGN_OR_RETURN(const double mult, detail::get_number(o, "block_ffn_dim_multiplier", 1.0, ctx));
      ff = static_cast<int64_t>(mult * static_cast<double>(ff));
      PAGODA_ASSIGN_OR_RETURN(const int64_t mo, detail::get_int(o, "block_multiple_of", 256, ctx, 1, kI32));
      ff = mo * ((ff + mo - 1) / mo);
    }
    m.ffn = static_cast<int32_t>(std::min<int64_t>(ff, kI32));
  } else {
    m.arch = "qwen35";
    if (has_types) {
      PAGODA_TRY(layers_from_types(*lt, ctx, "linear_attention", m));
    } else {
      PAGODA_ASSIGN_OR_RETURN(const int64_t interval,
                              detail::get_int(o, "full_attention_interval", 4, ctx, 1, m.num_layers));
      layers_from_interval(interval, m);
    }
    PAGODA_ASSIGN_OR_RETURN(const int64_t k, detail::get_required_int(o, "linear_conv_kernel_dim", ctx, 2, 64));
    PAGODA_ASSIGN_OR_RETURN(const int64_t kh, detail::get_required_int(o, "linear_num_key_heads", ctx, 1, 1024));
    PAGODA_ASSIGN_OR_RETURN(const int64_t vh, detail::get_required_int(o, "linear_num_value_heads", ctx, 1, 1024));
    PAGODA_ASSIGN_OR_RETURN(const int64_t dk, detail::get_required_int(o, "linear_key_head_dim", ctx, 1, 1024));
    PAGODA_ASSIGN_OR_RETURN(const int64_t dv, detail::get_required_int(o, "linear_value_head_dim", ctx, 1, 1024));
    if (dk != dv)
      return errorf("%s: linear_key_head_dim %lld and linear_value_head_dim %lld differ (the state keeps rows of one head dim)",
                    ctx.c_str(), static_cast<long long>(dk), static_cast<long long>(dv));
    if (vh % kh != 0)
      return errorf("%s: linear_num_value_heads %lld must be a multiple of linear_num_key_heads %lld", ctx.c_str(),
                    static_cast<long long>(vh), static_cast<long long>(kh));
    m.recurrent = {.kind = RecurrentKind::kGatedDeltaNet, .conv_kernel = static_cast<int32_t>(k),
                   .k_heads = static_cast<int32_t>(kh), .v_heads = static_cast<int32_t>(vh),
                   .head_dim = static_cast<int32_t>(dk)};
    m.attn_output_gate = detail::get_bool(o, "attn_output_gate", detail::get_bool(top, "attn_output_gate", true));
  }
  return set_recurrent_state(m);
}

Expected<ModelDesc> preset_from_json(const std::string& name, const json& o) {
  const std::string ctx = "models.json " + name;
  ModelDesc m;
  m.name = name;
  m.source = "preset";
  PAGODA_ASSIGN_OR_RETURN(m.arch, detail::get_string(o, "arch", "llama", ctx));
  PAGODA_TRY(read_int_fields(o, ctx, /*hf=*/false, kAll, m));
  PAGODA_ASSIGN_OR_RETURN(m.params_total, detail::get_int(o, "params", 0, ctx, 0));
  PAGODA_ASSIGN_OR_RETURN(m.params_active, detail::get_int(o, "params_active", m.params_total, ctx, 0));
  PAGODA_ASSIGN_OR_RETURN(std::string kind, detail::get_string(o, "attention", "", ctx));
  m.tied_embeddings = detail::get_bool(o, "tied_embeddings", false);
  m.attn_bias = detail::get_bool(o, "attn_bias", false);
  if (kind.empty()) {
    m.attention = m.kv_lora_rank > 0 ? kv::AttentionKind::kMLA : infer_kind(m.num_heads, m.num_kv_heads);
  } else {
    PAGODA_ASSIGN_OR_RETURN(m.attention, kv::parse_attention_kind(kind));
  }
  PAGODA_TRY(read_preset_recurrent(o, ctx, m));
  fill_params(m);
  PAGODA_TRY(validate_model(m));
  return m;
}

}  // namespace

std::vector<std::string> list_model_presets() { return detail::list_entries("models.json", "models"); }

Expected<ModelDesc> load_model_preset(const std::string& name) {
  PAGODA_ASSIGN_OR_RETURN(detail::Entry e, detail::find_entry("models.json", "models", name, "model preset"));
  return preset_from_json(e.key, e.obj);
}

Expected<ModelDesc> load_hf_config(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(json top, detail::read_json_file(path));
  if (!top.is_object()) return errorf("%s: expected a JSON object", path.c_str());
  // Multimodal configs (Gemma 3, Llama 4, ...) nest the decoder in text_config.
  const json& o = top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  const std::string ctx = path;
  ModelDesc m;
  m.source = "hf-config:" + path;
  PAGODA_ASSIGN_OR_RETURN(std::string name_or_path, detail::get_string(top, "_name_or_path", "", ctx));
  if (!name_or_path.empty()) {
    m.name = std::filesystem::path(name_or_path).filename().string();
  } else {
    const auto parent = std::filesystem::path(path).parent_path().filename().string();
    m.name = parent.empty() ? std::filesystem::path(path).stem().string() : parent;
  }
  PAGODA_ASSIGN_OR_RETURN(std::string top_type, detail::get_string(top, "model_type", "", ctx));
  PAGODA_ASSIGN_OR_RETURN(m.arch, detail::get_string(o, "model_type", top_type, ctx));
  PAGODA_TRY(read_int_fields(o, ctx, /*hf=*/true, kCore, m));
  m.tied_embeddings = detail::get_bool(o, "tie_word_embeddings", detail::get_bool(top, "tie_word_embeddings", false));
  m.attn_bias = detail::get_bool(o, "attention_bias", m.arch == "qwen2" || m.arch == "qwen2_moe");

  // Hybrids (LFM2, Qwen3.5): which layers are recurrent, and their state.
  PAGODA_TRY(read_hf_recurrent(o, top, ctx, m));

  // Mixture of experts: Mixtral (num_local_experts), DeepSeek (n_routed_experts), Qwen-MoE (num_experts).
  PAGODA_ASSIGN_OR_RETURN(int64_t e1, detail::get_int(o, "num_local_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t e2, detail::get_int(o, "n_routed_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t e3, detail::get_int(o, "num_experts", 0, ctx, 0, kI32));
  m.num_experts = static_cast<int32_t>(e1 > 0 ? e1 : e2 > 0 ? e2 : e3);
  if (m.num_experts > 0) PAGODA_TRY(read_int_fields(o, ctx, /*hf=*/true, kMoe, m));

  // MLA (DeepSeek-V2/V3): kv_lora_rank present.
  if (m.kv_lora_rank > 0) {
    m.attention = kv::AttentionKind::kMLA;
    PAGODA_TRY(read_int_fields(o, ctx, /*hf=*/true, kMla, m));
    if (m.qk_nope_head_dim + m.qk_rope_head_dim > 0) m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  } else {
    m.attention = infer_kind(m.num_heads, m.num_kv_heads);
  }

  // Sliding window. Qwen2 configs carry a window with use_sliding_window = false.
  PAGODA_ASSIGN_OR_RETURN(int64_t window, detail::get_int(o, "sliding_window", 0, ctx, 0, kI32));
  if (window > 0 && detail::get_bool(o, "use_sliding_window", true) && window < m.max_context) {
    m.sliding_window = static_cast<int32_t>(window);
    PAGODA_ASSIGN_OR_RETURN(int64_t period, detail::get_int(o, "sliding_window_pattern", 0, ctx, 0, kI32));
    if (period == 0 && m.arch == "gemma2") period = 2;
    if (period == 0 && (m.arch == "gemma3" || m.arch == "gemma3_text")) period = 6;
    // Newer configs list every layer: "sliding_attention" / "full_attention".
    auto lt = o.find("layer_types");
    if (lt != o.end() && lt->is_array() && !lt->empty()) {
      int64_t first_full = -1, i = 0;
      for (const auto& t : *lt) {
        if (t.is_string() && t.get<std::string>() == "full_attention") { first_full = i; break; }
        ++i;
      }
      period = first_full < 0 ? 0 : first_full + 1;
    }
    m.swa_period = static_cast<int32_t>(period);
  }
  fill_params(m);
  PAGODA_TRY(validate_model(m));
  return m;
}

Expected<ModelDesc> resolve_model(const std::string& spec) {
  const std::string l = detail::lower(spec);
  auto ends_with = [&](const char* suf) {
    const std::string s(suf);
    return l.size() >= s.size() && l.compare(l.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".gguf")) return load_gguf_model(spec);
  if (ends_with(".json")) return load_hf_config(spec);
  if (std::filesystem::is_directory(spec) && std::filesystem::exists(spec + "/config.json")) {
    return load_hf_config(spec + "/config.json");
  }
  return load_model_preset(spec);
}

}  // namespace pagoda::sim
