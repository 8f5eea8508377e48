// GBNF (vLLM's guided_grammar, llama.cpp's format) -> grammar: syntax, Unicode
// classes, repetitions, and the errors a bad grammar gets.
#include <gtest/gtest.h>

#include <string>

#include "grammar/grammar.h"

namespace pagoda::grammar {
namespace {

std::shared_ptr<const Grammar> gbnf(const std::string& src, const GrammarOptions& o = {}) {
  auto g = Grammar::from_gbnf(src, o);
  EXPECT_TRUE(g.ok()) << src << " -> " << (g.ok() ? "" : g.message());
  return g.ok() ? *g : nullptr;
}

void check(const std::string& src, std::initializer_list<std::string> yes, std::initializer_list<std::string> no) {
  auto g = gbnf(src);
  ASSERT_TRUE(g) << src;
  for (const auto& s : yes) EXPECT_TRUE(g->matches(s)) << src << " should match '" << s << "'";
  for (const auto& s : no) EXPECT_FALSE(g->matches(s)) << src << " should not match '" << s << "'";
}

std::string error_of(const std::string& src, const GrammarOptions& o = {}) {
  auto g = Grammar::from_gbnf(src, o);
  EXPECT_FALSE(g.ok()) << src << " was accepted";
  return g.ok() ? "" : g.message();
}

TEST(Gbnf, LiteralsAlternativesAndRules) {
  check(R"(root ::= "yes" | "no")", {"yes", "no"}, {"", "yesno", "y", "Yes"});
  check("root ::= greeting \" \" name\ngreeting ::= \"hi\" | \"hello\"\nname ::= \"bob\"  # a comment\n",
        {"hi bob", "hello bob"}, {"hibob", "hello  bob"});
  // Forward references, comments and blank lines between rules; '|' and '::=' may end a line.
  check("# leading comment\n\nroot ::=\n  a |\n  b\n\na ::= \"A\"\nb ::= \"B\"\n", {"A", "B"}, {"AB", ""});
  check(R"(root ::= "")", {""}, {"a"});
}

TEST(Gbnf, ClassesAndEscapes) {
  check(R"(root ::= [a-c0-9_]+)", {"a", "abc09_", "_"}, {"", "d", "A"});
  check(R"(root ::= [^"\\]*)", {"", "abc", "\xC3\xA9\xE2\x82\xAC"}, {"\"", "a\\b"});
  check(R"(root ::= "\x41\u00e9\n\t\"\\")", {"A\xC3\xA9\n\t\"\\"}, {"A"});
  check(R"(root ::= [\u00e0-\u00ff])", {"\xC3\xA0", "\xC3\xBF"}, {"a", "\xC3\x9F", "\xC4\x80"});
  // A range across UTF-8 lengths, and the whole plane range.
  check(R"(root ::= [\x7e-\u0801])", {"~", "\x7f", "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xE0\xA0\x81"},
        {"}", "\xE0\xA0\x82"});
  check(R"(root ::= [\U0001F600-\U0001F64F])", {"\xF0\x9F\x98\x80", "\xF0\x9F\x99\x8F"}, {"\xF0\x9F\x99\x90"});
  // '.' is any character (as valid UTF-8), one at a time.
  check("root ::= . .", {"ab", "a\xE2\x82\xAC", "\n\n"}, {"a", "abc", "\xFF\xFF", "\xED\xA0\x80"});
  check(R"(root ::= [\[\]\-])", {"[", "]", "-"}, {"\\"});
}

TEST(Gbnf, GroupsAndRepetitions) {
  check(R"(root ::= ("ab" | "c")* "!")", {"!", "ab!", "cabc!"}, {"", "a!", "abab"});
  check(R"(root ::= "x"+ "y"?)", {"x", "xxy"}, {"", "y", "xyy"});
  check(R"(root ::= [0-9]{3})", {"123"}, {"12", "1234"});
  check(R"(root ::= [0-9]{2,})", {"12", "12345"}, {"1"});
  check(R"(root ::= [0-9]{1,3} ("." [0-9]{0,2})?)", {"1", "123", "1.", "1.5", "12.34"}, {"", "1234", "1.234"});
  check("root ::= (\n  \"a\"\n  | \"b\"\n)+", {"a", "abba"}, {""});
  // A JSON-like list, recursive through a non-left position.
  check("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list\n",
        {"[]", "[1,2]", "[[1],[]]"}, {"[", "[1,]", "[,]"});
  auto g = gbnf(R"(root ::= "a"{2} "b")");
  ASSERT_TRUE(g);
  EXPECT_TRUE(g->matches_prefix("a"));
  EXPECT_TRUE(g->matches_prefix("aa"));
  EXPECT_FALSE(g->matches_prefix("ab"));
}

TEST(Gbnf, ErrorsNameTheProblem) {
  EXPECT_NE(error_of("").find("no rules"), std::string::npos);
  EXPECT_NE(error_of(R"(item ::= "a")").find("'root'"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= missing)").find("'missing'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("twice"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= "abc)").find("unterminated"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= [abc)").find("unterminated"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= ("a")").find("')'"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= [z-a])").find("reversed"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= "\q")").find("escape"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= "\uD800")").find("scalar"), std::string::npos);
  EXPECT_NE(error_of("root = \"a\"").find("::="), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nitem ::= \"b\" )").find("line 2"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= "a"{2000})").find("max_repeat"), std::string::npos);
  EXPECT_NE(error_of(R"(root ::= "a"{3,1})").find("n < m"), std::string::npos);
  // Left recursion would not terminate in the matcher: refused.
  EXPECT_FALSE(Grammar::from_gbnf("root ::= root \"a\" | \"a\"").ok());
  // Limits of the builder hold: a grammar over max_rules is refused.
  GrammarOptions small;
  small.max_rules = 8;
  EXPECT_FALSE(Grammar::from_gbnf(R"(root ::= "a"? "b"? "c"? "d"? "e"? "f"? "g"? "h"? "i"?)", small).ok());
}

}  // namespace
}  // namespace pagoda::grammar
