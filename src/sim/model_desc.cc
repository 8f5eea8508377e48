#include "sim/model_desc.h"

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
    attn = h * H * hd + h * kvh * hd + h * kvh * vd + H * vd * h;
    if (m.attn_bias) attn += H * hd + kvh * hd + kvh * vd;
  }
  const int64_t dense_layers = m.is_moe() ? m.first_dense_layers : L;
  const int64_t moe_layers = L - dense_layers;
  const int64_t dense_mlp = 3 * h * m.ffn;
  const int64_t expert = 3 * h * (m.moe_ffn > 0 ? m.moe_ffn : m.ffn);
  const int64_t router = h * m.num_experts;
  const int64_t moe_total = (int64_t{m.num_experts} + m.num_shared_experts) * expert + router;
  const int64_t moe_active = (int64_t{m.experts_per_token} + m.num_shared_experts) * expert + router;
  const int64_t embed = int64_t{m.vocab} * h * (m.tied_embeddings ? 1 : 2);
  const int64_t common = L * (attn + 2 * h) + embed + h;
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
    if (m.recurrent_layers.size() != static_cast<size_t>(m.num_layers) || rec == m.num_layers)
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

// Reads the table's fields of `parts` from `o` into m, by the preset or the HF names.
Status read_int_fields(const json& o, const std::string& ctx, bool hf, unsigned parts, ModelDesc& m) {
  constexpr int64_t kI32 = INT32_MAX;
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

  // Mixture of experts: Mixtral (num_local_experts), DeepSeek (n_routed_experts), Qwen-MoE (num_experts).
  constexpr int64_t kI32 = INT32_MAX;
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
