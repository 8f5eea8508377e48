// Tool-call parsing on model text in each supported syntax, the forced-call
// grammar, and the request fields of structured outputs (issue 18).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>

#include "grammar/cache.h"
#include "grammar/matcher.h"
#include "openai/openai_api.h"
#include "openai/structured.h"

namespace pagoda::server {
namespace {

const std::vector<std::string> kNames = {"get_weather", "add"};

// The calls, in order: each name and its arguments (compared as JSON values).
using Calls = std::vector<std::pair<std::string, std::string>>;
void expect_calls(const std::vector<ToolCall>& calls, const Calls& want) {
  ASSERT_EQ(calls.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(calls[i].name, want[i].first) << "call " << i;
    EXPECT_EQ(nlohmann::json::parse(calls[i].arguments), nlohmann::json::parse(want[i].second)) << "call " << i;
  }
}

// Parses `text` with the declared kNames, checks the calls, returns the rest (the content).
std::string expect_parse(const std::string& text, const Calls& want) {
  auto p = parse_tool_calls(text, kNames);
  expect_calls(p.calls, want);
  return p.content;
}

TEST(ToolParse, HermesQwen) {
  EXPECT_EQ(expect_parse("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
                         "\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
                         {{"get_weather", R"({"city":"Paris"})"}, {"add", R"({"a":1,"b":2})"}}),
            "Let me check.");
  // The closing tag cut by the end of generation still parses.
  EXPECT_EQ(expect_parse("<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 5}}", {{"add", R"({"a":5})"}}), "");
}

TEST(ToolParse, Llama3Json) {
  expect_parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}",
               {{"get_weather", R"({"city":"Oslo","unit":"celsius"})"}});
  expect_parse("<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}; {\"name\": \"add\", \"parameters\": {\"a\": 2}}",
               {{"add", R"({"a":1})"}, {"add", R"({"a":2})"}});
}

TEST(ToolParse, MistralAndPlainJson) {
  // The second call's arguments come as a JSON string.
  expect_parse("[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}, {\"name\": \"get_weather\", "
               "\"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}]",
               {{"add", R"({"a":3,"b":4})"}, {"get_weather", R"({"city":"Rome"})"}});
  expect_parse("  {\"name\":\"add\",\"arguments\":{\"a\":0,\"b\":0}}\n", {{"add", R"({"a":0,"b":0})"}});
}

