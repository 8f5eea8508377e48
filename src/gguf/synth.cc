// Random-weight GGUF models of real shapes (see synth.h).
#include "gguf/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/rng.h"
#include "base/ggml_quant.h"

namespace pagoda::gguf {

namespace {

SynthShape preset(const char* name, const char* arch, const char* pre, int64_t embd, int64_t layers, int64_t heads,
                  int64_t kv, int64_t ff, int64_t vocab, int64_t ctx, double rope, double eps, bool tied, bool bias) {
  return SynthShape{.name = name, .arch = arch, .pre = pre, .n_embd = embd, .n_layer = layers, .n_head = heads,
                    .n_head_kv = kv, .n_ff = ff, .n_vocab = vocab, .n_ctx = ctx, .rope_base = rope, .rms_eps = eps,
                    .tied = tied, .qkv_bias = bias};
}

// Weight values: N(0, stddev) from a generator seeded per (seed, tensor, row), so
// any row can be regenerated independently and the output does not depend on
// the chunking.
void fill_normal_row(uint64_t seed, uint64_t tensor_id, uint64_t row, float stddev, float* dst, int64_t n) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull ^ (tensor_id + 1) * 0xD1B54A32D192ED03ull ^ (row + 1) * 0xC2B2AE3D27D4EB4Full);
  constexpr float kTwoPi = 6.2831853071795864f;
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t bits = rng.next_u64();
    const float u1 = static_cast<float>((bits >> 40) + 1) * 0x1.0p-24f;  // (0, 1]
    const float u2 = static_cast<float>((bits >> 16) & 0xFFFFFF) * 0x1.0p-24f;
    const float r = stddev * std::sqrt(-2.0f * std::log(u1));
    dst[i] = r * std::cos(kTwoPi * u2);
    if (i + 1 < n) dst[i + 1] = r * std::sin(kTwoPi * u2);
  }
}

// [rows, cols] in `type`; value < 0 means random N(0, stddev), else a constant.
TensorProducer weight_producer(uint64_t seed, uint64_t tensor_id, int64_t cols, int64_t rows, GgmlType type,
                               float constant, float stddev) {
  return [=](const ByteSink& sink) -> Status {
    const size_t row_bytes = ggml_row_bytes(type, static_cast<size_t>(cols));
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{1} << 20) / std::max<int64_t>(cols, 1)));
    std::vector<float> f(static_cast<size_t>(chunk * cols));
    std::vector<uint8_t> q(static_cast<size_t>(chunk) * row_bytes);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      for (int64_t r = 0; r < n; ++r) {
        float* row = f.data() + r * cols;
        if (constant < 0) fill_normal_row(seed, tensor_id, static_cast<uint64_t>(r0 + r), stddev, row, cols);
        else std::fill(row, row + cols, constant);
        quantize_row(type, row, q.data() + static_cast<size_t>(r) * row_bytes, cols);
      }
      PAGODA_TRY(sink(q.data(), static_cast<size_t>(n) * row_bytes));
    }
    return Status::Ok();
  };
}

// A 1-D F32 tensor of the given values.
TensorProducer values_producer(std::vector<float> v) {
  return [v = std::move(v)](const ByteSink& sink) -> Status { return sink(v.data(), v.size() * sizeof(float)); };
}

// Synthetic LongRoPE factors ([n], increasing from 1): short up to 1.5, long up to 41,
// the ranges of Phi-3-mini-128k's.
std::vector<float> longrope_factors(int64_t n, bool long_factors) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x = n > 1 ? static_cast<double>(i) / static_cast<double>(n - 1) : 0.0;
    f[static_cast<size_t>(i)] = static_cast<float>(long_factors ? 1.0 + 40.0 * x * x : 1.0 + 0.5 * x);
  }
  return f;
}

}  // namespace

