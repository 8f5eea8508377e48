// llama (and mistral, registry.cc): pre-norm blocks of grouped-query attention
// with rotary positions (pairs (2i, 2i+1)) and a SwiGLU feed-forward; no biases.
// Everything is the shared decoder: the common keys, llama's tensor names and
// decoder_forward. Llama 3.x rope scaling comes as the optional tensor
// rope_freqs.weight ([rope_dim / 2] divisors of the rotary frequencies, which
// llama.cpp's converter computes from rope_scaling's factor, low/high_freq_factor
// and original_max_position_embeddings); linear scaling as rope.scaling.factor
// (config.cc).
#include "model/arch.h"
#include "model/blocks.h"

namespace pagoda::model {

namespace {

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_decoder_weights(f, c));
  if (f.find_tensor("rope_freqs.weight")) {
    PAGODA_ASSIGN_OR_RETURN(w.rope_freqs, bind_rope_factors(f, "rope_freqs.weight", c));
  }
  return w;
}

}  // namespace

extern const ArchDef kLlamaArch;  // registry.cc; forward: decoder_forward
const ArchDef kLlamaArch{.read_hparams = nullptr, .bind_weights = &bind_weights};

}  // namespace pagoda::model
