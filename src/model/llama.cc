// The llama-family decoder (llama, mistral, qwen2): pre-norm blocks of
// grouped-query attention with rotary positions and a SwiGLU feed-forward.
// qwen2 differs only in q/k/v biases and NeoX rotary pairing (config flags).
#include <cmath>
#include <cstring>

#include "model/model.h"

namespace pagoda::model {

namespace {

struct Ops {
  decltype(&kernels::cpu::matmul) matmul;
  decltype(&kernels::cpu::rmsnorm) rmsnorm;
  decltype(&kernels::cpu::rope) rope;
  decltype(&kernels::cpu::kv_write) kv_write;
  decltype(&kernels::cpu::paged_attention) paged_attention;
};

Ops ops_for(KernelBackend b) {
  if (b == KernelBackend::Ref) {
    return {&kernels::ref::matmul, &kernels::ref::rmsnorm, &kernels::ref::rope, &kernels::ref::kv_write,
            &kernels::ref::paged_attention};
  }
  return {&kernels::cpu::matmul, &kernels::cpu::rmsnorm, &kernels::cpu::rope, &kernels::cpu::kv_write,
          &kernels::cpu::paged_attention};
}

// x[t, :] += bias for every row. x: [n_tokens, n]
void add_bias(float* x, const float* bias, int64_t n_tokens, int64_t n) {
  for (int64_t t = 0; t < n_tokens; ++t) kernels::add_inplace(x + t * n, bias, n);
}

}  // namespace

Status llama_forward(const ModelConfig& c, const ModelWeights& weights, const kernels::BatchView& batch,
                     std::span<const kernels::KvLayerView> kv_layers, float* logits, Workspace& ws,
                     KernelBackend backend) {
  const int64_t T = batch.n_tokens;
  const int64_t E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), F = c.n_ff;

  // Check before mutating: nothing below may fail once a KV row is written.
  if (T <= 0) return errorf("forward: empty batch");
  if (kv_layers.size() != static_cast<size_t>(c.n_layers)) {
    return errorf("forward: %zu KV layers for a %d-layer model", kv_layers.size(), c.n_layers);
  }
  for (const kernels::KvLayerView& kv : kv_layers) {
    if (kv.n_kv_heads != c.n_kv_heads || kv.head_dim != c.head_dim || !kv.k || !kv.v) {
      return errorf("forward: KV layer has %d heads x %d dims, model needs %d x %d", kv.n_kv_heads, kv.head_dim,
                    c.n_kv_heads, c.head_dim);
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.n_vocab) return errorf("forward: token id %d out of range [0, %d)", id, c.n_vocab);
  }
  if (batch.n_logits < 0 || batch.n_logits > T) {
    return errorf("forward: %d logit rows for %lld tokens", batch.n_logits, static_cast<long long>(T));
  }
  for (int32_t i = 0; i < batch.n_logits; ++i) {
    if (batch.logit_rows[i] < 0 || batch.logit_rows[i] >= T) {
      return errorf("forward: logit row %d outside the batch of %lld tokens", batch.logit_rows[i],
                    static_cast<long long>(T));
    }
  }
  ws.reserve(c, static_cast<int32_t>(T));
  const Ops ops = ops_for(backend);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  float* x = ws.x.data();        // [T, E]
  float* xn = ws.xn.data();      // [T, E]
  float* q = ws.q.data();        // [T, n_heads, head_dim]
  float* k = ws.k.data();        // [T, n_kv_heads, head_dim]
  float* v = ws.v.data();        // [T, n_kv_heads, head_dim]
  float* att = ws.att.data();    // [T, n_heads, head_dim]
  float* proj = ws.proj.data();  // [T, E]
  float* gate = ws.gate.data();  // [T, F]
  float* up = ws.up.data();      // [T, F]

  for (int64_t t = 0; t < T; ++t) embed_token(weights.token_embd, batch.token_ids[t], x + t * E);

  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = weights.layers[static_cast<size_t>(l)];
    const kernels::KvLayerView& kv = kv_layers[static_cast<size_t>(l)];

    // Attention: x += Wo * attention(rope(Wq xn), rope(Wk xn), Wv xn)
    ops.rmsnorm(x, w.attn_norm, c.rms_eps, T, E, xn);
    ops.matmul(w.wq, xn, T, q);
    ops.matmul(w.wk, xn, T, k);
    ops.matmul(w.wv, xn, T, v);
    if (w.bq) {
      add_bias(q, w.bq, T, QD);
      add_bias(k, w.bk, T, KVD);
      add_bias(v, w.bv, T, KVD);
    }
    ops.rope(q, batch.positions, T, c.n_heads, c.head_dim, c.rope_dim, c.rope_base, c.rope_neox);
    ops.rope(k, batch.positions, T, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_base, c.rope_neox);
    ops.kv_write(kv, k, v, batch.slot_mapping, T);
    ops.paged_attention(q, kv, batch, c.n_heads, scale, att);
    ops.matmul(w.wo, att, T, proj);
    kernels::add_inplace(x, proj, T * E);

    // Feed-forward (SwiGLU): x += W_down (silu(W_gate xn) * W_up xn)
    ops.rmsnorm(x, w.ffn_norm, c.rms_eps, T, E, xn);
    ops.matmul(w.w_gate, xn, T, gate);
    ops.matmul(w.w_up, xn, T, up);
    kernels::silu_mul(gate, up, T * F);
    ops.matmul(w.w_down, gate, T, proj);
    kernels::add_inplace(x, proj, T * E);
  }

  // Final norm and output projection, only for the rows whose logits are wanted.
  const int64_t L = batch.n_logits;
  if (L == 0) return Status::Ok();
  float* rows = proj;  // [L, E] gathered residual rows (L <= T)
  for (int64_t i = 0; i < L; ++i) std::memcpy(rows + i * E, x + batch.logit_rows[i] * E, sizeof(float) * E);
  ops.rmsnorm(rows, weights.output_norm, c.rms_eps, L, E, xn);
  ops.matmul(weights.output, xn, L, logits);  // [L, n_vocab]
  return Status::Ok();
}

}  // namespace pagoda::model
