// lfm2 (Liquid AI's LFM2): a hybrid of gated short-convolution layers and GQA
// attention layers, as llama.cpp's src/models/lfm2.cpp computes it. The per-layer
// attention.head_count_kv array marks the convolution layers with 0. Every layer:
//   x += op(rmsnorm(x, attn_norm));  x += swiglu_ffn(rmsnorm(x, ffn_norm))
// where op is
//  - a conv layer: B | C | x = in_proj(xn); y = C * conv(B * x) with a causal
//    depthwise convolution of length l_cache (shortconv.l_cache) per channel over
//    B * x, whose previous l_cache - 1 rows are the sequence's recurrent state
//    (kernels::ref::short_conv); then out_proj. No K/V: the state is
//    (l_cache - 1) x n_embd f32 per conv layer, in the sequence's state rows
//    (ModelConfig::n_state_rows; kv/recurrent_state_group.cc keeps them);
//  - an attention layer: per-head RMSNorm of Q and K, NeoX rope, grouped-query
//    attention (the shared attention_block).
// The final norm is token_embd_norm.weight (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2);
// the output is tied to token_embd unless output.weight exists. Not supported:
// lfm2moe (its MoE feed-forward), the sliding-window variant and the ColBERT head.
#include <string>

#include "base/recurrent_state.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/model.h"

