// The architectures added over the llama decoder (qwen3, phi3, gemma3, llama
// with llama-3.x rope scaling) against an independent dense implementation
// written here from the math (double precision, no paging, no shared code with
// src/model): per-head Q/K RMSNorm, post-sublayer norms, GeGLU, embedding
// scale, sliding-window layers with their own rope base, rope frequency factors
// and attention factor, fused QKV / gate-up tensors. Every model is a small
// synth file (gguf/synth.cc writes the same tensors and keys for the presets).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "common/dense_ref.h"
#include "common/mem_gguf.h"
#include "gguf/dequant.h"
#include "gguf/synth.h"
#include "gguf/writer.h"
#include "kernels/api.h"
#include "model/model.h"
#include "model/arch_test_util.h"
#include "runtime/model_runner.h"

using namespace pagoda;

namespace {

using testutil::MemModel;

Expected<MemModel> synth_in_memory(const gguf::SynthOptions& o) {
  gguf::GgufWriter w;
  PAGODA_TRY(gguf::synth_model(o, &w));
  return testutil::to_memory(w);
}

using testutil::dequant;
using testutil::mv;

// Rows [r0, r0 + n) of a [rows, cols] matrix.
std::vector<double> rows_of(const std::vector<double>& w, size_t cols, size_t r0, size_t n) {
  return std::vector<double>(w.begin() + static_cast<std::ptrdiff_t>(r0 * cols),
                             w.begin() + static_cast<std::ptrdiff_t>((r0 + n) * cols));
}

// RMSNorm of each consecutive group of w.size() values of x.
void rmsnorm_groups(std::vector<double>& x, const std::vector<double>& w, double eps) {
  const size_t n = w.size();
  for (size_t g = 0; g + n <= x.size(); g += n) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[g + i] * x[g + i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (size_t i = 0; i < n; ++i) x[g + i] = x[g + i] * s * w[i];
  }
}

struct Arch {
  bool neox = false, qk_norm = false, post_norms = false, gelu = false, fused = false;
  double embd_scale = 1;
  std::vector<int> window;        // [n_layers] 0 = full
  std::vector<double> rope_base;  // [n_layers]
  std::vector<double> factors;    // [rope_dim / 2] or empty
  double attn_factor = 1;
};

void rope(std::vector<double>& v, int n_heads, int hd, double base, const Arch& a, int pos) {
  for (int h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * hd;
    for (int i = 0; i < hd / 2; ++i) {
      double theta = pos * std::pow(base, -2.0 * i / hd);
      if (!a.factors.empty()) theta /= a.factors[static_cast<size_t>(i)];
      const double c = std::cos(theta) * a.attn_factor, s = std::sin(theta) * a.attn_factor;
      const int p = a.neox ? i : 2 * i, q = a.neox ? i + hd / 2 : 2 * i + 1;
      const double x0 = x[p], x1 = x[q];
      x[p] = x0 * c - x1 * s;
      x[q] = x0 * s + x1 * c;
    }
  }
}

// Logits [T][n_vocab] at every position.
std::vector<std::vector<double>> dense_forward(const gguf::GgufFile& f, const gguf::SynthShape& sh, const Arch& a,
                                               const std::vector<int32_t>& tokens) {
  const int H = static_cast<int>(sh.n_head), KVH = static_cast<int>(sh.n_head_kv), D = static_cast<int>(sh.head_dim());
  const size_t E = static_cast<size_t>(sh.n_embd), F = static_cast<size_t>(sh.n_ff);
  const double eps = sh.rms_eps;
  const auto emb = dequant(f, "token_embd.weight");
  auto out_w = dequant(f, "output.weight");
  if (out_w.empty()) out_w = emb;
  const size_t T = tokens.size();
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) {
    x[t].assign(emb.begin() + tokens[t] * static_cast<int64_t>(E), emb.begin() + (tokens[t] + 1) * static_cast<int64_t>(E));
    for (double& v : x[t]) v *= static_cast<double>(static_cast<float>(a.embd_scale));
  }
  for (int l = 0; l < sh.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const size_t qd = static_cast<size_t>(H * D), kd = static_cast<size_t>(KVH * D);
    std::vector<double> wq, wk, wv, wg, wu;
    if (a.fused) {
      const auto qkv = dequant(f, p + "attn_qkv.weight");
      wq = rows_of(qkv, E, 0, qd);
      wk = rows_of(qkv, E, qd, kd);
      wv = rows_of(qkv, E, qd + kd, kd);
      const auto gu = dequant(f, p + "ffn_up.weight");
      wg = rows_of(gu, E, 0, F);
      wu = rows_of(gu, E, F, F);
    } else {
      wq = dequant(f, p + "attn_q.weight");
      wk = dequant(f, p + "attn_k.weight");
      wv = dequant(f, p + "attn_v.weight");
      wg = dequant(f, p + "ffn_gate.weight");
      wu = dequant(f, p + "ffn_up.weight");
    }
    const auto an = dequant(f, p + "attn_norm.weight"), wo = dequant(f, p + "attn_output.weight"),
               fnw = dequant(f, p + "ffn_norm.weight"), wd = dequant(f, p + "ffn_down.weight"),
               qn = dequant(f, p + "attn_q_norm.weight"), kn = dequant(f, p + "attn_k_norm.weight"),
               pan = dequant(f, p + "post_attention_norm.weight"), pfn = dequant(f, p + "post_ffw_norm.weight");
    EXPECT_EQ(!qn.empty(), a.qk_norm) << p;
    EXPECT_EQ(!pan.empty(), a.post_norms) << p;
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto xn = x[t];
      rmsnorm_groups(xn, an, eps);
      q[t] = mv(wq, xn);
      k[t] = mv(wk, xn);
      v[t] = mv(wv, xn);
      if (a.qk_norm) {
        rmsnorm_groups(q[t], qn, eps);
        rmsnorm_groups(k[t], kn, eps);
      }
      rope(q[t], H, D, a.rope_base[static_cast<size_t>(l)], a, static_cast<int>(t));
      rope(k[t], KVH, D, a.rope_base[static_cast<size_t>(l)], a, static_cast<int>(t));
    }
    const int W = a.window[static_cast<size_t>(l)];
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(qd, 0.0);
      const size_t j0 = W > 0 && t + 1 > static_cast<size_t>(W) ? t + 1 - static_cast<size_t>(W) : 0;
      for (int h = 0; h < H; ++h) {
        const int kh = h / (H / KVH);
        std::vector<double> s(t + 1, 0.0);
        double mx = -1e300;
        for (size_t j = j0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][h * D + i] * k[j][kh * D + i];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (size_t j = j0; j <= t; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (size_t j = j0; j <= t; ++j)
          for (int i = 0; i < D; ++i) att[h * D + i] += s[j] / z * v[j][kh * D + i];
      }
      auto o = mv(wo, att);
      if (a.post_norms) rmsnorm_groups(o, pan, eps);
      for (size_t i = 0; i < E; ++i) x[t][i] += o[i];
      auto xn = x[t];
      rmsnorm_groups(xn, fnw, eps);
      auto g = mv(wg, xn);
      const auto u = mv(wu, xn);
      for (size_t i = 0; i < g.size(); ++i) {
        const double z = g[i];
        // GELU as llama.cpp evaluates it (kernels/api.h gelu_mul): the tanh form at z
        // rounded to f16, rounded to f16.
        const double gelu = z <= -10 ? 0.0 : z >= 10 ? z : kernels::gelu_of_f16(fp32_to_fp16(static_cast<float>(z)));
        g[i] = (a.gelu ? gelu : z / (1.0 + std::exp(-z))) * u[i];
      }
      auto d = mv(wd, g);
      if (a.post_norms) rmsnorm_groups(d, pfn, eps);
      for (size_t i = 0; i < E; ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<double>> logits(T);
  const auto on = dequant(f, "output_norm.weight");
  for (size_t t = 0; t < T; ++t) {
    auto xn = x[t];
    rmsnorm_groups(xn, on, eps);
    logits[t] = mv(out_w, xn);
  }
  return logits;
}

// A small shape of `arch` with the given options (head_dim 16: 4 rope pairs per
// half; 17 tokens so that a window of 5 drops keys in the local layers).
gguf::SynthShape small_shape(const std::string& arch) {
  gguf::SynthShape s;
  s.name = "arch-" + arch;
  s.arch = arch;
  s.pre = "smollm";
  s.n_embd = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 96;
  s.n_vocab = 320;
  s.n_ctx = 64;
  s.rope_base = 1000.0;
  s.rms_eps = 1e-6;
  return s;
}

const std::vector<int32_t> kTokens = {5, 300, 17, 17, 42, 100, 7, 250, 1, 99, 64, 128, 3, 200, 11, 12, 13};

// context: what the model is loaded for (0: its own context_length).
void check(const gguf::SynthShape& sh, const Arch& a, model::KernelBackend backend, double tol, int32_t context = 0) {
  gguf::SynthOptions o;
  o.shape = sh;
  o.type = GgmlType::F32;  // ref matmul is then exact: differences are the arithmetic of the blocks
  o.seed = 91;
  auto mem = synth_in_memory(o);
  ASSERT_TRUE(mem.ok()) << mem.message();
  auto m = model::Model::from_gguf(mem->file, {.context_length = context});
  ASSERT_TRUE(m.ok()) << m.message();
  const auto want = dense_forward(*mem->file, sh, a, kTokens);

  // Prefill the first 7 tokens as one step, then one token per step, block size 4,
  // so windows start mid-page and cross pages.
  runtime::RunnerOptions ro;
  ro.block_size = 4;
  ro.num_blocks = 8;
  ro.backend = backend;
  auto runner = runtime::ModelRunner::create(**m, ro);
  ASSERT_TRUE(runner.ok()) << runner.message();
  archtest::OneSeq seq(**runner, ro.block_size);
  for (size_t t = 6; t < kTokens.size(); ++t) {
    const std::span<const int32_t> feed =
        t == 6 ? std::span<const int32_t>(kTokens.data(), 7) : std::span<const int32_t>(&kTokens[t], 1);
    const std::vector<float> l = seq.feed(feed);
    ASSERT_EQ(l.size(), want[t].size());
    double max_abs = 0;
    for (double v : want[t]) max_abs = std::max(max_abs, std::fabs(v));
    for (size_t i = 0; i < want[t].size(); ++i) {
      ASSERT_NEAR(l[i], want[t][i], tol * max_abs) << sh.arch << " position " << t << " logit " << i;
    }
  }
}

constexpr auto kRef = model::KernelBackend::Ref;
constexpr auto kCpu = model::KernelBackend::Cpu;

Arch plain(const gguf::SynthShape& s) {
  Arch a;
  a.window.assign(static_cast<size_t>(s.n_layer), 0);
  a.rope_base.assign(static_cast<size_t>(s.n_layer), s.rope_base);
  return a;
}

TEST(ArchParity, Qwen3QkNormMatchesDense) {
  auto s = small_shape("qwen3");
  s.n_head_dim = 32;  // q_dim 128 != n_embd 64, as qwen3-0.6b's 2048 vs 1024
  Arch a = plain(s);
  a.neox = a.qk_norm = true;
  check(s, a, kRef, 1e-5);
  check(s, a, kCpu, 1e-4);
  auto m = synth_in_memory(gguf::SynthOptions{.shape = s, .type = GgmlType::F32});
  ASSERT_TRUE(m.ok());
  auto model = model::Model::from_gguf(m->file);
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_TRUE((*model)->config().qk_norm);
  EXPECT_EQ((*model)->config().head_dim, 32);
  EXPECT_NE((*model)->weights().layers[1].k_norm, nullptr);
}

TEST(ArchParity, Gemma3SlidingWindowGeGluPostNormsMatchDense) {
  auto s = small_shape("gemma3");
  s.n_layer = 6;  // layers 0..4 local (window), layer 5 global
  s.n_head_kv = 1;
  s.n_head_dim = 32;
  s.sliding_window = 5;
  s.rope_base = 1e6;
  Arch a = plain(s);
  a.neox = a.qk_norm = a.post_norms = a.gelu = true;
  a.embd_scale = std::sqrt(64.0);
  for (int l = 0; l < 5; ++l) {
    a.window[static_cast<size_t>(l)] = 5;
    a.rope_base[static_cast<size_t>(l)] = 10000.0;
  }
  // GELU rounds its input and output to f16 as llama.cpp does (kernels/api.h
  // gelu_mul): a gate value within float rounding of an f16 rounding boundary
  // takes one f16 step (2^-11 of it) in the engine and the other in this double
  // reference, so the tolerance is wider than the other architectures' (worst
  // seen 1.6e-4 of the largest logit, on one of the two backends); a wiring
  // error (a norm, the window, a rope base) moves the logits by far more (the
  // window check below).
  check(s, a, kRef, 5e-4);
  check(s, a, kCpu, 5e-4);
  // The window is what the model does: without it (all layers global) the dense
  // logits differ from the model's, so the check above could fail.
  Arch full = a;
  full.window.assign(6, 0);
  gguf::SynthOptions o{.shape = s, .type = GgmlType::F32, .seed = 91};
  auto mem = synth_in_memory(o);
  ASSERT_TRUE(mem.ok());
  const auto with = dense_forward(*mem->file, s, a, kTokens), without = dense_forward(*mem->file, s, full, kTokens);
  EXPECT_EQ(with[4], without[4]);   // position 4: the window of 5 still holds every key
  EXPECT_NE(with[16], without[16]);  // position 16: keys 0..11 are outside
  auto model = model::Model::from_gguf(mem->file);
  ASSERT_TRUE(model.ok()) << model.message();
  const model::ModelConfig& c = (*model)->config();
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(c.layers[static_cast<size_t>(l)].window, l == 5 ? 0 : 5) << l;
    EXPECT_EQ(c.layers[static_cast<size_t>(l)].rope_base, l == 5 ? 1e6f : 10000.f) << l;
  }
  EXPECT_EQ(c.ffn_act, model::FfnAct::GeluTanh);
  EXPECT_FLOAT_EQ(c.embd_scale, 8.0f);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(32.0f));
  EXPECT_TRUE(c.tied_output);
}

