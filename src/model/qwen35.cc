// qwen35 (Qwen3.5): a hybrid of Gated DeltaNet linear-attention layers and gated
// full-attention layers, as llama.cpp's src/models/qwen35.cpp computes it. Layer
// l is a full-attention one when (l + 1) % full_attention_interval == 0 (default
// 4), unless attention.recurrent_layers lists the kind of every layer. Every layer:
//   x += op(rmsnorm(x, attn_norm));  x += swiglu_ffn(rmsnorm(x, post_attention_norm))
// where op is
//  - a delta-net layer: qkv = attn_qkv(xn) (q | k | v, S = ssm.state_size per
//    head, group_count k heads, time_step_rank v heads), z = attn_gate(xn),
//    alpha = ssm_alpha(xn), beta = ssm_beta(xn); a causal depthwise convolution of
//    length ssm.conv_kernel plus SiLU over qkv (kernels ssm_conv_silu), whose
//    previous conv_kernel - 1 rows are state; then the gated delta rule
//    (kernels gated_delta_net: L2-normed q and k, decay exp(softplus(alpha +
//    ssm_dt.bias) * ssm_a), beta = sigmoid(beta)) over the S x S state matrix of
//    each v head; o = rmsnorm(o per head, ssm_norm) * silu(z); ssm_out(o). No K/V:
//    the state of one layer is (conv_kernel - 1) x conv_dim + v_heads x S x S
//    f32, kept as rows of S floats in the sequence's state rows (conv rows first);
//  - an attention layer: attn_q gives per head q | gate (2 x head_dim); per-head
//    RMSNorm of q and k, NeoX rope over rope.dimension_count dims (llama.cpp's
//    interleaved M-RoPE, which for text positions is exactly that: checked at
//    load), grouped-query attention, out * sigmoid(gate), attn_output.
// The output is tied to token_embd unless output.weight exists. Not supported:
// qwen35moe, the MTP (nextn) draft layers, vision positions.
#include <algorithm>
#include <cstring>
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
  c.attn_output_gate = true;
  PAGODA_ASSIGN_OR_RETURN(c.ssm_d_conv, read_required_int(f, p + "ssm.conv_kernel", 2, 64, "qwen35"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_d_state, read_required_int(f, p + "ssm.state_size", 1, 1024, "qwen35"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_n_k_heads, read_required_int(f, p + "ssm.group_count", 1, 1024, "qwen35"));
  PAGODA_ASSIGN_OR_RETURN(c.ssm_n_v_heads, read_required_int(f, p + "ssm.time_step_rank", 1, 1024, "qwen35"));
  int32_t d_inner = 0;
  PAGODA_ASSIGN_OR_RETURN(d_inner, read_required_int(f, p + "ssm.inner_size", 1, int64_t{1} << 20, "qwen35"));
  if (d_inner != c.ssm_n_v_heads * c.ssm_d_state)
    return errorf("%sssm.inner_size %d must be time_step_rank x state_size (%d x %d)", p.c_str(), d_inner,
                  c.ssm_n_v_heads, c.ssm_d_state);
  if (c.ssm_n_v_heads % c.ssm_n_k_heads != 0)
    return errorf("%sssm.time_step_rank %d must be a multiple of ssm.group_count %d", p.c_str(), c.ssm_n_v_heads,
                  c.ssm_n_k_heads);
  if (f.get_int_or(p + "nextn_predict_layers", 0) > 0)
    return errorf("%snextn_predict_layers: qwen35's MTP draft layers are not supported", p.c_str());
  if (f.get_int_or(p + "attention.sliding_window", 0) > 0)
    return errorf("%sattention.sliding_window: qwen35 with a sliding window is not supported", p.c_str());
  // Which layers are recurrent: attention.recurrent_layers (one flag per layer), else
  // every full_attention_interval-th layer is an attention one.
  if (const gguf::Value* rl = f.find(p + "attention.recurrent_layers")) {
    if (rl->type != gguf::ValueType::ARRAY || rl->arr.size() != static_cast<size_t>(c.n_layers))
      return errorf("%sattention.recurrent_layers: expected an array of %d flags", p.c_str(), c.n_layers);
    for (size_t l = 0; l < rl->arr.size(); ++l) {
      if (!rl->arr[l].is_int()) return errorf("%sattention.recurrent_layers[%zu]: expected a flag", p.c_str(), l);
      c.layers[l].recurrent = rl->arr[l].as_int() != 0;
    }
  } else {
    int32_t interval = 4;
    if (f.find(p + "full_attention_interval")) {
      PAGODA_ASSIGN_OR_RETURN(interval, read_required_int(f, p + "full_attention_interval", 1, c.n_layers, "qwen35"));
    }
    for (int32_t l = 0; l < c.n_layers; ++l) c.layers[static_cast<size_t>(l)].recurrent = (l + 1) % interval != 0;
  }
  if (c.n_recurrent_layers() == c.n_layers) return errorf("%s: qwen35 with no attention layer", p.c_str());
  // Interleaved M-RoPE (llama.cpp's rope type for qwen35): rotary pair i takes
  // section i % 3's position while i < 3 x sections[i % 3], else the 4th's. Text
  // tokens give the first three sections the token's position and the 4th 0,
  // so this is NeoX rope exactly when no rotated pair falls to the 4th section.
  if (const gguf::Value* rs = f.find(p + "rope.dimension_sections")) {
    if (rs->type != gguf::ValueType::ARRAY || rs->arr.size() < 3 || rs->arr.size() > 4)
      return errorf("%srope.dimension_sections: expected 3 or 4 integers", p.c_str());
    int64_t sec[4] = {0, 0, 0, 0}, total = 0;
    for (size_t i = 0; i < rs->arr.size(); ++i) {
      if (!rs->arr[i].is_int() || rs->arr[i].as_int() < 0)
        return errorf("%srope.dimension_sections[%zu]: expected a non-negative integer", p.c_str(), i);
      sec[i] = rs->arr[i].as_int();
      total += sec[i];
    }
    for (int32_t pair = 0; pair < c.rope_dim / 2 && total > 0; ++pair) {
      const int64_t sector = pair % total;
      const bool text = sector < 3 * sec[sector % 3];
      if (!text)
        return errorf("%srope.dimension_sections: rotary pair %d takes the 4th (vision) position; unsupported",
                      p.c_str(), pair);
    }
  }
  const int32_t cd = c.ssm_conv_dim();
  const StateRows st =
      gated_delta_net_state(c.n_recurrent_layers(), c.ssm_d_conv, c.ssm_n_k_heads, c.ssm_n_v_heads, c.ssm_d_state);
  c.n_state_rows = static_cast<int32_t>(st.rows);
  c.state_row_floats = st.row_floats;
  // Workspace::conv per token: the delta-net buffers, or the attention's q | gate
  // rows and the gates (delta_net_block, gated_attention_block).
  c.scratch_floats = std::max(2 * cd + 2 * c.ssm_value_dim() + 2 * c.ssm_n_v_heads, 3 * c.q_dim());
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_io_weights(f, c));
  w.layers.resize(static_cast<size_t>(c.n_layers));
  const int64_t E = c.n_embd, S = c.ssm_d_state, Hv = c.ssm_n_v_heads, cd = c.ssm_conv_dim(), vd = c.ssm_value_dim();
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.attn_norm, bind_vector(f, b + "attn_norm.weight", E));
    if (c.layers[static_cast<size_t>(i)].recurrent) {
      PAGODA_ASSIGN_OR_RETURN(l.ssm_qkv, bind_matrix(f, b + "attn_qkv.weight", cd, E));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_gate, bind_matrix(f, b + "attn_gate.weight", vd, E));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_alpha, bind_matrix(f, b + "ssm_alpha.weight", Hv, E));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_beta, bind_matrix(f, b + "ssm_beta.weight", Hv, E));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_out, bind_matrix(f, b + "ssm_out.weight", E, vd));
      // GGUF dims {d_conv, conv_dim}: row c holds channel c's taps.
      PAGODA_ASSIGN_OR_RETURN(l.ssm_conv, bind_f32(f, b + "ssm_conv1d.weight",
                                                   {static_cast<uint64_t>(c.ssm_d_conv), static_cast<uint64_t>(cd)}));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_dt, bind_vector(f, b + "ssm_dt.bias", Hv));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_a, bind_vector(f, b + "ssm_a", Hv));
      PAGODA_ASSIGN_OR_RETURN(l.ssm_norm, bind_vector(f, b + "ssm_norm.weight", S));
    } else {
      PAGODA_ASSIGN_OR_RETURN(l.wq, bind_matrix(f, b + "attn_q.weight", 2 * int64_t{c.q_dim()}, E));  // q | gate per head
      PAGODA_ASSIGN_OR_RETURN(l.wk, bind_matrix(f, b + "attn_k.weight", c.kv_dim(), E));
      PAGODA_ASSIGN_OR_RETURN(l.wv, bind_matrix(f, b + "attn_v.weight", c.kv_dim(), E));
      PAGODA_ASSIGN_OR_RETURN(l.wo, bind_matrix(f, b + "attn_output.weight", E, c.q_dim()));
      PAGODA_ASSIGN_OR_RETURN(l.q_norm, bind_vector(f, b + "attn_q_norm.weight", c.head_dim));
      PAGODA_ASSIGN_OR_RETURN(l.k_norm, bind_vector(f, b + "attn_k_norm.weight", c.head_dim));
    }
    // The pre-FFN norm is named post_attention_norm (llama.cpp's attn_post_norm).
    PAGODA_ASSIGN_OR_RETURN(l.ffn_norm, bind_vector(f, b + "post_attention_norm.weight", E));
    PAGODA_ASSIGN_OR_RETURN(l.w_gate, bind_matrix(f, b + "ffn_gate.weight", c.n_ff, E));
    PAGODA_ASSIGN_OR_RETURN(l.w_up, bind_matrix(f, b + "ffn_up.weight", c.n_ff, E));
    PAGODA_ASSIGN_OR_RETURN(l.w_down, bind_matrix(f, b + "ffn_down.weight", E, c.n_ff));
  }
  return w;
}

