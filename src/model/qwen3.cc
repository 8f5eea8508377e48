// qwen3: the llama decoder with NeoX rotary pairing and a per-head RMSNorm of Q
// and K (attn_q_norm / attn_k_norm, [head_dim]) before rope; no biases.
#include <string>

#include "model/arch.h"
#include "model/blocks.h"

namespace pagoda::model {

namespace {

Status read_hparams(const gguf::GgufFile&, const std::string&, ModelConfig& c) {
  c.rope_neox = true;
  c.qk_norm = true;
  return Status::Ok();
}

Expected<ModelWeights> bind_weights(const gguf::GgufFile& f, const ModelConfig& c) {
  PAGODA_ASSIGN_OR_RETURN(ModelWeights w, bind_decoder_weights(f, c));
  PAGODA_TRY(bind_qk_norms(f, c, w));
  return w;
}

}  // namespace

extern const ArchDef kQwen3Arch;  // registry.cc; forward: decoder_forward
const ArchDef kQwen3Arch{.read_hparams = &read_hparams, .bind_weights = &bind_weights};

}  // namespace pagoda::model
