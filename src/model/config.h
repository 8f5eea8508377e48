// ModelConfig: the hyperparameters of a decoder-only transformer, read from GGUF
// metadata (`general.architecture` and the `<arch>.*` keys) and checked for
// consistency before any weight is bound. The keys every decoder shares are read
// here; an architecture's own keys and flags by its file (model/arch.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace pagoda::model {

// Feed-forward activation of the gated FFN: down(act(gate) * up).
enum class FfnAct : uint8_t { Silu, GeluTanh };  // SwiGLU (llama, qwen, phi3); GeGLU (gemma3)

// Per-layer attention settings (the same for every layer unless the architecture
// interleaves local and global layers, as gemma3 does).
struct LayerAttn {
  int32_t window = 0;         // sliding window in tokens (p - window < j <= p); 0: full causal
  float rope_base = 10000.f;  // rope.freq_base of this layer
  float rope_freq_scale = 1.f;  // 1 / rope scaling factor of this layer (linear scaling)
  // YaRN's correction dims for this layer's base (ModelConfig::rope_ext_factor != 0):
  // rotary pairs below yarn_low keep the extrapolated angle, above yarn_high the
  // interpolated one, a linear ramp between.
  float yarn_low = 0.f, yarn_high = 0.f;
  // A recurrent layer (a per-layer head_count_kv of 0, ArchDef::recurrent_layers):
  // no K/V; its state lives in the sequence's recurrent state (n_state_rows).
  bool recurrent = false;
};

struct ModelConfig {
  std::string arch;          // general.architecture, a name in the registry (registry.cc)
  int32_t n_layers = 0;      // <arch>.block_count
  int32_t n_embd = 0;        // <arch>.embedding_length
  int32_t n_ff = 0;          // <arch>.feed_forward_length
  int32_t n_heads = 0;       // <arch>.attention.head_count
  int32_t n_kv_heads = 0;    // <arch>.attention.head_count_kv (default n_heads)
  int32_t head_dim = 0;      // <arch>.attention.key_length (default n_embd / n_heads)
  int32_t rope_dim = 0;      // <arch>.rope.dimension_count (default head_dim)
  int32_t n_vocab = 0;       // token_embd.weight dims[1]
  int32_t n_ctx_train = 0;   // <arch>.context_length
  float rms_eps = 1e-5f;     // <arch>.attention.layer_norm_rms_epsilon
  float rope_base = 10000.f; // <arch>.rope.freq_base
  // Set by the architecture's read_hparams:
  bool rope_neox = false;    // rotary pairs (i, i + rope_dim/2) (qwen2); else (2i, 2i+1) (llama)
  bool attn_bias = false;    // q/k/v projections carry biases (qwen2)
  bool tied_output = false;  // no output.weight: token_embd doubles as the output matrix
  bool qk_norm = false;      // per-head RMSNorm of Q and K before rope (qwen3, gemma3)
  bool post_norms = false;   // RMSNorm of each sublayer's output before the residual add (gemma3)
  FfnAct ffn_act = FfnAct::Silu;
  float embd_scale = 1.f;    // token embeddings are multiplied by it (gemma3: sqrt(n_embd))
  float attn_scale = 0.f;    // softmax scale of q.k; set to 1/sqrt(head_dim) when 0
  float rope_attn_factor = 1.f;  // <arch>.rope.scaling.attn_factor (phi3 LongRoPE)
  // rope.scaling.original_context_length (default n_ctx_train): YaRN's correction
  // dims, and phi3's choice of LongRoPE factors.
  int32_t n_ctx_orig = 0;
  // YaRN (rope.scaling.type yarn): ggml_rope_ext's ext_factor, 1 (0: no YaRN); the
  // layers' correction dims use llama.cpp's beta_fast 32 and beta_slow 1 (it reads no
  // GGUF key for them).
  float rope_ext_factor = 0.f;
  // The context a sequence may reach (ModelLoadOptions, else n_ctx_train).
  int32_t n_ctx = 0;
  // phi3 LongRoPE: rope_factors_long instead of _short, because n_ctx > n_ctx_orig
  // (llama.cpp's choice, by the context it was given; set by phi3's read_hparams).
  bool rope_long_factors = false;
  // [n_layers], filled by config_from_gguf (window 0, rope_base, 1/rope.scaling.factor)
  // before the architecture's read_hparams, which may change them.
  std::vector<LayerAttn> layers;
  // Hybrid models (set by the architecture's read_hparams): each sequence's
  // fixed-size recurrent state, n_state_rows f32 rows of state_row_floats
  // (kernels::BatchView::state_rows). LFM2: (l_cache - 1) rows of n_embd per
  // short-conv layer.
  int32_t shortconv_l_cache = 0;  // <arch>.shortconv.l_cache (lfm2)
  int32_t n_state_rows = 0;
  int32_t state_row_floats = 0;
  // qwen35 (Gated DeltaNet layers, <arch>.ssm.*): conv_kernel, state_size (the
  // head dim S of q, k and v), group_count (k heads), time_step_rank (v heads);
  // its attention layers gate their output (sigmoid of a second half of attn_q).
  int32_t ssm_d_conv = 0, ssm_d_state = 0, ssm_n_k_heads = 0, ssm_n_v_heads = 0;
  bool attn_output_gate = false;
  // mamba2 (<arch>.ssm.*, with ssm_d_conv and ssm_d_state above): inner_size,
  // group_count (B/C groups), time_step_rank (heads of inner_size / n_head).
  // Attention-free (ArchDef::attention_free): every layer is recurrent; n_heads =
  // n_kv_heads = 1 and head_dim = ssm_d_state only lay out the KV pool's token
  // blocks, which then hold state rows (no layer attends).
  int32_t ssm_d_inner = 0, ssm_n_group = 0, ssm_n_head = 0;
  // Per-token floats of Workspace::conv the architecture's own sublayers need
  // beyond lfm2's 3 n_embd (set by read_hparams; 0: none).
  int32_t scratch_floats = 0;
  int32_t ssm_conv_dim() const { return (2 * ssm_n_k_heads + ssm_n_v_heads) * ssm_d_state; }  // q | k | v
  int32_t ssm_value_dim() const { return ssm_n_v_heads * ssm_d_state; }

  int32_t n_recurrent_layers() const {
    int32_t n = 0;
    for (const LayerAttn& a : layers) n += a.recurrent ? 1 : 0;
    return n;
  }
  int32_t q_dim() const { return n_heads * head_dim; }      // width of Q and of attention output
  int32_t kv_dim() const { return n_kv_heads * head_dim; }  // width of one token's K (or V) row
};

// What a model is loaded for beyond its file.
struct ModelLoadOptions {
  int32_t context_length = 0;  // the longest sequence it will run (0: the model's n_ctx_train)
};

// Reads and validates the config of a registered architecture. Errors name the
// missing/invalid key, or list the supported architectures.
Expected<ModelConfig> config_from_gguf(const gguf::GgufFile& file, const ModelLoadOptions& opt = {});

// ggml_rope_yarn_corr_dims: the rotary pairs [low, high] over which YaRN ramps from
// extrapolation to interpolation, for an original context n_ctx_orig (float math as ggml).
void yarn_corr_dims(int32_t rope_dim, int32_t n_ctx_orig, float base, float beta_fast, float beta_slow, float dims[2]);

}  // namespace pagoda::model