TEST(ToolParse, TextThatIsNotACallStaysContent) {
  for (const char* text : {"The weather in Paris is sunny.",
                           "{\"name\": \"unknown_fn\", \"arguments\": {}}",        // not a declared function
                           "{\"name\": \"add\", \"arguments\": {\"a\": 1}} and more",  // trailing text
                           "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>",  // arguments not an object
                           "[TOOL_CALLS] not json", "{\"answer\": 42}"}) {
    auto p = parse_tool_calls(text, kNames);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(ToolParse, MayBeToolCallHoldsOnlyPossibleOpeners) {
  for (const char* t : {"", "  ", "<tool", "<tool_call>{\"na", "[TOOL", "{", " {\"name\"", "<|python_tag|>"})
    EXPECT_TRUE(may_be_tool_call(t)) << t;
  for (const char* t : {"Hello", "<b>", "[1, 2]", "The"}) EXPECT_FALSE(may_be_tool_call(t)) << t;
}

TEST(ToolSyntax, DetectedFromTheTemplate) {
  EXPECT_EQ(detect_tool_syntax("{% if tools %}<tool_call>{{ x }}</tool_call>{% endif %}"), ToolSyntax::kHermes);
  EXPECT_EQ(detect_tool_syntax("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]"), ToolSyntax::kMistral);
  EXPECT_EQ(detect_tool_syntax("<|python_tag|>{{ t }}"), ToolSyntax::kLlama3);
  EXPECT_EQ(detect_tool_syntax("<|im_start|>{{ m.content }}"), ToolSyntax::kJson);
}

// The forced-call grammar derives exactly the calls of the declared functions,
// in the model's syntax, and what it derives parses back to the same call.
TEST(ToolCallSpec, GrammarDerivesValidCallsOnly) {
  ToolSetup t;
  t.names = {"add", "get_weather"};
  t.parameters = {nlohmann::ordered_json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"),
                  nlohmann::ordered_json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")};
  t.choice = ToolChoice::kRequired;
  struct Case {
    ToolSyntax syntax;
    std::string good, bad;
  };
  const Case cases[] = {
      {ToolSyntax::kJson, R"({"name":"add","arguments":{"a":7}})", R"({"name":"sub","arguments":{"a":7}})"},
      {ToolSyntax::kHermes, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>",
       "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"},
      {ToolSyntax::kLlama3, R"({"name":"add","parameters":{"a":1}})", R"({"name":"add","arguments":{"a":1}})"},
      {ToolSyntax::kMistral, R"([TOOL_CALLS][{"name":"add","arguments":{"a":2}}])", R"({"name":"add","arguments":{"a":"x"}})"},
  };
  for (const auto& c : cases) {
    auto g = grammar::compile_constraint(tool_call_spec(t, c.syntax), {});
    ASSERT_TRUE(g.ok()) << g.message();
    EXPECT_TRUE((*g)->matches(c.good)) << tool_syntax_name(c.syntax);
    EXPECT_FALSE((*g)->matches(c.bad)) << tool_syntax_name(c.syntax);
    auto p = parse_tool_calls(c.good, t.names);
    EXPECT_EQ(p.calls.size(), 1u) << c.good;
  }
  t.choice = ToolChoice::kNamed;
  t.named = "get_weather";
  auto g = grammar::compile_constraint(tool_call_spec(t, ToolSyntax::kJson), {});
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE((*g)->matches(R"({"name":"add","arguments":{"a":7}})"));
  EXPECT_TRUE((*g)->matches(R"({"name":"get_weather","arguments":{"city":"x"}})"));
}

ParsedRequest parse_ok(Endpoint ep, const std::string& body) {
  auto r = parse_request(ep, body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << ": " << e->message;
  return std::get<ParsedRequest>(std::move(r));
}

TEST(StructuredRequest, FieldsToSpecs) {
  auto r = parse_ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,
      "schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}}}}})");
  EXPECT_EQ(r.constraint.spec.kind, grammar::ConstraintKind::kJsonSchema);
  // Property order as written (the output writes them in this order).
  EXPECT_LT(r.constraint.spec.text.find("zeta"), r.constraint.spec.text.find("alpha"));
  r = parse_ok(Endpoint::kCompletions, R"({"prompt":"x","guided_choice":["a","b"]})");
  EXPECT_EQ(r.constraint.spec.kind, grammar::ConstraintKind::kChoice);
  EXPECT_EQ(r.constraint.spec.choices, (std::vector<std::string>{"a", "b"}));
  r = parse_ok(Endpoint::kCompletions, R"({"prompt":"x","guided_regex":"[0-9]+"})");
  EXPECT_EQ(r.constraint.spec.kind, grammar::ConstraintKind::kRegex);
  r = parse_ok(Endpoint::kCompletions, R"({"prompt":"x","guided_json":"{\"type\":\"integer\"}"})");
  EXPECT_EQ(r.constraint.spec.text, R"({"type":"integer"})");
  r = parse_ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})");
  EXPECT_TRUE(r.constraint.spec.empty());
  r = parse_ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  EXPECT_EQ(r.constraint.tools.choice, ToolChoice::kAuto);
  EXPECT_EQ(r.constraint.tools.names, (std::vector<std::string>{"f"}));
  r = parse_ok(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none"})");
  EXPECT_FALSE(r.constraint.tools.active());
}

TEST(StructuredRequest, ShapeErrorsNameTheParam) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt":"x","response_format":{"type":"yaml"}})", "response_format"},
      {R"({"prompt":"x","response_format":{"type":"json_schema"}})", "response_format"},
      {R"({"prompt":"x","guided_choice":[]})", "guided_choice"},
      {R"({"prompt":"x","guided_regex":5})", "guided_regex"},
      {R"({"prompt":"x","guided_json":{},"guided_regex":"a"})", "guided_regex"},
      {R"({"prompt":"x","tools":[]})", "tools"},
  };
  for (const auto& [body, param] : cases) {
    auto r = parse_request(Endpoint::kCompletions, body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, param) << body;
    EXPECT_EQ(std::get<ApiError>(r).status, 400);
  }
}

