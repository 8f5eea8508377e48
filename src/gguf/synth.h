// Random-weight models of real shapes, written as llama.cpp-compatible GGUF:
// full metadata for arch llama, qwen2, qwen3, phi3, gemma3, lfm2, qwen35 or mamba2, tensor names as llama.cpp expects,
// weights N(0, 0.02) from base/rng.h (norm weights 1.0), and a synthetic gpt2-style
// byte-level BPE vocabulary of exactly the model's vocab size. Tensor bytes are
// generated while the file is written (streaming), so any size fits in memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/ggml_types.h"
#include "base/status.h"
#include "gguf/writer.h"

namespace pagoda::gguf {

// Llama 3.x rope scaling (HF rope_scaling, rope_type "llama3"): written as the
// rope_freqs.weight tensor llama.cpp's converter computes from these.
struct SynthLlama3Rope {
  double factor = 0;  // 0: none
  double low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;
};

struct SynthShape {
  std::string name;            // preset name, also general.name
  std::string arch = "llama";  // "llama", "qwen2", "qwen3", "phi3", "gemma3", "lfm2", "qwen35" or "mamba2"
  std::string pre = "smollm";  // tokenizer.ggml.pre: "smollm", "llama-bpe" or "qwen2" (also picks the specials, but for phi3)
  int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_vocab = 0, n_ctx = 0;
  int64_t n_head_dim = 0;      // attention.key_length; 0: n_embd / n_head
  double rope_base = 10000.0;
  double rms_eps = 1e-5;
  // Standard deviation of the random weights. Presets of real models keep 0.02;
  // the tiny ones without Q/K norms use more, so that attention scores are
  // large enough for positions (rope, its scaling) to change the logits.
  double weight_std = 0.02;
  bool tied = true;            // no output.weight: the output projection reuses token_embd
  bool qkv_bias = false;       // attn_q/k/v.bias (qwen2)
  // Architecture-specific parts, written by arch (qwen3/gemma3: attn_q/k_norm;
  // gemma3: post_attention_norm, post_ffw_norm; phi3: fused attn_qkv and ffn_up).
  int64_t sliding_window = 0;  // gemma3 / phi3: attention.sliding_window
  SynthLlama3Rope llama3_rope{};  // llama: rope_freqs.weight
  // phi3 LongRoPE: rope_factors_short/long.weight and rope.scaling.attn_factor,
  // with rope.scaling.original_context_length = longrope_original_context (0: none).
  int64_t longrope_original_context = 0;
  // YaRN (rope.scaling.type yarn, rope.scaling.factor, original_context_length); 0: none.
  double yarn_factor = 0;
  int64_t yarn_original_context = 0;
  // lfm2: the short-convolution length (shortconv.l_cache) and the attention
  // layers (every other layer is a short-conv one; head_count_kv 0 in the array).
  int64_t shortconv_l_cache = 0;
  std::vector<int64_t> attn_layers = {};
  // qwen35 (Gated DeltaNet): ssm.conv_kernel, ssm.state_size (per-head dim S),
  // ssm.group_count (k heads), ssm.time_step_rank (v heads); every
  // full_attention_interval-th layer is a gated attention one; rope over
  // rope_dim dims (0: head_dim) with rope.dimension_sections.
  // mamba2 (no attention, no FFN: n_head, n_head_kv, n_ff 0): ssm.conv_kernel,
  // ssm.state_size, ssm.group_count (ssm_k_heads: the B/C groups),
  // ssm.time_step_rank (ssm_v_heads: the heads) and ssm.inner_size (ssm_inner).
  int64_t ssm_conv_kernel = 0, ssm_state = 0, ssm_k_heads = 0, ssm_v_heads = 0;
  int64_t ssm_inner = 0;
  int64_t full_attention_interval = 0;
  int64_t rope_dim = 0;
  std::vector<int32_t> rope_sections = {};
  bool is_attn_layer(int64_t l) const {
    if (arch == "qwen35") return full_attention_interval > 0 && (l + 1) % full_attention_interval == 0;
    if (arch == "mamba2") return false;
    if (arch != "lfm2") return true;
    for (int64_t a : attn_layers) if (a == l) return true;
    return false;
  }
  int64_t head_dim() const { return n_head_dim > 0 ? n_head_dim : n_head ? n_embd / n_head : 0; }
};

// The rope_freqs values llama.cpp's converter writes for llama3 rope scaling
// (one divisor per rotary pair). [head_dim / 2]
std::vector<float> llama3_rope_factors(const SynthLlama3Rope& r, double rope_base, int64_t head_dim);

// smollm2-135m, smollm2-360m, llama-3.2-1b (with its rope scaling), llama-3.1-8b,
// qwen2.5-0.5b, qwen3-0.6b, phi-3-mini (4k), phi-3-mini-128k (LongRoPE), gemma3-270m,
// lfm2-350m, qwen3.5-0.8b, mamba2-130m, and tiny-qwen3, tiny-qwen3-yarn, tiny-llama3, tiny-phi3, tiny-gemma3,
// tiny-lfm2, tiny-qwen35, tiny-mamba2 (toy sizes for parity fixtures).
const std::vector<SynthShape>& synth_presets();
const SynthShape* find_synth_preset(const std::string& name);

struct SynthOptions {
  SynthShape shape;                  // a preset, or any custom (small) shape for tests
  GgmlType type = GgmlType::Q8_0;    // F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_NL, IQ4_XS (norms/biases F32)
  int64_t n_layers_override = -1;    // >0: use this many layers instead of shape.n_layer
  // Rows a K-quant type cannot hold (row length not a multiple of 256) are
  // stored in synth_weight_type's fallback instead of failing.
  bool k_quant_fallback = false;
  // With type Q4_K: llama.cpp's Q4_K_M mix instead of Q4_K_S. attn_v and
  // ffn_down of the layers synth_more_bits_layer picks are Q6_K, and the file
  // type says Q4_K_M (15). Ignored for other types.
  bool q4_k_m = false;
  uint64_t seed = 0;
};

// The layers llama.cpp's Q4_K_M gives 6-bit attn_v and ffn_down: the first and
// last eighth of the n_layers, and every third layer in between.
bool synth_more_bits_layer(int64_t layer, int64_t n_layers);

// The type a weight of row length cols is stored in when the file's type is
// `type` and k_quant_fallback is set: K-quant rows must hold whole 256-value
// super-blocks, so (like llama.cpp's quantize) other rows fall back: Q6_K -> Q8_0, Q4_K -> Q4_1
// (llama.cpp uses Q5_0, which pagoda cannot quantize) and Q2_K, Q3_K -> Q4_0 (llama.cpp: IQ4_NL,
// Q4_0 in older versions), IQ4_XS -> IQ4_NL (as llama.cpp). Other types: unchanged.
GgmlType synth_weight_type(GgmlType type, int64_t cols);

// llama.cpp's general.file_type (LLAMA_FTYPE_*) for a weight type, or -1.
int llama_file_type(GgmlType type);

// A GPT-2 style byte-level BPE vocabulary.
struct SynthVocab {
  std::vector<std::string> tokens;   // [n_vocab], GPT-2 byte-to-unicode form
  std::vector<int32_t> token_types;  // [n_vocab]: 1 normal, 3 control, 4 user-defined
  std::vector<std::string> merges;   // "left right", in rank order; each result is a token
  int32_t bos = -1, eos = -1, pad = -1, unk = -1;
  bool add_bos = false;
  std::string chat_template;
};
// The 256 byte tokens (id = specials before them + byte value), deterministic
// merges of letters / "Ġ"+letters, and the specials and chat template of the
// model family: arch phi3 puts Phi-3's 11 (<|endoftext|> ... <|end|> <|user|>)
// from 32000 (or last, for small vocabularies) with Phi-3.5's template; else by
// `pre`: smollm puts <|endoftext|> <|im_start|> <|im_end|> at 0..2 (ChatML);
// llama-bpe puts 256 specials (<|begin_of_text|> ... <|eot_id|> ...) last, only
// the first 11 below 512 entries (Llama 3's template); qwen2 puts its 22
// specials from 151643 (or last) (ChatML). Vocabularies larger than the real
// one are padded to n_vocab with [PADn].
// Error if n_vocab is too small to hold bytes + specials.
Expected<SynthVocab> make_synth_vocab(int64_t n_vocab, const std::string& pre, const std::string& arch = "");
// GPT-2's byte-to-unicode map: the UTF-8 string standing for byte b.
std::string gpt2_byte_to_unicode(uint8_t b);

// Fills a writer with the model's metadata and streaming tensor producers.
Status synth_model(const SynthOptions& opt, GgufWriter* w);
// synth_model + write_file.
Status synth_model_file(const SynthOptions& opt, const std::string& path);

}  // namespace pagoda::gguf
