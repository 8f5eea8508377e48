// Writer -> reader round trips of every metadata type and every tensor type,
// the llama.cpp data layout, typed getters, and the real model files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "base/rng.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace pagoda::gguf {
namespace {

std::unique_ptr<GgufFile> read_back(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.message());
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(GgufRoundTrip, EveryMetadataType) {
  GgufWriter w;
  w.set_u8("t.u8", 250);
  w.set_i8("t.i8", -100);
  w.set_u16("t.u16", 65000);
  w.set_i16("t.i16", -32000);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_u64("t.u64", 18000000000000000000ull);
  w.set_i64("t.i64", -9000000000000000000ll);
  w.set_f32("t.f32", 0.15625f);
  w.set_f64("t.f64", -1.0 / 3.0);
  w.set_bool("t.true", true);
  w.set_bool("t.false", false);
  w.set_string("t.str", "héllo\nworld");
  w.set_string("t.empty", "");
  w.set_string_array("t.strs", {"a", "", "Ġthe", "<|im_end|>"});
  w.set_f32_array("t.f32s", {1.5f, -2.25f});
  w.set_i32_array("t.i32s", {});
  w.set("t.u8s", make_array(ValueType::UINT8, {make_u8(1), make_u8(255)}));
  w.set("t.bools", make_array(ValueType::BOOL, {make_bool(true), make_bool(false)}));
  w.set("t.u64s", make_array(ValueType::UINT64, {make_u64(~0ull)}));
  w.set("t.f64s", make_array(ValueType::FLOAT64, {make_f64(1e300)}));
  // [[1, 2], [], [3]] and [[["x"]]]
  w.set("t.nested", make_array(ValueType::ARRAY, {make_array(ValueType::INT16, {make_i16(1), make_i16(2)}),
                                                  make_array(ValueType::INT16, {}),
                                                  make_array(ValueType::INT16, {make_i16(3)})}));
  w.set("t.deep", make_array(ValueType::ARRAY,
                             {make_array(ValueType::ARRAY, {make_array(ValueType::STRING, {make_string("x")})})}));
  w.set_u32("t.replaced", 1);
  w.set_u32("t.replaced", 2);  // replaces, does not duplicate
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.ok()) << bytes.message();
  auto f = read_back(*bytes);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 24u);
  EXPECT_EQ(f->find("t.u8")->type, ValueType::UINT8);
  EXPECT_EQ(f->get_int("t.u8").value(), 250);
  EXPECT_EQ(f->get_int("t.i8").value(), -100);
  EXPECT_EQ(f->get_int("t.u16").value(), 65000);
  EXPECT_EQ(f->get_int("t.i16").value(), -32000);
  EXPECT_EQ(f->get_int("t.u32").value(), 4000000000ll);
  EXPECT_EQ(f->find("t.u32")->type, ValueType::UINT32);
  EXPECT_EQ(f->get_int("t.i32").value(), -2000000000);
  EXPECT_EQ(f->find("t.u64")->u64, 18000000000000000000ull);
  EXPECT_EQ(f->get_int("t.i64").value(), -9000000000000000000ll);
  EXPECT_EQ(f->get_float("t.f32").value(), 0.15625);
  EXPECT_EQ(f->find("t.f32")->type, ValueType::FLOAT32);
  EXPECT_EQ(f->get_float("t.f64").value(), -1.0 / 3.0);
  EXPECT_EQ(f->find("t.true")->type, ValueType::BOOL);
  EXPECT_EQ(f->get_int("t.true").value(), 1);
  EXPECT_EQ(f->get_int("t.false").value(), 0);
  EXPECT_EQ(f->get_string("t.str").value(), "héllo\nworld");
  EXPECT_EQ(f->get_string("t.empty").value(), "");
  EXPECT_EQ(f->get_string_array("t.strs").value(), (std::vector<std::string>{"a", "", "Ġthe", "<|im_end|>"}));
  EXPECT_EQ(f->get_float_array("t.f32s").value(), (std::vector<float>{1.5f, -2.25f}));
  EXPECT_TRUE(f->get_int_array("t.i32s").value().empty());
  EXPECT_EQ(f->find("t.i32s")->elem_type, ValueType::INT32);
  EXPECT_EQ(f->get_int_array("t.u8s").value(), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(f->get_int_array("t.bools").value(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(f->find("t.u64s")->arr[0].u64, ~0ull);
  EXPECT_EQ(f->find("t.f64s")->arr[0].f64, 1e300);
  const Value* n = f->find("t.nested");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->elem_type, ValueType::ARRAY);
  ASSERT_EQ(n->arr.size(), 3u);
  EXPECT_EQ(n->arr[0].elem_type, ValueType::INT16);
  EXPECT_EQ(n->arr[0].arr[1].as_int(), 2);
  EXPECT_EQ(n->arr[1].arr.size(), 0u);
  EXPECT_EQ(n->arr[2].arr[0].as_int(), 3);
  EXPECT_EQ(f->find("t.deep")->arr[0].arr[0].arr[0].str, "x");
  EXPECT_EQ(f->get_int("t.replaced").value(), 2);
  EXPECT_EQ(format_value(*f->find("t.nested")), "[[1, 2], [], [3]]");
}

TEST(GgufRoundTrip, GettersReportMissingAndWrongType) {
  GgufWriter w;
  w.set_string("s", "x");
  w.set_u32("i", 7);
  auto bytes = w.write_to_memory();
  auto f = read_back(*bytes);
  ASSERT_TRUE(f);
  auto m = f->get_int("nope");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("'nope' is missing"), std::string::npos) << m.message();
  auto t = f->get_int("s");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("type string"), std::string::npos) << t.message();
  EXPECT_FALSE(f->get_string_array("s").ok());
  EXPECT_EQ(f->get_int_or("s", 5), 5);
  EXPECT_EQ(f->get_int_or("i", 5), 7);
  EXPECT_EQ(f->get_float_or("i", 0.5), 7.0);
  EXPECT_EQ(f->get_string_or("i", "d"), "d");
  EXPECT_EQ(f->architecture(), "");
}