TEST(ArchParity, Llama3RopeFreqsMatchDense) {
  auto s = small_shape("llama");
  // Wavelengths of head_dim 16 at base 1000 span 6..3500 positions: with an
  // original context of 64 and low/high factors 1/4, pairs fall in all three bands.
  s.llama3_rope = {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_context = 64};
  Arch a = plain(s);
  const auto f = gguf::llama3_rope_factors(s.llama3_rope, s.rope_base, s.head_dim());
  ASSERT_EQ(f.size(), 8u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[7], 8.0f);
  EXPECT_TRUE(std::any_of(f.begin(), f.end(), [](float v) { return v > 1.0f && v < 8.0f; }));
  a.factors.assign(f.begin(), f.end());
  check(s, a, kRef, 1e-5);
  check(s, a, kCpu, 1e-4);
}

TEST(ArchParity, Phi3FusedLongRopeMatchesDense) {
  auto s = small_shape("phi3");
  s.n_head_kv = 4;
  s.tied = false;
  s.sliding_window = 2047;  // declared by phi-3 files and ignored (as llama.cpp)
  s.n_ctx = 4096;
  s.longrope_original_context = 256;
  gguf::SynthOptions o{.shape = s, .type = GgmlType::F32, .seed = 91};
  auto mem = synth_in_memory(o);
  ASSERT_TRUE(mem.ok()) << mem.message();
  Arch a = plain(s);
  a.neox = a.fused = true;
  a.factors = dequant(*mem->file, "rope_factors_short.weight");
  ASSERT_EQ(a.factors.size(), 8u);
  a.attn_factor = static_cast<float>(std::sqrt(1.0 + std::log(16.0) / std::log(256.0)));
  auto model = model::Model::from_gguf(mem->file);
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_FLOAT_EQ((*model)->config().rope_attn_factor, static_cast<float>(a.attn_factor));
  EXPECT_EQ((*model)->config().layers[0].window, 0);
  EXPECT_TRUE((*model)->config().rope_long_factors);  // loaded for its own 4096 > 256
  // Loaded for the original context: the short factors.
  check(s, a, kRef, 1e-5, 256);
  check(s, a, kCpu, 1e-4, 256);
  // For more (the model's own 4096, or 257), the long ones, as llama.cpp.
  a.factors = dequant(*mem->file, "rope_factors_long.weight");
  check(s, a, kRef, 1e-5);
  check(s, a, kCpu, 1e-4, 257);
}