TEST(GrammarCacheKey, CanonicalTextKeepsOrderIgnoresWhitespace) {
  using grammar::ConstraintKind;
  using grammar::ConstraintSpec;
  using grammar::GrammarCache;
  ConstraintSpec a{ConstraintKind::kJsonSchema, R"({"type": "object", "properties": {"b": {}, "a": {}}})", {}, "", ""};
  ConstraintSpec b{ConstraintKind::kJsonSchema, "{\"type\":\"object\",\n \"properties\":{\"b\":{},\"a\":{}}}", {}, "", ""};
  ConstraintSpec c{ConstraintKind::kJsonSchema, R"({"type":"object","properties":{"a":{},"b":{}}})", {}, "", ""};
  EXPECT_EQ(GrammarCache::key_of(a), GrammarCache::key_of(b));
  EXPECT_NE(GrammarCache::key_of(a), GrammarCache::key_of(c));
  ConstraintSpec x{ConstraintKind::kChoice, "", {"ab", "c"}, "", ""}, y{ConstraintKind::kChoice, "", {"a", "bc"}, "", ""};
  EXPECT_NE(GrammarCache::key_of(x), GrammarCache::key_of(y));
  ConstraintSpec r{ConstraintKind::kRegex, "ab", {}, "", ""};
  EXPECT_NE(GrammarCache::key_of(r), GrammarCache::key_of(ConstraintSpec{ConstraintKind::kJsonSchema, "ab", {}, "", ""}));
}

TEST(GrammarCache, SharesOneCompiledGrammarPerConstraintAndEvictsLeastRecent) {
  auto ti = grammar::TokenIndex::create({"a", "b", "{", "}", "\"", ":", "1"}, {});
  ASSERT_TRUE(ti.ok());
  grammar::GrammarCache cache(*ti, {}, /*capacity=*/2);
  grammar::ConstraintSpec s1{grammar::ConstraintKind::kRegex, "a+", {}, "", ""};
  grammar::ConstraintSpec s2{grammar::ConstraintKind::kRegex, "b+", {}, "", ""};
  grammar::ConstraintSpec s3{grammar::ConstraintKind::kChoice, "", {"ab"}, "", ""};
  auto g1 = cache.get(s1);
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(cache.get(s1)->get(), g1->get());  // the same object: its masks are shared
  ASSERT_TRUE(cache.get(s2).ok());
  ASSERT_TRUE(cache.get(s1).ok());  // s1 most recent
  ASSERT_TRUE(cache.get(s3).ok());  // evicts s2
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get(s1)->get(), g1->get());
  EXPECT_EQ(cache.hits(), 3u);
  EXPECT_EQ(cache.misses(), 3u);
  auto bad = cache.get(grammar::ConstraintSpec{grammar::ConstraintKind::kRegex, "(a", {}, "", ""});
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(cache.size(), 2u);  // errors are not cached
}


