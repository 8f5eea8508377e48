// Model loading, validation and a parity test against an independent dense
// (non-paged, double precision) implementation written here from the math.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/recurrent_state.h"
#include "common/dense_ref.h"
#include "common/mem_gguf.h"
#include "gguf/dequant.h"
#include "model/arch.h"
#include "gguf/synth.h"
#include "gguf/writer.h"
#include "model/golden_util.h"

using namespace pagoda;
using namespace pagoda::golden;

namespace {

using testutil::MemModel;
using testutil::to_memory;

// stories260K rewritten with edits: metadata keys dropped / tensors dropped or reshaped.
struct Edits {
  std::vector<std::string> drop_keys;
  std::vector<std::string> drop_tensors;
  std::map<std::string, std::vector<uint64_t>> reshape;  // name -> new dims (F32)
  std::string flip_byte_of;                               // tensor whose first byte changes
  std::string arch;  // non-empty: general.architecture becomes this and llama.* keys arch.*
};

Expected<MemModel> edited_stories(const Edits& e) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> src, gguf::GgufFile::open(stories_path()));
  gguf::GgufWriter w;
  for (const auto& [k, v] : src->metadata()) {
    if (std::find(e.drop_keys.begin(), e.drop_keys.end(), k) != e.drop_keys.end()) continue;
    if (!e.arch.empty() && k == "general.architecture") {
      w.set_string(k, e.arch);
    } else if (!e.arch.empty() && k.rfind("llama.", 0) == 0) {
      w.set(e.arch + k.substr(5), v);
    } else {
      w.set(k, v);
    }
  }
  for (const gguf::TensorInfo& t : src->tensors()) {
    if (std::find(e.drop_tensors.begin(), e.drop_tensors.end(), t.name) != e.drop_tensors.end()) continue;
    auto it = e.reshape.find(t.name);
    if (it != e.reshape.end()) {
      uint64_t n = 1;
      for (uint64_t d : it->second) n *= d;
      std::vector<float> zeros(n, 0.0f);
      PAGODA_TRY(w.add_tensor(t.name, it->second, GgmlType::F32, zeros.data(), n * 4));
    } else {
      std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
      if (t.name == e.flip_byte_of) data[0] ^= 1;
      PAGODA_TRY(w.add_tensor(t.name, t.dims, t.type, data.data(), data.size()));
    }
  }
  return to_memory(w);
}

std::string load_error(const Edits& e) {
  auto m = edited_stories(e);
  if (!m.ok()) return "edit failed: " + m.message();
  auto model = model::Model::from_gguf(m->file);
  return model.ok() ? "" : model.message();
}

}  // namespace

TEST(ModelLoad, ShapeMismatchNamesTensorAndShapes) {
  Edits e;
  e.reshape["blk.3.attn_q.weight"] = {64, 56};
  EXPECT_EQ(load_error(e), "tensor blk.3.attn_q.weight: expected [64, 64], found [64, 56]");
}

TEST(ModelLoad, MissingTensorAndMetadataAreErrors) {
  Edits e;
  e.drop_tensors = {"blk.2.ffn_up.weight"};
  EXPECT_EQ(load_error(e), "tensor blk.2.ffn_up.weight: missing (expected shape [64, 172])");
  Edits k;
  k.drop_keys = {"llama.block_count"};
  EXPECT_NE(load_error(k).find("llama.block_count: missing"), std::string::npos) << load_error(k);
  Edits a;
  a.drop_keys = {"general.architecture"};
  EXPECT_NE(load_error(a).find("general.architecture"), std::string::npos) << load_error(a);
}

TEST(ModelLoad, MissingOutputMeansTiedEmbeddings) {
  Edits e;
  e.drop_tensors = {"output.weight"};
  auto m = edited_stories(e);
  ASSERT_TRUE(m.ok()) << m.message();
  auto model = model::Model::from_gguf(m->file);
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_TRUE((*model)->config().tied_output);
  EXPECT_EQ((*model)->weights().output.data, (*model)->weights().token_embd.data);
  EXPECT_EQ((*model)->weights().output.rows, 512);
  // It runs (different tokens, of course).
  EXPECT_EQ(runner_greedy(**model, {1, 403, 407}, 5).size(), 5u);
}

