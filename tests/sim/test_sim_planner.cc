// sim/: model presets, HF config and GGUF loading, hardware, the capacity planner and its SVG.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/sizing.h"
#include "sim/hardware.h"
#include "sim/model_desc.h"
#include "sim/planner.h"
#include "sim/svg_plot.h"

namespace pagoda::sim {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("pagoda_sim_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string p = temp_path(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

ModelDesc preset(const std::string& name) {
  auto m = load_model_preset(name);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.message());
  return m.ok() ? *m : ModelDesc{};
}

PlanInput h100_plan(const std::string& model, int tp) {
  PlanInput in;
  in.model = preset(model);
  in.hw = load_hardware("H100-80GB-SXM").value();
  in.tp = tp;
  in.kv_dtype = kv::kv_dtype_bf16();
  in.context = 8192;
  in.concurrency = 16;
  return in;
}

TEST(SimPresets, AllLoadAndMatchPublishedParamCounts) {
  const auto names = list_model_presets();
  ASSERT_EQ(names.size(), 23u);  // + Mamba2-130m (issue 38)
  for (const auto& n : names) {
    auto m = load_model_preset(n);
    ASSERT_TRUE(m.ok()) << n << ": " << m.message();
    EXPECT_TRUE(validate_model(*m).ok()) << n;
    const ParamEstimate e = estimate_params(*m);
    const double rel = std::fabs(static_cast<double>(e.total) / static_cast<double>(m->params_total) - 1.0);
    EXPECT_LT(rel, 1e-3) << n << ": estimate " << e.total << " vs published " << m->params_total;
    if (m->is_moe()) {
      const double ra = std::fabs(static_cast<double>(e.active) / static_cast<double>(m->params_active) - 1.0);
      EXPECT_LT(ra, 0.02) << n << ": active estimate " << e.active << " vs " << m->params_active;
    } else {
      EXPECT_EQ(m->params_active, m->params_total) << n;
    }
  }
}

TEST(SimPresets, KvBytesPerTokenOfPresets) {
  auto bpt = [](const std::string& n, kv::KvDtype d) { return kv::kv_bytes_per_token(preset(n).kv_shape(), d); };
  EXPECT_EQ(bpt("Llama-2-13B", kv::kv_dtype_f16()), 819200u);
  EXPECT_EQ(bpt("Llama-3.1-8B", kv::kv_dtype_bf16()), 131072u);
  EXPECT_EQ(bpt("Llama-3.1-70B", kv::kv_dtype_bf16()), 327680u);
  EXPECT_EQ(bpt("DeepSeek-V3", kv::kv_dtype_bf16()), 70272u);
  EXPECT_EQ(bpt("SmolLM2-135M", kv::kv_dtype_f16()), 23040u);
  EXPECT_EQ(bpt("Gemma-3-27B", kv::kv_dtype_bf16()), 507904u);
  const ModelDesc g = preset("Gemma-3-27B");
  EXPECT_EQ(g.kv_shape().num_local_layers(), 52);
  EXPECT_EQ(kv::kv_bytes_for_sequence(g.kv_shape(), kv::kv_dtype_bf16(), 8192), 8192u * (10 * 8192 + 52 * 1024));
  EXPECT_EQ(preset("DeepSeek-V3").attention, kv::AttentionKind::kMLA);
  EXPECT_EQ(preset("Mistral-7B").kv_shape().num_local_layers(), 32);
}

TEST(SimPresets, NameMatching) {
  EXPECT_EQ(preset("llama-3.1-70b").name, "Llama-3.1-70B");
  EXPECT_EQ(preset("mixtral").name, "Mixtral-8x7B");
  auto amb = load_model_preset("llama");
  ASSERT_FALSE(amb.ok());
  EXPECT_NE(amb.message().find("ambiguous"), std::string::npos);
  auto unk = load_model_preset("gpt-5");
  ASSERT_FALSE(unk.ok());
  EXPECT_NE(unk.message().find("unknown model preset"), std::string::npos);
}

TEST(SimHardware, LoadsDatasheetNumbers) {
  EXPECT_EQ(list_hardware().size(), 10u);
  auto h = load_hardware("h100");
  ASSERT_TRUE(h.ok()) << h.message();
  EXPECT_EQ(h->name, "H100-80GB-SXM");
  EXPECT_EQ(h->memory_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h->mem_bandwidth, 3.35e12);
  EXPECT_DOUBLE_EQ(h->peak_fp8_flops, 1978.9e12);
  EXPECT_EQ(load_hardware("A100-80GB").value().peak_fp8_flops, 0.0);
  const HardwareDesc cpu = load_hardware("cpu-local").value();
  EXPECT_EQ(cpu.memory_bytes, 24 * kGiB);
  EXPECT_DOUBLE_EQ(cpu.mem_bandwidth, 30e9);
  EXPECT_DOUBLE_EQ(cpu.peak_bf16_flops, 580e9);
  EXPECT_FALSE(load_hardware("TPU").ok());
}

TEST(SimHardware, ParseBytes) {
  EXPECT_EQ(parse_bytes("80GiB").value(), 80 * kGiB);
  EXPECT_EQ(parse_bytes("80GB").value(), 80000000000u);
  EXPECT_EQ(parse_bytes("1.5e9").value(), 1500000000u);
  EXPECT_EQ(parse_bytes("512mib").value(), 512u << 20);
  EXPECT_EQ(parse_bytes("1280").value(), 1280u);
  EXPECT_FALSE(parse_bytes("lots").ok());
  EXPECT_FALSE(parse_bytes("12 parsecs").ok());
  EXPECT_FALSE(parse_bytes("-5").ok());
}

TEST(SimPlanner, Llama70BOnH100Tp4) {
  PlanInput in = h100_plan("Llama-3.1-70B", 4);
  ASSERT_TRUE(validate_plan_input(in).ok());
  const PlanReport r = plan_capacity(in);
  EXPECT_EQ(r.kv_bytes_per_token, 327680u);
  EXPECT_EQ(r.kv_bytes_per_token_per_gpu, 81920u);     // 2 of 8 KV heads per rank
  EXPECT_EQ(r.kv_bytes_per_request, 8192u * 81920u);   // 640 MiB per GPU at 8k
  EXPECT_EQ(r.weights_bytes, 35276853248u);            // 70,553,706,496 x 2 / 4
  EXPECT_EQ(r.usable_bytes, static_cast<uint64_t>(0.9 * 80.0 * kGiB));
  EXPECT_EQ(r.kv_budget_bytes, static_cast<int64_t>(r.usable_bytes - r.weights_bytes - r.activation_bytes -
                                                    r.runtime_overhead_bytes));
  EXPECT_GT(r.kv_budget_bytes, 0);
  const uint64_t budget = static_cast<uint64_t>(r.kv_budget_bytes);
  EXPECT_EQ(r.max_tokens_in_cache, static_cast<int64_t>(budget / 81920u));
  EXPECT_LE(static_cast<uint64_t>(r.max_concurrency) * r.kv_bytes_per_request, budget);
  EXPECT_GT(static_cast<uint64_t>(r.max_concurrency + 1) * r.kv_bytes_per_request, budget);
  EXPECT_TRUE(r.fits);
  // The longest context at C = 16 fits, one more token does not.
  EXPECT_FALSE(r.longest_context_capped);
  EXPECT_LE(16u * r.longest_context * 81920u, budget);
  EXPECT_GT(16u * (r.longest_context + 1) * 81920u, budget);
  // 70B in bf16 (141 GB): two H100s hold the weights and one 8k request, but
  // 16 x 8k requests (10 GiB per GPU at tp 4) need four.
  EXPECT_EQ(r.min_tp, 4);
  PlanInput one = in;
  one.concurrency = 1;
  EXPECT_EQ(plan_capacity(one).min_tp, 2);
  one.tp = 2;
  EXPECT_TRUE(plan_capacity(one).fits);
  one.concurrency = 16;
  EXPECT_FALSE(plan_capacity(one).fits);
  // The paged pool: 16-token blocks of 1.25 MiB each per GPU.
  EXPECT_EQ(r.kv_bytes_per_block, 16u * 81920u);
  EXPECT_EQ(r.num_blocks, static_cast<int64_t>(budget / (16u * 81920u)));
  EXPECT_EQ(r.blocks_per_request, 512);
  EXPECT_EQ(r.pool_max_concurrency, kv::max_concurrency(r.num_blocks, 512, 0.01));
}

TEST(SimPlanner, DoublingContextOrConcurrencyDoublesKvMemory) {
  PlanInput in = h100_plan("Llama-3.1-8B", 1);
  const PlanReport base = plan_capacity(in);
  PlanInput c2 = in;
  c2.context *= 2;
  PlanInput n2 = in;
  n2.concurrency *= 2;
  EXPECT_EQ(plan_capacity(c2).kv_bytes_needed, 2 * base.kv_bytes_needed);
  EXPECT_EQ(plan_capacity(n2).kv_bytes_needed, 2 * base.kv_bytes_needed);
  EXPECT_EQ(plan_capacity(c2).kv_bytes_per_request, 2 * base.kv_bytes_per_request);
  // The budget does not depend on the workload.
  EXPECT_EQ(plan_capacity(c2).kv_budget_bytes, base.kv_budget_bytes);
  const FitTable t = fit_table(in, {4096, 8192}, {1, 2});
  EXPECT_EQ(t.kv_bytes[1][0], 2 * t.kv_bytes[0][0]);
  EXPECT_EQ(t.kv_bytes[0][1], 2 * t.kv_bytes[0][0]);
}

TEST(SimPlanner, Fp8KvHalvesAndTpShrinksPerGpuKv) {
  PlanInput a = h100_plan("Llama-3.1-70B", 8);
  PlanInput b = a;
  b.kv_dtype = kv::kv_dtype_fp8();
  const PlanReport ra = plan_capacity(a), rb = plan_capacity(b);
  EXPECT_EQ(rb.kv_bytes_per_request * 2, ra.kv_bytes_per_request);
  EXPECT_EQ(rb.kv_budget_bytes, ra.kv_budget_bytes);
  EXPECT_GE(rb.max_concurrency, 2 * ra.max_concurrency);
  // tp 16 > 8 KV heads: replicated, per-GPU KV stays at one head.
  PlanInput c = a;
  c.tp = 16;
  EXPECT_EQ(plan_capacity(c).kv_bytes_per_token_per_gpu, ra.kv_bytes_per_token_per_gpu);
}

TEST(SimPlanner, WeightsThatDoNotFit) {
  PlanInput in = h100_plan("Llama-3.1-405B", 1);
  const PlanReport r = plan_capacity(in);
  EXPECT_LT(r.kv_budget_bytes, 0);
  EXPECT_FALSE(r.fits);
  EXPECT_EQ(r.max_concurrency, 0);
  EXPECT_EQ(r.num_blocks, 0);
  EXPECT_EQ(r.min_tp, 16);  // 810 GB of bf16 weights: 8 x 72 GiB usable is not enough
  const FitTable t = fit_table(in, default_table_contexts(), default_table_concurrencies());
  for (size_t i = 0; i < t.contexts.size(); ++i)
    for (size_t j = 0; j < t.concurrencies.size(); ++j) EXPECT_FALSE(t.fits(i, j));
}

TEST(SimPlanner, GivenKvBudgetBlocksAndConcurrency) {
  PlanInput in;
  in.model = preset("SmolLM2-135M");
  in.kv_dtype = kv::kv_dtype_f16();
  in.kv_cache_memory = kGiB;
  in.context = 8192;
  ASSERT_TRUE(validate_plan_input(in).ok());
  const PlanReport r = plan_capacity(in);
  EXPECT_EQ(r.kv_budget_bytes, static_cast<int64_t>(kGiB));
  EXPECT_EQ(r.kv_bytes_per_block, 368640u);
  EXPECT_EQ(r.num_blocks, 2912);
  EXPECT_EQ(r.blocks_per_request, 512);
  EXPECT_EQ(r.pool_max_concurrency, 5);  // floor((2912 - 1 - 29) / 512)
  EXPECT_EQ(r.max_concurrency, 5);       // floor(1 GiB / 180 MiB)
  EXPECT_EQ(r.longest_context, 8192);    // the model's max context fits once
  EXPECT_TRUE(r.longest_context_capped);
}

TEST(SimPlanner, SlidingWindowModelHoldsMoreLongRequests) {
  PlanInput in;
  in.model = preset("Gemma-3-27B");
  in.hw = load_hardware("H100-80GB-SXM").value();
  in.context = 131072;
  const PlanReport r = plan_capacity(in);
  const uint64_t per_layer = 2 * 16 * 128 * 2;
  EXPECT_EQ(r.kv_bytes_per_request, per_layer * (10 * 131072 + 52 * 1024));
  EXPECT_EQ(r.max_concurrency, r.kv_budget_bytes / static_cast<int64_t>(r.kv_bytes_per_request));
  // Without the window (all layers global) fewer requests would fit.
  EXPECT_GT(r.max_concurrency, r.kv_budget_bytes / static_cast<int64_t>(131072 * r.kv_bytes_per_token_per_gpu));
}

TEST(SimPlanner, RejectsBadInput) {
  PlanInput in = h100_plan("Llama-3.1-8B", 1);
  in.tp = 0;
  EXPECT_FALSE(validate_plan_input(in).ok());
  in = h100_plan("Llama-3.1-8B", 1);
  in.utilization = 1.5;
  EXPECT_FALSE(validate_plan_input(in).ok());
  in = h100_plan("Llama-3.1-8B", 1);
  in.hw = HardwareDesc{};
  EXPECT_FALSE(validate_plan_input(in).ok());
  EXPECT_TRUE(parse_weights_dtype("q4").ok());
  EXPECT_DOUBLE_EQ(parse_weights_dtype("q4").value().bytes_per_param, 0.5625);
  EXPECT_FALSE(parse_weights_dtype("fp4").ok());
}

TEST(SimHfConfig, LlamaGemmaDeepSeekQwen) {
  const std::string llama = write_temp("llama.json", R"({
    "_name_or_path": "meta-llama/Llama-3.1-8B", "model_type": "llama", "num_hidden_layers": 32,
    "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": false})");
  auto m = load_hf_config(llama);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->name, "Llama-3.1-8B");
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_EQ(m->attention, kv::AttentionKind::kGQA);
  EXPECT_EQ(m->params_total, 8030261248);
  EXPECT_EQ(kv::kv_bytes_per_token(m->kv_shape(), kv::kv_dtype_bf16()), 131072u);

  const std::string gemma = write_temp("gemma.json", R"({
    "model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 62,
    "hidden_size": 5376, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
    "intermediate_size": 21504, "vocab_size": 262208, "max_position_embeddings": 131072,
    "sliding_window": 1024, "sliding_window_pattern": 6}})");
  m = load_hf_config(gemma);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->sliding_window, 1024);
  EXPECT_EQ(m->kv_shape().num_local_layers(), 52);

  const std::string gemma_lt = write_temp("gemma_lt.json", R"({
    "model_type": "gemma3_text", "num_hidden_layers": 12, "hidden_size": 640, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144,
    "max_position_embeddings": 32768, "sliding_window": 512,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]})");
  m = load_hf_config(gemma_lt);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->swa_period, 4);
  EXPECT_EQ(m->attention, kv::AttentionKind::kMQA);
  EXPECT_EQ(m->kv_shape().num_local_layers(), 9);

  const std::string ds = write_temp("ds.json", R"({
    "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
    "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840})");
  m = load_hf_config(ds);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->attention, kv::AttentionKind::kMLA);
  EXPECT_EQ(kv::kv_bytes_per_token(m->kv_shape(), kv::kv_dtype_bf16()), 70272u);
  EXPECT_NEAR(static_cast<double>(m->params_total), 671e9, 671e9 * 1e-3);
  EXPECT_LT(m->params_active, m->params_total / 10);

  const std::string qwen = write_temp("qwen.json", R"({
    "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
    "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
    "max_position_embeddings": 32768, "sliding_window": 131072, "use_sliding_window": false})");
  m = load_hf_config(qwen);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->sliding_window, 0);
  EXPECT_EQ(m->params_total, 7615616512);

  const std::string bad = write_temp("bad.json", R"({"model_type": "llama", "hidden_size": 64})");
  m = load_hf_config(bad);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("num_hidden_layers"), std::string::npos);
  const std::string broken = write_temp("broken.json", "{ not json");
  EXPECT_FALSE(load_hf_config(broken).ok());
  for (const auto& p : {llama, gemma, gemma_lt, ds, qwen, bad, broken}) std::remove(p.c_str());
}

