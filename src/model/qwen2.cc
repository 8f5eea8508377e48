// qwen2: the llama decoder with biases on the q/k/v projections and NeoX rotary
// pairing (i, i + rope_dim/2).
#include <string>

#include "model/arch.h"
#include "model/blocks.h"

namespace pagoda::model {

namespace {

Status read_hparams(const gguf::GgufFile&, const std::string&, ModelConfig& c) {
  c.rope_neox = true;
  c.attn_bias = true;
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_decoder_weights(f, c));
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    PAGODA_ASSIGN_OR_RETURN(l.bq, bind_vector(f, b + "attn_q.bias", c.q_dim()));
    PAGODA_ASSIGN_OR_RETURN(l.bk, bind_vector(f, b + "attn_k.bias", c.kv_dim()));
    PAGODA_ASSIGN_OR_RETURN(l.bv, bind_vector(f, b + "attn_v.bias", c.kv_dim()));
  }
  return w;
}

}  // namespace

extern const ArchDef kQwen2Arch;  // registry.cc; forward: decoder_forward
const ArchDef kQwen2Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights};

}  // namespace pagoda::model