bool synth_more_bits_layer(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

GgmlType synth_weight_type(GgmlType type, int64_t cols) {
  if (type != GgmlType::Q2_K && type != GgmlType::Q3_K && type != GgmlType::Q4_K && type != GgmlType::Q6_K &&
      type != GgmlType::IQ4_XS)
    return type;
  if (cols % kQK_K == 0) return type;
  if (type == GgmlType::IQ4_XS) return GgmlType::IQ4_NL;
  if (type == GgmlType::Q2_K || type == GgmlType::Q3_K) return GgmlType::Q4_0;
  return type == GgmlType::Q4_K ? GgmlType::Q4_1 : GgmlType::Q8_0;
}

std::vector<float> llama3_rope_factors(const SynthLlama3Rope& r, double rope_base, int64_t head_dim) {
  // convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors), in the same order.
  const double kPi = 3.14159265358979323846;
  const double low_wavelen = static_cast<double>(r.original_context) / r.low_freq_factor;
  const double high_wavelen = static_cast<double>(r.original_context) / r.high_freq_factor;
  std::vector<float> f;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const float freq = static_cast<float>(1.0 / std::pow(rope_base, static_cast<double>(static_cast<float>(i) / static_cast<float>(head_dim))));
    const double wavelen = 2 * kPi / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(static_cast<float>(r.factor));
    } else {
      const double smooth = (static_cast<double>(r.original_context) / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return f;
}

const std::vector<SynthShape>& synth_presets() {
  static const std::vector<SynthShape> p = [] {
    std::vector<SynthShape> v = {
        preset("smollm2-135m", "llama", "smollm", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5, true, false),
        preset("smollm2-360m", "llama", "smollm", 960, 32, 15, 5, 2560, 49152, 8192, 100000.0, 1e-5, true, false),
        preset("llama-3.2-1b", "llama", "llama-bpe", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0, 1e-5, true,
               false),
        preset("llama-3.1-8b", "llama", "llama-bpe", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0, 1e-5, false,
               false),
        preset("qwen2.5-0.5b", "qwen2", "qwen2", 896, 24, 14, 2, 4864, 151936, 32768, 1000000.0, 1e-6, true, true),
        preset("qwen3-0.6b", "qwen3", "qwen2", 1024, 28, 16, 8, 3072, 151936, 40960, 1000000.0, 1e-6, true, false),
        preset("phi-3-mini", "phi3", "smollm", 3072, 32, 32, 32, 8192, 32064, 4096, 10000.0, 1e-5, false, false),
        preset("phi-3-mini-128k", "phi3", "smollm", 3072, 32, 32, 32, 8192, 32064, 131072, 10000.0, 1e-5, false,
               false),
        preset("gemma3-270m", "gemma3", "smollm", 640, 18, 4, 1, 2048, 262144, 32768, 1000000.0, 1e-6, true, false),
    };
    // Llama 3.2's rope_scaling: factor 32, low/high_freq_factor 1/4, original 8192.
    v[2].llama3_rope = {.factor = 32, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 8192};
    // Llama 3.1's: factor 8.
    v[3].llama3_rope = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 8192};
    v[5].n_head_dim = 128;
    v[6].sliding_window = 2047;
    v[7].sliding_window = 262144;
    v[7].longrope_original_context = 4096;
    v[8].n_head_dim = 256;
    v[8].sliding_window = 512;
    // LFM2-350M: 16 layers, attention at 2, 5, 8, 10, 12, 14 (its config's
    // full_attn_idxs), short convolutions of length 3 elsewhere.
    v.push_back(preset("lfm2-350m", "lfm2", "smollm", 1024, 16, 16, 8, 4608, 65536, 128000, 1000000.0, 1e-5, true, false));
    v.back().shortconv_l_cache = 3;
    v.back().attn_layers = {2, 5, 8, 10, 12, 14};
    // Tiny shapes of the newer architectures, every feature on at toy size:
    // tests/model/test_arch_llamacpp.cc checks them against llama.cpp's logits
    // (docs/parity/compare_arch.py --fixtures writes those).
    v.push_back(preset("tiny-qwen3", "qwen3", "qwen2", 64, 2, 4, 2, 96, 320, 256, 1000000.0, 1e-6, true, false));
    v.back().n_head_dim = 32;
    // tiny-qwen3 with YaRN (factor 4 over an original context of 64): at 64 positions
    // the ramp spans rotary pairs 0..3 (extrapolated below, interpolated above).
    v.push_back(v.back());
    v.back().name = "tiny-qwen3-yarn";
    v.back().yarn_factor = 4;
    v.back().yarn_original_context = 64;
    v.push_back(preset("tiny-llama3", "llama", "llama-bpe", 64, 2, 4, 2, 96, 320, 4096, 500000.0, 1e-5, true, false));
    v.back().llama3_rope = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 64};
    v.back().weight_std = 0.25;  // q.k of order 10: attention, and so rope, depends on positions
    v.push_back(preset("tiny-phi3", "phi3", "smollm", 64, 2, 4, 4, 96, 320, 4096, 10000.0, 1e-5, false, false));
    v.back().sliding_window = 2047;
    v.back().longrope_original_context = 256;
    v.back().weight_std = 0.25;
    v.push_back(preset("tiny-gemma3", "gemma3", "smollm", 64, 6, 4, 1, 96, 320, 256, 1000000.0, 1e-6, true, false));
    v.back().n_head_dim = 32;
    v.back().sliding_window = 8;
    // tiny-lfm2: conv, attention, conv, conv, attention, conv.
    v.push_back(preset("tiny-lfm2", "lfm2", "smollm", 64, 6, 4, 2, 96, 320, 256, 1000000.0, 1e-5, true, false));
    v.back().shortconv_l_cache = 3;
    v.back().attn_layers = {1, 4};
    v.back().weight_std = 0.25;
    // Qwen3.5-0.8B: 24 layers, gated attention every 4th (8 heads, 2 KV heads of
    // 256, rope over 64 dims, sections 11/11/10), Gated DeltaNet elsewhere (16 k
    // and 16 v heads of 128, convolution of 4), vocabulary 248320, tied output.
    v.push_back(preset("qwen3.5-0.8b", "qwen35", "qwen2", 1024, 24, 8, 2, 3584, 248320, 262144, 10000000.0, 1e-6, true, false));
    v.back().n_head_dim = 256;
    v.back().rope_dim = 64;
    v.back().rope_sections = {11, 11, 10, 0};
    v.back().ssm_conv_kernel = 4;
    v.back().ssm_state = 128;
    v.back().ssm_k_heads = 16;
    v.back().ssm_v_heads = 16;
    v.back().full_attention_interval = 4;
    // tiny-qwen35: delta-net, delta-net, attention, delta-net, delta-net, attention;
    // 4 v heads over 2 k heads (the broadcast), partial rope (16 of 32 dims).
    v.push_back(preset("tiny-qwen35", "qwen35", "qwen2", 64, 6, 4, 2, 96, 320, 256, 1000000.0, 1e-6, true, false));
    v.back().n_head_dim = 32;
    v.back().rope_dim = 16;
    v.back().rope_sections = {3, 3, 2, 0};
    v.back().ssm_conv_kernel = 4;
    v.back().ssm_state = 16;
    v.back().ssm_k_heads = 2;
    v.back().ssm_v_heads = 4;
    v.back().full_attention_interval = 3;
    v.back().weight_std = 0.25;
    // Mamba-2 130M (state-spaces/mamba2-130m): 24 layers of d_model 768, d_inner
    // 1536 in 24 heads of 64, d_state 128, one B/C group, convolution of 4,
    // vocabulary 50288 (GPT-NeoX's 50277 padded to 16; here synth's byte-level
    // BPE with the smollm specials), tied output. No attention, no FFN.
    v.push_back(preset("mamba2-130m", "mamba2", "smollm", 768, 24, 0, 0, 0, 50288, 1048576, 10000.0, 1e-5, true, false));
    v.back().ssm_conv_kernel = 4;
    v.back().ssm_state = 128;
    v.back().ssm_k_heads = 1;
    v.back().ssm_v_heads = 24;
    v.back().ssm_inner = 1536;
    // tiny-mamba2: 3 layers, d_inner 128 in 8 heads of 16, d_state 32, two B/C
    // groups (4 heads each).
    v.push_back(preset("tiny-mamba2", "mamba2", "smollm", 64, 3, 0, 0, 0, 320, 1048576, 10000.0, 1e-5, true, false));
    v.back().ssm_conv_kernel = 4;
    v.back().ssm_state = 32;
    v.back().ssm_k_heads = 2;
    v.back().ssm_v_heads = 8;
    v.back().ssm_inner = 128;
    v.back().weight_std = 0.25;
    return v;
  }();
  return p;
}

