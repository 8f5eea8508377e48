// Token masks against a brute-force reference on real vocabularies, random
// generation that always ends in valid JSON, and copy == replay.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"
#include "tok/tok_test_util.h"

namespace pagoda::grammar {
namespace {

using json = nlohmann::json;

std::shared_ptr<const TokenIndex> index_of(const tok::Tokenizer* t) {
  auto ti = TokenIndex::from_tokenizer(*t);
  EXPECT_TRUE(ti.ok()) << ti.message();
  return ti.ok() ? *ti : nullptr;
}

// For every token: does appending its bytes keep the matcher alive? (EOG: only
// when the grammar can end.)
std::vector<uint32_t> brute_mask(const Matcher& m, const TokenIndex& ti) {
  std::vector<uint32_t> mask(ti.mask_words(), 0);
  for (int32_t t = 0; t < ti.vocab_size(); ++t) {
    bool ok;
    if (ti.is_eog(t)) ok = m.can_end();
    else ok = !ti.token_bytes(t).empty() && m.accepts_bytes(ti.token_bytes(t));
    if (ok) mask[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
  }
  return mask;
}

std::vector<int32_t> allowed(const std::vector<uint32_t>& mask, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t t = 0; t < n; ++t)
    if ((mask[static_cast<size_t>(t) >> 5] >> (t & 31)) & 1) out.push_back(t);
  return out;
}

// A bounded schema: every walk ends within a few hundred tokens.
const char* kBounded = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":6},
  "age":{"type":"integer","minimum":0,"maximum":120},
  "tags":{"type":"array","items":{"enum":["a","b","c d"]},"maxItems":3},
  "ok":{"type":"boolean"},
  "kind":{"anyOf":[{"const":"x"},{"type":"null"}]},
  "pos":{"type":"object","properties":{"x":{"type":"integer","minimum":-5,"maximum":5}},"required":["x"]}},
  "required":["name","age","pos"]})";

