// pagoda against llama.cpp on the tiny synth presets of the newer architectures
// (tiny-qwen3, tiny-qwen3-yarn, tiny-llama3 with llama-3.x rope_freqs, tiny-phi3
// with fused tensors and LongRoPE short and long factors, tiny-gemma3 with a
// sliding window of 8, tiny-lfm2's short convolutions, tiny-qwen35's gated
// delta-net), without
// llama.cpp: tests/data/arch_parity/<arch>.bin holds llama.cpp's logits after
// each of 63 positions of 4 random prompts (docs/parity/compare_arch.py
// --fixtures wrote them from `pagoda synth --preset tiny-<arch> --type f32`,
// which this test regenerates bit for bit). Per position: cosine >= 0.9999
// (issue 14 asks 0.999; with F32 weights the engines agree to 1e-5);
// over the 4 x 63 positions: top-1 agreement >= 97% (issue 14's criteria).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "gguf/synth.h"
#include "gguf/writer.h"
#include "kv/pool_plan.h"
#include "model/model.h"
#include "model/arch_test_util.h"
#include "runtime/model_runner.h"

using namespace pagoda;

namespace {

struct Fixture {
  uint32_t n_prompts = 0, n_pos = 0, n_vocab = 0;
  std::vector<int32_t> tokens;  // [n_prompts, n_pos]
  std::vector<float> logits;    // [n_prompts, n_pos - 1, n_vocab]
};

// Little-endian: 'PGAP', u32 n_prompts, n_pos, n_vocab, i32 tokens, f16 logits.
bool read_fixture(const std::string& path, Fixture* fx, std::string* err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *err = "cannot open " + path;
    return false;
  }
  char magic[4];
  uint32_t hdr[3];
  in.read(magic, 4);
  in.read(reinterpret_cast<char*>(hdr), sizeof(hdr));
  if (!in || std::memcmp(magic, "PGAP", 4) != 0 || hdr[0] == 0 || hdr[1] < 2 || hdr[2] == 0) {
    *err = "bad header in " + path;
    return false;
  }
  fx->n_prompts = hdr[0];
  fx->n_pos = hdr[1];
  fx->n_vocab = hdr[2];
  fx->tokens.resize(static_cast<size_t>(fx->n_prompts) * fx->n_pos);
  in.read(reinterpret_cast<char*>(fx->tokens.data()), static_cast<std::streamsize>(fx->tokens.size() * 4));
  std::vector<uint16_t> h(static_cast<size_t>(fx->n_prompts) * (fx->n_pos - 1) * fx->n_vocab);
  in.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(h.size() * 2));
  if (!in || in.peek() != std::char_traits<char>::eof()) {
    *err = "truncated or oversized " + path;
    return false;
  }
  fx->logits.resize(h.size());
  for (size_t i = 0; i < h.size(); ++i) fx->logits[i] = fp16_to_fp32(h[i]);
  return true;
}