// Issue 35: the cache is bounded in bytes too (grammars and the masks they learn).
namespace bytes_bound {

std::shared_ptr<const grammar::TokenIndex> letters() {
  std::vector<std::string> toks;
  for (char c = 'a'; c <= 'z'; ++c) toks.emplace_back(1, c);
  toks.emplace_back("");  // id 26: end of generation
  auto ti = grammar::TokenIndex::create(toks, {26});
  EXPECT_TRUE(ti.ok());
  return *ti;
}

// 300 choices of 6 letters starting with `first`: a trie of ~1000 rules. Specs with
// other first letters compile to grammars of the same shape (and byte count).
grammar::ConstraintSpec words(char first) {
  grammar::ConstraintSpec s{grammar::ConstraintKind::kChoice, "", {}, "", ""};
  for (int i = 0; i < 300; ++i) {
    std::string w(1, first);
    for (int k = 0, v = i * 7919; k < 5; ++k, v /= 26) w += static_cast<char>('a' + v % 26);
    s.choices.push_back(w);
  }
  return s;
}

size_t bytes_alone(const std::shared_ptr<const grammar::TokenIndex>& ti, const grammar::ConstraintSpec& spec) {
  grammar::GrammarCache probe(ti, {}, 64, SIZE_MAX);
  EXPECT_TRUE(probe.get(spec).ok());
  return probe.bytes();
}

TEST(GrammarCacheBytes, GrammarsAreCountedAndTheLeastRecentGoesFirst) {
  auto ti = letters();
  const auto s1 = words('a'), s2 = words('b'), s3 = words('c');
  const size_t b1 = bytes_alone(ti, s1), b2 = bytes_alone(ti, s2);
  EXPECT_GT(b1, 10'000u);  // the rules of ~1000 trie nodes, not a constant
  EXPECT_EQ(b1, bytes_alone(ti, s3));
  EXPECT_LT(bytes_alone(ti, grammar::ConstraintSpec{grammar::ConstraintKind::kChoice, "", {"ab"}, "", ""}), b1 / 10);

  grammar::GrammarCache cache(ti, {}, /*capacity=*/64, /*max_bytes=*/b1 + b2);
  auto g1 = cache.get(s1);
  ASSERT_TRUE(g1.ok());
  ASSERT_TRUE(cache.get(s2).ok());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), b1 + b2);
  ASSERT_TRUE(cache.get(s3).ok());  // over by b3: s1, the least recent, goes
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), b2 + b1);
  EXPECT_EQ(cache.misses(), 3u);
  ASSERT_TRUE(cache.get(s3).ok());
  ASSERT_TRUE(cache.get(s2).ok());
  EXPECT_EQ(cache.hits(), 2u);
  auto again = cache.get(s1);  // compiled anew; s3 is now the least recent and goes
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(cache.misses(), 4u);
  EXPECT_NE(again->get(), g1->get());
  EXPECT_EQ(cache.get(s2)->get(), cache.get(s2)->get());
  EXPECT_EQ(cache.hits(), 4u);
  ASSERT_TRUE(cache.get(s3).ok());
  EXPECT_EQ(cache.misses(), 5u);
}

TEST(GrammarCacheBytes, MasksLearnedWhileDecodingCountAndEvictOthers) {
  auto ti = letters();
  const auto s1 = words('a'), s2 = words('b');
  const size_t b1 = bytes_alone(ti, s1), b2 = bytes_alone(ti, s2);
  grammar::GrammarCache cache(ti, {}, 64, b1 + b2);
  ASSERT_TRUE(cache.get(s1).ok());
  auto g2 = cache.get(s2);
  ASSERT_TRUE(g2.ok());
  const size_t grammar_only = (*g2)->memory_bytes();
  // A request decoding under s2: each new context's mask is kept in the grammar.
  grammar::Matcher m(*g2);
  std::vector<uint32_t> mask(m.mask_words());
  for (char c : s2.choices[1]) {
    m.fill_mask(mask);
    ASSERT_TRUE(m.accept(c - 'a')) << c;
  }
  const size_t learned = (*g2)->memory_bytes() - grammar_only;
  EXPECT_GE(learned, 6 * m.mask_words() * sizeof(uint32_t));  // six contexts, one mask each at least
  EXPECT_EQ(cache.size(), 2u);  // nothing happens until the cache is used
  EXPECT_EQ(cache.bytes(), b1 + b2 + learned);
  ASSERT_TRUE(cache.get(s2).ok());  // a hit, and now over: s1 goes
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.bytes(), b2 + learned);
  ASSERT_TRUE(cache.get(s1).ok());
  EXPECT_EQ(cache.misses(), 3u);
}

TEST(GrammarCacheBytes, OneGrammarOverTheBoundStaysUntilAnotherComes) {
  auto ti = letters();
  grammar::GrammarCache cache(ti, {}, 64, /*max_bytes=*/1);
  auto g1 = cache.get(words('a'));
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.get(words('a'))->get(), g1->get());  // kept: the most recent always stays
  ASSERT_TRUE(cache.get(words('b')).ok());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_NE(cache.get(words('a'))->get(), g1->get());
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 3u);
  // A grammar dropped from the cache lives on while a request holds it.
  EXPECT_EQ((*g1)->grammar().num_rules(), (*cache.get(words('a')))->grammar().num_rules());
}

}  // namespace bytes_bound

}  // namespace
}  // namespace pagoda::server
