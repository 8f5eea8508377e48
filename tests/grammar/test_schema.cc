// JSON schema -> grammar: every feature accepts exactly its valid byte strings.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "grammar/grammar.h"

namespace pagoda::grammar {
namespace {

std::shared_ptr<const Grammar> schema(const std::string& s, const GrammarOptions& o = {}) {
  auto g = Grammar::from_json_schema(s, o);
  EXPECT_TRUE(g.ok()) << s << " -> " << (g.ok() ? "" : g.message());
  return g.ok() ? *g : nullptr;
}

void expect_accepts(const Grammar& g, std::initializer_list<const char*> yes,
                    std::initializer_list<const char*> no) {
  for (const char* s : yes) EXPECT_TRUE(g.matches(s)) << "should accept: " << s;
  for (const char* s : no) EXPECT_FALSE(g.matches(s)) << "should reject: " << s;
}

TEST(GrammarSchema, ObjectRequiredOptionalInOrder) {
  auto g = schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},
                      "required":["name"]})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {R"({"name":"a"})", R"({"name": "a", "age": 3})", "{\n  \"name\": \"x\",\n  \"age\": -12\n}",
                      R"({"name":"\u00e9\n\"q\""})", "{\"name\":\"caf\xC3\xA9\"}"},
                 {"{}", R"({"age":3})", R"({"age":3,"name":"a"})", R"({"name":"a","extra":1})", R"({"name":1})",
                  R"({"name":"a",})", R"({"name":"a"} )", R"( {"name":"a"})", R"({"name":"a","age":01})",
                  "{\"name\":\"\x01\"}", "{\"name\":\"\xC3\"}", "{\"name\":\"\xC0\x80\"}",
                  "{\"name\":\"\xE0\x80\x80\"}", "{\"name\":\"\xED\xA0\x80\"}", "{\"name\":\"\xF4\x90\x80\x80\"}"});
  EXPECT_TRUE(g->matches("{\"name\":\"\xF0\x9F\x98\x80\xED\x9F\xBF\"}"));  // U+1F600, U+D7FF
  EXPECT_TRUE(g->matches_prefix(R"({"name":"a", "ag)"));
  EXPECT_FALSE(g->matches_prefix(R"({"nam3)"));
}

TEST(GrammarSchema, AdditionalProperties) {
  auto g = schema(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {"{}", R"({"a":1,"b":2})", R"({ "a" : 1 })"}, {R"({"a":"x"})", R"({"a":1,})", "{,}"});
  auto g2 = schema(R"({"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
                       "additionalProperties":true})");
  ASSERT_TRUE(g2);
  expect_accepts(*g2, {R"({"id":1})", R"({"id":1,"x":[true,null]})", R"({"id":1,"i":2,"idx":3,"\u0041":4})"},
                 {R"({"x":1})", R"({"x":1,"id":1})", R"({"id":1,"id":2})", R"({"id":1,"x":0,"id":2})"});
  // Without strictness, JSON Schema's default: other keys allowed.
  GrammarOptions lax;
  lax.strict_additional_properties = false;
  auto g3 = schema(R"({"properties":{"id":{"type":"integer"}}})", lax);
  ASSERT_TRUE(g3);
  expect_accepts(*g3, {"{}", R"({"id":1,"z":"w"})"}, {R"({"id":"1"})"});
}

TEST(GrammarSchema, ArraysMinMaxItems) {
  auto g = schema(R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {"[true]", "[true,false,true]", "[ true , false ]"},
                 {"[]", "[true,true,true,true]", "[1]", "[true,]"});
  auto g2 = schema(R"({"type":"array","minItems":2})");
  ASSERT_TRUE(g2);
  expect_accepts(*g2, {"[1,\"a\"]", "[1,2,3,4,5,{}]"}, {"[]", "[1]"});
  auto g3 = schema(R"({"type":"array","items":{"type":"integer"}})");
  ASSERT_TRUE(g3);
  expect_accepts(*g3, {"[]", "[1]", "[1,2,3]"}, {"[1,]", "[,]", "[\"a\"]"});
}