const SynthShape* find_synth_preset(const std::string& name) {
  for (const auto& p : synth_presets())
    if (p.name == name) return &p;
  return nullptr;
}

int llama_file_type(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q2_K: return 10;  // LLAMA_FTYPE_MOSTLY_Q2_K
    case GgmlType::Q3_K: return 11;  // LLAMA_FTYPE_MOSTLY_Q3_K_S
    case GgmlType::Q4_K: return 14;  // LLAMA_FTYPE_MOSTLY_Q4_K_S
    case GgmlType::IQ4_NL: return 25;
    case GgmlType::IQ4_XS: return 30;
    case GgmlType::Q6_K: return 18;
    case GgmlType::BF16: return 32;
    default: return -1;
  }
}

namespace {

// general.* keys: architecture, type, name, file type, quantization version.
void write_general_keys(const SynthOptions& opt, GgufWriter* w) {
  const SynthShape& s = opt.shape;
  w->set_string("general.architecture", s.arch);
  w->set_string("general.type", "model");
  // llama.cpp gives tokens of a model whose name contains "phi-3"/"phi3" Phi-3's
  // attributes by looking up </s>, <unk>, <s>, which the synthetic vocabulary
  // lacks (it would refuse the file): the name spells it "phi_3" instead.
  std::string name = s.name;
  for (const char* phi : {"phi-3", "phi3"}) {
    for (size_t at; (at = name.find(phi)) != std::string::npos;) name.replace(at, std::strlen(phi), "phi_3");
  }
  w->set_string("general.name", name + " (pagoda synth, random weights)");
  const bool q4_k_m = opt.q4_k_m && opt.type == GgmlType::Q4_K;
  w->set_u32("general.file_type", q4_k_m ? 15u : static_cast<uint32_t>(llama_file_type(opt.type)));  // 15: Q4_K_M
  w->set_u32("general.quantization_version", 2);
}

// tokenizer.* keys of a synthetic byte-level BPE vocabulary.
void write_tokenizer_keys(const std::string& pre, const SynthVocab& vocab, GgufWriter* w) {
  w->set_string("tokenizer.ggml.model", "gpt2");
  w->set_string("tokenizer.ggml.pre", pre);
  w->set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w->set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  w->set_string_array("tokenizer.ggml.merges", vocab.merges);
  w->set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.bos));
  w->set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos));
  if (vocab.unk >= 0) w->set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(vocab.unk));
  w->set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(vocab.pad));
  w->set_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  w->set_string("tokenizer.chat_template", vocab.chat_template);
}

