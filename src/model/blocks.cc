#include "model/blocks.h"

#include <cmath>

#include "model/model.h"

namespace pagoda::model {

void embed_tokens(const ForwardPass& p) {
  p.k.get_rows(p.w.token_embd, p.batch.token_ids, p.batch.n_tokens, p.ws.x.data());
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
  p.k.matmul(w.wq, xn, T, q);
  p.k.matmul(w.wk, xn, T, k);
  p.k.matmul(w.wv, xn, T, v);
  if (w.bq) {
    p.k.add_rows(q, w.bq, T, c.q_dim());
    p.k.add_rows(k, w.bk, T, c.kv_dim());
    p.k.add_rows(v, w.bv, T, c.kv_dim());
  }
  p.k.rope(q, p.batch.positions, T, c.n_heads, c.head_dim, c.rope_dim, c.rope_base, c.rope_neox);
  p.k.rope(k, p.batch.positions, T, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_base, c.rope_neox);
  p.k.kv_write(kv, k, v, p.batch.slot_mapping, T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.k.paged_attention(q, kv, p.batch, c.n_heads, scale, att);
  p.k.matmul(w.wo, att, T, proj);
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
  p.k.matmul(w.w_gate, xn, T, gate);
  p.k.matmul(w.w_up, xn, T, up);
  p.k.silu_mul(gate, up, T * c.n_ff);
  p.k.matmul(w.w_down, gate, T, proj);
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