// Checks a document against kBounded by hand.
bool valid_bounded(const json& j, std::string* why) {
  auto fail = [&](const std::string& w) { *why = w; return false; };
  if (!j.is_object()) return fail("not an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::string("name age tags ok kind pos").find(it.key()) == std::string::npos) return fail("extra " + it.key());
  if (!j.contains("name") || !j["name"].is_string()) return fail("name");
  // maxLength counts characters (code points).
  size_t cps = 0;
  for (unsigned char c : j["name"].get<std::string>()) cps += (c & 0xC0) != 0x80;
  if (cps > 6) return fail("name too long");
  if (!j.contains("age") || !j["age"].is_number_integer() || j["age"] < 0 || j["age"] > 120) return fail("age");
  if (j.contains("tags")) {
    if (!j["tags"].is_array() || j["tags"].size() > 3) return fail("tags");
    for (auto& t : j["tags"])
      if (t != "a" && t != "b" && t != "c d") return fail("tag");
  }
  if (j.contains("ok") && !j["ok"].is_boolean()) return fail("ok");
  if (j.contains("kind") && !(j["kind"].is_null() || j["kind"] == "x")) return fail("kind");
  if (!j.contains("pos") || !j["pos"].is_object() || j["pos"].size() != 1 || !j["pos"]["x"].is_number_integer() ||
      j["pos"]["x"] < -5 || j["pos"]["x"] > 5)
    return fail("pos");
  return true;
}

struct Walk {
  std::vector<int32_t> tokens;
  std::string text;
  bool finished = false;
};

// Random walk over allowed tokens; every step's mask is compared with the brute
// force (when check), a copy taken at a random step must follow identically and
// a replay of the history must give the same mask.
Walk random_walk(const std::shared_ptr<const CompiledGrammar>& cg, uint32_t seed, int max_steps, bool check) {
  const TokenIndex& ti = cg->index();
  std::mt19937 rng(seed);
  Matcher m(cg);
  Walk w;
  std::vector<uint32_t> mask(m.mask_words());
  const int fork_at = static_cast<int>(rng() % 8);
  std::optional<Matcher> fork;
  for (int step = 0; step < max_steps; ++step) {
    if (step == fork_at) fork = m;  // n>1: a copy of the live value
    m.fill_mask(mask);
    if (check) {
      EXPECT_EQ(mask, brute_mask(m, ti)) << "seed " << seed << " step " << step << " text so far: " << w.text;
      if (::testing::Test::HasFailure()) return w;
    }
    auto ok = allowed(mask, ti.vocab_size());
    if (ok.empty()) {
      ADD_FAILURE() << "dead end: no token allowed after " << w.text;
      return w;
    }
    int32_t t;
    // End as soon as allowed, half the time; else any allowed non-end token.
    std::vector<int32_t> non_end;
    for (int32_t x : ok)
      if (!ti.is_eog(x)) non_end.push_back(x);
    if (m.can_end() && (non_end.empty() || rng() % 2 == 0)) t = ti.eog_ids().front();
    else t = non_end[rng() % non_end.size()];
    EXPECT_TRUE(m.accept(t));
    if (fork) {
      std::vector<uint32_t> fm(m.mask_words());
      EXPECT_TRUE(fork->accept(t));
      fork->fill_mask(fm);
      std::vector<uint32_t> mm(m.mask_words());
      m.fill_mask(mm);
      EXPECT_EQ(fm, mm) << "fork diverged at step " << step;
    }
    w.tokens.push_back(t);
    if (ti.is_eog(t)) {
      w.finished = true;
      break;
    }
    w.text += ti.token_bytes(t);
  }
  // Replay (preemption / prefix-cache hit) lands on the same state.
  Matcher r(cg);
  EXPECT_TRUE(r.replay(w.tokens));
  EXPECT_EQ(r.stacks(), m.stacks());
  EXPECT_EQ(r.is_finished(), m.is_finished());
  return w;
}

void masks_match_brute_force(const tok::Tokenizer* tk, int walks, int steps) {
  auto ti = index_of(tk);
  ASSERT_TRUE(ti);
  std::vector<std::shared_ptr<const Grammar>> grammars;
  for (const char* s : {kBounded, R"({"type":"array","items":{"type":"number"}})",
                        R"({"properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
                        R"({"type":"string","pattern":"^[a-z]{2,}( [a-z]+)*\\.$"})"}) {
    auto g = Grammar::from_json_schema(s);
    ASSERT_TRUE(g.ok()) << g.message();
    grammars.push_back(*g);
  }
  auto jo = Grammar::json_object();
  ASSERT_TRUE(jo.ok());
  grammars.push_back(*jo);
  auto ch = Grammar::from_choices({"Paris", "London", "Lo", "New York"});
  ASSERT_TRUE(ch.ok());
  grammars.push_back(*ch);
  for (size_t gi = 0; gi < grammars.size(); ++gi) {
    auto cg = std::make_shared<const CompiledGrammar>(grammars[gi], ti);
    for (int w = 0; w < walks; ++w) {
      random_walk(cg, static_cast<uint32_t>(1000 * gi + w), steps, true);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(GrammarMask, MatchesBruteForceStories260K) {
  std::string why;
  const tok::Tokenizer* t = tok::testing::stories(&why);
  ASSERT_NE(t, nullptr) << why;
  masks_match_brute_force(t, 6, 60);
}

TEST(GrammarMask, MatchesBruteForceSmolLM2) {
  std::string why;
  const tok::Tokenizer* t = tok::testing::smollm2(&why);
  if (t == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why;
  masks_match_brute_force(t, 2, 12);
}

void generation_is_valid(const tok::Tokenizer* tk, int walks) {
  auto ti = index_of(tk);
  ASSERT_TRUE(ti);
  auto g = Grammar::from_json_schema(kBounded);
  ASSERT_TRUE(g.ok()) << g.message();
  auto cg = std::make_shared<const CompiledGrammar>(*g, ti);
  int finished = 0;
  for (int w = 0; w < walks; ++w) {
    Walk walk = random_walk(cg, static_cast<uint32_t>(77 + w), 600, false);
    if (::testing::Test::HasFailure()) return;
    ASSERT_TRUE(walk.finished) << "did not end within 600 tokens: " << walk.text;
    ++finished;
    if (std::getenv("GRAMMAR_TEST_VERBOSE")) std::printf("walk %d (%zu tokens): %s\n", w, walk.tokens.size(), walk.text.c_str());
    json j = json::parse(walk.text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << walk.text;
    std::string why;
    EXPECT_TRUE(valid_bounded(j, &why)) << why << ": " << walk.text;
  }
  EXPECT_EQ(finished, walks);
}

TEST(GrammarMask, RandomGenerationIsValidJsonStories260K) {
  std::string why;
  const tok::Tokenizer* t = tok::testing::stories(&why);
  ASSERT_NE(t, nullptr) << why;
  generation_is_valid(t, 40);
}

TEST(GrammarMask, RandomGenerationIsValidJsonSmolLM2) {
  std::string why;
  const tok::Tokenizer* t = tok::testing::smollm2(&why);
  if (t == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why;
  generation_is_valid(t, 10);
}

TEST(GrammarMask, HandBuiltVocabularyExactMasks) {
  // ids: 0 "{", 1 "}", 2 "\"", 3 "{\"", 4 "\"}", 5 "a", 6 "ab\"", 7 "" (control), 8 EOS, 9 " "
  auto ti = TokenIndex::create({"{", "}", "\"", "{\"", "\"}", "a", "ab\"", "", "", " "}, {8});
  ASSERT_TRUE(ti.ok()) << ti.message();
  auto g = Grammar::from_json_schema(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})");
  ASSERT_TRUE(g.ok()) << g.message();
  auto cg = std::make_shared<const CompiledGrammar>(*g, *ti);
  Matcher m(cg);
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
  EXPECT_EQ(allowed(mask, 10), (std::vector<int32_t>{0, 3}));
  ASSERT_TRUE(m.accept(3));  // {"
  m.fill_mask(mask);
  EXPECT_EQ(allowed(mask, 10), (std::vector<int32_t>{5}));
  EXPECT_FALSE(m.accept(6));  // ab" : the key is "a"
  EXPECT_FALSE(m.accept(7));  // control token: never
  EXPECT_FALSE(m.accept(8));  // EOS before the end
  ASSERT_TRUE(m.accept_bytes("a\":"));
  m.fill_mask(mask);
  EXPECT_EQ(allowed(mask, 10), (std::vector<int32_t>{2, 4, 9}));  // "} is the empty string's start
  ASSERT_TRUE(m.accept(2));
  m.fill_mask(mask);
  EXPECT_EQ(allowed(mask, 10), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 9}));  // inside a string
  ASSERT_TRUE(m.accept(4));  // "}
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.is_finished());  // the root is the value alone: only the end remains
  m.fill_mask(mask);
  EXPECT_EQ(allowed(mask, 10), (std::vector<int32_t>{8}));
  ASSERT_TRUE(m.accept(8));
  EXPECT_TRUE(m.is_finished());
  m.fill_mask(mask);
  EXPECT_TRUE(allowed(mask, 10).empty());
}

}  // namespace
}  // namespace pagoda::grammar

namespace pagoda::grammar {
namespace {

TEST(GrammarMask, ThreadsShareOneCompiledGrammar) {
  std::string why;
  const tok::Tokenizer* tk = tok::testing::stories(&why);
  ASSERT_NE(tk, nullptr) << why;
  auto ti = index_of(tk);
  ASSERT_TRUE(ti);
  auto g = Grammar::from_json_schema(kBounded);
  ASSERT_TRUE(g.ok()) << g.message();
  // Reference: one walk on a private CompiledGrammar, all masks recorded.
  auto ref_cg = std::make_shared<const CompiledGrammar>(*g, ti);
  Walk walk = random_walk(ref_cg, 5, 600, false);
  ASSERT_TRUE(walk.finished);
  std::vector<std::vector<uint32_t>> ref;
  {
    Matcher m(ref_cg);
    for (int32_t t : walk.tokens) {
      ref.emplace_back(m.mask_words());
      m.fill_mask(ref.back());
      ASSERT_TRUE(m.accept(t));
    }
  }
  // Four threads replay it in lockstep-ish over one fresh shared CompiledGrammar,
  // so they meet each new context at about the same time.
  auto cg = std::make_shared<const CompiledGrammar>(*g, ti);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      Matcher m(cg);
      std::vector<uint32_t> mask(m.mask_words());
      for (size_t i = 0; i < walk.tokens.size(); ++i) {
        m.fill_mask(mask);
        if (mask != ref[i]) ++mismatches[static_cast<size_t>(k)];
        if (!m.accept(walk.tokens[i])) ++mismatches[static_cast<size_t>(k)];
      }
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
  EXPECT_EQ(cg->stats().contexts, ref_cg->stats().contexts);
}

}  // namespace
}  // namespace pagoda::grammar
