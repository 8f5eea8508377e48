// Regex -> DFA -> grammar: features, anchors, UTF-8, and hostile patterns.
#include <gtest/gtest.h>

#include <chrono>

#include "grammar/grammar.h"
#include "grammar/regex.h"

namespace pagoda::grammar {
namespace {

std::shared_ptr<const Grammar> re(const char* r, const GrammarOptions& o = {}) {
  auto g = Grammar::from_regex(r, o);
  EXPECT_TRUE(g.ok()) << r << " -> " << (g.ok() ? "" : g.message());
  return g.ok() ? *g : nullptr;
}

void check(const char* r, std::initializer_list<const char*> yes, std::initializer_list<const char*> no) {
  auto g = re(r);
  ASSERT_TRUE(g) << r;
  for (const char* s : yes) EXPECT_TRUE(g->matches(s)) << r << " should match " << s;
  for (const char* s : no) EXPECT_FALSE(g->matches(s)) << r << " should not match " << s;
}

TEST(GrammarRegex, Features) {
  check("abc", {"abc"}, {"ab", "abcd", ""});
  check("^a|b$", {"a", "b"}, {"ab", ""});
  check("a*b+c?", {"b", "aabbc", "bbb"}, {"", "ac", "abcc"});
  check("(ab|cd){2,3}", {"abab", "abcdab"}, {"ab", "abababab"});
  check("x{3}", {"xxx"}, {"xx", "xxxx"});
  check("x{2,}", {"xx", "xxxxx"}, {"x"});
  check("[a-c_]+[^a-z]", {"abc_X", "a1", "a\xC3\xA9"}, {"abc", "ad!"});
  check(R"(\d\w\s\D)", {"1a x", "9_\tZ"}, {"aa x", "1a 1"});
  check(R"(\.\*\\\x41\u00e9)", {".*\\A\xC3\xA9"}, {"a*\\A\xC3\xA9"});
  check("a.c", {"abc", "a\xE2\x82\xAC" "c"}, {"a\nc", "ac"});
  check("(?:ab)?(?<n>c)[\xC3\xA9x]", {"abcx", "c\xC3\xA9"}, {"abc"});
  check("a+?b*?", {"a", "aab"}, {"b"});
  check("a{,2}", {"a{,2}"}, {"aa"});  // not a quantifier: literal braces
  check("", {""}, {"a"});
}

TEST(GrammarRegex, UnsupportedIsAClearError) {
  for (const char* r : {"(a)\\1", "(?=a)", "\\bword", "a++", "[\\x{100}-\\x{200}]", "[\xC3\xA9-\xC3\xBF]", "(a",
                        "a)", "*a", "[a", "a{3,2}", "a^b", "[]"}) {
    auto g = Grammar::from_regex(r);
    ASSERT_FALSE(g.ok()) << r;
    EXPECT_EQ(g.message().rfind("regex: ", 0), 0u) << r << " -> " << g.message();
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

TEST(GrammarRegex, HostilePatternsFailFastOrStaySmall) {
  auto t0 = std::chrono::steady_clock::now();
  // Nested stars: catastrophic for backtracking engines, a 2-state DFA here.
  check("(a*)*b", {"b", "aaab"}, {"aa", ""});
  check("(a|a)*(a|aa)*c", {"aaaac", "c"}, {"aab"});
  EXPECT_LT(ms_since(t0), 500.0);
  // The n-th-from-last-symbol language needs 2^n DFA states: refused by the limit.
  t0 = std::chrono::steady_clock::now();
  auto g = Grammar::from_regex("(a|b)*a(a|b){20}");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("max_regex_states=4096"), std::string::npos) << g.message();
  EXPECT_LT(ms_since(t0), 3000.0);
  auto rep = Grammar::from_regex("a{5000}");
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.message().find("max_repeat=1024"), std::string::npos) << rep.message();
  auto nest = Grammar::from_regex("((a{1000}){1000}){1000}");
  ASSERT_FALSE(nest.ok());
  EXPECT_NE(nest.message().find("max_regex_states"), std::string::npos) << nest.message();
  std::string longre(5000, 'a');
  auto lg = Grammar::from_regex(longre);
  ASSERT_FALSE(lg.ok());
  EXPECT_NE(lg.message().find("max_regex_length=4096"), std::string::npos) << lg.message();
  std::string deep(300, '(');
  deep += "a";
  deep += std::string(300, ')');
  auto dp = Grammar::from_regex(deep);
  ASSERT_FALSE(dp.ok());
  EXPECT_NE(dp.message().find("deeper than 256"), std::string::npos) << dp.message();
}

TEST(GrammarRegex, DfaIsMinimalEnoughForClassicPatterns) {
  auto d = compile_regex("[0-9]+(\\.[0-9]+)?", {}, false);
  ASSERT_TRUE(d.ok()) << d.message();
  EXPECT_LE(d->next.size(), 5u);  // start, int, dot, frac (+ at most one duplicate)
}

}  // namespace
}  // namespace pagoda::grammar
