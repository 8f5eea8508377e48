#include "model/blocks.h"

#include <cmath>

#include "model/model.h"

namespace pagoda::model {

void embed_tokens(const ForwardPass& p) {
  p.k.get_rows(p.w.token_embd, p.batch.token_ids, p.batch.n_tokens, p.ws.x.data());
  // gemma3: x * sqrt(n_embd) in f32, as llama.cpp's ggml_scale.
  if (p.c.embd_scale != 1.f) p.k.mul_scalar(p.ws.x.data(), p.c.embd_scale, static_cast<int64_t>(p.batch.n_tokens) * p.c.n_embd);
}

void attention_block(const ForwardPass& p, int32_t l) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const kernels::KvLayerView& kv = p.kv[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens;
  Workspace& ws = p.ws;
  float* x = ws.x.data();        // [T, E]
  float* xn = ws.xn.data();      // [T, E]
  float* q = ws.q.data();        // [T, n_heads, head_dim]
  float* k = ws.k.data();        // [T, n_kv_heads, head_dim]
  float* v = ws.v.data();        // [T, n_kv_heads, head_dim]
  float* att = ws.att.data();    // [T, n_heads, head_dim]
  float* proj = ws.proj.data();  // [T, E]

  p.k.rmsnorm(x, w.attn_norm, c.rms_eps, T, c.n_embd, xn);
  const kernels::WeightView* qkv_w[] = {&w.wq, &w.wk, &w.wv};
  float* const qkv_y[] = {q, k, v};
  p.k.matmul_multi(qkv_w, 3, xn, T, qkv_y);  // one launch at decode sizes
  if (w.bq) {
    p.k.add_rows(q, w.bq, T, c.q_dim());
    p.k.add_rows(k, w.bk, T, c.kv_dim());
    p.k.add_rows(v, w.bv, T, c.kv_dim());
  }
  if (w.q_norm) {  // per-head RMSNorm (rows of head_dim), in place, before rope
    p.k.rmsnorm(q, w.q_norm, c.rms_eps, T * c.n_heads, c.head_dim, q);
    p.k.rmsnorm(k, w.k_norm, c.rms_eps, T * c.n_kv_heads, c.head_dim, k);
  }
  const LayerAttn& la = c.layers[static_cast<size_t>(l)];
  const kernels::RopeScaling rs{.freq_factors = p.w.rope_freqs, .freq_scale = la.rope_freq_scale,
                                .attn_factor = c.rope_attn_factor, .ext_factor = c.rope_ext_factor,
                                .yarn_low = la.yarn_low, .yarn_high = la.yarn_high};
  p.k.rope(q, p.batch.positions, T, c.n_heads, c.head_dim, c.rope_dim, la.rope_base, c.rope_neox, rs);
  p.k.rope(k, p.batch.positions, T, c.n_kv_heads, c.head_dim, c.rope_dim, la.rope_base, c.rope_neox, rs);
  // The layer's KV group (hybrid manager): its own slots and block tables.
  const kernels::BatchView gb = kernels::group_view(p.batch, kv.group);
  p.k.kv_write(kv, k, v, gb.slot_mapping, T);
  p.k.paged_attention(q, kv, gb, c.n_heads, c.attn_scale, att, la.window);
  p.k.matmul(w.wo, att, T, proj);
  if (w.post_attn_norm) p.k.rmsnorm(proj, w.post_attn_norm, c.rms_eps, T, c.n_embd, proj);
  p.k.add(x, proj, T * c.n_embd);
}

void swiglu_ffn_block(const ForwardPass& p, int32_t l) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens;
  Workspace& ws = p.ws;
  float* x = ws.x.data();        // [T, E]
  float* xn = ws.xn.data();      // [T, E]
  float* gate = ws.gate.data();  // [T, F]
  float* up = ws.up.data();      // [T, F]
  float* proj = ws.proj.data();  // [T, E]

  p.k.rmsnorm(x, w.ffn_norm, c.rms_eps, T, c.n_embd, xn);
  const kernels::WeightView* gate_up_w[] = {&w.w_gate, &w.w_up};
  float* const gate_up_y[] = {gate, up};
  p.k.matmul_multi(gate_up_w, 2, xn, T, gate_up_y);  // one launch at decode sizes
  if (c.ffn_act == FfnAct::GeluTanh) {
    p.k.gelu_mul(gate, up, T * c.n_ff);
  } else {
    p.k.silu_mul(gate, up, T * c.n_ff);
  }
  p.k.matmul(w.w_down, gate, T, proj);
  if (w.post_ffn_norm) p.k.rmsnorm(proj, w.post_ffn_norm, c.rms_eps, T, c.n_embd, proj);
  p.k.add(x, proj, T * c.n_embd);
}

void output_logits(const ForwardPass& p) {
  const int64_t L = p.batch.n_logits, E = p.c.n_embd;
  if (L == 0) return;
  float* rows = p.ws.proj.data();  // [L, E] gathered residual rows (L <= T)
  float* xn = p.ws.xn.data();      // [L, E]
  p.k.gather_rows(p.ws.x.data(), E, p.batch.logit_rows, L, rows);
  p.k.rmsnorm(rows, p.w.output_norm, p.c.rms_eps, L, E, xn);
  p.k.matmul(p.w.output, xn, L, p.logits);  // [L, n_vocab]
}

void decoder_forward(const ForwardPass& p) {
  embed_tokens(p);
  for (int32_t l = 0; l < p.c.n_layers; ++l) {
    attention_block(p, l);
    swiglu_ffn_block(p, l);
  }
  output_logits(p);
}

}  // namespace pagoda::model