// arch: the fixture tests/data/arch_parity/<arch>.bin; preset: the synth preset it
// was made from ("": tiny-<arch>); context: the context length llama.cpp was given
// and the model is loaded for (0: the model's own; phi3 picks its LongRoPE factors
// by it). min_top1: the fraction of positions whose argmax must agree (0.97 in
// issue 14 for qwen3, llama-3.x and phi3).
void check_arch(const std::string& arch, model::KernelBackend backend, const std::string& preset = "",
                int32_t context = 0, double min_top1 = 0.97) {
  Fixture fx;
  std::string err;
  ASSERT_TRUE(read_fixture(std::string(PAGODA_TEST_DATA) + "/arch_parity/" + arch + ".bin", &fx, &err)) << err;

  // The file `pagoda synth --preset tiny-<arch> --type f32` writes (cmd_synth's options).
  // F32 weights: no activation quantization on either side (ggml's f32 matmul, pagoda's
  // f32 path), so what is left to differ is the architecture's arithmetic.
  const gguf::SynthShape* shape = gguf::find_synth_preset(preset.empty() ? "tiny-" + arch : preset);
  ASSERT_NE(shape, nullptr);
  gguf::SynthOptions o;
  o.shape = *shape;
  o.type = GgmlType::F32;
  o.k_quant_fallback = true;
  gguf::GgufWriter w;
  ASSERT_TRUE(gguf::synth_model(o, &w).ok());
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.ok());
  auto keep = std::make_shared<std::vector<uint8_t>>(std::move(*bytes));
  auto f = gguf::GgufFile::from_memory(keep->data(), keep->size());
  ASSERT_TRUE(f.ok()) << f.message();
  auto m = model::Model::from_gguf(std::shared_ptr<const gguf::GgufFile>(std::move(*f)), {.context_length = context});
  ASSERT_TRUE(m.ok()) << m.message();
  ASSERT_EQ(static_cast<uint32_t>((*m)->config().n_vocab), fx.n_vocab);

  runtime::RunnerOptions ro;
  ro.block_size = 16;
  ro.num_blocks = runtime::blocks_for_context(fx.n_pos, ro.block_size);
  ro.kv_dtype = kernels::KvDtype::F16;  // llama.cpp's default K/V type, as `pagoda run`'s
  ro.backend = backend;
  std::vector<int32_t> state_table;  // lfm2: the recurrent state's blocks, after the attention blocks
  const model::ModelConfig& mc = (*m)->config();
  if (mc.n_state_rows > 0) {
    kv::PoolRequest pr;
    pr.shape = {.kind = kv::AttentionKind::kMQA, .num_layers = mc.n_layers, .num_kv_heads = 1, .head_dim = mc.kv_dim()};
    pr.dtype = kv::kv_dtype_of(ro.kv_dtype);
    for (const model::LayerAttn& a : mc.layers) pr.layer_windows.push_back(a.recurrent ? kv::kStateWindow : 0);
    pr.block_size = ro.block_size;
    pr.state_rows = mc.n_state_rows;
    pr.state_row_bytes = static_cast<uint64_t>(mc.state_row_floats) * 4;
    pr.one_context_tokens = fx.n_pos;
    auto plan = kv::plan_pool(pr);
    ASSERT_TRUE(plan.ok()) << plan.message();
    ro.use_pool(*plan);
    for (int32_t b = ro.num_blocks - plan->layout.state_blocks; b < ro.num_blocks; ++b) state_table.push_back(b);
  }
  auto runner = runtime::ModelRunner::create(**m, ro);
  ASSERT_TRUE(runner.ok()) << runner.message();
  int agree = 0, total = 0;
  double min_cos = 1.0;
  for (uint32_t p = 0; p < fx.n_prompts; ++p) {
    archtest::OneSeq seq(**runner, ro.block_size, state_table);
    for (uint32_t i = 0; i + 1 < fx.n_pos; ++i) {
      const int32_t tok = fx.tokens[p * fx.n_pos + i];
      const std::vector<float> l = seq.feed(std::span<const int32_t>(&tok, 1));
      ASSERT_EQ(l.size(), fx.n_vocab);
      const float* ref = fx.logits.data() + (static_cast<size_t>(p) * (fx.n_pos - 1) + i) * fx.n_vocab;
      double dot = 0, na = 0, nb = 0;
      for (uint32_t v = 0; v < fx.n_vocab; ++v) {
        dot += static_cast<double>(l[v]) * ref[v];
        na += static_cast<double>(l[v]) * l[v];
        nb += static_cast<double>(ref[v]) * ref[v];
      }
      const double cos = dot / std::sqrt(na * nb);
      min_cos = std::min(min_cos, cos);
      EXPECT_GE(cos, 0.9999) << arch << " prompt " << p << " position " << i;
      const auto top = [&](const float* x) { return std::max_element(x, x + fx.n_vocab) - x; };
      agree += top(l.data()) == top(ref);
      ++total;
    }
  }
  EXPECT_GE(agree, static_cast<int>(std::ceil(min_top1 * total))) << arch << ": top-1 " << agree << "/" << total;
  std::printf("%s (%s): top-1 %d/%d, min cosine %.6f\n", arch.c_str(),
              backend == model::KernelBackend::Ref ? "ref" : "cpu", agree, total, min_cos);
}

// Both kernel backends against the same fixture.
void check_both(const std::string& arch, const std::string& preset = "", int32_t context = 0) {
  for (const auto backend : {model::KernelBackend::Cpu, model::KernelBackend::Ref}) {
    SCOPED_TRACE(backend == model::KernelBackend::Ref ? "ref" : "cpu");
    check_arch(arch, backend, preset, context);
  }
}

TEST(ArchLlamaCpp, Qwen3) { check_both("qwen3"); }
TEST(ArchLlamaCpp, Llama3RopeScaling) { check_both("llama3"); }
// At llama.cpp's context of 256, the original context: the short factors.
TEST(ArchLlamaCpp, Phi3LongRope) { check_both("phi3", "", 256); }
// YaRN (rope.scaling.type yarn, factor 4 over an original context of 64): the
// extrapolation/interpolation ramp and the 1 + 0.1 ln(4) rotation scale.
TEST(ArchLlamaCpp, Qwen3Yarn) { check_both("qwen3-yarn"); }
// tiny-phi3 run with a context of 512, past its original 256: llama.cpp and pagoda
// both take rope_factors_long (phi3.bin above is the same file at 256: short factors).
TEST(ArchLlamaCpp, Phi3LongRopeLongFactors) { check_both("phi3-long", "tiny-phi3", 512); }
TEST(ArchLlamaCpp, Gemma3SlidingWindow) { check_both("gemma3"); }
// LFM2 (issue 38): short-convolution layers (their recurrent state in the
// runner's state blocks) and attention layers with Q/K norms.
TEST(ArchLlamaCpp, Lfm2ShortConv) { check_both("lfm2"); }
// Qwen3.5 (issue 38): Gated DeltaNet layers (convolution + delta-rule state in
// the runner's state blocks; 4 v heads over 2 k heads) and gated attention
// layers with Q/K norms and partial rope (llama.cpp's interleaved M-RoPE).
TEST(ArchLlamaCpp, Qwen35GatedDeltaNet) { check_both("qwen35"); }
// Mamba-2 (issue 38): selective-scan layers only (no attention, no FFN): the
// conv (+ bias, SiLU) and scan state in the runner's state blocks, 8 heads over
// 2 B/C groups, the gated grouped RMSNorm.
TEST(ArchLlamaCpp, Mamba2SelectiveScan) { check_both("mamba2"); }

}  // namespace