TEST(ModelArch, RegistryMapsNamesToArchitectureFiles) {
  const model::ArchDef* llama = model::find_arch("llama");
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(model::find_arch("mistral"), llama);  // a registry line over llama.cc
  ASSERT_NE(model::find_arch("qwen2"), nullptr);
  EXPECT_NE(model::find_arch("qwen2"), llama);
  for (const char* name : {"qwen3", "phi3", "gemma3", "lfm2", "qwen35", "mamba2"}) {
    ASSERT_NE(model::find_arch(name), nullptr) << name;
    EXPECT_NE(model::find_arch(name), llama) << name;
  }
  EXPECT_EQ(model::find_arch("gemma2"), nullptr);
  EXPECT_EQ(model::find_arch("Llama"), nullptr);
  EXPECT_EQ(model::arch_names(), "llama, mistral, qwen2, qwen3, phi3, gemma3, lfm2, qwen35, mamba2");
  Edits e;
  e.arch = "gemma2";
  EXPECT_EQ(load_error(e), "general.architecture 'gemma2' is not supported (llama, mistral, qwen2, qwen3, phi3, gemma3, lfm2, qwen35, mamba2)");
}

TEST(ModelArch, MistralRunsTheLlamaForwardUnderItsOwnKeys) {
  Edits e;
  e.arch = "mistral";
  auto m = edited_stories(e);
  ASSERT_TRUE(m.ok()) << m.message();
  auto mistral = model::Model::from_gguf(m->file);
  ASSERT_TRUE(mistral.ok()) << mistral.message();
  EXPECT_EQ((*mistral)->config().arch, "mistral");
  EXPECT_EQ((*mistral)->config().n_layers, 5);
  auto llama = model::Model::load(stories_path());
  ASSERT_TRUE(llama.ok()) << llama.message();
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  EXPECT_EQ(runner_greedy(**mistral, prompt, 8), runner_greedy(**llama, prompt, 8));
  // Only the arch name moved, so the fingerprint (which hashes it) must differ.
  EXPECT_NE((*mistral)->fingerprint(), (*llama)->fingerprint());
}

TEST(ModelArch, Qwen2BindsItsBiases) {
  // stories260K relabelled qwen2 has the llama tensors but no q/k/v biases.
  Edits e;
  e.arch = "qwen2";
  EXPECT_EQ(load_error(e), "tensor blk.0.attn_q.bias: missing (expected shape [64])");
}

TEST(ModelLoad, FingerprintIsStableAndSeesWeights) {
  auto a = model::Model::load(stories_path());
  auto b = model::Model::load(stories_path());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->fingerprint(), (*b)->fingerprint());
  Edits e;
  e.flip_byte_of = "blk.4.ffn_down.weight";
  auto m = edited_stories(e);
  ASSERT_TRUE(m.ok()) << m.message();
  auto c = model::Model::from_gguf(m->file);
  ASSERT_TRUE(c.ok());
  EXPECT_NE((*a)->fingerprint(), (*c)->fingerprint());
  // Per token: all of stories260K's F32 weights, once (output is separate from token_embd here)
  // except the embedding matrix, of which one row is read.
  const uint64_t per_token = (*a)->weight_bytes_per_token();
  EXPECT_EQ(per_token, static_cast<uint64_t>((*a)->gguf().tensors().back().offset + (*a)->gguf().tensors().back().n_bytes) -
                           512 * 64 * 4 + 64 * 4);
}

// ---- Dense double-precision reference ----------------------------------------