namespace pagoda::model {

namespace {

Status read_hparams(const gguf::GgufFile& f, const std::string& p, ModelConfig& c) {
  c.rope_neox = true;
  c.qk_norm = true;
  const gguf::Value* lc = f.find(p + "shortconv.l_cache");
  if (!lc) return errorf("metadata %sshortconv.l_cache: missing (required for lfm2)", p.c_str());
  if (!lc->is_int() || lc->as_int() < 2 || lc->as_int() > 64)
    return errorf("metadata %sshortconv.l_cache: expected an integer in 2..64", p.c_str());
  c.shortconv_l_cache = static_cast<int32_t>(lc->as_int());
  if (f.get_int_or(p + "attention.sliding_window", 0) > 0)
    return errorf("%sattention.sliding_window: lfm2 with a sliding window is not supported", p.c_str());
  const StateRows st = short_conv_state(c.n_recurrent_layers(), c.shortconv_l_cache, c.n_embd);
  c.n_state_rows = static_cast<int32_t>(st.rows);
  c.state_row_floats = st.row_floats;
  if (c.n_heads * c.head_dim != c.n_embd)
    return errorf("%sattention: head_count x key_length (%d x %d) must equal embedding_length %d", p.c_str(), c.n_heads,
                  c.head_dim, c.n_embd);
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  ModelWeights w;
  PAGODA_ASSIGN_OR_RETURN(w.token_embd, bind_matrix(f, "token_embd.weight", c.n_vocab, c.n_embd));
  PAGODA_ASSIGN_OR_RETURN(w.output_norm, bind_vector(f, "token_embd_norm.weight", c.n_embd));
  if (c.tied_output) {
    w.output = w.token_embd;
  } else {
    PAGODA_ASSIGN_OR_RETURN(w.output, bind_matrix(f, "output.weight", c.n_vocab, c.n_embd));
  }
  w.layers.resize(static_cast<size_t>(c.n_layers));
  const int32_t E = c.n_embd;
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.attn_norm, bind_vector(f, b + "attn_norm.weight", E));
    if (c.layers[static_cast<size_t>(i)].recurrent) {
      PAGODA_ASSIGN_OR_RETURN(l.conv_in, bind_matrix(f, b + "shortconv.in_proj.weight", 3 * int64_t{E}, E));
      PAGODA_ASSIGN_OR_RETURN(l.conv_out, bind_matrix(f, b + "shortconv.out_proj.weight", E, E));
      // GGUF dims {l_cache, n_embd}: row c holds channel c's taps.
      const std::string cn = b + "shortconv.conv.weight";
      const gguf::TensorInfo* t = f.find_tensor(cn);
      if (!t) return errorf("tensor %s: missing (expected shape [%d, %d])", cn.c_str(), c.shortconv_l_cache, E);
      if (t->dims != std::vector<uint64_t>{static_cast<uint64_t>(c.shortconv_l_cache), static_cast<uint64_t>(E)})
        return errorf("tensor %s: expected [%d, %d] (l_cache, n_embd)", cn.c_str(), c.shortconv_l_cache, E);
      if (t->type != GgmlType::F32) return errorf("tensor %s: must be F32", cn.c_str());
      if (!t->data || reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
        return errorf("tensor %s: no data or not 4-byte aligned", cn.c_str());
      l.conv_w = reinterpret_cast<const float*>(t->data);
    } else {
      PAGODA_ASSIGN_OR_RETURN(l.wq, bind_matrix(f, b + "attn_q.weight", c.q_dim(), E));
      PAGODA_ASSIGN_OR_RETURN(l.wk, bind_matrix(f, b + "attn_k.weight", c.kv_dim(), E));
      PAGODA_ASSIGN_OR_RETURN(l.wv, bind_matrix(f, b + "attn_v.weight", c.kv_dim(), E));
      PAGODA_ASSIGN_OR_RETURN(l.wo, bind_matrix(f, b + "attn_output.weight", E, c.q_dim()));
      PAGODA_ASSIGN_OR_RETURN(l.q_norm, bind_vector(f, b + "attn_q_norm.weight", c.head_dim));
      PAGODA_ASSIGN_OR_RETURN(l.k_norm, bind_vector(f, b + "attn_k_norm.weight", c.head_dim));
    }
    PAGODA_ASSIGN_OR_RETURN(l.ffn_norm, bind_vector(f, b + "ffn_norm.weight", E));
    PAGODA_ASSIGN_OR_RETURN(l.w_gate, bind_matrix(f, b + "ffn_gate.weight", c.n_ff, E));
    PAGODA_ASSIGN_OR_RETURN(l.w_up, bind_matrix(f, b + "ffn_up.weight", c.n_ff, E));
    PAGODA_ASSIGN_OR_RETURN(l.w_down, bind_matrix(f, b + "ffn_down.weight", E, c.n_ff));
  }
  return w;
}

// x += out_proj(short_conv(in_proj(rmsnorm(x)))) for conv layer l, the
// conv_index-th of the model (its state rows start at conv_index x (l_cache - 1)).
void conv_block(const ForwardPass& p, int32_t l, int32_t conv_index) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens, E = c.n_embd;
  const int32_t d = c.shortconv_l_cache - 1;
  Workspace& ws = p.ws;
  float* x = ws.x.data();       // [T, E]
  float* xn = ws.xn.data();     // [T, E]
  float* bcx = ws.conv.data();  // [T, 3E]
  float* y = ws.att.data();     // [T, E] (q_dim == E)
  rmsnorm_rows(p, x, w.attn_norm, T, E, xn);
  p.k.matmul(w.conv_in, xn, T, bcx);
  const kernels::BatchView& b = p.batch;
  for (int32_t s = 0; s < b.n_seqs; ++s) {
    const int32_t t0 = b.q_indptr[s], n = b.q_indptr[s + 1] - t0;
    if (n == 0) continue;
    float* const* state = b.state_rows + static_cast<int64_t>(s) * b.n_state_rows + static_cast<int64_t>(conv_index) * d;
    p.k.short_conv(bcx + t0 * 3 * E, n, E, w.conv_w, c.shortconv_l_cache, state, b.positions[t0] == 0, y + t0 * E);
  }
  p.k.matmul(w.conv_out, y, T, ws.proj.data());
  add_residual(p, nullptr, x, ws.proj.data(), T);
}

void forward(const ForwardPass& p) {
  embed_tokens(p);
  int32_t conv_index = 0;
  for (int32_t l = 0; l < p.c.n_layers; ++l) {
    if (p.c.layers[static_cast<size_t>(l)].recurrent) {
      conv_block(p, l, conv_index++);
    } else {
      attention_block(p, l);
    }
    swiglu_ffn_block(p, l);
  }
  output_logits(p);
}

}  // namespace

extern const ArchDef kLfm2Arch;  // registry.cc
const ArchDef kLfm2Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights, .forward = &forward,
                        .recurrent_layers = true};

}  // namespace pagoda::model