TEST(SimGguf, Stories260KAndSmolLM2) {
#if !PAGODA_HAVE_GGUF
  GTEST_SKIP() << "built without the gguf/ reader";
#endif
  auto m = resolve_model(PAGODA_TEST_DATA "/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->num_layers, 5);
  EXPECT_EQ(m->num_kv_heads, 4);
  EXPECT_EQ(m->head_dim, 8);
  EXPECT_EQ(m->max_context, 512);
  EXPECT_EQ(m->vocab, 512);
  EXPECT_GT(m->weights_file_bytes, 4u * 200000u);  // ~260K F32 parameters
  EXPECT_EQ(m->weights_file_bytes, static_cast<uint64_t>(m->params_total) * 4u);
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_EQ(m->embed_file_bytes, 512u * 64 * 4);   // token_embd.weight, F32
  EXPECT_EQ(m->output_file_bytes, 512u * 64 * 4);  // output.weight, F32
  EXPECT_EQ(kv::kv_bytes_per_token(m->kv_shape(), kv::kv_dtype_f32()), 1280u);

  const std::string smol = PAGODA_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(smol)) GTEST_SKIP() << "missing " << smol;
  m = resolve_model(smol);
  ASSERT_TRUE(m.ok()) << m.message();
  EXPECT_EQ(m->num_layers, 30);
  EXPECT_EQ(m->num_kv_heads, 3);
  EXPECT_EQ(m->head_dim, 64);
  EXPECT_TRUE(m->tied_embeddings);
  EXPECT_EQ(m->params_total, 134515008);
  EXPECT_EQ(m->embed_file_bytes, 49152u * 576 / 32 * 34);  // token_embd.weight is Q8_0 in this Q4_1 file
  EXPECT_EQ(m->output_file_bytes, 0u);                      // tied: no output.weight
  const ModelDesc p = preset("SmolLM2-135M");
  EXPECT_EQ(kv::kv_bytes_per_token(m->kv_shape(), kv::kv_dtype_f16()), 23040u);
  EXPECT_EQ(kv::kv_bytes_per_token(m->kv_shape(), kv::kv_dtype_f16()),
            kv::kv_bytes_per_token(p.kv_shape(), kv::kv_dtype_f16()));
}

