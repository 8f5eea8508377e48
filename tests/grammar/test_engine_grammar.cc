// Constrained decoding through the engine on stories260K (issue 18): every
// choice's output stays in the grammar's language, ends when the grammar is
// complete, survives n > 1 forks and preemption by recompute, and costs
// unconstrained neighbours nothing (their tokens are bitwise the same).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/engine_test_util.h"
#include "grammar/cache.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"

namespace pagoda::enginetest {
namespace {

std::shared_ptr<const grammar::CompiledGrammar> compile(const Engine& e, const grammar::ConstraintSpec& spec) {
  auto ti = grammar::TokenIndex::from_tokenizer(e.tokenizer());
  EXPECT_TRUE(ti.ok()) << ti.message();
  auto g = grammar::compile_constraint(spec, {});
  EXPECT_TRUE(g.ok()) << g.message();
  if (!ti.ok() || !g.ok()) return nullptr;
  return std::make_shared<const grammar::CompiledGrammar>(*g, *ti);
}

std::vector<int32_t> prompt_of(const Engine& e, const std::string& text) {
  return e.tokenizer().encode(text, /*add_special=*/true, /*parse_special=*/false);
}

class EngineGrammar : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!file_exists(stories_path())) GTEST_SKIP() << stories_path() << " missing";
  }
};

TEST_F(EngineGrammar, ChoicesWithForksEndInTheLanguage) {
  auto e = make_engine(make_config(stories_path()));
  ASSERT_TRUE(e);
  const std::vector<std::string> choices = {" Lily", " Tom and Ben", " the little dog"};
  auto g = compile(*e, {grammar::ConstraintKind::kChoice, "", choices, "", ""});
  ASSERT_TRUE(g);
  Driver d(e.get());
  RequestParams p = seeded(prompt_of(*e, "Once upon a time, there was"), 30, 7, 4);
  p.temperature = 1.0f;
  p.grammar = g;
  const RequestId id = d.add(p);
  ASSERT_TRUE(d.run());
  d.expect_all_finished();
  for (int i = 0; i < 4; ++i) {
    const ChoiceResult& r = d.result(id, i);
    EXPECT_NE(std::find(choices.begin(), choices.end(), r.text), choices.end()) << i << ": '" << r.text << "'";
    // Finished by the grammar (nothing may follow), not by the length limit.
    EXPECT_EQ(r.finish, FinishReason::kStop) << i;
    EXPECT_LT(r.tokens.size(), 30u);
  }
  EXPECT_GT(e->stats().grammar_tokens_total, 0);
}

TEST_F(EngineGrammar, JsonSchemaOutputParsesAndValidates) {
  auto e = make_engine(make_config(stories_path()));
  ASSERT_TRUE(e);
  const char* schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},
      "age":{"type":"integer","minimum":1,"maximum":99}},"required":["name","age"]})";
  auto g = compile(*e, {grammar::ConstraintKind::kJsonSchema, schema, {}, "", ""});
  ASSERT_TRUE(g);
  Driver d(e.get());
  std::vector<RequestId> ids;
  for (uint64_t seed : {1, 2, 3}) {
    RequestParams p = seeded(prompt_of(*e, "The girl said"), 120, seed, 1);
    p.grammar = g;
    ids.push_back(d.add(p));
  }
  ASSERT_TRUE(d.run());
  for (RequestId id : ids) {
    const ChoiceResult& r = d.result(id);
    ASSERT_EQ(r.finish, FinishReason::kStop) << r.text;
    EXPECT_TRUE(g->grammar().matches(r.text)) << r.text;
    auto j = nlohmann::json::parse(r.text);
    EXPECT_TRUE(j["name"].is_string() && j["name"].get<std::string>().size() <= 10) << r.text;
    EXPECT_TRUE(j["age"].is_number_integer() && j["age"] >= 1 && j["age"] <= 99) << r.text;
  }
}

// Greedy outputs of constrained requests are the same alone and batched through
// a KV pool so small that requests are preempted (recomputed) mid-generation:
// each choice's matcher lives with the choice, not its blocks. Unconstrained
// neighbours get exactly their unconstrained tokens.
TEST_F(EngineGrammar, SurvivesPreemptionAndLeavesNeighboursUnchanged) {
  auto probe = make_engine(make_config(stories_path()));
  ASSERT_TRUE(probe);
  auto g = compile(*probe, {grammar::ConstraintKind::kRegex, "( [a-z]+){1,40}", {}, "", ""});
  ASSERT_TRUE(g);
  const char* prompts[] = {"Once upon a time", "The cat sat", "Tom had a big red", "She went to the park and"};
  auto params = [&](const Engine& e, int i) {
    RequestParams p = greedy(prompt_of(e, prompts[i]), 40, /*ignore_eos=*/false);
    if (i % 2 == 0) p.grammar = g;  // 0, 2 constrained; 1, 3 not
    return p;
  };
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 4; ++i) {
    auto e = make_engine(make_config(stories_path()));
    Driver d(e.get());
    const RequestId id = d.add(params(*e, i));
    ASSERT_TRUE(d.run());
    alone.push_back(d.result(id).tokens);
    if (i % 2 == 0) {
      EXPECT_TRUE(g->grammar().matches(d.result(id).text)) << d.result(id).text;
    }
  }
  // 7 usable blocks of 16 tokens: four sequences of up to ~50 tokens do not fit.
  auto e = make_engine(make_config(stories_path(), /*pool_tokens=*/112));
  ASSERT_TRUE(e);
  Driver d(e.get());
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(d.add(params(*e, i)));
  ASSERT_TRUE(d.run());
  d.expect_all_finished();
  EXPECT_GT(e->stats().num_preemptions, 0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d.result(ids[static_cast<size_t>(i)]).tokens, alone[static_cast<size_t>(i)]) << i;
}

TEST_F(EngineGrammar, RefusesMismatchedVocabularyAndForcedTokens) {
  auto e = make_engine(make_config(stories_path()));
  ASSERT_TRUE(e);
  auto ti = grammar::TokenIndex::create({"a", "b"}, {});
  ASSERT_TRUE(ti.ok());
  auto g = grammar::Grammar::from_regex("a+");
  ASSERT_TRUE(g.ok());
  RequestParams p = greedy(prompt_of(*e, "Hi"), 4);
  p.grammar = std::make_shared<const grammar::CompiledGrammar>(*g, *ti);
  auto r = e->add_request(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("vocabulary of 2 tokens"), std::string::npos) << r.message();
  p.grammar = compile(*e, {grammar::ConstraintKind::kRegex, "a+", {}, "", ""});
  p.forced_tokens = {1};
  EXPECT_FALSE(e->add_request(p).ok());
  EXPECT_FALSE(e->has_unfinished());
}

}  // namespace
}  // namespace pagoda::enginetest
