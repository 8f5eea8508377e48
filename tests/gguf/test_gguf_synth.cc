// Synthesized models read back with the expected shapes, types, metadata and
// a well-formed BPE vocabulary; generation is deterministic in the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <unordered_set>

#include "gguf/dequant.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"

namespace pagoda::gguf {
namespace {

std::vector<uint8_t> synth_bytes(const SynthOptions& o) {
  GgufWriter w;
  Status st = synth_model(o, &w);
  EXPECT_TRUE(st.ok()) << st.message();
  auto bytes = w.write_to_memory();
  EXPECT_TRUE(bytes.ok()) << bytes.message();
  return bytes.ok() ? std::move(bytes).value() : std::vector<uint8_t>{};
}

// A small SmolLM2-tokenizer shape: 4 heads (2 KV), vocab 512.
SynthOptions tiny_options(int64_t n_embd, int64_t n_ff, GgmlType type, int64_t n_layers) {
  SynthOptions o;
  o.shape = *find_synth_preset("smollm2-135m");
  o.shape.n_vocab = 512;
  o.shape.n_embd = n_embd;
  o.shape.n_head = 4;
  o.shape.n_head_kv = 2;
  o.shape.n_ff = n_ff;
  o.type = type;
  o.n_layers_override = n_layers;
  return o;
}

TEST(Synth, SmolLM2TwoLayersQ8_0) {
  SynthOptions o;
  o.shape = *find_synth_preset("smollm2-135m");
  o.type = GgmlType::Q8_0;
  o.n_layers_override = 2;
  o.seed = 1;
  const auto bytes = synth_bytes(o);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  const GgufFile& g = **f;
  EXPECT_EQ(g.architecture(), "llama");
  EXPECT_EQ(g.get_int("llama.block_count").value(), 2);
  EXPECT_EQ(g.get_int("llama.embedding_length").value(), 576);
  EXPECT_EQ(g.get_int("llama.attention.head_count").value(), 9);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv").value(), 3);
  EXPECT_EQ(g.get_int("llama.feed_forward_length").value(), 1536);
  EXPECT_EQ(g.get_int("llama.context_length").value(), 8192);
  EXPECT_EQ(g.get_int("llama.rope.dimension_count").value(), 64);
  EXPECT_EQ(g.get_float("llama.rope.freq_base").value(), 100000.0);
  EXPECT_EQ(g.get_int("general.file_type").value(), 7);
  EXPECT_EQ(g.tensors().size(), 2u * 9 + 2);  // tied: no output.weight
  EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
  const TensorInfo* emb = g.find_tensor("token_embd.weight");
  ASSERT_TRUE(emb);
  EXPECT_EQ(emb->dims, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(emb->type, GgmlType::Q8_0);
  struct Want { const char* name; std::vector<uint64_t> dims; GgmlType type; };
  const Want want[] = {
      {"blk.1.attn_norm.weight", {576}, GgmlType::F32},       {"blk.1.attn_q.weight", {576, 576}, GgmlType::Q8_0},
      {"blk.1.attn_k.weight", {576, 192}, GgmlType::Q8_0},    {"blk.1.attn_v.weight", {576, 192}, GgmlType::Q8_0},
      {"blk.1.attn_output.weight", {576, 576}, GgmlType::Q8_0}, {"blk.1.ffn_norm.weight", {576}, GgmlType::F32},
      {"blk.1.ffn_gate.weight", {576, 1536}, GgmlType::Q8_0}, {"blk.1.ffn_up.weight", {576, 1536}, GgmlType::Q8_0},
      {"blk.1.ffn_down.weight", {1536, 576}, GgmlType::Q8_0}, {"output_norm.weight", {576}, GgmlType::F32},
  };
  for (const auto& w : want) {
    const TensorInfo* t = g.find_tensor(w.name);
    ASSERT_TRUE(t) << w.name;
    EXPECT_EQ(t->dims, w.dims) << w.name;
    EXPECT_EQ(t->type, w.type) << w.name;
  }
  // Norm weights are exactly 1; weights look like N(0, 0.02).
  std::vector<float> row(1536);
  ASSERT_TRUE(dequantize_rows(*g.find_tensor("blk.0.ffn_norm.weight"), 0, 1, row.data()).ok());
  for (int i = 0; i < 576; ++i) ASSERT_EQ(row[i], 1.0f);
  double sum = 0, sq = 0;
  const TensorInfo* down = g.find_tensor("blk.1.ffn_down.weight");
  for (int64_t r = 0; r < 576; ++r) {
    ASSERT_TRUE(dequantize_rows(*down, r, 1, row.data()).ok());
    for (float v : row) {
      sum += v;
      sq += double(v) * v;
    }
  }
  const double n = 576.0 * 1536, mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(sd, 0.02, 0.0005);

  // Tokenizer: gpt2 BPE of exactly the vocab size, specials first for smollm.
  EXPECT_EQ(g.get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre").value(), "smollm");
  auto tokens = g.get_string_array("tokenizer.ggml.tokens").value();
  auto types = g.get_int_array("tokenizer.ggml.token_type").value();
  auto merges = g.get_string_array("tokenizer.ggml.merges").value();
  ASSERT_EQ(tokens.size(), 49152u);
  ASSERT_EQ(types.size(), 49152u);
  EXPECT_EQ(merges.size(), 49152u - 3 - 256);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(tokens[3 + 'a'], "a");
  EXPECT_EQ(tokens[3 + ' '], "Ġ");
  EXPECT_EQ(tokens[3 + '\n'], "Ċ");
  EXPECT_EQ(g.get_int("tokenizer.ggml.bos_token_id").value(), 1);
  EXPECT_EQ(g.get_int("tokenizer.ggml.eos_token_id").value(), 2);
  std::unordered_set<std::string> seen(tokens.begin(), tokens.end());
  EXPECT_EQ(seen.size(), tokens.size()) << "tokens must be unique";
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ');
    ASSERT_NE(sp, std::string::npos);
    const std::string l = merges[i].substr(0, sp), r = merges[i].substr(sp + 1);
    ASSERT_TRUE(seen.count(l) && seen.count(r)) << merges[i];
    ASSERT_EQ(tokens[259 + i], l + r) << "merge " << i << " must produce the next token";
  }
}

TEST(Synth, DeterministicInSeed) {
  SynthOptions o = tiny_options(64, 128, GgmlType::Q4_0, 1);
  o.seed = 5;
  const auto a = synth_bytes(o), b = synth_bytes(o);
  EXPECT_EQ(a, b);
  o.seed = 6;
  const auto c = synth_bytes(o);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
  auto f = GgufFile::from_memory(a.data(), a.size());
  ASSERT_TRUE(f.ok()) << f.message();
  // 4-bit files keep the (tied) output projection at Q8_0, like llama.cpp's quantize.
  EXPECT_EQ((*f)->find_tensor("token_embd.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q4_0);
  EXPECT_EQ((*f)->get_int("general.file_type").value(), 2);
}

TEST(Synth, QwenAndLlamaLayouts) {
  // Shapes shrunk, vocabulary kept: checks specials placement and biases.
  SynthOptions q;
  q.shape = *find_synth_preset("qwen2.5-0.5b");
  q.shape.n_embd = 64;
  q.shape.n_head = 4;
  q.shape.n_head_kv = 2;
  q.shape.n_ff = 64;
  q.n_layers_override = 1;
  q.type = GgmlType::F16;
  auto qb = synth_bytes(q);
  auto qf = GgufFile::from_memory(qb.data(), qb.size());
  ASSERT_TRUE(qf.ok()) << qf.message();
  EXPECT_EQ((*qf)->architecture(), "qwen2");
  EXPECT_EQ((*qf)->get_int("qwen2.attention.head_count").value(), 4);
  EXPECT_EQ((*qf)->find_tensor("blk.0.attn_k.bias")->dims, (std::vector<uint64_t>{32}));
  EXPECT_EQ((*qf)->find_tensor("blk.0.attn_q.bias")->type, GgmlType::F32);
  auto qt = (*qf)->get_string_array("tokenizer.ggml.tokens").value();
  ASSERT_EQ(qt.size(), 151936u);
  EXPECT_EQ(qt[151643], "<|endoftext|>");
  EXPECT_EQ(qt[151645], "<|im_end|>");
  EXPECT_EQ(qt[151935], "[PAD151935]");
  EXPECT_EQ((*qf)->get_int("tokenizer.ggml.eos_token_id").value(), 151645);

  auto lv = make_synth_vocab(128256, "llama-bpe");
  ASSERT_TRUE(lv.ok());
  EXPECT_EQ(lv->tokens.size(), 128256u);
  EXPECT_EQ(lv->tokens[128000], "<|begin_of_text|>");
  EXPECT_EQ(lv->tokens[128009], "<|eot_id|>");
  EXPECT_EQ(lv->bos, 128000);
  EXPECT_EQ(lv->eos, 128009);
  EXPECT_EQ(lv->tokens[0], "Ā");  // byte 0 in GPT-2's byte-to-unicode map
  EXPECT_EQ(lv->merges.size(), 128000u - 256);
  EXPECT_FALSE(make_synth_vocab(100, "smollm").ok());
  EXPECT_FALSE(make_synth_vocab(1000, "nope").ok());

  // Small llama-bpe vocabularies (tiny-llama3) keep the 11 named specials, last.
  auto ls = make_synth_vocab(320, "llama-bpe");
  ASSERT_TRUE(ls.ok()) << ls.message();
  EXPECT_EQ(ls->tokens.size(), 320u);
  EXPECT_EQ(ls->tokens[309], "<|begin_of_text|>");
  EXPECT_EQ(ls->tokens[318], "<|eot_id|>");
  EXPECT_EQ(ls->tokens[319], "<|python_tag|>");
  EXPECT_EQ(ls->bos, 309);
  EXPECT_EQ(ls->eos, 318);
  EXPECT_NE(ls->chat_template.find("<|start_header_id|>"), std::string::npos);
  EXPECT_FALSE(make_synth_vocab(267, "llama-bpe").ok());

  // phi3: Phi-3's added tokens from 32000 (padded to 32064), its template, whatever the pre.
  auto pv = make_synth_vocab(32064, "smollm", "phi3");
  ASSERT_TRUE(pv.ok()) << pv.message();
  EXPECT_EQ(pv->tokens.size(), 32064u);
  EXPECT_EQ(pv->tokens[0], "Ā");
  EXPECT_EQ(pv->tokens[32000], "<|endoftext|>");
  EXPECT_EQ(pv->tokens[32001], "<|assistant|>");
  EXPECT_EQ(pv->tokens[32007], "<|end|>");
  EXPECT_EQ(pv->tokens[32010], "<|user|>");
  EXPECT_EQ(pv->tokens[32063], "[PAD32063]");
  EXPECT_EQ(pv->eos, 32000);
  EXPECT_NE(pv->chat_template.find("<|user|>"), std::string::npos);
  auto pt = make_synth_vocab(320, "smollm", "phi3");  // tiny-phi3: specials last
  ASSERT_TRUE(pt.ok());
  EXPECT_EQ(pt->tokens[309], "<|endoftext|>");
  EXPECT_EQ(pt->tokens[319], "<|user|>");
}

// llama.cpp's Q4_K_M mix: attn_v and ffn_down are Q6_K in the first and last
// eighth of the layers and every third layer between; everything else Q4_K.
TEST(Synth, Q4KMMixFollowsUseMoreBits) {
  // n_layers 16: eighth 2, so layers 0, 1, 14, 15 and 4, 7, 10, 13 ((l - 2) % 3 == 2).
  std::vector<int> more;
  for (int l = 0; l < 16; ++l)
    if (synth_more_bits_layer(l, 16)) more.push_back(l);
  EXPECT_EQ(more, (std::vector<int>{0, 1, 4, 7, 10, 13, 14, 15}));
  more.clear();  // n_layers 30 (SmolLM2): eighth 3, last eighth from 26
  for (int l = 0; l < 30; ++l)
    if (synth_more_bits_layer(l, 30)) more.push_back(l);
  EXPECT_EQ(more, (std::vector<int>{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29}));

  SynthOptions o = tiny_options(256, 512, GgmlType::Q4_K, 8);  // eighth 1: layers 0, 3, 6, 7
  o.q4_k_m = true;
  const auto bytes = synth_bytes(o);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ((*f)->get_int("general.file_type").value(), 15);
  for (int l = 0; l < 8; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const GgmlType want = (l == 0 || l == 3 || l == 6 || l == 7) ? GgmlType::Q6_K : GgmlType::Q4_K;
    for (const char* name : {"attn_v.weight", "ffn_down.weight"}) {
      const TensorInfo* t = (*f)->find_tensor(p + name);
      ASSERT_TRUE(t) << p << name;
      EXPECT_EQ(t->type, want) << p << name;
    }
    for (const char* name : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight",
                             "ffn_up.weight"})
      EXPECT_EQ((*f)->find_tensor(p + name)->type, GgmlType::Q4_K) << p << name;
  }
  EXPECT_EQ((*f)->find_tensor("token_embd.weight")->type, GgmlType::Q6_K);  // tied output
  o.q4_k_m = false;  // Q4_K_S: no Q6_K in the layers
  const auto s_bytes = synth_bytes(o);
  auto fs = GgufFile::from_memory(s_bytes.data(), s_bytes.size());
  ASSERT_TRUE(fs.ok()) << fs.message();
  EXPECT_EQ((*fs)->get_int("general.file_type").value(), 14);
  EXPECT_EQ((*fs)->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::Q4_K);
}

// lfm2 (issue 38): llama.cpp's keys and tensors, conv layers marked by 0 in
// the per-layer head_count_kv array.
TEST(Synth, Lfm2LayersAndKeys) {
  const SynthShape* real = find_synth_preset("lfm2-350m");
  ASSERT_NE(real, nullptr);
  EXPECT_EQ(real->n_embd, 1024);
  EXPECT_EQ(real->n_ff, 4608);
  EXPECT_EQ(real->attn_layers, (std::vector<int64_t>{2, 5, 8, 10, 12, 14}));
  SynthOptions o;
  o.shape = *find_synth_preset("tiny-lfm2");
  o.type = GgmlType::F32;
  const auto bytes = synth_bytes(o);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  const Value* kv = (*f)->find("lfm2.attention.head_count_kv");
  ASSERT_NE(kv, nullptr);
  ASSERT_EQ(kv->type, ValueType::ARRAY);
  std::vector<int64_t> heads;
  for (const Value& v : kv->arr) heads.push_back(v.as_int());
  EXPECT_EQ(heads, (std::vector<int64_t>{0, 2, 0, 0, 2, 0}));
  EXPECT_EQ((*f)->get_int_or("lfm2.shortconv.l_cache", 0), 3);
  const TensorInfo* conv = (*f)->find_tensor("blk.0.shortconv.conv.weight");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->dims, (std::vector<uint64_t>{3, 64}));
  EXPECT_EQ(conv->type, GgmlType::F32);
  ASSERT_NE((*f)->find_tensor("blk.0.shortconv.in_proj.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.0.shortconv.in_proj.weight")->dims, (std::vector<uint64_t>{64, 192}));
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_NE((*f)->find_tensor("blk.1.attn_q_norm.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_NE((*f)->find_tensor("token_embd_norm.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("output_norm.weight"), nullptr);
}

// qwen35 (issue 38): llama.cpp's keys and tensors; every 3rd layer of tiny-qwen35
// (every 4th of Qwen3.5-0.8B) a gated attention one, the others gated delta-net.
TEST(Synth, Qwen35LayersAndKeys) {
  const SynthShape* real = find_synth_preset("qwen3.5-0.8b");
  ASSERT_NE(real, nullptr);
  EXPECT_EQ(real->n_embd, 1024);
  EXPECT_EQ(real->n_layer, 24);
  EXPECT_TRUE(real->is_attn_layer(3));
  EXPECT_FALSE(real->is_attn_layer(4));
  SynthOptions o;
  o.shape = *find_synth_preset("tiny-qwen35");
  o.type = GgmlType::F32;
  const auto bytes = synth_bytes(o);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ((*f)->get_int_or("qwen35.ssm.conv_kernel", 0), 4);
  EXPECT_EQ((*f)->get_int_or("qwen35.ssm.state_size", 0), 16);
  EXPECT_EQ((*f)->get_int_or("qwen35.ssm.group_count", 0), 2);
  EXPECT_EQ((*f)->get_int_or("qwen35.ssm.time_step_rank", 0), 4);
  EXPECT_EQ((*f)->get_int_or("qwen35.ssm.inner_size", 0), 64);
  EXPECT_EQ((*f)->get_int_or("qwen35.full_attention_interval", 0), 3);
  EXPECT_EQ((*f)->get_int_or("qwen35.rope.dimension_count", 0), 16);
  // Delta-net layer 0: qkv of (2 x 2 + 4) x 16 = 128 channels, F32 conv taps [4, 128].
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_qkv.weight")->dims, (std::vector<uint64_t>{64, 128}));
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_gate.weight")->dims, (std::vector<uint64_t>{64, 64}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_conv1d.weight")->dims, (std::vector<uint64_t>{4, 128}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_conv1d.weight")->type, GgmlType::F32);
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_a")->dims, (std::vector<uint64_t>{4}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_out.weight")->dims, (std::vector<uint64_t>{64, 64}));
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.weight"), nullptr);
  // Attention layer 2: attn_q holds q | gate (2 x 4 heads x 32).
  EXPECT_EQ((*f)->find_tensor("blk.2.attn_q.weight")->dims, (std::vector<uint64_t>{64, 256}));
  EXPECT_NE((*f)->find_tensor("blk.2.attn_q_norm.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.2.attn_qkv.weight"), nullptr);
  EXPECT_NE((*f)->find_tensor("blk.2.post_attention_norm.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.2.ffn_norm.weight"), nullptr);
  EXPECT_NE((*f)->find_tensor("output_norm.weight"), nullptr);
}

// mamba2 (issue 38): the keys and tensor shapes llama.cpp's converter (Mamba2Model) writes.
TEST(Synth, Mamba2KeysAndTensors) {
  const SynthShape* real = find_synth_preset("mamba2-130m");
  ASSERT_NE(real, nullptr);
  EXPECT_EQ(real->n_embd, 768);
  EXPECT_EQ(real->n_layer, 24);
  EXPECT_EQ(real->ssm_inner, 1536);
  EXPECT_EQ(real->n_vocab, 50288);
  EXPECT_FALSE(real->is_attn_layer(0));
  SynthOptions o;
  o.shape = *find_synth_preset("tiny-mamba2");
  o.type = GgmlType::F32;
  const auto bytes = synth_bytes(o);
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ((*f)->get_int_or("mamba2.ssm.conv_kernel", 0), 4);
  EXPECT_EQ((*f)->get_int_or("mamba2.ssm.inner_size", 0), 128);
  EXPECT_EQ((*f)->get_int_or("mamba2.ssm.state_size", 0), 32);
  EXPECT_EQ((*f)->get_int_or("mamba2.ssm.time_step_rank", 0), 8);
  EXPECT_EQ((*f)->get_int_or("mamba2.ssm.group_count", 0), 2);
  EXPECT_EQ((*f)->get_int_or("mamba2.attention.head_count", -1), 0);
  EXPECT_EQ((*f)->get_int_or("mamba2.feed_forward_length", -1), 0);
  EXPECT_EQ((*f)->get_int_or("mamba2.context_length", 0), 1048576);
  EXPECT_EQ((*f)->find("mamba2.attention.head_count_kv"), nullptr);
  // ssm_in: z | xBC | dt = 128 + (128 + 2 x 2 x 32) + 8 = 392 rows.
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_in.weight")->dims, (std::vector<uint64_t>{64, 392}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_conv1d.weight")->dims, (std::vector<uint64_t>{4, 256}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_conv1d.weight")->type, GgmlType::F32);
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_conv1d.bias")->dims, (std::vector<uint64_t>{256}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_dt.bias")->dims, (std::vector<uint64_t>{8}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_a")->dims, (std::vector<uint64_t>{1, 8}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_d")->dims, (std::vector<uint64_t>{1, 8}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_norm.weight")->dims, (std::vector<uint64_t>{64, 2}));
  EXPECT_EQ((*f)->find_tensor("blk.0.ssm_out.weight")->dims, (std::vector<uint64_t>{128, 64}));
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.0.ffn_up.weight"), nullptr);
  EXPECT_NE((*f)->find_tensor("output_norm.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("output.weight"), nullptr);  // tied
}

TEST(Synth, RejectsBadOptions) {
  SynthOptions o;
  o.shape = *find_synth_preset("smollm2-135m");
  o.type = GgmlType::Q4_K;  // 576 is not a multiple of 256
  GgufWriter w;
  EXPECT_FALSE(synth_model(o, &w).ok());
  o.type = GgmlType::Q8_0;
  o.shape.arch = "mamba";
  EXPECT_FALSE(synth_model(o, &w).ok());
  EXPECT_EQ(find_synth_preset("gpt-5"), nullptr);
  EXPECT_EQ(synth_presets().size(), 20u);  // + mamba2-130m, tiny-mamba2
  EXPECT_EQ(find_synth_preset("llama-3.1-8b")->tied, false);
}

}  // namespace
}  // namespace pagoda::gguf