TEST(GrammarSchema, EnumConstAnyOfTypeList) {
  auto g = schema(R"({"enum":["red",1,null,{"a":[1]}]})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {R"("red")", "1", "null", R"({"a":[1]})"}, {R"("blue")", "2", R"("re")"});
  auto c = schema(R"({"const":"x"})");
  ASSERT_TRUE(c);
  expect_accepts(*c, {R"("x")"}, {R"("y")", "x"});
  auto a = schema(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})");
  ASSERT_TRUE(a);
  expect_accepts(*a, {"5", R"("ab")", R"("")"}, {R"("abc")", "true", "5.5"});
  auto o = schema(R"({"oneOf":[{"type":"null"},{"type":"boolean"}]})");
  ASSERT_TRUE(o);
  expect_accepts(*o, {"null", "true", "false"}, {"0"});
  auto t = schema(R"({"type":["string","null"]})");
  ASSERT_TRUE(t);
  expect_accepts(*t, {"null", R"("s")"}, {"1"});
  auto any = schema("{}");
  ASSERT_TRUE(any);
  expect_accepts(*any, {"1", "[1,{\"a\":null}]", "-0.5e+3", "\"\""}, {"", "nul", "01", "[1,]"});
}

TEST(GrammarSchema, LargeEnumIsOneDeterministicTrie) {
  std::string e = R"({"enum":[)";
  for (int i = 0; i < 4096; ++i) {
    if (i) e += ',';
    e += "\"item" + std::to_string(i * 7) + "\"";
  }
  e += "]}";
  auto g = schema(e);
  ASSERT_TRUE(g);
  EXPECT_EQ(initial_stacks(*g).size(), 1u);  // one parse stack, not one per value
  expect_accepts(*g, {R"("item0")", R"("item28665")", R"("item7")"}, {R"("item1")", R"("item")", R"("item286650")"});
}

TEST(GrammarSchema, RefDefsRecursive) {
  auto g = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"},
                 {R"({"v":1,"kids":[{}]})", R"({"kids":[]})"});
  auto d = schema(R"({"definitions":{"a b/c":{"type":"integer"}},"properties":{"x":{"$ref":"#/definitions/a b~1c"}},
                      "required":["x"]})");
  ASSERT_TRUE(d);
  expect_accepts(*d, {R"({"x":5})"}, {R"({"x":"5"})"});
}

TEST(GrammarSchema, StringFormatsAndPatterns) {
  auto date = schema(R"({"type":"string","format":"date"})");
  ASSERT_TRUE(date);
  expect_accepts(*date, {R"("2024-02-29")", R"("2000-02-29")", R"("2023-12-31")", R"("0001-04-30")"},
                 {R"("2024-13-01")", R"("24-01-01")", R"("2023-02-29")", R"("1900-02-29")", R"("2024-04-31")",
                  R"("0000-01-01")", R"("2024-02-30")"});
  auto dt = schema(R"({"type":"string","format":"date-time"})");
  ASSERT_TRUE(dt);
  expect_accepts(*dt, {R"("2024-02-29T23:59:00Z")", R"("2024-02-29T23:59:00.123+05:30")"},
                 {R"("2024-02-29 23:59:00Z")", R"("2024-02-29T24:00:00Z")"});
  auto uuid = schema(R"({"type":"string","format":"uuid"})");
  ASSERT_TRUE(uuid);
  expect_accepts(*uuid, {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567e89b12d3a456426614174000")"});
  auto email = schema(R"({"type":"string","format":"email"})");
  ASSERT_TRUE(email);
  expect_accepts(*email, {R"("a.b@c.io")"}, {R"("a@b")", R"("@b.io")"});
  auto unk = schema(R"({"type":"string","format":"uri"})");  // annotation only
  ASSERT_TRUE(unk);
  expect_accepts(*unk, {R"("anything")"}, {"1"});
  auto p = schema(R"({"type":"string","pattern":"^[a-z]+\\d{2}$"})");
  ASSERT_TRUE(p);
  expect_accepts(*p, {R"("abc12")"}, {R"("abc1")", R"("Abc12")", R"("abc123")"});
  auto q = schema(R"({"type":"string","pattern":"^a\"b\\\\$"})");  // a"b\ decoded
  ASSERT_TRUE(q);
  expect_accepts(*q, {R"("a\"b\\")"}, {R"("a"b\")"});
  auto search = schema(R"({"type":"string","pattern":"ab"})");  // unanchored: contains
  ASSERT_TRUE(search);
  expect_accepts(*search, {R"("ab")", R"("xxabyy")", "\"\xC3\xA9" "ab\""}, {R"("xxa")", R"("")"});
}