std::string tname(size_t i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "t%zu", i);
  return buf;
}

TEST(GgufRoundTrip, EveryTensorTypeAndLlamaCppLayout) {
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q2_K,
                            GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  for (uint32_t alignment : {32u, 64u}) {
    GgufWriter w;
    if (alignment != 32) w.set_u32("general.alignment", alignment);
    Rng rng(42);
    std::vector<std::vector<uint8_t>> payloads;
    for (size_t i = 0; i < std::size(types); ++i) {
      const auto& ti = ggml_type_info(types[i]);
      std::vector<uint64_t> dims = {ti.block_size * 2ull, 3};
      if (i % 3 == 1) dims.push_back(2);
      std::vector<uint8_t> bytes(tensor_bytes(dims, types[i]));
      for (auto& b : bytes) b = static_cast<uint8_t>(rng.next_u64());
      ASSERT_TRUE(w.add_tensor(tname(i), dims, types[i], bytes.data(), bytes.size()).ok());
      payloads.push_back(std::move(bytes));
    }
    auto out = w.write_to_memory();
    ASSERT_TRUE(out.ok()) << out.message();
    auto f = read_back(*out);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    ASSERT_EQ(f->tensors().size(), std::size(types));
    uint64_t expected_offset = 0;  // llama.cpp requires offsets = running padded sizes
    for (size_t i = 0; i < std::size(types); ++i) {
      const TensorInfo& t = f->tensors()[i];
      EXPECT_EQ(t.name, tname(i));
      EXPECT_EQ(t.type, types[i]);
      EXPECT_EQ(t.offset, expected_offset);
      EXPECT_EQ(t.n_bytes, payloads[i].size());
      EXPECT_EQ(t.n_elements, t.dims[0] * 3 * (t.dims.size() == 3 ? 2 : 1));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, reinterpret_cast<uintptr_t>(out->data()) % alignment);
      EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), payloads[i]) << t.name;
      EXPECT_EQ(f->find_tensor(t.name), &t);
      expected_offset += (t.n_bytes + alignment - 1) / alignment * alignment;
    }
    EXPECT_EQ(f->data_offset() + expected_offset, out->size());
    EXPECT_EQ(f->find_tensor("missing"), nullptr);
  }
}

TEST(GgufWriter, StreamedTensorsAndFileOutputMatchMemory) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  ASSERT_TRUE(w.add_tensor("a", {64, 5}, GgmlType::F32, [](const ByteSink& sink) -> Status {
                 for (int r = 0; r < 5; ++r) {
                   std::vector<float> row(64, static_cast<float>(r));
                   PAGODA_TRY(sink(row.data(), row.size() * 4));
                 }
                 return Status::Ok();
               }).ok());
  auto mem = w.write_to_memory();
  ASSERT_TRUE(mem.ok());
  const std::string path = ::testing::TempDir() + "/pagoda_gguf_writer_test.gguf";
  ASSERT_TRUE(w.write_file(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ((*f)->file_size(), mem->size());
  EXPECT_EQ(std::vector<uint8_t>((*f)->tensors()[0].data, (*f)->tensors()[0].data + 64 * 5 * 4),
            std::vector<uint8_t>(mem->data() + (*f)->data_offset(), mem->data() + (*f)->data_offset() + 1280));
  float v;
  std::memcpy(&v, (*f)->find_tensor("a")->data + 4 * (64 * 3 + 7), 4);
  EXPECT_EQ(v, 3.0f);
  EXPECT_EQ((*f)->architecture(), "llama");
  std::remove(path.c_str());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GgufWriter, RejectsBadInput) {
  GgufWriter w;
  std::vector<uint8_t> b(1000);
  Status s = w.add_tensor("x", {33}, GgmlType::Q8_0, b.data(), 34);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row length 33"), std::string::npos) << s.message();
  s = w.add_tensor("x", {32}, GgmlType::Q8_0, b.data(), 35);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("35 bytes given"), std::string::npos) << s.message();
  EXPECT_FALSE(w.add_tensor("x", {}, GgmlType::F32, b.data(), 0).ok());
  EXPECT_FALSE(w.add_tensor("x", {1, 1, 1, 1, 1}, GgmlType::F32, b.data(), 4).ok());
  EXPECT_FALSE(w.add_tensor("x", {256}, GgmlType::Q8_K, b.data(), 292).ok());
  ASSERT_TRUE(w.add_tensor("x", {8}, GgmlType::F32, b.data(), 32).ok());
  s = w.add_tensor("x", {8}, GgmlType::F32, b.data(), 32);
  EXPECT_NE(s.message().find("added twice"), std::string::npos) << s.message();
  // A producer that writes the wrong amount fails the write.
  ASSERT_TRUE(w.add_tensor("y", {8}, GgmlType::F32, [](const ByteSink& sink) { return sink("abcd", 4); }).ok());
  auto out = w.write_to_memory();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("tensor y: producer wrote 4 bytes, expected 32"), std::string::npos) << out.message();
  // Mixed-type arrays are refused.
  GgufWriter w2;
  w2.set("bad", make_array(ValueType::UINT8, {make_u8(1), make_i32(2)}));
  auto out2 = w2.write_to_memory();
  ASSERT_FALSE(out2.ok());
  EXPECT_NE(out2.message().find("metadata key 'bad'"), std::string::npos) << out2.message();
  GgufWriter w3;
  w3.set_u32("general.alignment", 48);
  EXPECT_FALSE(w3.write_to_memory().ok());
}