namespace {

using testutil::dequant;
using testutil::mv;

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

void rope(std::vector<double>& v, int n_heads, int hd, int rope_dim, double base, bool neox, int pos) {
  for (int h = 0; h < n_heads; ++h) {
    double* x = v.data() + h * hd;
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double theta = pos * std::pow(base, -2.0 * i / rope_dim);
      const int a = neox ? i : 2 * i, b = neox ? i + rope_dim / 2 : 2 * i + 1;
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      x[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
}

// Logits [n_tokens][n_vocab] at every position of `tokens`.
std::vector<std::vector<double>> dense_forward(const gguf::GgufFile& f, const model::ModelConfig& c,
                                               const std::vector<int32_t>& tokens) {
  const int H = c.n_heads, KVH = c.n_kv_heads, D = c.head_dim, E = c.n_embd;
  const auto emb = dequant(f, "token_embd.weight");
  auto out_w = dequant(f, "output.weight");
  if (out_w.empty()) out_w = emb;
  const size_t T = tokens.size();
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) x[t].assign(emb.begin() + tokens[t] * E, emb.begin() + (tokens[t] + 1) * E);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto an = dequant(f, p + "attn_norm.weight"), wq = dequant(f, p + "attn_q.weight"),
               wk = dequant(f, p + "attn_k.weight"), wv = dequant(f, p + "attn_v.weight"),
               wo = dequant(f, p + "attn_output.weight"), fnw = dequant(f, p + "ffn_norm.weight"),
               wg = dequant(f, p + "ffn_gate.weight"), wu = dequant(f, p + "ffn_up.weight"),
               wd = dequant(f, p + "ffn_down.weight"), bq = dequant(f, p + "attn_q.bias"),
               bk = dequant(f, p + "attn_k.bias"), bv = dequant(f, p + "attn_v.bias");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      const auto xn = rmsnorm(x[t], an, c.rms_eps);
      q[t] = mv(wq, xn);
      k[t] = mv(wk, xn);
      v[t] = mv(wv, xn);
      for (size_t i = 0; i < bq.size(); ++i) q[t][i] += bq[i];
      for (size_t i = 0; i < bk.size(); ++i) k[t][i] += bk[i];
      for (size_t i = 0; i < bv.size(); ++i) v[t][i] += bv[i];
      rope(q[t], H, D, c.rope_dim, c.rope_base, c.rope_neox, static_cast<int>(t));
      rope(k[t], KVH, D, c.rope_dim, c.rope_base, c.rope_neox, static_cast<int>(t));
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(H * D), 0.0);
      for (int h = 0; h < H; ++h) {
        const int kh = h / (H / KVH);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += q[t][h * D + i] * k[j][kh * D + i];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (int i = 0; i < D; ++i) att[h * D + i] += s[j] / z * v[j][kh * D + i];
      }
      const auto o = mv(wo, att);
      for (int i = 0; i < E; ++i) x[t][i] += o[i];
      const auto xn = rmsnorm(x[t], fnw, c.rms_eps);
      auto g = mv(wg, xn);
      const auto u = mv(wu, xn);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto d = mv(wd, g);
      for (int i = 0; i < E; ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<double>> logits(T);
  const auto on = dequant(f, "output_norm.weight");
  for (size_t t = 0; t < T; ++t) logits[t] = mv(out_w, rmsnorm(x[t], on, c.rms_eps));
  return logits;
}

void check_parity(const std::string& arch, GgmlType type, bool tied, model::KernelBackend backend, float tol) {
  gguf::SynthOptions o;
  o.shape.name = "parity-" + arch;
  o.shape.arch = arch;
  o.shape.pre = arch == "qwen2" ? "qwen2" : "smollm";
  o.shape.n_embd = 64;
  o.shape.n_layer = 2;
  o.shape.n_head = 4;
  o.shape.n_head_kv = 2;
  o.shape.n_ff = 96;
  o.shape.n_vocab = 320;
  o.shape.n_ctx = 64;
  o.shape.rope_base = 1000.0;
  o.shape.tied = tied;
  o.shape.qkv_bias = arch == "qwen2";
  o.type = type;
  o.seed = 77;
  gguf::GgufWriter w;
  ASSERT_TRUE(gguf::synth_model(o, &w).ok());
  auto mem = to_memory(w);
  ASSERT_TRUE(mem.ok()) << mem.message();
  auto m = model::Model::from_gguf(mem->file);
  ASSERT_TRUE(m.ok()) << m.message();
  const model::ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.rope_neox, arch == "qwen2");
  EXPECT_EQ(c.attn_bias, arch == "qwen2");
  EXPECT_EQ(c.tied_output, tied);

  const std::vector<int32_t> tokens = {5, 300, 17, 17, 42, 100, 7, 250, 1, 99, 64, 128, 3};
  const auto want = dense_forward(*mem->file, c, tokens);

  // Prefill the first 6 as one step, then one token per step, block size 4.
  runtime::RunnerOptions ro;
  ro.block_size = 4;
  ro.num_blocks = 8;
  ro.backend = backend;
  auto runner = runtime::ModelRunner::create(**m, ro);
  ASSERT_TRUE(runner.ok());
  // One sequence driven through ModelRunner::execute: blocks 1, 2, ... (block 0
  // is the null block), grown to cover the tokens computed so far.
  sched::StepPlan plan;
  plan.seqs.resize(1);
  sched::ScheduledSeq& q = plan.seqs[0];
  q.request_id = 1;
  q.wants_logits = true;
  for (size_t t = 5; t < tokens.size(); ++t) {
    const size_t begin = t == 5 ? 0 : t;
    q.start_pos = static_cast<int32_t>(begin);
    q.token_ids.assign(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                       tokens.begin() + static_cast<std::ptrdiff_t>(t + 1));
    while (static_cast<int32_t>(q.block_ids.size()) * ro.block_size < static_cast<int32_t>(t + 1))
      q.block_ids.push_back(static_cast<int32_t>(q.block_ids.size()) + 1);
    auto l = (*runner)->execute(plan);
    ASSERT_TRUE(l.ok()) << l.message();
    ASSERT_EQ(l->size(), 1);
    const std::span<const float> row = l->row(0);
    double max_abs = 0;
    for (double v : want[t]) max_abs = std::max(max_abs, std::fabs(v));
    for (size_t i = 0; i < want[t].size(); ++i) {
      ASSERT_NEAR(row[i], want[t][i], tol * max_abs) << arch << " position " << t << " logit " << i;
    }
  }
}

}  // namespace

