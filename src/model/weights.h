// Weight binding: every matrix is a kernels::WeightView pointing straight into
// the GGUF mapping (quantized weights are never expanded); norm weights and
// biases must be F32 and are used as float*. Shapes are in math order
// [rows = output features, cols = input features] (GGUF dims reversed).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/api.h"
#include "kernels/backend.h"
#include "model/config.h"

namespace pagoda::model {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  kernels::WeightView wq;            // [q_dim, n_embd]
  kernels::WeightView wk;            // [kv_dim, n_embd]
  kernels::WeightView wv;            // [kv_dim, n_embd]
  const float* bq = nullptr;         // [q_dim]  (all three set or all null: qwen2)
  const float* bk = nullptr;         // [kv_dim]
  const float* bv = nullptr;         // [kv_dim]
  kernels::WeightView wo;            // [n_embd, q_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  kernels::WeightView w_gate;        // [n_ff, n_embd]
  kernels::WeightView w_up;          // [n_ff, n_embd]
  kernels::WeightView w_down;        // [n_embd, n_ff]
  const float* q_norm = nullptr;     // [head_dim] per-head RMSNorm of Q (qwen3, gemma3; set with k_norm)
  const float* k_norm = nullptr;     // [head_dim]
  const float* post_attn_norm = nullptr;  // [n_embd] norm of the attention output (gemma3; set with post_ffn_norm)
  const float* post_ffn_norm = nullptr;   // [n_embd] norm of the FFN output
  // lfm2's short-convolution layers (LayerAttn::recurrent; no attention weights):
  kernels::WeightView conv_in;            // [3 n_embd, n_embd] shortconv.in_proj: B | C | x
  const float* conv_w = nullptr;          // [n_embd, l_cache] shortconv.conv, taps oldest first
  kernels::WeightView conv_out;           // [n_embd, n_embd] shortconv.out_proj
  // qwen35's gated delta-net layers (LayerAttn::recurrent; no attention weights):
  kernels::WeightView ssm_qkv;            // [conv_dim, n_embd] attn_qkv: q | k | v
  kernels::WeightView ssm_gate;           // [value_dim, n_embd] attn_gate (z)
  kernels::WeightView ssm_alpha;          // [n_v_heads, n_embd] ssm_alpha
  kernels::WeightView ssm_beta;           // [n_v_heads, n_embd] ssm_beta
  kernels::WeightView ssm_out;            // [n_embd, value_dim] ssm_out
  const float* ssm_conv = nullptr;        // [conv_dim, d_conv] ssm_conv1d, taps oldest first
  const float* ssm_dt = nullptr;          // [n_v_heads] ssm_dt.bias
  const float* ssm_a = nullptr;           // [n_v_heads] ssm_a (-exp(A_log))
  const float* ssm_norm = nullptr;        // [d_state] ssm_norm (gated RMSNorm per head)
  // mamba2's layers (all recurrent), beside ssm_out [n_embd, d_inner], ssm_conv
  // [conv_dim, d_conv], ssm_dt [n_head] (dt bias), ssm_a [n_head] and ssm_norm
  // [d_inner] (grouped RMSNorm: n_group groups of d_inner / n_group):
  kernels::WeightView ssm_in;             // [2 d_inner + 2 n_group d_state + n_head, n_embd]: z | x B C | dt
  const float* ssm_conv_b = nullptr;      // [conv_dim] ssm_conv1d.bias
  const float* ssm_d = nullptr;           // [n_head] ssm_d (skip connection)
};

// The decode-packed copies of a model's matrices (pack_decode_weights), one buffer.
struct PackedWeights {
  explicit PackedWeights(size_t bytes) : buf(bytes) {}
  kernels::PackedBuffer buf;
  uint64_t matrices = 0;        // distinct matrices packed
  uint64_t released_bytes = 0;  // bytes of the file mapping given back (MADV_DONTNEED)
};

struct ModelWeights {
  kernels::WeightView token_embd;    // [n_vocab, n_embd]; rows dequantized one token at a time
  const float* output_norm = nullptr;  // [n_embd]
  kernels::WeightView output;        // [n_vocab, n_embd]; == token_embd when tied
  std::vector<LayerWeights> layers;  // [n_layers]
  const float* rope_freqs = nullptr; // [rope_dim / 2] rope frequency divisors (llama 3.x, phi3 LongRoPE) or null
  std::shared_ptr<const PackedWeights> packed;  // owner of the views' .packed copies, or null
};

// Helpers for the architectures' bind_weights (model/arch.h). Errors name the
// tensor: "tensor blk.3.attn_q.weight: expected [576, 576], found [576, 512]"
// (GGUF dim order). Precondition: `file` outlives the returned views.

// A matrix of `rows` output features x `cols` input features of a type matmul supports.
Expected<kernels::WeightView> bind_matrix(const gguf::GgufFile& file, const std::string& name, int64_t rows,
                                          int64_t cols);
// A 1-D F32 vector (norm weight or bias) of n values.
Expected<const float*> bind_vector(const gguf::GgufFile& file, const std::string& name, int64_t n);
// The tensors of a pre-norm decoder with llama's names: token_embd, output_norm,
// output (or tied to token_embd), and per layer attn_norm, attn_q/k/v/output,
// ffn_norm, ffn_gate/up/down. Biases are left null.
Expected<ModelWeights> bind_decoder_weights(const gguf::GgufFile& file, const ModelConfig& config);
// Only the embedding, final norm and output matrix (token_embd when tied); the
// layers are left empty for an architecture that binds its own (phi3's fused tensors).
Expected<ModelWeights> bind_io_weights(const gguf::GgufFile& file, const ModelConfig& config);

// Bytes of weights read to compute one token (all matrices, norms and the output
// matrix; one embedding row). The numerator of decode GB/s.
// Binds the per-head Q/K norms of every layer (blk.N.attn_q_norm / attn_k_norm, [head_dim]).
Status bind_qk_norms(const gguf::GgufFile& file, const ModelConfig& config, ModelWeights& w);

// A rope frequency-factor vector ([rope_dim / 2] F32); every factor must be positive.
Expected<const float*> bind_rope_factors(const gguf::GgufFile& file, const std::string& name, const ModelConfig& config);
// Rows [row0, row0 + rows) of a bound matrix (fused QKV / gate-up tensors: each
// row is one output feature, so a slice is a pointer offset).
kernels::WeightView row_slice(const kernels::WeightView& w, int64_t row0, int64_t rows);

uint64_t weight_bytes_per_token(const ModelWeights& w, const ModelConfig& c);

// Packs every matrix the CPU backend packs (kernels::packed_weight_bytes: Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_XS on the AVX-512 path) into one buffer
// owned by w.packed and points the views' .packed at it (a tied output and
// token_embd share one copy). When `file` is mmapped, the originals' whole pages
// are then given back with MADV_DONTNEED, so resident memory holds one copy of
// the weights, not two. The
// mapping is read-only and private: a later read of an original (get_rows of a
// tied embedding, the Ref backend, the AVX2 path) faults its page in again from
// the file, so `data` stays valid. Packing is skipped when PAGODA_PACK=0.
void pack_decode_weights(const gguf::GgufFile& file, ModelWeights& w);

}  // namespace pagoda::model