// mamba2: the keys and tensors llama.cpp's converter (Mamba2Model) writes: no
// attention and no FFN (head_count and feed_forward_length 0), context 2^20, the
// ssm.* keys; per layer attn_norm, ssm_in, ssm_conv1d (+ bias), ssm_dt.bias,
// ssm_a and ssm_d ({1, n_head}), ssm_norm ({d_inner / n_group, n_group}), ssm_out.
// Small vectors (taps, biases, A, D, norms) are F32.
Status synth_mamba2(const SynthOptions& opt, GgufWriter* w) {
  const SynthShape& s = opt.shape;
  const int64_t n_layer = opt.n_layers_override > 0 ? opt.n_layers_override : s.n_layer;
  const int64_t Di = s.ssm_inner, N = s.ssm_state, G = s.ssm_k_heads, H = s.ssm_v_heads;
  if (s.n_embd <= 0 || n_layer <= 0 || s.n_vocab <= 0 || s.n_ctx <= 0 || s.ssm_conv_kernel < 2 || Di <= 0 || N <= 0 ||
      G <= 0 || H <= 0 || Di % H != 0 || H % G != 0)
    return errorf("synth: mamba2 shape '%s' needs positive dims, ssm_conv_kernel >= 2, heads dividing inner size "
                  "and groups dividing heads", s.name.c_str());
  const GgmlType t = opt.type;
  if (llama_file_type(t) < 0 || !quantize_supported(t))
    return errorf("synth: weight type %s is not supported", ggml_type_info(t).name);
  const auto stored_type = [&](GgmlType type, int64_t cols) {
    return opt.k_quant_fallback ? synth_weight_type(type, cols) : type;
  };
  for (int64_t cols : {s.n_embd, Di}) {
    const GgmlType ct = stored_type(t, cols);
    if (cols % ggml_type_info(ct).block_size != 0)
      return errorf("synth: row length %lld is not a multiple of the %s block size", (long long)cols, ggml_type_info(ct).name);
  }
  PAGODA_ASSIGN_OR_RETURN(SynthVocab vocab, make_synth_vocab(s.n_vocab, s.pre, s.arch));
  const std::string a = s.arch;
  write_general_keys(opt, w);
  w->set_u32(a + ".context_length", static_cast<uint32_t>(s.n_ctx));
  w->set_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
  w->set_u32(a + ".feed_forward_length", 0);
  w->set_u32(a + ".attention.head_count", 0);
  w->set_u32(a + ".block_count", static_cast<uint32_t>(n_layer));
  w->set_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(s.ssm_conv_kernel));
  w->set_u32(a + ".ssm.inner_size", static_cast<uint32_t>(Di));
  w->set_u32(a + ".ssm.state_size", static_cast<uint32_t>(N));
  w->set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(H));
  w->set_u32(a + ".ssm.group_count", static_cast<uint32_t>(G));
  w->set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(s.rms_eps));
  write_tokenizer_keys(s.pre, vocab, w);

  uint64_t id = 0;
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, GgmlType type, float constant) -> Status {
    type = stored_type(type, static_cast<int64_t>(dims[0]));
    const int64_t rows = dims.size() > 1 ? static_cast<int64_t>(dims[1]) : 1;
    return w->add_tensor(name, dims, type,
                         weight_producer(opt.seed, id++, static_cast<int64_t>(dims[0]), rows, type, constant,
                                         static_cast<float>(s.weight_std)));
  };
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  const bool four_bit = t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
                        t == GgmlType::IQ4_NL;
  const bool k_quant = t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K || t == GgmlType::Q6_K ||
                       t == GgmlType::IQ4_XS;
  const GgmlType out_type = k_quant ? GgmlType::Q6_K : four_bit ? GgmlType::Q8_0 : t;
  PAGODA_TRY(add("token_embd.weight", {u(s.n_embd), u(s.n_vocab)}, s.tied ? out_type : t, -1));
  const int64_t conv_dim = Di + 2 * G * N, d_in_proj = Di + conv_dim + H;
  // Mamba-2's initialization, spread over the heads: dt log-uniform in [0.001, 0.1]
  // (dt_bias = softplus^-1(dt)), A = -exp(A_log) in -1 .. -16, D = 1.
  std::vector<float> dt_bias(static_cast<size_t>(H)), a_vals(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    const double f = static_cast<double>(h) / static_cast<double>(std::max<int64_t>(1, H - 1));
    const double dt = std::exp(std::log(0.001) + f * (std::log(0.1) - std::log(0.001)));
    dt_bias[static_cast<size_t>(h)] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
    a_vals[static_cast<size_t>(h)] = -(1.0f + 15.0f * static_cast<float>(f));
  }
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    PAGODA_TRY(add(p + "attn_norm.weight", {u(s.n_embd)}, GgmlType::F32, 1.0f));
    PAGODA_TRY(add(p + "ssm_in.weight", {u(s.n_embd), u(d_in_proj)}, t, -1));
    PAGODA_TRY(add(p + "ssm_conv1d.weight", {u(s.ssm_conv_kernel), u(conv_dim)}, GgmlType::F32, -1));
    PAGODA_TRY(add(p + "ssm_conv1d.bias", {u(conv_dim)}, GgmlType::F32, -1));
    PAGODA_TRY(w->add_tensor(p + "ssm_dt.bias", {u(H)}, GgmlType::F32, values_producer(dt_bias)));
    PAGODA_TRY(w->add_tensor(p + "ssm_a", {1, u(H)}, GgmlType::F32, values_producer(a_vals)));
    PAGODA_TRY(add(p + "ssm_d", {1, u(H)}, GgmlType::F32, 1.0f));
    PAGODA_TRY(add(p + "ssm_norm.weight", {u(Di / G), u(G)}, GgmlType::F32, 1.0f));
    PAGODA_TRY(add(p + "ssm_out.weight", {u(Di), u(s.n_embd)}, t, -1));
  }
  PAGODA_TRY(add("output_norm.weight", {u(s.n_embd)}, GgmlType::F32, 1.0f));
  if (!s.tied) PAGODA_TRY(add("output.weight", {u(s.n_embd), u(s.n_vocab)}, out_type, -1));
  return Status::Ok();
}

}  // namespace

