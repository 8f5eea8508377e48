// A loaded decoder-only transformer of a registered architecture (model/arch.h,
// registry.cc) and its forward pass over a ragged batch with a block-addressed
// (paged) KV cache.
//
// Thread-safety: a Model is immutable after load; forward() is const and may run
// concurrently on different Workspaces and different KV storage.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/aligned.h"
#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/api.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace pagoda::model {

struct ArchDef;

// Which kernel backend table forward() calls through: Cpu (fast) or Ref
// (scalar oracles, for debugging and parity tests).
using KernelBackend = kernels::BackendKind;

// Scratch activations of one forward pass, reused across steps. Grows on demand
// (never shrinks); reserve() up front to keep allocation out of the step loop.
class Workspace {
 public:
  Workspace() = default;
  // Sizes every buffer for up to `max_tokens` rows of this config.
  void reserve(const ModelConfig& c, int32_t max_tokens);
  int32_t max_tokens() const { return max_tokens_; }

  // T = max_tokens, E = n_embd, F = n_ff.
  AlignedBuffer<float> x;     // [T, E]       residual stream
  AlignedBuffer<float> xn;    // [T, E]       normed input of a sublayer; later the normed logit rows
  AlignedBuffer<float> q;     // [T, q_dim]   queries (rotated)
  AlignedBuffer<float> k;     // [T, kv_dim]  keys of this step's tokens (rotated)
  AlignedBuffer<float> v;     // [T, kv_dim]  values of this step's tokens
  AlignedBuffer<float> att;   // [T, q_dim]   attention output, heads concatenated
  AlignedBuffer<float> proj;  // [T, E]       sublayer output; later the gathered logit rows
  AlignedBuffer<float> gate;  // [T, F]       FFN gate, then silu(gate) * up
  AlignedBuffer<float> up;    // [T, F]       FFN up
  AlignedBuffer<float> conv;  // [T, C]       hybrid models' own sublayers: lfm2's short-conv in_proj output
                              //              (C = 3 E), qwen35's delta-net buffers (C = scratch_floats)

 private:
  int32_t max_tokens_ = 0;
  int64_t embd_ = 0, q_dim_ = 0, kv_dim_ = 0, ff_ = 0, conv_ = 0;
};

class Model {
 public:
  // Opens the GGUF file, reads the config, binds and validates all weights.
  // opt.context_length: the longest sequence it will run (phi3's LongRoPE factors).
  static Expected<std::unique_ptr<Model>> load(const std::string& path, const ModelLoadOptions& opt = {});
  // Same, over an already opened file (shared with the tokenizer).
  static Expected<std::unique_ptr<Model>> from_gguf(std::shared_ptr<const gguf::GgufFile> file,
                                                    const ModelLoadOptions& opt = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const gguf::GgufFile& gguf() const { return *file_; }
  std::shared_ptr<const gguf::GgufFile> gguf_shared() const { return file_; }
  // Identifies the weights for the prefix cache: xxh3 over architecture, config,
  // every tensor's name/type/dims and the first and last bytes of its data.
  uint64_t fingerprint() const { return fingerprint_; }
  // Weight bytes read per token of a forward pass (decode GB/s numerator).
  uint64_t weight_bytes_per_token() const { return weight_bytes_per_token_; }

  // One forward pass over a ragged batch of sequences.
  // - Writes each token's K/V into its slot (batch.slot_mapping) of every layer
  //   before attention, then attends over each sequence's pages (causal).
  // - logits: [batch.n_logits, n_vocab], row i for token row batch.logit_rows[i];
  //   the final norm and output matmul run only for those rows.
  // Preconditions: kv_layers.size() == n_layers, each matching n_kv_heads/head_dim;
  // every slot in slot_mapping and page in kv_indices lies inside the KV storage.
  // Errors (no partial KV writes happen for them): token id out of range, shape
  // mismatch between batch/kv and config.
  Status forward(const kernels::BatchView& batch, std::span<const kernels::KvLayerView> kv_layers,
                 float* logits, Workspace& ws, KernelBackend backend = KernelBackend::Cpu) const;

 private:
  Model() = default;
  std::shared_ptr<const gguf::GgufFile> file_;
  ModelConfig config_;
  ModelWeights weights_;
  const ArchDef* arch_ = nullptr;  // registry entry of config_.arch
  uint64_t fingerprint_ = 0;
  uint64_t weight_bytes_per_token_ = 0;
};

}  // namespace pagoda::model
