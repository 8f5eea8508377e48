// phi3: the llama decoder with NeoX rotary pairing, a fused QKV projection
// (attn_qkv.weight, rows Q | K | V) and a fused gate/up projection
// (ffn_up.weight of 2 * n_ff rows: gate | up, as ggml_swiglu splits it). Split
// tensors (attn_q/k/v) are accepted too. LongRoPE: rope_factors_short/long.weight
// ([rope_dim / 2]) divide the rotary frequencies and rope.scaling.attn_factor
// scales the rotation (config.cc). As llama.cpp, the long factors are used when
// the context the model is loaded for (ModelLoadOptions, default the model's
// context_length) exceeds rope.scaling.original_context_length, the short ones
// otherwise: a choice per loaded model, not per sequence length, so that cached
// keys never change rotation. The sliding window some phi3 files declare is
// ignored, as llama.cpp does.
#include <string>

#include "base/ggml_quant.h"
#include "model/arch.h"
#include "model/blocks.h"

namespace pagoda::model {

namespace {

Status read_hparams(const gguf::GgufFile& f, const std::string&, ModelConfig& c) {
  c.rope_neox = true;
  c.rope_long_factors = c.n_ctx > c.n_ctx_orig && f.find_tensor("rope_factors_long.weight") != nullptr;
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_io_weights(f, c));
  const char* factors = c.rope_long_factors ? "rope_factors_long.weight" : "rope_factors_short.weight";
  if (f.find_tensor(factors)) {
    PAGODA_ASSIGN_OR_RETURN(w.rope_freqs, bind_rope_factors(f, factors, c));
  }
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.attn_norm, bind_vector(f, b + "attn_norm.weight", c.n_embd));
    if (f.find_tensor(b + "attn_qkv.weight")) {
      PAGODA_ASSIGN_OR_RETURN(kernels::WeightView qkv,
                              bind_matrix(f, b + "attn_qkv.weight", c.q_dim() + 2 * c.kv_dim(), c.n_embd));
      l.wq = row_slice(qkv, 0, c.q_dim());
      l.wk = row_slice(qkv, c.q_dim(), c.kv_dim());
      l.wv = row_slice(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
    } else {
      PAGODA_ASSIGN_OR_RETURN(l.wq, bind_matrix(f, b + "attn_q.weight", c.q_dim(), c.n_embd));
      PAGODA_ASSIGN_OR_RETURN(l.wk, bind_matrix(f, b + "attn_k.weight", c.kv_dim(), c.n_embd));
      PAGODA_ASSIGN_OR_RETURN(l.wv, bind_matrix(f, b + "attn_v.weight", c.kv_dim(), c.n_embd));
    }
    PAGODA_ASSIGN_OR_RETURN(l.wo, bind_matrix(f, b + "attn_output.weight", c.n_embd, c.q_dim()));
    PAGODA_ASSIGN_OR_RETURN(l.ffn_norm, bind_vector(f, b + "ffn_norm.weight", c.n_embd));
    PAGODA_ASSIGN_OR_RETURN(kernels::WeightView gate_up, bind_matrix(f, b + "ffn_up.weight", 2 * static_cast<int64_t>(c.n_ff), c.n_embd));
    l.w_gate = row_slice(gate_up, 0, c.n_ff);
    l.w_up = row_slice(gate_up, c.n_ff, c.n_ff);
    PAGODA_ASSIGN_OR_RETURN(l.w_down, bind_matrix(f, b + "ffn_down.weight", c.n_embd, c.n_ff));
  }
  return w;
}

}  // namespace

extern const ArchDef kPhi3Arch;  // registry.cc; forward: decoder_forward
const ArchDef kPhi3Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights};

}  // namespace pagoda::model