// ref:: matmul dequantizes weights exactly, so it matches the dense reference
// tightly; cpu:: may quantize activations (as ggml does), hence a looser bound.
void check_parity_ref_and_cpu(const std::string& arch, GgmlType type, bool tied, float cpu_tol) {
  check_parity(arch, type, tied, model::KernelBackend::Ref, 1e-4f);
  check_parity(arch, type, tied, model::KernelBackend::Cpu, cpu_tol);
}
TEST(ModelParity, LlamaF32MatchesDenseReference) { check_parity_ref_and_cpu("llama", GgmlType::F32, false, 1e-4f); }
TEST(ModelParity, LlamaQ8TiedMatchesDenseReference) { check_parity_ref_and_cpu("llama", GgmlType::Q8_0, true, 2e-2f); }
TEST(ModelParity, LlamaQ4_1MatchesDenseReference) { check_parity_ref_and_cpu("llama", GgmlType::Q4_1, true, 2e-2f); }
TEST(ModelParity, Qwen2BiasNeoxMatchesDenseReference) {
  check_parity_ref_and_cpu("qwen2", GgmlType::F32, true, 1e-4f);
}

namespace qwen35_test {

// A synth preset (F32) in memory, with `edit` applied to the writer before it is written.
Expected<std::unique_ptr<model::Model>> tiny_model(const char* preset, const std::function<void(gguf::GgufWriter&)>& edit) {
  gguf::SynthOptions o;
  o.shape = *gguf::find_synth_preset(preset);
  o.type = GgmlType::F32;
  gguf::GgufWriter w;
  PAGODA_TRY(gguf::synth_model(o, &w));
  if (edit) edit(w);
  PAGODA_ASSIGN_OR_RETURN(MemModel m, testutil::to_memory(w));
  return model::Model::from_gguf(m.file);
}

// qwen35 (issue 38): the hybrid's config from llama.cpp's keys, and clear errors
// for what pagoda does not run.
TEST(ModelArch, Qwen35ConfigAndRefusals) {
  auto m = tiny_model("tiny-qwen35", nullptr);
  ASSERT_TRUE(m.ok()) << m.message();
  const model::ModelConfig& c = (*m)->config();
  std::vector<bool> rec;
  for (const model::LayerAttn& a : c.layers) rec.push_back(a.recurrent);
  EXPECT_EQ(rec, (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_EQ(c.ssm_d_conv, 4);
  EXPECT_EQ(c.ssm_d_state, 16);
  EXPECT_EQ(c.ssm_n_k_heads, 2);
  EXPECT_EQ(c.ssm_n_v_heads, 4);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.head_dim, 32);
  // 4 delta-net layers x (3 x 128 / 16 conv rows + 4 x 16 matrix rows) of 16 floats.
  EXPECT_EQ(c.n_state_rows, 4 * (24 + 64));
  EXPECT_EQ(c.state_row_floats, 16);
  const auto err = [](const std::function<void(gguf::GgufWriter&)>& edit) {
    auto r = tiny_model("tiny-qwen35", edit);
    return r.ok() ? std::string("loaded") : r.message();
  };
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("qwen35.ssm.inner_size", 48); }),
            "qwen35.ssm.inner_size 48 must be time_step_rank x state_size (4 x 16)");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("qwen35.ssm.group_count", 3); }),
            "qwen35.ssm.time_step_rank 4 must be a multiple of ssm.group_count 3");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("qwen35.nextn_predict_layers", 1); }),
            "qwen35.nextn_predict_layers: qwen35's MTP draft layers are not supported");
  // Sections 2/2/2/2 over 8 rotary pairs: pair 6 would take the 4th (vision) position.
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_i32_array("qwen35.rope.dimension_sections", {2, 2, 2, 2}); }),
            "qwen35.rope.dimension_sections: rotary pair 6 takes the 4th (vision) position; unsupported");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("qwen35.ssm.conv_kernel", 1); }),
            "metadata qwen35.ssm.conv_kernel: expected an integer in 2..64");
}

}  // namespace qwen35_test