// YaRN as llama.cpp sets it up: ext_factor 1, correction dims from beta_fast 32 and
// beta_slow 1 over the original context (per layer base), everything else linear
// scaling. (Its arithmetic is checked against llama.cpp's logits in test_arch_llamacpp.)
TEST(ArchParity, YarnConfigFollowsLlamaCpp) {
  gguf::SynthShape s = *gguf::find_synth_preset("tiny-qwen3-yarn");
  auto mem = synth_in_memory(gguf::SynthOptions{.shape = s, .type = GgmlType::F32});
  ASSERT_TRUE(mem.ok()) << mem.message();
  auto m = model::Model::from_gguf(mem->file);
  ASSERT_TRUE(m.ok()) << m.message();
  const model::ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.rope_ext_factor, 1.0f);
  EXPECT_EQ(c.n_ctx_orig, 64);
  // head_dim 32, base 1e6, n_ctx_orig 64: 32 ln(64 / (32 * 2 pi)) / (2 ln 1e6) = -1.33
  // -> floor, at least 0: 0; 32 ln(64 / (2 pi)) / (2 ln 1e6) = 2.69 -> ceil: 3.
  EXPECT_EQ(c.layers[0].yarn_low, 0.0f);
  EXPECT_EQ(c.layers[0].yarn_high, 3.0f);
  EXPECT_EQ(c.layers[1].rope_freq_scale, 0.25f);
  auto bad = model::Model::from_gguf(mem->file, {.context_length = -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), "context length -1 must not be negative");
  float dims[2];
  model::yarn_corr_dims(128, 4096, 10000.0f, 32.0f, 1.0f, dims);  // a llama-2 shape: ggml gives 20, 46
  EXPECT_EQ(dims[0], 20.0f);
  EXPECT_EQ(dims[1], 46.0f);
}