TEST(GrammarSchema, StringLengthCountsCharacters) {
  auto g = schema(R"({"type":"string","minLength":2,"maxLength":3})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {R"("ab")", R"("abc")", "\"\xC3\xA9" "1\"", R"("\n\"")"}, {R"("a")", R"("abcd")", R"("")"});
  auto u = schema(R"({"type":"string","minLength":3})");
  ASSERT_TRUE(u);
  expect_accepts(*u, {R"("abc")", R"("abcdefgh")"}, {R"("ab")"});
}

TEST(GrammarSchema, IntegerBoundsAreExact) {
  struct Case { const char* schema; long lo, hi; };
  for (Case c : {Case{R"({"type":"integer","minimum":10,"maximum":250})", 10, 250},
                 Case{R"({"type":"integer","minimum":-37,"maximum":5})", -37, 5},
                 Case{R"({"type":"integer","minimum":-300,"maximum":-99})", -300, -99},
                 Case{R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":100})", 1, 99},
                 Case{R"({"type":"integer","minimum":7})", 7, 1000000},
                 Case{R"({"type":"integer","maximum":-3})", -1000000, -3},
                 Case{R"({"type":"integer","minimum":0.5,"maximum":3.5})", 1, 3}}) {
    auto g = schema(c.schema);
    ASSERT_TRUE(g) << c.schema;
    for (long v = -400; v <= 400; ++v)
      EXPECT_EQ(g->matches(std::to_string(v)), v >= c.lo && v <= c.hi) << c.schema << " v=" << v;
    EXPECT_EQ(g->matches("123456"), 123456 >= c.lo && 123456 <= c.hi) << c.schema;
    EXPECT_FALSE(g->matches("07"));
    EXPECT_FALSE(g->matches("-0"));
    EXPECT_FALSE(g->matches("1.0"));
  }
}

