#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tok/chat_template.h"
#include "tok/smollm2_chat.h"
#include "tok/tok_test_util.h"

using namespace pagoda;
using namespace pagoda::tok;

namespace {

std::vector<ChatMessage> conversation() {
  return {{"system", "You are a helpful assistant."},
          {"user", "Hello! "},
          {"assistant", "  Hi there, how can I help?\n"},
          {"user", "What is 2+2?"}};
}

}  // namespace

// Every case of the fixture was rendered by Jinja2 from the template text
// (scripts/make_tok_fixture.py), like HF transformers' apply_chat_template.
TEST(TokChatTemplate, MatchesJinjaRenderingsOfEachFamily) {
  const auto cases = nlohmann::json::parse(pagoda::tok::testing::read_file(
      PAGODA_SOURCE_DIR "/tests/tok/fixtures/chat_templates.json"));
  ASSERT_GE(cases.size(), 40u);
  int rendered = 0, refused = 0;
  for (const auto& c : cases) {
    const std::string label = c["name"].get<std::string>() + "/" +
                              c["conversation"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? "/gen" : "");
    auto tmpl = ChatTemplate::parse(c["template"].get<std::string>(), c["bos"], c["eos"]);
    ASSERT_TRUE(tmpl.ok()) << label << ": " << tmpl.message();
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    auto out = tmpl->render(msgs, c["add_generation_prompt"].get<bool>());
    if (c["expected"].is_null()) {
      ASSERT_FALSE(out.ok()) << label << " rendered: " << out.value();
      // The template's own raise_exception message reaches the caller.
      EXPECT_NE(out.message().find(c["error"].get<std::string>()), std::string::npos) << label << ": " << out.message();
      ++refused;
    } else {
      ASSERT_TRUE(out.ok()) << label << ": " << out.message();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << label;
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 20);
  EXPECT_GT(refused, 5);
}

TEST(TokChatTemplate, SmolLM2FromGgufInjectsItsDefaultSystemMessage) {
  std::string why;
  const ChatTemplate* tmpl = pagoda::tok::testing::smollm2_template(&why);
  if (tmpl == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why;
  const Tokenizer* t = pagoda::tok::testing::smollm2(&why);
  EXPECT_EQ(tmpl->bos_token(), "<|im_start|>");
  EXPECT_EQ(tmpl->eos_token(), "<|im_end|>");
  const std::vector<ChatMessage> msgs = {{"user", "What is the capital of France?"}};
  auto out = tmpl->render(msgs, true);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The rendered prompt tokenizes with its markers as control tokens.
  const auto ids = t->encode(*out, false, /*parse_special=*/true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);  // two <|im_end|>

  const auto with_system = tmpl->render(conversation(), false);
  ASSERT_TRUE(with_system.ok());
  EXPECT_EQ(with_system->rfind("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0), 0u);
}

// Any template renders (no family guessing); what the interpreter cannot do is an
// error that names the construct.
TEST(TokChatTemplate, TemplatesOfNoKnownFamilyRenderAndBadOnesNameTheProblem) {
  auto t = ChatTemplate::parse("{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
                               "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.message();
  const std::vector<ChatMessage> msgs = {{"user", "hi"}, {"assistant", "yo"}};
  auto out = t->render(msgs, true);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(*out, "### user: hi\n### assistant: yo\n");

  auto empty = ChatTemplate::parse("", "<s>", "</s>");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("--chat-template"), std::string::npos) << empty.message();

  auto syntax = ChatTemplate::parse("{% for m in messages %}{{ m.content }}", "<s>", "</s>");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(syntax.message().find("endfor"), std::string::npos) << syntax.message();

  auto include = ChatTemplate::parse("{% include 'other.jinja' %}", "<s>", "</s>");
  ASSERT_FALSE(include.ok());
  EXPECT_NE(include.message().find("include"), std::string::npos) << include.message();

  auto filter = ChatTemplate::parse("{{ messages | pprint }}", "<s>", "</s>");
  ASSERT_TRUE(filter.ok());  // unknown filters fail when used, as in jinja2
  auto bad = filter->render(msgs, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("unsupported filter 'pprint'"), std::string::npos) << bad.message();
}

TEST(TokChatTemplate, StoriesHasNoTemplate) {
  std::string why;
  const Tokenizer* t = pagoda::tok::testing::stories(&why);
  ASSERT_NE(t, nullptr) << why;
  auto tmpl = ChatTemplate::from_tokenizer(*t);
  ASSERT_FALSE(tmpl.ok());
  EXPECT_NE(tmpl.message().find("no tokenizer.chat_template"), std::string::npos);
}

TEST(TokChatTemplate, RolesAreTheTemplatesBusinessAndEmptyConversationsAreErrors) {
  auto t = ChatTemplate::parse(
      "{% for message in messages %}{% if message['role'] not in ['user', 'assistant', 'tool'] %}"
      "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.message();
  const std::vector<ChatMessage> bad = {{"user", "hi"}, {"wizard", "poof"}};
  auto out = t->render(bad, true);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("unknown role wizard"), std::string::npos) << out.message();
  EXPECT_FALSE(t->render({}, true).ok());
  const std::vector<ChatMessage> tool = {{"user", "hi"}, {"tool", "42"}};
  auto ok = t->render(tool, false);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(*ok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n");
}

TEST(TokChatTemplate, PyStripMatchesPythonWhitespace) {
  EXPECT_EQ(py_strip("  a b \n\t"), "a b");
  EXPECT_EQ(py_strip("\xC2\xA0x\xE3\x80\x80"), "x");  // NBSP, ideographic space
  EXPECT_EQ(py_strip("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");  // zero-width space is not whitespace
  EXPECT_EQ(py_strip("   "), "");
  EXPECT_EQ(py_strip("\x1Fq\x1C"), "q");
}
