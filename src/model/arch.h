// An architecture = one file under model/ that defines an ArchDef: how to read
// its hyper-parameters, bind its weights, and run its forward. registry.cc maps
// `general.architecture` names to ArchDefs, so a new architecture is its own
// file, one registry line, and its line in model/CMakeLists.txt. Forwards are
// built from the shared blocks of model/blocks.h and call kernels only through
// the backend table (kernels/backend.h).
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace pagoda::model {

class Workspace;

// One forward pass: its inputs, buffers and backend. Built by Model::forward
// after every check, so a forward cannot fail.
struct ForwardPass {
  const kernels::Backend& k;
  const ModelConfig& c;
  const ModelWeights& w;
  const kernels::BatchView& batch;
  std::span<const kernels::KvLayerView> kv;  // [n_layers], each matching n_kv_heads x head_dim
  Workspace& ws;                             // reserved for batch.n_tokens rows
  float* logits;                             // [batch.n_logits, n_vocab]
};

// The shared pre-norm decoder (blocks.cc): every architecture's forward so far,
// its differences carried by the config's flags and the optional weights.
void decoder_forward(const ForwardPass& p);

struct ArchDef {
  // Reads the architecture's own keys (`prefix` is "<arch>.") and sets its
  // flags, after config.cc has read the keys every decoder shares; validation
  // of the whole config follows. Null: nothing of its own.
  Status (*read_hparams)(const gguf::GgufFile& f, const std::string& prefix, ModelConfig& c);
  // Binds and validates every tensor the config implies (weights.h helpers).
  Expected<ModelWeights> (*bind_weights)(const gguf::GgufFile& f, const ModelConfig& c);
  // Runs the forward (Model::forward's contract): embeds the batch, writes
  // every layer's K/V, and leaves the wanted rows' logits in p.logits.
  void (*forward)(const ForwardPass& p) = &decoder_forward;
  // Whether head_count_kv may be a per-layer array whose 0 entries mark
  // recurrent layers (LayerAttn::recurrent; lfm2's short convolutions).
  bool recurrent_layers = false;
  // No attention and no feed-forward anywhere (mamba2): config.cc then reads no
  // attention.* key nor feed_forward_length (llama.cpp's converter writes 0 for
  // both) and read_hparams sets the head counts, head_dim and recurrent layers.
  bool attention_free = false;
};

// Helpers for read_hparams and bind_weights (config.cc, weights.cc):
// an integer key the architecture requires, in lo..hi (errors name the key, and
// the architecture when it is missing);
Expected<int32_t> read_required_int(const gguf::GgufFile& f, const std::string& key, int64_t lo, int64_t hi,
                                    const std::string& arch);
// an F32 tensor of exactly these GGUF dims (trailing 1s aside, as llama.cpp's
// loader), 4-byte aligned: conv taps, ssm vectors, grouped norms.
Expected<const float*> bind_f32(const gguf::GgufFile& file, const std::string& name, std::vector<uint64_t> dims);

// The ArchDef registered for a `general.architecture` name, or null.
const ArchDef* find_arch(std::string_view name);
// The registered names, comma separated, for error messages.
std::string arch_names();

}  // namespace pagoda::model
