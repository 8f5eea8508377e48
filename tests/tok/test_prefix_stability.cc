// check_prefix_stability (issue 36) with a real template that drops earlier
// turns' reasoning: Qwen3's (tests/tok/fixtures/templates), which keeps a
// <think> block only in assistant turns after the last user message.
#include <gtest/gtest.h>

#include "tok/prefix_stability.h"
#include "tok/tok_test_util.h"
#include "tok/tokenizer.h"

namespace pagoda::tok::testing {
namespace {

ChatTemplate qwen3() {
  const std::string src = read_file(PAGODA_SOURCE_DIR "/tests/tok/fixtures/templates/Qwen-Qwen3-0.6B.jinja");
  EXPECT_FALSE(src.empty());
  auto t = ChatTemplate::parse(src, "", "<|im_end|>");
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.message());
  return std::move(t).value();
}

nlohmann::ordered_json conversation(bool reasoning) {
  const std::string r1 = reasoning ? "<think>\nAdd them.\n</think>\n\n" : "";
  const std::string r2 = reasoning ? "<think>\nAgain.\n</think>\n\n" : "";
  return nlohmann::ordered_json::array({
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", "What is 2+2?"}},
      {{"role", "assistant"}, {"content", r1 + "4"}},
      {{"role", "user"}, {"content", "And 3+3?"}},
      {{"role", "assistant"}, {"content", r2 + "6"}},
      {{"role", "user"}, {"content", "Thanks."}},
  });
}

// The prompt the server renders for the first n messages.
RenderedPrompt prompt(const ChatTemplate& t, const nlohmann::ordered_json& m, size_t n) {
  const nlohmann::ordered_json part(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(n));
  auto r = t.render_json(part, ChatRenderOptions{});
  EXPECT_TRUE(r.ok());
  return std::move(r).value();
}

TEST(PrefixStability, ReasoningDroppedFromEarlierTurnsBreaksAtTheReply) {
  const ChatTemplate t = qwen3();
  const auto m = conversation(true);
  auto rep = check_prefix_stability(t, m, ChatRenderOptions{}, nullptr);
  ASSERT_TRUE(rep.ok()) << rep.message();
  EXPECT_EQ(rep->num_turns, 3);
  ASSERT_EQ(rep->breaks.size(), 2u);
  // Turn 1's rendering keeps its <think> block (the last user message is
  // before it); turn 2's prompt drops it: they part where the reply starts,
  // right after turn 1's prompt.
  const std::string p1 = prompt(t, m, 2).text;
  ASSERT_TRUE(p1.ends_with("<|im_start|>assistant\n"));
  EXPECT_EQ(rep->breaks[0].turn, 1);
  EXPECT_EQ(rep->breaks[0].byte, static_cast<int64_t>(p1.size()));
  EXPECT_EQ(rep->breaks[0].token, -1);
  EXPECT_EQ(rep->breaks[0].context, p1.substr(p1.size() - 40));
  EXPECT_EQ(rep->breaks[0].prev, "<think>\nAdd them.\n</think>\n\n4<|im_end|>\n");
  EXPECT_EQ(rep->breaks[0].next, std::string("4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_").substr(0, 40));
  const std::string p2 = prompt(t, m, 4).text;
  EXPECT_EQ(rep->breaks[1].turn, 2);
  EXPECT_EQ(rep->breaks[1].byte, static_cast<int64_t>(p2.size()));
  EXPECT_TRUE(rep->breaks[1].prev.starts_with("<think>\nAgain."));
  EXPECT_TRUE(rep->breaks[1].next.starts_with("6<|im_end|>"));
}

// Qwen3 breaks even without reasoning: the turn just answered renders an empty
// "<think>\n\n</think>\n\n" that the next prompt no longer has.
TEST(PrefixStability, Qwen3BreaksEvenWithoutReasoning) {
  const ChatTemplate t = qwen3();
  const auto m = conversation(false);
  auto rep = check_prefix_stability(t, m, ChatRenderOptions{}, nullptr);
  ASSERT_TRUE(rep.ok()) << rep.message();
  EXPECT_EQ(rep->num_turns, 3);
  ASSERT_EQ(rep->breaks.size(), 2u);
  EXPECT_EQ(rep->breaks[0].byte, static_cast<int64_t>(prompt(t, m, 2).text.size()));
  EXPECT_EQ(rep->breaks[0].prev, "<think>\n\n</think>\n\n4<|im_end|>\n");
}

// SmolLM2's own template (ChatML, no reasoning handling) extends every turn.
TEST(PrefixStability, SmolLM2TemplateIsStable) {
  std::string why;
  const Tokenizer* tk = smollm2(&why);
  if (tk == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why;
  auto t = ChatTemplate::from_tokenizer(*tk);
  ASSERT_TRUE(t.ok()) << t.message();
  for (bool reasoning : {false, true}) {
    auto rep = check_prefix_stability(*t, conversation(reasoning), ChatRenderOptions{}, tk);
    ASSERT_TRUE(rep.ok()) << rep.message();
    EXPECT_EQ(rep->num_turns, 3);
    EXPECT_TRUE(rep->stable()) << "reasoning=" << reasoning << " break at byte " << rep->breaks[0].byte;
  }
}

// With a tokenizer the break is also a token index: the server's encoding of
// turn 1's prompt is a prefix of both encodings, which part right after it.
TEST(PrefixStability, TokenPositionWithSmolLM2) {
  std::string why;
  const Tokenizer* tk = smollm2(&why);
  if (tk == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why;
  const ChatTemplate t = qwen3();
  const auto m = conversation(true);
  auto rep = check_prefix_stability(t, m, ChatRenderOptions{}, tk);
  ASSERT_TRUE(rep.ok()) << rep.message();
  ASSERT_EQ(rep->breaks.size(), 2u);
  const std::vector<TokenId> p1 = encode_prompt(*tk, prompt(t, m, 2));
  EXPECT_EQ(rep->breaks[0].token, static_cast<int64_t>(p1.size()));
  const std::vector<TokenId> p2 = encode_prompt(*tk, prompt(t, m, 4));
  EXPECT_EQ(rep->breaks[1].token, static_cast<int64_t>(p2.size()));
}

TEST(PrefixStability, BadInputIsNamed) {
  const ChatTemplate t = qwen3();
  auto not_array = check_prefix_stability(t, nlohmann::ordered_json::object(), ChatRenderOptions{}, nullptr);
  ASSERT_FALSE(not_array.ok());
  EXPECT_NE(not_array.message().find("JSON array"), std::string::npos);
  auto no_role = check_prefix_stability(t, nlohmann::ordered_json::array({{{"content", "x"}}}), ChatRenderOptions{},
                                        nullptr);
  ASSERT_FALSE(no_role.ok());
  EXPECT_NE(no_role.message().find("messages[0]"), std::string::npos);
  auto no_assistant = check_prefix_stability(
      t, nlohmann::ordered_json::array({{{"role", "user"}, {"content", "x"}}}), ChatRenderOptions{}, nullptr);
  ASSERT_FALSE(no_assistant.ok());
  EXPECT_NE(no_assistant.message().find("no assistant message"), std::string::npos);
}

}  // namespace
}  // namespace pagoda::tok::testing