// x += ssm_out(gated_norm(delta_rule(conv(attn_qkv(xn))), attn_gate(xn))) for
// delta-net layer l, the rec_index-th recurrent layer of the model.
void delta_net_block(const ForwardPass& p, int32_t l, int32_t rec_index) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens, E = c.n_embd;
  const int32_t S = c.ssm_d_state, Hv = c.ssm_n_v_heads;
  const int64_t cd = c.ssm_conv_dim(), vd = c.ssm_value_dim();
  const int32_t conv_rows = (c.ssm_d_conv - 1) * static_cast<int32_t>(cd) / S;
  const int32_t rows_per_layer = conv_rows + Hv * S;
  Workspace& ws = p.ws;
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  float* mixed = ws.conv.data();   // [T, cd] attn_qkv output
  float* conv = mixed + T * cd;    // [T, cd] after the convolution + silu
  float* z = conv + T * cd;        // [T, vd] attn_gate output, then the gated output
  float* o = z + T * vd;           // [T, vd] delta-rule output
  float* alpha = o + T * vd;       // [T, Hv]
  float* beta = alpha + T * Hv;    // [T, Hv]
  rmsnorm_rows(p, x, w.attn_norm, T, E, xn);
  const kernels::WeightView* ws_in[] = {&w.ssm_qkv, &w.ssm_gate, &w.ssm_alpha, &w.ssm_beta};
  float* const ys_in[] = {mixed, z, alpha, beta};
  p.k.matmul_multi(ws_in, 4, xn, T, ys_in);
  const kernels::BatchView& b = p.batch;
  for (int32_t s = 0; s < b.n_seqs; ++s) {
    const int32_t t0 = b.q_indptr[s], n = b.q_indptr[s + 1] - t0;
    if (n == 0) continue;
    float* const* rows = b.state_rows + static_cast<int64_t>(s) * b.n_state_rows + static_cast<int64_t>(rec_index) * rows_per_layer;
    const bool fresh = b.positions[t0] == 0;
    p.k.ssm_conv_silu(mixed + t0 * cd, n, cd, w.ssm_conv, c.ssm_d_conv, rows, S, fresh, conv + t0 * cd, nullptr);
    kernels::GatedDeltaNetArgs a;
    a.qkv = conv + t0 * cd;
    a.ld = cd;
    a.alpha = alpha + t0 * Hv;
    a.beta = beta + t0 * Hv;
    a.ld_ab = Hv;
    a.dt_bias = w.ssm_dt;
    a.ssm_a = w.ssm_a;
    a.n_tokens = n;
    a.S = S;
    a.H_k = c.ssm_n_k_heads;
    a.H_v = Hv;
    a.eps = c.rms_eps;
    a.state = rows + conv_rows;
    a.fresh = fresh;
    a.out = o + t0 * vd;
    p.k.gated_delta_net(a);
  }
  // Gated RMSNorm per v head: rmsnorm(o, ssm_norm) * silu(z).
  p.k.rmsnorm(o, w.ssm_norm, c.rms_eps, T * Hv, S, o);
  p.k.silu_mul(z, o, T * vd);
  p.k.matmul(w.ssm_out, z, T, ws.proj.data());
  add_residual(p, nullptr, x, ws.proj.data(), T);
}

