// What capacity planning and simulation need to know about a model: its shape,
// parameter counts and attention kind. Loaded from a preset name
// (data/models.json), a Hugging Face config.json, or a GGUF file's metadata.
// Never the weights: sim/ plans for hardware and models that are not here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/recurrent_state.h"
#include "base/status.h"
#include "kv/sizing.h"

namespace pagoda::sim {

struct ModelDesc {
  std::string name;
  std::string source;            // "preset", "hf-config:<path>" or "gguf:<path>"
  std::string arch;              // llama, mistral, qwen2, gemma3, deepseek2, ...
  int32_t num_layers = 0;
  int32_t hidden = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;          // K/Q head dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
  int32_t v_head_dim = 0;        // 0 = head_dim
  int32_t ffn = 0;               // dense MLP width
  int32_t vocab = 0;
  int32_t max_context = 0;
  bool tied_embeddings = false;
  bool attn_bias = false;        // q/k/v projections carry biases (qwen2)
  // Mixture of experts (num_experts == 0: dense).
  int32_t num_experts = 0;
  int32_t num_shared_experts = 0;
  int32_t experts_per_token = 0;
  int32_t moe_ffn = 0;           // one expert's MLP width; 0 = ffn
  int32_t first_dense_layers = 0;  // leading layers with a dense MLP (DeepSeek)
  // Attention as the KV cache sees it.
  kv::AttentionKind attention = kv::AttentionKind::kGQA;
  int32_t sliding_window = 0;    // see kv::KvShape
  int32_t swa_period = 0;
  int32_t kv_lora_rank = 0;      // MLA
  int32_t q_lora_rank = 0;       // MLA (0: full-rank Q projection)
  int32_t qk_rope_head_dim = 0;  // MLA
  int32_t qk_nope_head_dim = 0;  // MLA
  // Hybrid models (lfm2, qwen35; a preset, a Hugging Face config or a GGUF):
  // the recurrent layers hold no K/V but a fixed-size state per sequence,
  // state_rows f32 rows of state_row_floats, kept in the KV pool's blocks
  // (kv::PoolRequest::state_rows). The rows follow from `recurrent` and the
  // recurrent layers' count by base/recurrent_state.h, the formula
  // model/lfm2.cc and model/qwen35.cc use (set_recurrent_state fills them).
  // Empty / 0 / kNone: no recurrent layer.
  std::vector<bool> recurrent_layers;  // [num_layers] or empty
  RecurrentShape recurrent;
  int64_t state_rows = 0;
  int32_t state_row_floats = 0;
  // Attention details of the hybrids (parameter counts only): qwen35's attn_q
  // also gives a sigmoid gate per head (q | gate); per-head RMSNorm of q and k.
  bool attn_output_gate = false;
  bool qk_norm = false;
  // Parameter counts: total, and touched per token (MoE); 0 = unknown (estimate_params fills them).
  int64_t params_total = 0;
  int64_t params_active = 0;
  // Bytes of all weight tensors in the file the desc was read from (GGUF only; 0 otherwise).
  uint64_t weights_file_bytes = 0;
  // Of those, token_embd.weight and output.weight (0 when absent: tied, or not a GGUF).
  // GGUF files often store these at another type than the rest (Q6_K, Q8_0).
  uint64_t embed_file_bytes = 0;
  uint64_t output_file_bytes = 0;

  // The attention as the KV cache stores it: the layers that hold K/V
  // (num_layers less the recurrent ones).
  kv::KvShape kv_shape() const;
  int32_t num_recurrent_layers() const;
  // One sequence's recurrent state: state_rows x state_row_floats x 4 bytes (0: none).
  uint64_t state_bytes() const { return static_cast<uint64_t>(state_rows) * static_cast<uint64_t>(state_row_floats) * 4; }
  // The share of that state one of tp tensor-parallel ranks keeps (base/recurrent_state.h:
  // channels / heads split as vLLM splits them; an error when they do not divide).
  Expected<StateRows> state_on_rank(int32_t tp) const;
  // [num_layers] as kv::PoolRequest::layer_windows takes them: kv::kStateWindow
  // for a recurrent layer, else the attention layer's window (0: full context).
  std::vector<int32_t> layer_windows() const;
  bool is_moe() const { return num_experts > 0; }
  // Parameters of the output head (vocab x hidden): one matmul per logits row.
  int64_t head_params() const { return int64_t{vocab} * hidden; }
};

struct ParamEstimate {
  int64_t total = 0;
  int64_t active = 0;
};
// Parameter counts from the shape (embeddings, attention incl. MLA projections,
// gated MLPs / experts + router, norms). Matches the published counts of the
// presets within 0.1% (tests/sim pin this).
ParamEstimate estimate_params(const ModelDesc& m);

// Checks the fields are positive and consistent; names the bad field.
Status validate_model(const ModelDesc& m);

// Sets state_rows / state_row_floats from recurrent_layers and `recurrent` (the
// whole state, tp 1); a model whose state comes to no row is left with none.
Status set_recurrent_state(ModelDesc& m);

// The data directory: $PAGODA_DATA_DIR if set, else <source tree>/data.
std::string data_dir();

// Presets of data/models.json. Names match case-insensitively; a unique prefix
// ("llama-3.1-70") is accepted.
std::vector<std::string> list_model_presets();
Expected<ModelDesc> load_model_preset(const std::string& name);

// A Hugging Face config.json (nested "text_config" of multimodal configs is used when present).
Expected<ModelDesc> load_hf_config(const std::string& path);

// GGUF metadata (`general.architecture`, `<arch>.*`); params and weight bytes from the tensor table.
Expected<ModelDesc> load_gguf_model(const std::string& path);

// `spec` is a preset name, a path to a config.json (*.json) or a GGUF file (*.gguf).
Expected<ModelDesc> resolve_model(const std::string& spec);

}  // namespace pagoda::sim
