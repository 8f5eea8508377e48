// Smoke test on the default model (skipped when the file is absent), through
// engine::Engine as `pagoda run` drives it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/engine.h"
#include "tok/chat_template.h"
#include "tok/tokenizer.h"

using namespace pagoda;

TEST(SmolLM2, ChatCapitalOfFranceSaysParis) {
  const std::string path = std::string(PAGODA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found (run scripts/setup)";
  // Scalar reference kernels: exact dequantized weights. The top two first
  // tokens ("The" / "L") are only 0.08 apart in exact arithmetic, so the fast
  // kernels' int8-quantized activations (as ggml does) may pick the other one.
  engine::EngineConfig c;
  c.model_path = path;
  c.context_length = 256;
  c.kv_pool_one_context = true;
  c.watermark = 0;
  c.ref_kernels = true;
  auto e = engine::Engine::create(c);
  ASSERT_TRUE(e.ok()) << e.message();
  const engine::ModelInfo& info = (*e)->model_info();
  EXPECT_EQ(info.n_layers, 30);
  EXPECT_EQ(info.architecture, "llama");
  const tok::Tokenizer& tk = (*e)->tokenizer();

  auto tmpl = tok::ChatTemplate::from_tokenizer(tk);
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  const tok::ChatMessage msgs[] = {{"user", "What is the capital of France?"}};
  auto text = tmpl->render(msgs, true);
  ASSERT_TRUE(text.ok()) << text.message();
  engine::RequestParams p;
  p.prompt = tk.encode(*text, false, true);
  p.max_tokens = 12;
  p.temperature = 0.0f;
  auto id = (*e)->add_request(p);
  ASSERT_TRUE(id.ok()) << id.message();
  std::vector<int32_t> gen;
  while ((*e)->has_unfinished()) {
    for (const engine::TokenEvent& ev : (*e)->step()) {
      ASSERT_NE(ev.finish, engine::FinishReason::kError) << ev.error;
      gen.insert(gen.end(), ev.tokens.begin(), ev.tokens.end());
    }
  }
  const std::string answer = tk.decode(gen);
  EXPECT_NE(answer.find("Paris"), std::string::npos) << "answer: " << answer;
}