TEST(GrammarSchema, NumberBoundsAreExact) {
  auto g = schema(R"({"type":"number","minimum":0,"maximum":1})");
  ASSERT_TRUE(g);
  expect_accepts(*g, {"0", "0.5", "1", "1.0", "1.000", "0.999"},
                 {"1.5", "-0.1", "1.01", "2", "-1", "1e0"});
  auto p = schema(R"({"type":"number","exclusiveMinimum":0})");
  ASSERT_TRUE(p);
  expect_accepts(*p, {"0.001", "3", "3.25", "1000000.5"}, {"0", "0.0", "-1", "-0.5"});
  auto n = schema(R"({"type":"number","minimum":-2.0,"exclusiveMaximum":-1})");
  ASSERT_TRUE(n);
  expect_accepts(*n, {"-2", "-1.5", "-1.0001", "-2.000"}, {"-1", "-1.0", "-2.5", "0", "-0.5"});
  auto bad = Grammar::from_json_schema(R"({"type":"number","minimum":0.25})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("#/minimum"), std::string::npos) << bad.message();
}

TEST(GrammarSchema, JsonObjectMode) {
  auto g = Grammar::json_object();
  ASSERT_TRUE(g.ok()) << g.message();
  expect_accepts(**g, {"{}", R"({"a":[1,{"b":null}],"c":"x"})", "{ \"k\" : [ ] }"},
                 {"[]", R"({"a"})", R"({"a":1,})", "1", R"({"a":tru})"});
}

TEST(GrammarSchema, ErrorsNameThePath) {
  struct Case { const char* schema; const char* needle; };
  for (Case c : {Case{R"({"type":"object","properties":{"a":{"type":"strin"}}})", "#/properties/a/type"},
                 Case{R"({"properties":{"a":{"$ref":"#/$defs/missing"}}})", "#/properties/a/$ref"},
                 Case{R"({"items":{"not":{}}})", "#/items/not"},
                 Case{R"({"type":"array","maxItems":100000})", "max_repeat=1024"},
                 Case{R"({"anyOf":[{"type":"integer"},{"type":"string","pattern":"(a"}]})", "#/anyOf/1/pattern"},
                 Case{R"({"type":"integer","minimum":5,"maximum":4})", "no integer fits"},
                 Case{R"({"type":"object",)", "not valid JSON"},
                 Case{R"(false)", "accepts nothing"}}) {
    auto g = Grammar::from_json_schema(c.schema);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_NE(g.message().find(c.needle), std::string::npos) << c.schema << " -> " << g.message();
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(GrammarSchema, HostileSchemasFailFast) {
  // 10k-deep nesting.
  std::string deep;
  for (int i = 0; i < 10000; ++i) deep += R"({"type":"array","items":)";
  deep += "{}";
  for (int i = 0; i < 10000; ++i) deep += "}";
  auto t0 = std::chrono::steady_clock::now();
  auto g = Grammar::from_json_schema(deep);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("max_schema_depth"), std::string::npos) << g.message();
  EXPECT_LT(ms_since(t0), 500.0);
  // Deep through properties, just past the limit (the JSON pre-scan lets it
  // through; the converter stops it).
  std::string props;
  for (int i = 0; i < 130; ++i) props += R"({"properties":{"a":)";
  props += "{}";
  for (int i = 0; i < 130; ++i) props += "}}";
  auto gp = Grammar::from_json_schema(props);
  ASSERT_FALSE(gp.ok());
  EXPECT_NE(gp.message().find("max_schema_depth=128"), std::string::npos) << gp.message();
  // Enum of 1e6 values.
  std::string big = R"({"enum":[)";
  for (int i = 0; i < 1000000; ++i) {
    if (i) big += ',';
    big += std::to_string(i);
  }
  big += "]}";
  t0 = std::chrono::steady_clock::now();
  auto e = Grammar::from_json_schema(big);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("#/enum: 1000000 values > max_enum_size=4096"), std::string::npos) << e.message();
  EXPECT_LT(ms_since(t0), 3000.0);
  // Many properties each with big arrays: the element limit, named.
  GrammarOptions small;
  small.max_elements = 5000;
  std::string wide = R"({"properties":{)";
  for (int i = 0; i < 200; ++i) {
    if (i) wide += ',';
    wide += "\"p";
    wide += std::to_string(i);
    wide += R"(":{"type":"array","maxItems":50})";
  }
  wide += "}}";
  auto w = Grammar::from_json_schema(wide, small);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.message().find("max_elements=5000"), std::string::npos) << w.message();
}

TEST(GrammarChoices, ExactlyOneOf) {
  auto g = Grammar::from_choices({"yes", "no", "maybe", "may"});
  ASSERT_TRUE(g.ok()) << g.message();
  expect_accepts(**g, {"yes", "no", "maybe", "may"}, {"", "ye", "mayb", "yesno", "maybee"});
  EXPECT_TRUE((*g)->matches_prefix("mayb"));
  std::vector<std::string> many(5000, "x");
  auto m = Grammar::from_choices(many);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("max_enum_size=4096"), std::string::npos);
  EXPECT_FALSE(Grammar::from_choices({}).ok());
}

TEST(GrammarBuilder, RejectsLeftRecursionAndUndefinedRules) {
  GrammarBuilder gb({});
  const uint32_t a = gb.new_rule("a");
  const uint32_t b = gb.new_rule("b");
  ASSERT_TRUE(gb.add_alt(a, {rule_elem(b), gb.byte('x')}).ok());
  ASSERT_TRUE(gb.add_alt(b, {}).ok());
  ASSERT_TRUE(gb.add_alt(b, {rule_elem(a)}).ok());  // a -> b -> a without a byte
  auto g = gb.finish(a);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("left recursion"), std::string::npos) << g.message();
  GrammarBuilder gb2({});
  const uint32_t r = gb2.new_rule("r");
  gb2.new_rule("empty");
  ASSERT_TRUE(gb2.add_alt(r, {gb2.byte('x')}).ok());
  auto g2 = gb2.finish(r);
  ASSERT_FALSE(g2.ok());
  EXPECT_NE(g2.message().find("'empty' has no alternatives"), std::string::npos) << g2.message();
}

}  // namespace
}  // namespace pagoda::grammar