Status synth_model(const SynthOptions& opt, GgufWriter* w) {
  const SynthShape& s = opt.shape;
  const int64_t n_layer = opt.n_layers_override > 0 ? opt.n_layers_override : s.n_layer;
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "phi3" && s.arch != "gemma3" &&
      s.arch != "lfm2" && s.arch != "qwen35" && s.arch != "mamba2")
    return errorf("synth: unsupported arch '%s' (llama, qwen2, qwen3, phi3, gemma3, lfm2, qwen35, mamba2)", s.arch.c_str());
  const bool lfm2 = s.arch == "lfm2", qwen35 = s.arch == "qwen35", mamba2 = s.arch == "mamba2";
  if (mamba2) return synth_mamba2(opt, w);
  if (qwen35 && (s.ssm_conv_kernel < 2 || s.ssm_state <= 0 || s.ssm_k_heads <= 0 || s.ssm_v_heads % std::max<int64_t>(s.ssm_k_heads, 1) != 0 ||
                 s.full_attention_interval <= 0))
    return errorf("synth: qwen35 shape '%s' needs ssm_conv_kernel >= 2, state size, k heads dividing v heads, and an interval",
                  s.name.c_str());
  if (lfm2 && (s.shortconv_l_cache < 2 || s.attn_layers.empty()))
    return errorf("synth: lfm2 shape '%s' needs shortconv_l_cache >= 2 and attention layers", s.name.c_str());
  if (s.n_embd <= 0 || n_layer <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 || s.n_vocab <= 0 ||
      s.n_ctx <= 0)
    return errorf("synth: shape '%s' has a non-positive dimension", s.name.c_str());
  if ((s.n_head_dim <= 0 && s.n_embd % s.n_head != 0) || s.n_head % s.n_head_kv != 0 || s.head_dim() % 2 != 0)
    return errorf("synth: n_embd %lld / n_head %lld / n_head_kv %lld do not divide evenly", (long long)s.n_embd,
                  (long long)s.n_head, (long long)s.n_head_kv);
  const GgmlType t = opt.type;
  if (llama_file_type(t) < 0 || !quantize_supported(t))
    return errorf("synth: weight type %s is not supported (use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, "
                  "q3_k, q4_k, q6_k, iq4_nl or iq4_xs)",
                  ggml_type_info(t).name);
  const int64_t hd = s.head_dim();
  const auto stored_type = [&](GgmlType type, int64_t cols) {
    return opt.k_quant_fallback ? synth_weight_type(type, cols) : type;
  };
  for (int64_t cols : {s.n_embd, s.n_ff, s.n_head * hd, qwen35 ? s.ssm_v_heads * s.ssm_state : s.n_embd}) {
    const GgmlType ct = stored_type(t, cols);
    const int64_t bs = ggml_type_info(ct).block_size;
    if (cols % bs != 0)
      return errorf("synth: row length %lld is not a multiple of the %s block size %lld", (long long)cols,
                    ggml_type_info(ct).name, (long long)bs);
  }

  PAGODA_ASSIGN_OR_RETURN(SynthVocab vocab, make_synth_vocab(s.n_vocab, s.pre, s.arch));

  // ---- metadata
  const std::string a = s.arch;
  const bool q4_k_m = opt.q4_k_m && t == GgmlType::Q4_K;
  write_general_keys(opt, w);
  w->set_u32(a + ".vocab_size", static_cast<uint32_t>(s.n_vocab));
  w->set_u32(a + ".context_length", static_cast<uint32_t>(s.n_ctx));
  w->set_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
  w->set_u32(a + ".block_count", static_cast<uint32_t>(n_layer));
  w->set_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w->set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(s.rope_dim > 0 ? s.rope_dim : hd));
  if (!s.rope_sections.empty()) w->set_i32_array(a + ".rope.dimension_sections", s.rope_sections);
  if (qwen35) {  // llama.cpp's converter (Qwen3NextModel / Qwen3_5TextModel)
    w->set_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(s.ssm_conv_kernel));
    w->set_u32(a + ".ssm.state_size", static_cast<uint32_t>(s.ssm_state));
    w->set_u32(a + ".ssm.group_count", static_cast<uint32_t>(s.ssm_k_heads));
    w->set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(s.ssm_v_heads));
    w->set_u32(a + ".ssm.inner_size", static_cast<uint32_t>(s.ssm_v_heads * s.ssm_state));
    w->set_u32(a + ".full_attention_interval", static_cast<uint32_t>(s.full_attention_interval));
  }
  w->set_f32(a + ".rope.freq_base", static_cast<float>(s.rope_base));
  w->set_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
  if (lfm2) {  // llama.cpp's converter: per-layer head_count_kv, 0 for a conv layer
    std::vector<int32_t> kv(static_cast<size_t>(n_layer));
    for (int64_t l = 0; l < n_layer; ++l) kv[static_cast<size_t>(l)] = s.is_attn_layer(l) ? static_cast<int32_t>(s.n_head_kv) : 0;
    w->set_i32_array(a + ".attention.head_count_kv", kv);
    w->set_u32(a + ".shortconv.l_cache", static_cast<uint32_t>(s.shortconv_l_cache));
  } else {
    w->set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  }
  w->set_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(s.rms_eps));
  if (s.n_head_dim > 0) {
    w->set_u32(a + ".attention.key_length", static_cast<uint32_t>(hd));
    w->set_u32(a + ".attention.value_length", static_cast<uint32_t>(hd));
  }
  if (s.sliding_window > 0) w->set_u32(a + ".attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  const bool longrope = s.arch == "phi3" && s.longrope_original_context > 0;
  if (longrope) {
    // convert_hf_to_gguf.py (Phi3MiniModel): attn_factor = sqrt(1 + ln(scale) / ln(original)).
    const double scale = static_cast<double>(s.n_ctx) / static_cast<double>(s.longrope_original_context);
    const double attn_factor =
        scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.longrope_original_context))) : 1.0;
    w->set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(s.longrope_original_context));
    w->set_f32(a + ".rope.scaling.attn_factor", static_cast<float>(attn_factor));
  }
  if (s.yarn_factor > 0) {
    w->set_string(a + ".rope.scaling.type", "yarn");
    w->set_f32(a + ".rope.scaling.factor", static_cast<float>(s.yarn_factor));
    w->set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_original_context));
  }
  write_tokenizer_keys(s.pre, vocab, w);

  // ---- tensors (dims in ggml order: {row length, rows})
  uint64_t id = 0;
  auto add = [&](const std::string& name, int64_t cols, int64_t rows, GgmlType type, float constant) -> Status {
    type = stored_type(type, cols);
    std::vector<uint64_t> dims = {static_cast<uint64_t>(cols)};
    if (rows > 0) dims.push_back(static_cast<uint64_t>(rows));
    return w->add_tensor(name, dims, type,
                         weight_producer(opt.seed, id++, cols, rows > 0 ? rows : 1, type, constant,
                                         static_cast<float>(s.weight_std)));
  };
  const int64_t q_dim = s.n_head * hd, kv_dim = s.n_head_kv * hd;
  // Like llama.cpp's quantize, 4- and 5-bit files keep the output projection at higher
  // precision: output.weight, or token_embd when tied, is stored as Q8_0
  // (llama.cpp picks Q6_K when n_embd is a multiple of 256, Q8_0 otherwise).
  // K-quant files get Q6_K there, as llama.cpp's Q4_K_S/M (Q8_0 when n_embd
  // is not a multiple of 256 and k_quant_fallback is set).
  const bool four_bit = t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1 ||
                        t == GgmlType::IQ4_NL;
  const bool k_quant = t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K || t == GgmlType::Q6_K ||
                       t == GgmlType::IQ4_XS;
  const GgmlType out_type = k_quant ? GgmlType::Q6_K : four_bit ? GgmlType::Q8_0 : t;
  PAGODA_TRY(add("token_embd.weight", s.n_embd, s.n_vocab, s.tied ? out_type : t, -1));
  if (s.arch == "llama" && s.llama3_rope.factor > 0) {
    PAGODA_TRY(w->add_tensor("rope_freqs.weight", {static_cast<uint64_t>(hd / 2)}, GgmlType::F32,
                             values_producer(llama3_rope_factors(s.llama3_rope, s.rope_base, hd))));
  }
  if (longrope) {
    for (const bool lf : {true, false}) {
      PAGODA_TRY(w->add_tensor(lf ? "rope_factors_long.weight" : "rope_factors_short.weight",
                               {static_cast<uint64_t>(hd / 2)}, GgmlType::F32, values_producer(longrope_factors(hd / 2, lf))));
    }
  }
  const bool qk_norm = s.arch == "qwen3" || s.arch == "gemma3" || lfm2 || qwen35, post_norms = s.arch == "gemma3";
  const int64_t ssm_k_dim = s.ssm_k_heads * s.ssm_state, ssm_v_dim = s.ssm_v_heads * s.ssm_state;
  const bool fused = s.arch == "phi3";
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    PAGODA_TRY(add(p + "attn_norm.weight", s.n_embd, 0, GgmlType::F32, 1.0f));
    const GgmlType t_more = q4_k_m && synth_more_bits_layer(l, n_layer) ? GgmlType::Q6_K : t;
    if (qwen35 && !s.is_attn_layer(l)) {  // a gated delta-net layer (conv taps, dt, A, norm: F32)
      PAGODA_TRY(add(p + "attn_qkv.weight", s.n_embd, 2 * ssm_k_dim + ssm_v_dim, t, -1));
      PAGODA_TRY(add(p + "attn_gate.weight", s.n_embd, ssm_v_dim, t, -1));
      PAGODA_TRY(add(p + "ssm_conv1d.weight", s.ssm_conv_kernel, 2 * ssm_k_dim + ssm_v_dim, GgmlType::F32, -1));
      PAGODA_TRY(add(p + "ssm_dt.bias", s.ssm_v_heads, 0, GgmlType::F32, -1));
      // A = -exp(A_log) with A_log ~ log(U(1, 16)) as Qwen's init: here -1 .. -16 spread over the heads.
      std::vector<float> a_vals(static_cast<size_t>(s.ssm_v_heads));
      for (int64_t h = 0; h < s.ssm_v_heads; ++h)
        a_vals[static_cast<size_t>(h)] = -(1.0f + 15.0f * static_cast<float>(h) / static_cast<float>(std::max<int64_t>(1, s.ssm_v_heads - 1)));
      PAGODA_TRY(w->add_tensor(p + "ssm_a", {static_cast<uint64_t>(s.ssm_v_heads)}, GgmlType::F32, values_producer(a_vals)));
      ++id;
      PAGODA_TRY(add(p + "ssm_beta.weight", s.n_embd, s.ssm_v_heads, t, -1));
      PAGODA_TRY(add(p + "ssm_alpha.weight", s.n_embd, s.ssm_v_heads, t, -1));
      PAGODA_TRY(add(p + "ssm_norm.weight", s.ssm_state, 0, GgmlType::F32, 1.0f));
      PAGODA_TRY(add(p + "ssm_out.weight", ssm_v_dim, s.n_embd, t, -1));
    } else if (qwen35) {  // gated attention: attn_q holds q | gate per head
      PAGODA_TRY(add(p + "attn_q.weight", s.n_embd, 2 * q_dim, t, -1));
      PAGODA_TRY(add(p + "attn_k.weight", s.n_embd, kv_dim, t, -1));
      PAGODA_TRY(add(p + "attn_v.weight", s.n_embd, kv_dim, t_more, -1));
    } else if (!s.is_attn_layer(l)) {  // lfm2's short-conv layer (llama.cpp keeps the taps in F32)
      PAGODA_TRY(add(p + "shortconv.in_proj.weight", s.n_embd, 3 * s.n_embd, t, -1));
      PAGODA_TRY(add(p + "shortconv.conv.weight", s.shortconv_l_cache, s.n_embd, GgmlType::F32, -1));
      PAGODA_TRY(add(p + "shortconv.out_proj.weight", s.n_embd, s.n_embd, t, -1));
    } else if (fused) {
      PAGODA_TRY(add(p + "attn_qkv.weight", s.n_embd, q_dim + 2 * kv_dim, t, -1));
    } else {
      PAGODA_TRY(add(p + "attn_q.weight", s.n_embd, q_dim, t, -1));
      PAGODA_TRY(add(p + "attn_k.weight", s.n_embd, kv_dim, t, -1));
      PAGODA_TRY(add(p + "attn_v.weight", s.n_embd, kv_dim, t_more, -1));
    }
    if (qk_norm && s.is_attn_layer(l)) {
      PAGODA_TRY(add(p + "attn_q_norm.weight", hd, 0, GgmlType::F32, 1.0f));
      PAGODA_TRY(add(p + "attn_k_norm.weight", hd, 0, GgmlType::F32, 1.0f));
    }
    if (s.qkv_bias) {
      PAGODA_TRY(add(p + "attn_q.bias", q_dim, 0, GgmlType::F32, -1));
      PAGODA_TRY(add(p + "attn_k.bias", kv_dim, 0, GgmlType::F32, -1));
      PAGODA_TRY(add(p + "attn_v.bias", kv_dim, 0, GgmlType::F32, -1));
    }
    if (s.is_attn_layer(l)) PAGODA_TRY(add(p + "attn_output.weight", q_dim, s.n_embd, t, -1));
    if (post_norms) PAGODA_TRY(add(p + "post_attention_norm.weight", s.n_embd, 0, GgmlType::F32, 1.0f));
    PAGODA_TRY(add(p + (qwen35 ? "post_attention_norm.weight" : "ffn_norm.weight"), s.n_embd, 0, GgmlType::F32, 1.0f));
    if (fused) {
      PAGODA_TRY(add(p + "ffn_up.weight", s.n_embd, 2 * s.n_ff, t, -1));  // gate | up
    } else {
      PAGODA_TRY(add(p + "ffn_gate.weight", s.n_embd, s.n_ff, t, -1));
      PAGODA_TRY(add(p + "ffn_up.weight", s.n_embd, s.n_ff, t, -1));
    }
    PAGODA_TRY(add(p + "ffn_down.weight", s.n_ff, s.n_embd, t_more, -1));
    if (post_norms) PAGODA_TRY(add(p + "post_ffw_norm.weight", s.n_embd, 0, GgmlType::F32, 1.0f));
  }
  // lfm2's final norm is named token_embd_norm (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2).
  PAGODA_TRY(add(lfm2 ? "token_embd_norm.weight" : "output_norm.weight", s.n_embd, 0, GgmlType::F32, 1.0f));
  if (!s.tied) PAGODA_TRY(add("output.weight", s.n_embd, s.n_vocab, out_type, -1));
  return Status::Ok();
}

Status synth_model_file(const SynthOptions& opt, const std::string& path) {
  GgufWriter w;
  PAGODA_TRY(synth_model(opt, &w));
  return w.write_file(path);
}

}  // namespace pagoda::gguf
