// Building blocks shared by the architecture files: embedding, the attention
// and feed-forward sublayers of a pre-norm decoder, the output head, and the
// plain decoder forward made of them. Each reads and writes the Workspace of
// the pass (buffers and shapes in model.h) and calls kernels only through p.k.
#pragma once
#include <cstdint>

#include "model/arch.h"

namespace pagoda::model {

// y = rmsnorm(x) * weight over rows [0, T) of width n, split over the kernels'
// threads at token boundaries (bitwise the same as one call).
void rmsnorm_rows(const ForwardPass& p, const float* x, const float* weight, int64_t T, int64_t n, float* y);
// x += post_norm(proj) (the norm only when non-null), rows of width n_embd, split as above.
void add_residual(const ForwardPass& p, const float* post_norm, float* x, float* proj, int64_t T);

// ws.x[t, :] = token_embd row of batch.token_ids[t] (times c.embd_scale).
void embed_tokens(const ForwardPass& p);

// ws.x += post(Wo * attention(rope(qn(Wq xn + bq)), rope(kn(Wk xn + bk)), Wv xn + bv))
// with xn = rmsnorm(ws.x, attn_norm); biases, per-head q/k norms (qn, kn) and the
// post-attention norm (post) where the layer has them; rope base/scale, sliding
// window from c.layers[l], rope frequency factors from w.rope_freqs. Writes the
// batch's K/V into layer `l` of the KV cache before attending.
void attention_block(const ForwardPass& p, int32_t l);
// The middle of attention_block, for an architecture that projects Q/K/V itself
// (qwen35's gated attention): ws.q, ws.k, ws.v hold the projections (biases
// added); per-head q/k norms, rope, the KV write and paged attention leave the
// heads' output in ws.att (rotated back for K/V types below 8 bits).
void attend(const ForwardPass& p, int32_t l);

// ws.x += post(W_down (act(W_gate xn) * W_up xn)) with xn = rmsnorm(ws.x, ffn_norm),
// act = silu or tanh-GELU (c.ffn_act), post = the post-FFN norm where the layer has one.
void swiglu_ffn_block(const ForwardPass& p, int32_t l);

// p.logits[i, :] = output * rmsnorm(ws.x[batch.logit_rows[i], :], output_norm):
// the final norm and output matmul run only for the wanted rows.
void output_logits(const ForwardPass& p);

// decoder_forward (declared in arch.h, every ArchDef's default forward) is the
// pre-norm decoder (llama, mistral, qwen2, qwen3, phi3, gemma3): embed, n_layers x
// (attention, gated feed-forward), output head; the variations are config flags
// and optional weights.

}  // namespace pagoda::model
