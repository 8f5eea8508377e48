#include "sim/model_desc.h"

#include <cstdlib>
#include <filesystem>

#include "sim/json_util.h"

namespace pagoda::sim {

using detail::json;

kv::KvShape ModelDesc::kv_shape() const {
  kv::KvShape s;
  s.kind = attention;
  s.num_layers = num_layers;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.v_head_dim = v_head_dim;
  s.kv_lora_rank = kv_lora_rank;
  s.qk_rope_head_dim = qk_rope_head_dim;
  s.sliding_window = sliding_window;
  s.swa_period = swa_period;
  return s;
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

Expected<json> load_models_json() {
  const std::string path = data_dir() + "/models.json";
  PAGODA_ASSIGN_OR_RETURN(json j, detail::read_json_file(path));
  if (!j.is_object() || !j.contains("models") || !j["models"].is_object()) {
    return errorf("%s: expected an object with a \"models\" object", path.c_str());
  }
  return j;
}

Expected<ModelDesc> preset_from_json(const std::string& name, const json& o) {
  const std::string ctx = "models.json " + name;
  constexpr int64_t kI32 = INT32_MAX;
  ModelDesc m;
  m.name = name;
  m.source = "preset";
  PAGODA_ASSIGN_OR_RETURN(m.arch, detail::get_string(o, "arch", "llama", ctx));
  PAGODA_ASSIGN_OR_RETURN(int64_t layers, detail::get_required_int(o, "layers", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t hidden, detail::get_required_int(o, "hidden", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t heads, detail::get_required_int(o, "heads", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t kv_heads, detail::get_int(o, "kv_heads", heads, ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t head_dim, detail::get_int(o, "head_dim", hidden / heads, ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t v_head_dim, detail::get_int(o, "v_head_dim", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t ffn, detail::get_int(o, "ffn", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t vocab, detail::get_required_int(o, "vocab", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t max_ctx, detail::get_required_int(o, "max_context", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t experts, detail::get_int(o, "experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t shared, detail::get_int(o, "shared_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t topk, detail::get_int(o, "experts_per_token", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t moe_ffn, detail::get_int(o, "moe_ffn", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t first_dense, detail::get_int(o, "first_dense_layers", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t window, detail::get_int(o, "sliding_window", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t period, detail::get_int(o, "swa_period", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t kv_lora, detail::get_int(o, "kv_lora_rank", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t q_lora, detail::get_int(o, "q_lora_rank", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t rope, detail::get_int(o, "qk_rope_head_dim", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t nope, detail::get_int(o, "qk_nope_head_dim", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t params, detail::get_int(o, "params", 0, ctx, 0));
  PAGODA_ASSIGN_OR_RETURN(int64_t active, detail::get_int(o, "params_active", params, ctx, 0));
  PAGODA_ASSIGN_OR_RETURN(std::string kind, detail::get_string(o, "attention", "", ctx));
  m.num_layers = static_cast<int32_t>(layers);
  m.hidden = static_cast<int32_t>(hidden);
  m.num_heads = static_cast<int32_t>(heads);
  m.num_kv_heads = static_cast<int32_t>(kv_heads);
  m.head_dim = static_cast<int32_t>(head_dim);
  m.v_head_dim = static_cast<int32_t>(v_head_dim);
  m.ffn = static_cast<int32_t>(ffn);
  m.vocab = static_cast<int32_t>(vocab);
  m.max_context = static_cast<int32_t>(max_ctx);
  m.num_experts = static_cast<int32_t>(experts);
  m.num_shared_experts = static_cast<int32_t>(shared);
  m.experts_per_token = static_cast<int32_t>(topk);
  m.moe_ffn = static_cast<int32_t>(moe_ffn);
  m.first_dense_layers = static_cast<int32_t>(first_dense);
  m.sliding_window = static_cast<int32_t>(window);
  m.swa_period = static_cast<int32_t>(period);
  m.kv_lora_rank = static_cast<int32_t>(kv_lora);
  m.q_lora_rank = static_cast<int32_t>(q_lora);
  m.qk_rope_head_dim = static_cast<int32_t>(rope);
  m.qk_nope_head_dim = static_cast<int32_t>(nope);
  m.tied_embeddings = detail::get_bool(o, "tied_embeddings", false);
  m.attn_bias = detail::get_bool(o, "attn_bias", false);
  m.params_total = params;
  m.params_active = active;
  if (kind.empty()) {
    m.attention = kv_lora > 0 ? kv::AttentionKind::kMLA : infer_kind(m.num_heads, m.num_kv_heads);
  } else {
    PAGODA_ASSIGN_OR_RETURN(m.attention, kv::parse_attention_kind(kind));
  }
  fill_params(m);
  PAGODA_TRY(validate_model(m));
  return m;
}

}  // namespace

std::vector<std::string> list_model_presets() {
  std::vector<std::string> names;
  auto j = load_models_json();
  if (!j.ok()) return names;
  for (auto it = j.value()["models"].begin(); it != j.value()["models"].end(); ++it) names.push_back(it.key());
  return names;
}

Expected<ModelDesc> load_model_preset(const std::string& name) {
  PAGODA_ASSIGN_OR_RETURN(json j, load_models_json());
  std::vector<std::string> names;
  for (auto it = j["models"].begin(); it != j["models"].end(); ++it) names.push_back(it.key());
  PAGODA_ASSIGN_OR_RETURN(std::string key, detail::match_name(names, name, "model preset"));
  const json& o = j["models"][key];
  if (!o.is_object()) return errorf("models.json %s: expected an object", key.c_str());
  return preset_from_json(key, o);
}

Expected<ModelDesc> load_hf_config(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(json top, detail::read_json_file(path));
  if (!top.is_object()) return errorf("%s: expected a JSON object", path.c_str());
  // Multimodal configs (Gemma 3, Llama 4, ...) nest the decoder in text_config.
  const json& o = top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  const std::string ctx = path;
  constexpr int64_t kI32 = INT32_MAX;
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
  PAGODA_ASSIGN_OR_RETURN(int64_t layers, detail::get_required_int(o, "num_hidden_layers", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t hidden, detail::get_required_int(o, "hidden_size", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t heads, detail::get_required_int(o, "num_attention_heads", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t kv_heads, detail::get_int(o, "num_key_value_heads", heads, ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t head_dim, detail::get_int(o, "head_dim", hidden / heads, ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t ffn, detail::get_int(o, "intermediate_size", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t vocab, detail::get_required_int(o, "vocab_size", ctx, 1, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t max_ctx, detail::get_int(o, "max_position_embeddings", 2048, ctx, 1, kI32));
  m.num_layers = static_cast<int32_t>(layers);
  m.hidden = static_cast<int32_t>(hidden);
  m.num_heads = static_cast<int32_t>(heads);
  m.num_kv_heads = static_cast<int32_t>(kv_heads);
  m.head_dim = static_cast<int32_t>(head_dim);
  m.ffn = static_cast<int32_t>(ffn);
  m.vocab = static_cast<int32_t>(vocab);
  m.max_context = static_cast<int32_t>(max_ctx);
  m.tied_embeddings = detail::get_bool(o, "tie_word_embeddings", detail::get_bool(top, "tie_word_embeddings", false));
  m.attn_bias = detail::get_bool(o, "attention_bias", m.arch == "qwen2" || m.arch == "qwen2_moe");

  // Mixture of experts: Mixtral (num_local_experts), DeepSeek (n_routed_experts), Qwen-MoE (num_experts).
  PAGODA_ASSIGN_OR_RETURN(int64_t e1, detail::get_int(o, "num_local_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t e2, detail::get_int(o, "n_routed_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t e3, detail::get_int(o, "num_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t topk, detail::get_int(o, "num_experts_per_tok", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t shared, detail::get_int(o, "n_shared_experts", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t moe_ffn, detail::get_int(o, "moe_intermediate_size", 0, ctx, 0, kI32));
  PAGODA_ASSIGN_OR_RETURN(int64_t first_dense, detail::get_int(o, "first_k_dense_replace", 0, ctx, 0, kI32));
  m.num_experts = static_cast<int32_t>(e1 > 0 ? e1 : e2 > 0 ? e2 : e3);
  if (m.num_experts > 0) {
    m.experts_per_token = static_cast<int32_t>(topk);
    m.num_shared_experts = static_cast<int32_t>(shared);
    m.moe_ffn = static_cast<int32_t>(moe_ffn);
    m.first_dense_layers = static_cast<int32_t>(first_dense);
  }

  // MLA (DeepSeek-V2/V3): kv_lora_rank present.
  PAGODA_ASSIGN_OR_RETURN(int64_t kv_lora, detail::get_int(o, "kv_lora_rank", 0, ctx, 0, kI32));
  if (kv_lora > 0) {
    PAGODA_ASSIGN_OR_RETURN(int64_t rope, detail::get_int(o, "qk_rope_head_dim", 0, ctx, 0, kI32));
    PAGODA_ASSIGN_OR_RETURN(int64_t nope, detail::get_int(o, "qk_nope_head_dim", 0, ctx, 0, kI32));
    PAGODA_ASSIGN_OR_RETURN(int64_t vd, detail::get_int(o, "v_head_dim", 0, ctx, 0, kI32));
    PAGODA_ASSIGN_OR_RETURN(int64_t q_lora, detail::get_int(o, "q_lora_rank", 0, ctx, 0, kI32));
    m.attention = kv::AttentionKind::kMLA;
    m.kv_lora_rank = static_cast<int32_t>(kv_lora);
    m.qk_rope_head_dim = static_cast<int32_t>(rope);
    m.qk_nope_head_dim = static_cast<int32_t>(nope);
    m.v_head_dim = static_cast<int32_t>(vd);
    m.q_lora_rank = static_cast<int32_t>(q_lora);
    if (nope + rope > 0) m.head_dim = static_cast<int32_t>(nope + rope);
  } else {
    m.attention = infer_kind(m.num_heads, m.num_kv_heads);
  }

  // Sliding window. Qwen2 configs carry a window with use_sliding_window = false.
  PAGODA_ASSIGN_OR_RETURN(int64_t window, detail::get_int(o, "sliding_window", 0, ctx, 0, kI32));
  if (window > 0 && detail::get_bool(o, "use_sliding_window", true) && window < max_ctx) {
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
