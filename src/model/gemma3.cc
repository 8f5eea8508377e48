// gemma3: the pre-norm decoder with
//  - embeddings scaled by sqrt(n_embd) (f32, as llama.cpp);
//  - per-head RMSNorm of Q and K before rope, and RMSNorm of each sublayer's
//    output (post_attention_norm, post_ffw_norm) before the residual add;
//  - GeGLU feed-forward (tanh-approximated GELU);
//  - interleaved local and global attention: layer l is global when
//    (l + 1) % pattern == 0 (pattern 6 unless attention.sliding_window_pattern
//    says otherwise); local layers attend over a sliding window
//    (attention.sliding_window) with rope base rope.freq_base_swa (10000),
//    global layers over the whole context with rope.freq_base (and
//    rope.scaling.factor); in this version the window is a mask over the full
//    cache, so out-of-window blocks stay allocated;
//  - attention scale 1/sqrt(attention.key_length), NeoX rotary pairing, tied output.
// The GGUF's RMSNorm weights already hold Gemma's (1 + w) (llama.cpp's converter
// adds the 1), so the shared rmsnorm applies them as they are.
#include <cmath>
#include <string>

#include "model/arch.h"
#include "model/blocks.h"

namespace pagoda::model {

namespace {

Status read_hparams(const gguf::GgufFile& f, const std::string& p, ModelConfig& c) {
  c.rope_neox = true;
  c.qk_norm = true;
  c.post_norms = true;
  c.ffn_act = FfnAct::GeluTanh;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  // llama.cpp: 1/sqrt(key_length) (the 27B's query_pre_attn_scalar = n_embd/n_heads
  // is not in its GGUF metadata; honour the key when a file carries it).
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (const gguf::Value* v = f.find(p + "attention.query_pre_attn_scalar")) {
    if (!v->is_number() || !(v->as_float() > 0)) return errorf("%sattention.query_pre_attn_scalar: expected a positive number", p.c_str());
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(v->as_float()));
  }
  const int64_t window = f.get_int_or(p + "attention.sliding_window", 0);
  if (window < 0 || window > (1ll << 30)) return errorf("%sattention.sliding_window %lld out of range", p.c_str(), static_cast<long long>(window));
  if (window == 0) return Status::Ok();  // no sliding window: every layer global (llama.cpp: LLAMA_SWA_TYPE_NONE)
  int64_t pattern = 6;
  if (const gguf::Value* v = f.find(p + "attention.sliding_window_pattern")) {
    if (!v->is_int() || v->as_int() < 0) return errorf("%sattention.sliding_window_pattern: expected a non-negative integer (per-layer arrays are not supported)", p.c_str());
    pattern = v->as_int();
  }
  const double base_swa = f.get_float_or(p + "rope.freq_base_swa", 10000.0);
  if (!(base_swa > 0)) return errorf("%srope.freq_base_swa must be positive", p.c_str());
  for (int32_t l = 0; l < c.n_layers; ++l) {
    // llama.cpp's set_swa_pattern: local unless l % pattern == pattern - 1 (pattern 0: all local).
    const bool local = pattern == 0 || (l % pattern) < (pattern - 1);
    if (!local) continue;
    LayerAttn& a = c.layers[static_cast<size_t>(l)];
    a.window = static_cast<int32_t>(window);
    a.rope_base = static_cast<float>(base_swa);
    a.rope_freq_scale = 1.0f;  // llama.cpp's rope_freq_scale_train_swa
  }
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_decoder_weights(f, c));
  PAGODA_TRY(bind_qk_norms(f, c, w));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.post_attn_norm, bind_vector(f, b + "post_attention_norm.weight", c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(l.post_ffn_norm, bind_vector(f, b + "post_ffw_norm.weight", c.n_embd));
  }
  return w;
}

}  // namespace

extern const ArchDef kGemma3Arch;  // registry.cc; forward: decoder_forward
const ArchDef kGemma3Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights};

}  // namespace pagoda::model
