#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/mem_gguf.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "tok/tokenizer.h"
#include "tok/vocab.h"

using namespace pagoda;
using namespace pagoda::tok;

namespace {

// Writes the metadata to memory and reads the vocabulary back through GgufFile.
testutil::MemModel write(const gguf::GgufWriter& w) {
  auto m = testutil::to_memory(w);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(*m) : testutil::MemModel{};
}

gguf::GgufWriter spm_writer() {
  gguf::GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b",
                                               "\xE2\x96\x81" "a", "ab"});
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, -4, -5});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
  return w;
}

}  // namespace

TEST(TokVocabGguf, SpmDefaultsFollowLlamaCpp) {
  auto m = write(spm_writer());
  auto v = vocab_from_gguf(*m.file);
  ASSERT_TRUE(v.ok()) << v.message();
  EXPECT_EQ(v->kind, VocabKind::kSpm);
  EXPECT_EQ(v->bos_id, 1);
  EXPECT_EQ(v->eos_id, 2);
  EXPECT_EQ(v->unk_id, 0);
  EXPECT_TRUE(v->add_bos);
  EXPECT_FALSE(v->add_eos);
  EXPECT_TRUE(v->add_space_prefix);
  EXPECT_EQ(v->types[0], TokenType::kUnknown);
  EXPECT_FLOAT_EQ(v->scores[7], -5.0f);
  auto t = Tokenizer::create(std::move(v).value());
  ASSERT_TRUE(t.ok()) << t.message();
  // " ab a": "▁a" (-4) beats "ab" (-5); then "b"; then "▁a".
  EXPECT_EQ((*t)->encode("ab a", true, false), (std::vector<TokenId>{1, 6, 5, 6}));
  EXPECT_EQ((*t)->decode((*t)->encode("ab a", true, false)), "ab a");
}

TEST(TokVocabGguf, KeysOverrideDefaults) {
  auto w = spm_writer();
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_bool("tokenizer.ggml.add_eos_token", true);
  w.set_bool("tokenizer.ggml.add_space_prefix", false);
  w.set_u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);  // out of range: keep default 1
  w.set_u32("tokenizer.ggml.eos_token_id", 1);
  w.set_string("tokenizer.chat_template", "{{ '<|im_start|>' }}");
  auto m = write(w);
  auto v = vocab_from_gguf(*m.file);
  ASSERT_TRUE(v.ok()) << v.message();
  EXPECT_FALSE(v->add_bos);
  EXPECT_TRUE(v->add_eos);
  EXPECT_FALSE(v->add_space_prefix);
  EXPECT_EQ(v->bos_id, 1);
  EXPECT_EQ(v->eos_id, 1);
  EXPECT_EQ(v->chat_template, "{{ '<|im_start|>' }}");
}

namespace {
// vocab_from_gguf refuses the file `w` writes, with `message_has` in its error.
void expect_vocab_error(const gguf::GgufWriter& w, const std::string& message_has) {
  auto m = write(w);
  auto v = vocab_from_gguf(*m.file);
  ASSERT_FALSE(v.ok()) << message_has;
  EXPECT_NE(v.message().find(message_has), std::string::npos) << v.message();
}
}  // namespace

TEST(TokVocabGguf, ErrorsNameTheProblem) {
  {
    gguf::GgufWriter w;
    w.set_string("tokenizer.ggml.model", "bert");
    w.set_string_array("tokenizer.ggml.tokens", {"a"});
    expect_vocab_error(w, "bert");
  }
  {
    gguf::GgufWriter w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "gpt2");
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    expect_vocab_error(w, "tokenizer.ggml.merges");
  }
  {
    auto w = spm_writer();
    w.set_f32_array("tokenizer.ggml.scores", {0, 0});
    expect_vocab_error(w, "scores");
  }
  {
    gguf::GgufWriter w;
    w.set_string("general.architecture", "llama");
    expect_vocab_error(w, "tokenizer.ggml.model");
  }
  {
    auto w = spm_writer();
    w.set_string("tokenizer.ggml.tokens", "not an array");
    expect_vocab_error(w, "tokenizer.ggml.tokens");
  }
}
