// Smoke test on the default model (skipped when the file is absent).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "gguf/gguf.h"
#include "model/golden_util.h"
#include "sample/stop.h"
#include "tok/chat_template.h"
#include "tok/tokenizer.h"

using namespace pagoda;

TEST(SmolLM2, ChatCapitalOfFranceSaysParis) {
  const std::string path = std::string(PAGODA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found (run scripts/setup)";
  auto file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.message();
  std::shared_ptr<const gguf::GgufFile> gf(std::move(*file));
  auto tk = tok::Tokenizer::from_gguf(*gf);
  ASSERT_TRUE(tk.ok()) << tk.message();
  auto model = model::Model::from_gguf(gf);
  ASSERT_TRUE(model.ok()) << model.message();
  EXPECT_EQ((*model)->config().n_layers, 30);
  EXPECT_TRUE((*model)->config().tied_output);
  EXPECT_FLOAT_EQ((*model)->config().rope_base, 100000.f);

  auto tmpl = tok::ChatTemplate::from_tokenizer(**tk);
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  const tok::ChatMessage msgs[] = {{"user", "What is the capital of France?"}};
  auto text = tmpl->render(msgs, true);
  ASSERT_TRUE(text.ok()) << text.message();
  const std::vector<int32_t> prompt = (*tk)->encode(*text, false, true);

  // Scalar reference kernels: exact dequantized weights. The top two first
  // tokens ("The" / "L") are only 0.08 apart in exact arithmetic, so the fast
  // kernels' int8-quantized activations (as ggml does) may pick the other one.
  runtime::RunnerOptions ro;
  ro.num_blocks = runtime::blocks_for_context(static_cast<int64_t>(prompt.size()) + 16, 16);
  ro.backend = model::KernelBackend::Ref;
  auto runner = runtime::ModelRunner::create(**model, ro);
  ASSERT_TRUE(runner.ok());
  runtime::SequenceSession seq(**runner);
  sample::SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_tokens = 12;
  sample::Sampler sampler(sp, prompt);
  std::vector<int32_t> gen;
  auto logits = seq.feed(prompt);
  for (;;) {
    ASSERT_TRUE(logits.ok()) << logits.message();
    const int32_t t = sampler.sample(*logits).token;
    gen.push_back(t);
    if (sample::check_token(sp, t, static_cast<int32_t>(gen.size()), (*tk)->eog_ids()) != sample::FinishReason::None) {
      break;
    }
    logits = seq.feed(std::span<const int32_t>(&t, 1));
  }
  const std::string answer = (*tk)->decode(gen);
  EXPECT_NE(answer.find("Paris"), std::string::npos) << "answer: " << answer;
}
