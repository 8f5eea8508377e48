// llama (and mistral, registry.cc): pre-norm blocks of grouped-query attention
// with rotary positions (pairs (2i, 2i+1)) and a SwiGLU feed-forward; no biases.
// Everything is the shared decoder: the common keys, llama's tensor names and
// decoder_forward.
#include "model/arch.h"
#include "model/blocks.h"

namespace pagoda::model {

extern const ArchDef kLlamaArch;
const ArchDef kLlamaArch{
    .read_hparams = nullptr,
    .bind_weights = &bind_decoder_weights,
    .forward = &decoder_forward,
};

}  // namespace pagoda::model