namespace mamba2_test {

using qwen35_test::tiny_model;

// mamba2 (issue 38): the config from llama.cpp's keys (no attention, no FFN:
// head_count and feed_forward_length 0), and clear errors for malformed files.
TEST(ModelArch, Mamba2ConfigAndRefusals) {
  auto m = tiny_model("tiny-mamba2", nullptr);
  ASSERT_TRUE(m.ok()) << m.message();
  const model::ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.n_recurrent_layers(), 3);
  EXPECT_EQ(c.ssm_d_conv, 4);
  EXPECT_EQ(c.ssm_d_inner, 128);
  EXPECT_EQ(c.ssm_d_state, 32);
  EXPECT_EQ(c.ssm_n_head, 8);
  EXPECT_EQ(c.ssm_n_group, 2);
  EXPECT_EQ(c.n_ff, 0);
  // The pool's token rows: one "head" one state row wide.
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 32);
  // 3 layers x (3 x (128 + 2 x 2 x 32) / 32 conv rows + 128 scan rows) of 32 floats.
  EXPECT_EQ(c.n_state_rows, 3 * (24 + 128));
  EXPECT_EQ(c.state_row_floats, 32);
  EXPECT_EQ(mamba2_state(1, 4, 1536, 1, 128).rows, 42 + 1536);  // mamba2-130m: one layer
  const auto err = [](const std::function<void(gguf::GgufWriter&)>& edit) {
    auto r = tiny_model("tiny-mamba2", edit);
    return r.ok() ? std::string("loaded") : r.message();
  };
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("mamba2.ssm.time_step_rank", 6); }),
            "mamba2.ssm.inner_size 128 must be a multiple of ssm.time_step_rank (heads) 6");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("mamba2.ssm.group_count", 3); }),
            "mamba2.ssm.time_step_rank 8 must be a multiple of ssm.group_count 3");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("mamba2.ssm.state_size", 48); }),
            "mamba2.ssm.inner_size 128 must be a multiple of ssm.state_size 48 (the state is kept in rows of state_size floats)");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("mamba2.ssm.conv_kernel", 1); }),
            "metadata mamba2.ssm.conv_kernel: expected an integer in 2..64");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_string("mamba2.ssm.group_count", "two"); }),
            "metadata mamba2.ssm.group_count: expected an integer in 1..1024");
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("mamba2.attention.head_count", 8); }),
            "mamba2.: mamba2 with attention heads or a feed-forward (a hybrid such as falcon-h1) is not supported");
  // A state_size the tensors do not have: the first tensor whose shape depends on it is named.
  EXPECT_EQ(err([](gguf::GgufWriter& w) { w.set_u32("mamba2.ssm.state_size", 16); }),
            "tensor blk.0.ssm_in.weight: expected [64, 328], found [64, 392]");
}

}  // namespace mamba2_test