// Tiny XML well-formedness check: every tag closes in order, attributes are quoted,
// text has no raw '<' or unescaped '&'.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  while (i < s.size()) {
    if (s[i] == '&') {
      const size_t semi = s.find(';', i);
      const std::string ent = s.substr(i, semi == std::string::npos ? 8 : semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;") return "bad entity " + ent;
      ++i;
      continue;
    }
    if (s[i] != '<') { ++i; continue; }
    const size_t end = s.find('>', i);
    if (end == std::string::npos) return "unterminated tag";
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      stack.pop_back();
      continue;
    }
    const bool self = tag.back() == '/';
    if (self) tag.pop_back();
    const std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
    size_t quotes = 0;
    for (char c : tag) quotes += c == '"';
    if (quotes % 2) return "odd quotes in <" + name + ">";
    if (tag.find('<') != std::string::npos) return "'<' inside <" + name + ">";
    if (!self) stack.push_back(name);
  }
  return stack.empty() ? "" : "unclosed <" + stack.back() + ">";
}

TEST(SimSvg, PlotIsWellFormedAndRenders) {
  PlanInput in = h100_plan("Llama-3.1-70B", 4);
  const std::string svg = kv_memory_plot_svg(in, {4096, 8192, 32768, 131072}, 64);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("concurrent requests"), std::string::npos);
  EXPECT_NE(svg.find("KV cache per GPU (GiB)"), std::string::npos);
  EXPECT_NE(svg.find("KV budget"), std::string::npos);
  EXPECT_NE(svg.find("context 32k"), std::string::npos);
  EXPECT_EQ(xml_problem("<a><b></a>"), "mismatched </a>");  // the checker itself can fail
  EXPECT_EQ(xml_escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");

  LinePlot p;
  p.title = "T & <escaped>";
  PlotSeries ser;
  ser.label = "s";
  ser.points = {{0, 0}, {0.5, 5}, {1, 0.5}};  // leaves and re-enters the y range
  ser.markers = {{0.25, 0.5}, {3, 3}};       // the second is outside and skipped
  p.series.push_back(ser);
  p.hlines.push_back({"h", 0.5});
  const std::string small = render_svg(p);
  EXPECT_EQ(xml_problem(small), "");
  EXPECT_EQ(small.find("<polyline", small.find("<polyline") + 1) != std::string::npos, true);  // clipped in two
  EXPECT_NE(small.find("<circle"), std::string::npos);
  EXPECT_EQ(small.find("<circle", small.find("<circle") + 1), std::string::npos);

  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0) GTEST_SKIP() << "rsvg-convert not installed";
  const std::string svg_path = write_temp("plot.svg", svg), png_path = temp_path("plot.png");
  const std::string cmd = "rsvg-convert -o '" + png_path + "' '" + svg_path + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_GT(std::filesystem::file_size(png_path), 1000u);
  std::remove(svg_path.c_str());
  std::remove(png_path.c_str());
}