TEST(ArchParity, BadArchitectureMetadataIsAClearError) {
  auto s = small_shape("gemma3");
  s.n_head_dim = 32;
  auto mem = synth_in_memory(gguf::SynthOptions{.shape = s, .type = GgmlType::F32});
  ASSERT_TRUE(mem.ok());
  // Rewrite with a missing q norm / a bad rope type / YaRN with DeepSeek's log multiplier.
  for (int edit = 0; edit < 3; ++edit) {
    gguf::GgufWriter w;
    for (const auto& [k, v] : mem->file->metadata()) w.set(k, v);
    if (edit == 1) w.set_string("gemma3.rope.scaling.type", "dynamic");
    if (edit == 2) {
      w.set_string("gemma3.rope.scaling.type", "yarn");
      w.set_f32("gemma3.rope.scaling.yarn_log_multiplier", 0.1f);
    }
    for (const gguf::TensorInfo& t : mem->file->tensors()) {
      if (edit == 0 && t.name == "blk.1.attn_q_norm.weight") continue;
      ASSERT_TRUE(w.add_tensor(t.name, t.dims, t.type, t.data, t.n_bytes).ok());
    }
    auto bytes = w.write_to_memory();
    ASSERT_TRUE(bytes.ok());
    auto f = gguf::GgufFile::from_memory(bytes->data(), bytes->size());
    ASSERT_TRUE(f.ok()) << f.message();
    auto m = model::Model::from_gguf(std::shared_ptr<const gguf::GgufFile>(std::move(*f)));
    ASSERT_FALSE(m.ok());
    const char* const want[] = {"tensor blk.1.attn_q_norm.weight: missing (expected shape [32])",
                                "gemma3.rope.scaling.type 'dynamic' is not supported (none, linear, longrope, yarn)",
                                "gemma3.rope.scaling.yarn_log_multiplier is not supported"};
    EXPECT_EQ(m.message(), want[edit]);
  }
}

}  // namespace