TEST(GgufFileOpen, ReportsMissingAndNonRegularFiles) {
  auto f = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("cannot open '/nonexistent/model.gguf'"), std::string::npos) << f.message();
  auto d = GgufFile::open(::testing::TempDir());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("not a regular file"), std::string::npos) << d.message();
}

namespace {
// A model file of the tree, opened; nullptr when it is absent (a file that does
// not open is also a failure).
std::unique_ptr<GgufFile> open_if_present(const std::string& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.message();
  return f.ok() ? std::move(f).value() : nullptr;
}
}  // namespace

TEST(GgufRealModels, Stories260K) {
  const std::string path = std::string(PAGODA_TEST_DATA) + "/stories260K.gguf";
  const std::unique_ptr<GgufFile> f = open_if_present(path);
  if (!f) GTEST_SKIP() << "missing or unreadable: " << path;
  const GgufFile& g = *f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.architecture(), "llama");
  EXPECT_EQ(g.tensors().size(), 48u);
  for (const auto& t : g.tensors()) EXPECT_EQ(t.type, GgmlType::F32) << t.name;
  EXPECT_EQ(g.get_int("llama.block_count").value(), 5);
  EXPECT_EQ(g.get_int("llama.embedding_length").value(), 64);
  EXPECT_EQ(g.get_int("llama.attention.head_count").value(), 8);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv").value(), 4);
  EXPECT_EQ(g.get_int("llama.context_length").value(), 512);
  EXPECT_EQ(g.get_string("tokenizer.ggml.model").value(), "llama");
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[1], "<s>");
  const TensorInfo* emb = g.find_tensor("token_embd.weight");
  ASSERT_TRUE(emb);
  EXPECT_EQ(emb->dims, (std::vector<uint64_t>{64, 512}));
  const TensorInfo* ffn = g.find_tensor("blk.4.ffn_down.weight");
  ASSERT_TRUE(ffn);
  EXPECT_EQ(ffn->dims, (std::vector<uint64_t>{172, 64}));
  EXPECT_EQ(ffn->n_bytes, 172u * 64 * 4);
}

TEST(GgufRealModels, SmolLM2) {
  const std::string path = std::string(PAGODA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  const std::unique_ptr<GgufFile> f = open_if_present(path);
  if (!f) GTEST_SKIP() << "missing or unreadable: " << path;
  const GgufFile& g = *f;
  EXPECT_EQ(g.tensors().size(), 272u);  // 30 layers x 9 + token_embd + output_norm (tied)
  int n_f32 = 0, n_q41 = 0, n_q80 = 0;
  uint64_t params = 0;
  for (const auto& t : g.tensors()) {
    n_f32 += t.type == GgmlType::F32;
    n_q41 += t.type == GgmlType::Q4_1;
    n_q80 += t.type == GgmlType::Q8_0;
    params += t.n_elements;
  }
  EXPECT_EQ(n_f32, 61);
  EXPECT_EQ(n_q41, 210);
  EXPECT_EQ(n_q80, 1);
  EXPECT_EQ(params, 134515008u);
  EXPECT_EQ(g.find_tensor("token_embd.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ(g.find_tensor("token_embd.weight")->dims, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.29.attn_k.weight")->dims, (std::vector<uint64_t>{576, 192}));
  EXPECT_EQ(g.find_tensor("blk.29.attn_k.weight")->type, GgmlType::Q4_1);
  EXPECT_EQ(g.get_int("llama.block_count").value(), 30);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv").value(), 3);
  EXPECT_EQ(g.get_float("llama.rope.freq_base").value(), 100000.0);
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre").value(), "smollm");
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.merges")->size(), 48900u);
}

}  // namespace
}  // namespace pagoda::gguf