// x += attn_output(attention(...) * sigmoid(gate)): attn_q gives per head q | gate.
void gated_attention_block(const ForwardPass& p, int32_t l) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens, hd = c.head_dim, qd = c.q_dim();
  Workspace& ws = p.ws;
  float* qg = ws.conv.data();  // [T, n_heads, 2 head_dim]
  float* gate = qg + T * 2 * qd;  // [T, q_dim]
  rmsnorm_rows(p, ws.x.data(), w.attn_norm, T, c.n_embd, ws.xn.data());
  const kernels::WeightView* qkv_w[] = {&w.wq, &w.wk, &w.wv};
  float* const qkv_y[] = {qg, ws.k.data(), ws.v.data()};
  p.k.matmul_multi(qkv_w, 3, ws.xn.data(), T, qkv_y);
  float* q = ws.q.data();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const float* src = qg + (t * c.n_heads + h) * 2 * hd;
      std::memcpy(q + (t * c.n_heads + h) * hd, src, static_cast<size_t>(hd) * sizeof(float));
      std::memcpy(gate + (t * c.n_heads + h) * hd, src + hd, static_cast<size_t>(hd) * sizeof(float));
    }
  }
  attend(p, l);
  p.k.sigmoid_mul(ws.att.data(), gate, T * qd);
  p.k.matmul(w.wo, ws.att.data(), T, ws.proj.data());
  add_residual(p, nullptr, ws.x.data(), ws.proj.data(), T);
}

void forward(const ForwardPass& p) {
  embed_tokens(p);
  int32_t rec_index = 0;
  for (int32_t l = 0; l < p.c.n_layers; ++l) {
    if (p.c.layers[static_cast<size_t>(l)].recurrent) {
      delta_net_block(p, l, rec_index++);
    } else {
      gated_attention_block(p, l);
    }
    swiglu_ffn_block(p, l);
  }
  output_logits(p);
}

}  // namespace

extern const ArchDef kQwen35Arch;  // registry.cc
const ArchDef kQwen35Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights, .forward = &forward,
                          .recurrent_layers = true};

}  // namespace pagoda::model
