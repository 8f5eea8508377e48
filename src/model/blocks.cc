#include "model/blocks.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"

namespace pagoda::model {
namespace {

// The row-wise ops between the matmuls (norms, the gated activation, the
// residual add, the KV write) on the kernels' thread pool, split at token
// boundaries: each token row's values are computed by the same code whatever
// the split (every op here is row by row or element by element, and the gated activation
// is split only when n_ff is a multiple of its 8-lane vectors), so results
// are bitwise those of one call. Batches under kMinSplitTokens run as one call
// (a pool launch would cost more than it gives back).
constexpr int64_t kMinSplitTokens = 8;

template <class F>
void over_tokens(int64_t n_tokens, F&& fn) {  // fn(t0, t1): rows [t0, t1)
  const int64_t parts = n_tokens >= kMinSplitTokens ? std::min<int64_t>(n_tokens, kernels::num_threads()) : 1;
  if (parts <= 1) {
    fn(int64_t{0}, n_tokens);
    return;
  }
  kernels::parallel_for(parts, [&](int64_t i) { fn(n_tokens * i / parts, n_tokens * (i + 1) / parts); });
}

}  // namespace

// x = rmsnorm(x) * weight, rows [0, T) of width n, on the pool.
void rmsnorm_rows(const ForwardPass& p, const float* x, const float* weight, int64_t T, int64_t n, float* y) {
  over_tokens(T, [&](int64_t t0, int64_t t1) { p.k.rmsnorm(x + t0 * n, weight, p.c.rms_eps, t1 - t0, n, y + t0 * n); });
}

// x += post_norm(proj) (the norm only where the layer has one), rows of width E.
void add_residual(const ForwardPass& p, const float* post_norm, float* x, float* proj, int64_t T) {
  const int64_t E = p.c.n_embd;
  over_tokens(T, [&](int64_t t0, int64_t t1) {
    if (post_norm) p.k.rmsnorm(proj + t0 * E, post_norm, p.c.rms_eps, t1 - t0, E, proj + t0 * E);
    p.k.add(x + t0 * E, proj + t0 * E, (t1 - t0) * E);
  });
}

void embed_tokens(const ForwardPass& p) {
  p.k.get_rows(p.w.token_embd, p.batch.token_ids, p.batch.n_tokens, p.ws.x.data());
  // gemma3: x * sqrt(n_embd) in f32, as llama.cpp's ggml_scale.
  if (p.c.embd_scale != 1.f) p.k.mul_scalar(p.ws.x.data(), p.c.embd_scale, static_cast<int64_t>(p.batch.n_tokens) * p.c.n_embd);
}

void attention_block(const ForwardPass& p, int32_t l) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens;
  Workspace& ws = p.ws;
  float* x = ws.x.data();        // [T, E]
  float* xn = ws.xn.data();      // [T, E]
  float* q = ws.q.data();        // [T, n_heads, head_dim]
  float* k = ws.k.data();        // [T, n_kv_heads, head_dim]
  float* v = ws.v.data();        // [T, n_kv_heads, head_dim]
  float* proj = ws.proj.data();  // [T, E]

  rmsnorm_rows(p, x, w.attn_norm, T, c.n_embd, xn);
  const kernels::WeightView* qkv_w[] = {&w.wq, &w.wk, &w.wv};
  float* const qkv_y[] = {q, k, v};
  p.k.matmul_multi(qkv_w, 3, xn, T, qkv_y);  // one launch at decode sizes
  if (w.bq) {
    p.k.add_rows(q, w.bq, T, c.q_dim());
    p.k.add_rows(k, w.bk, T, c.kv_dim());
    p.k.add_rows(v, w.bv, T, c.kv_dim());
  }
  attend(p, l);
  p.k.matmul(w.wo, ws.att.data(), T, proj);
  add_residual(p, w.post_attn_norm, x, proj, T);
}

void attend(const ForwardPass& p, int32_t l) {
  const ModelConfig& c = p.c;
  const LayerWeights& w = p.w.layers[static_cast<size_t>(l)];
  const kernels::KvLayerView& kv = p.kv[static_cast<size_t>(l)];
  const int64_t T = p.batch.n_tokens;
  Workspace& ws = p.ws;
  float* q = ws.q.data();        // [T, n_heads, head_dim]
  float* k = ws.k.data();        // [T, n_kv_heads, head_dim]
  float* v = ws.v.data();        // [T, n_kv_heads, head_dim]
  float* att = ws.att.data();    // [T, n_heads, head_dim]
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
  const int64_t kvd = c.kv_dim(), qd = c.q_dim();
  // K/V types below 8 bits: Q and K (after RoPE) and V rotated per head block
  // before the store, the output rotated back (base/kv_dtype.h kv_rot_block_*).
  const int32_t rot_k = kv_rot_block_k(kv.dtype, c.head_dim), rot_v = kv_rot_block_v(kv.v_dtype, c.head_dim);
  over_tokens(T, [&](int64_t t0, int64_t t1) {
    if (rot_k > 0) {
      p.k.hadamard_rotate(q + t0 * qd, (t1 - t0) * qd, rot_k);
      p.k.hadamard_rotate(k + t0 * kvd, (t1 - t0) * kvd, rot_k);
    }
    if (rot_v > 0) p.k.hadamard_rotate(v + t0 * kvd, (t1 - t0) * kvd, rot_v);
    p.k.kv_write(kv, k + t0 * kvd, v + t0 * kvd, gb.slot_mapping + t0, t1 - t0);
  });
  p.k.paged_attention(q, kv, gb, c.n_heads, c.attn_scale, att, la.window);
  if (rot_v > 0) over_tokens(T, [&](int64_t t0, int64_t t1) { p.k.hadamard_rotate(att + t0 * qd, (t1 - t0) * qd, rot_v); });
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

  rmsnorm_rows(p, x, w.ffn_norm, T, c.n_embd, xn);
  const kernels::WeightView* gate_up_w[] = {&w.w_gate, &w.w_up};
  float* const gate_up_y[] = {gate, up};
  p.k.matmul_multi(gate_up_w, 2, xn, T, gate_up_y);  // one launch at decode sizes
  const int64_t F = c.n_ff;
  const auto act = c.ffn_act == FfnAct::GeluTanh ? p.k.gelu_mul : p.k.silu_mul;
  if (F % 8 != 0) {  // a split would move elements between the vector loop and the scalar tail
    act(gate, up, T * F);
  } else {
    over_tokens(T, [&](int64_t t0, int64_t t1) { act(gate + t0 * F, up + t0 * F, (t1 - t0) * F); });
  }
  p.k.matmul(w.w_down, gate, T, proj);
  add_residual(p, w.post_ffn_norm, x, proj, T);
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