TEST(SimSvg, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(0, 64, 8), (std::vector<double>{0, 10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(nice_ticks(0, 88, 8).back(), 80);
}

// The line of `text` that contains `key` (empty if none).
std::string line_with(const std::string& text, const std::string& key) {
  const size_t k = text.find(key);
  if (k == std::string::npos) return "";
  const size_t b = text.rfind('\n', k), e = text.find('\n', k);
  return text.substr(b == std::string::npos ? 0 : b + 1, e == std::string::npos ? std::string::npos : e - b - 1);
}

TEST(SimReport, TextAndJsonCarryTheNumbers) {
  PlanInput in = h100_plan("Llama-3.1-70B", 4);
  const PlanReport r = plan_capacity(in);
  const std::string text = format_report(in, r);
  EXPECT_NE(text.find("327,680 B"), std::string::npos) << text;
  EXPECT_NE(line_with(text, "  per GPU").find("81,920 B (2 of 8 KV heads per rank)"), std::string::npos) << text;
  const std::string tp_line = line_with(text, "smallest TP that fits");
  EXPECT_EQ(tp_line.substr(tp_line.size() - 4), "tp 4") << text;
  EXPECT_NE(line_with(text, "max concurrency @ 8,192").find(std::to_string(r.max_concurrency) + " requests"),
            std::string::npos) << text;
  const std::string js = plan_to_json(in, r, nullptr);
  EXPECT_NE(js.find("\"kv_bytes_per_token\": 327680"), std::string::npos);
  EXPECT_NE(js.find("\"min_tp\": 4"), std::string::npos);
  const FitTable t = fit_table(in, default_table_contexts(), default_table_concurrencies());
  const std::string md = format_fit_table(t);
  EXPECT_NE(md.find("| 128k |"), std::string::npos);
  EXPECT_NE(md.find(" x |"), std::string::npos);  // 128k x 256 does not fit
  EXPECT_TRUE(t.fits(0, 0));
}

// ---- Hybrid models (issue 38): the recurrent state's one formula, its sources, and --tp ----

// base/recurrent_state.h, the formula model/lfm2.cc, model/qwen35.cc and sim/ share.
TEST(RecurrentState, FormulaAndTpSplit) {
  // LFM2-350M: 10 short-conv layers of l_cache 3 over 1024 channels: 2 rows of 1024 each.
  EXPECT_EQ(short_conv_state(10, 3, 1024), (StateRows{20, 1024}));
  EXPECT_EQ(short_conv_state(10, 3, 1024).bytes(), 81920u);
  EXPECT_EQ(short_conv_state(0, 3, 1024), StateRows{});
  // Qwen3.5-0.8B: 18 Gated DeltaNet layers: (4 - 1) x (2 x 16 + 16) + 16 x 128 = 2,192 rows of 128.
  EXPECT_EQ(gated_delta_net_state(18, 4, 16, 16, 128), (StateRows{39456, 128}));
  EXPECT_EQ(gated_delta_net_state(18, 4, 16, 16, 128).bytes(), 20201472u);
  const RecurrentShape conv{.kind = RecurrentKind::kShortConv, .conv_kernel = 3, .channels = 1024};
  const RecurrentShape gdn{.kind = RecurrentKind::kGatedDeltaNet, .conv_kernel = 4, .k_heads = 16, .v_heads = 16,
                           .head_dim = 128};
  // vLLM's split: the channels (short conv) or the k and v heads (Gated DeltaNet) over the ranks.
  EXPECT_EQ(recurrent_state_rows(conv, 10, 4).value(), (StateRows{20, 256}));
  EXPECT_EQ(recurrent_state_rows(gdn, 18, 2).value(), (StateRows{18 * (3 * 24 + 8 * 128), 128}));
  EXPECT_EQ(recurrent_state_rows(gdn, 18, 16).value(), (StateRows{18 * (3 * 3 + 1 * 128), 128}));
  auto bad = recurrent_state_rows(conv, 10, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("1024 channels do not split across tp 3"), std::string::npos) << bad.message();
  bad = recurrent_state_rows(gdn, 18, 32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("16 k heads and 16 v heads do not split across tp 32"), std::string::npos);
  // Mamba-2 130M: 24 layers, conv of 4 over 1536 + 2 x 1 x 128 channels (42 rows of 128), then 1536 scan rows.
  EXPECT_EQ(mamba2_state(24, 4, 1536, 1, 128), (StateRows{24 * (42 + 1536), 128}));
  EXPECT_EQ(mamba2_state(24, 4, 1536, 1, 128).bytes(), 19390464u);
  // tiny-mamba2's shape over 2 ranks: 64 inner channels and 1 group each.
  const RecurrentShape m2{.kind = RecurrentKind::kMamba2, .conv_kernel = 4, .channels = 128, .k_heads = 2, .v_heads = 8,
                          .head_dim = 32};
  EXPECT_EQ(recurrent_state_rows(m2, 3, 1).value(), (StateRows{3 * (24 + 128), 32}));
  EXPECT_EQ(recurrent_state_rows(m2, 3, 2).value(), (StateRows{3 * (3 * 128 / 32 + 64), 32}));
  bad = recurrent_state_rows(m2, 3, 4);  // 2 groups over 4 ranks
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("2 groups, 8 heads and 128 inner channels (rows of 32) do not split across tp 4"),
            std::string::npos) << bad.message();
}

std::string hf_fixture(const std::string& dir) { return data_dir() + "/../tests/cli/data/" + dir + "/config.json"; }

// The published Hugging Face configs read as the presets say (the same layers, state and
// parameter count: the published count, exactly).
TEST(SimHfConfig, HybridsMatchTheirPresets) {
  for (const auto& [dir, name] : {std::pair<std::string, std::string>{"LFM2-350M", "LFM2-350M"},
                                  {"Qwen3.5-0.8B", "Qwen3.5-0.8B"}}) {
    SCOPED_TRACE(dir);
    auto hf = load_hf_config(hf_fixture(dir));
    ASSERT_TRUE(hf.ok()) << hf.message();
    const ModelDesc p = preset(name);
    EXPECT_EQ(hf->arch, p.arch);
    EXPECT_EQ(hf->recurrent_layers, p.recurrent_layers);
    EXPECT_EQ(hf->recurrent, p.recurrent);
    EXPECT_EQ(hf->state_rows, p.state_rows);
    EXPECT_EQ(hf->state_row_floats, p.state_row_floats);
    EXPECT_EQ(hf->ffn, p.ffn);  // LFM2: block_ff_dim 6656 auto-adjusted to 4608
    EXPECT_EQ(hf->params_total, p.params_total);
    EXPECT_EQ(kv::kv_bytes_per_token(hf->kv_shape(), kv::kv_dtype_f16()), 12288u);
  }
  EXPECT_EQ(preset("LFM2-350M").state_bytes(), 81920u);
  EXPECT_EQ(preset("Qwen3.5-0.8B").state_bytes(), 20201472u);
  EXPECT_EQ(preset("LFM2-1.2B").state_bytes(), 10u * 2 * 2048 * 4);
  EXPECT_EQ(preset("Qwen3.5-27B").state_rows, 48 * (3 * (2 * 16 + 48) + 48 * 128));
  // Mamba-2 130M: every layer recurrent (no attention), the state of the GGUF path (engine_capacity's
  // SimReadsTheStateTheModelReads checks that one against model/).
  const ModelDesc m2 = preset("Mamba2-130m");
  EXPECT_EQ(m2.num_recurrent_layers(), 24);
  EXPECT_EQ(m2.kv_shape().num_layers, 0);
  EXPECT_EQ(m2.state_bytes(), 19390464u);
  EXPECT_EQ(m2.state_row_floats, 128);
}

// A hybrid config without a field its state needs is refused, naming the field.
TEST(SimHfConfig, HybridMissingFieldsAreNamed) {
  const auto without = [](const std::string& dir, const std::string& key, bool text) {
    std::ifstream in(hf_fixture(dir));
    nlohmann::json j = nlohmann::json::parse(in);
    (text ? j["text_config"] : j).erase(key);
    const std::string path = write_temp(dir + "-" + key + ".json", j.dump());
    auto m = load_hf_config(path);
    std::remove(path.c_str());
    return m.ok() ? std::string("ok") : m.message();
  };
  EXPECT_NE(without("LFM2-350M", "conv_L_cache", false).find("conv_L_cache is missing"), std::string::npos);
  EXPECT_NE(without("LFM2-350M", "layer_types", false).find("layer_types is missing"), std::string::npos);
  for (const char* k : {"linear_conv_kernel_dim", "linear_num_key_heads", "linear_num_value_heads",
                        "linear_key_head_dim", "linear_value_head_dim"}) {
    EXPECT_NE(without("Qwen3.5-0.8B", k, true).find(std::string(k) + " is missing"), std::string::npos) << k;
  }
  // Without layer_types, Qwen3.5 takes every full_attention_interval-th layer (transformers' rule).
  EXPECT_EQ(without("Qwen3.5-0.8B", "layer_types", true), "ok");
}

// --tp: each rank plans with its share of the state; a tp that does not split it is refused.
TEST(SimPlanner, HybridStatePerRank) {
  PlanInput in;
  in.model = preset("Qwen3.5-0.8B");
  in.kv_dtype = kv::kv_dtype_f16();
  in.kv_cache_memory = 64u << 20;
  in.context = 1024;
  in.tp = 1;
  ASSERT_TRUE(validate_plan_input(in).ok());
  EXPECT_EQ(plan_capacity(in).state_bytes_per_sequence, 20201472u);
  in.tp = 2;
  ASSERT_TRUE(validate_plan_input(in).ok());
  const PlanReport r = plan_capacity(in);
  EXPECT_EQ(r.state_bytes_per_sequence, 10100736u);
  EXPECT_EQ(r.kv_bytes_per_request, 1024u * 6144u + 10100736u);  // 1 of 2 KV heads per rank
  in.tp = 32;
  Status s = validate_plan_input(in);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--tp 32"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace pagoda::sim
