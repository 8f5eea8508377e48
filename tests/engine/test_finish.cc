// The one place a token's finish reason is decided (engine/finish.h, issue 34):
// each cause on exact token ids over a byte vocabulary (token id = byte value),
// the order between causes on one token, and through the engine the reason the
// scheduler ends a request with (forced tokens choose the exact ids).
#include <gtest/gtest.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "engine/finish.h"
#include "engine_test_util.h"
#include "tok/tokenizer.h"
#include "tok/unicode.h"

namespace pagoda::enginetest {
namespace {

constexpr int32_t kEos = 256;   // a control token, the vocabulary's eos (end of generation)
constexpr int32_t kCtl = 257;   // a control token that is not end of generation
constexpr int32_t kNoContext = 0;

// A byte-level vocabulary without merges: the text "ab" is tokens {97, 98}.
const tok::Tokenizer& bytes() {
  static const std::unique_ptr<tok::Tokenizer> t = [] {
    tok::Vocab v;
    v.kind = tok::VocabKind::kBpe;
    v.model = "gpt2";
    v.pre = "gpt2";
    for (int b = 0; b < 256; ++b) {
      v.tokens.push_back(tok::byte_to_unicode(static_cast<uint8_t>(b)));
      v.types.push_back(tok::TokenType::kNormal);
    }
    v.tokens.push_back("<eos>");
    v.types.push_back(tok::TokenType::kControl);
    v.tokens.push_back("<ctl>");
    v.types.push_back(tok::TokenType::kControl);
    v.eos_id = kEos;
    auto r = tok::Tokenizer::create(std::move(v));
    if (!r.ok()) std::abort();
    return std::move(r).value();
  }();
  return *t;
}

std::vector<int32_t> ids(const std::string& text) { return {text.begin(), text.end()}; }

// Feeds tokens until one ends the choice (or all are fed). Records each token's
// reason and text.
struct Fed {
  std::vector<FinishReason> reasons;
  std::vector<std::string> texts;
  std::string flushed;
  FinishReason last() const { return reasons.empty() ? FinishReason::kNone : reasons.back(); }
  std::string text() const {
    std::string s;
    for (const auto& t : texts) s += t;
    return s + flushed;
  }
};
Fed feed(const sample::SamplingParams& sp, const std::vector<int32_t>& tokens, int32_t num_prompt = 4,
         int32_t context_length = kNoContext, int grammar_done_at = INT_MAX) {
  engine::FinishRule rule(sp, bytes(), num_prompt, context_length);
  Fed r;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string text;
    const int32_t n = static_cast<int32_t>(i) + 1;
    r.reasons.push_back(rule.accept(tokens[i], n, n >= grammar_done_at, &text));
    r.texts.push_back(text);
    if (r.reasons.back() != FinishReason::kNone) break;
  }
  r.flushed = rule.flush();
  return r;
}

sample::SamplingParams params(int32_t max_tokens) {
  sample::SamplingParams sp;
  sp.max_tokens = max_tokens;
  return sp;
}

using R = FinishReason;
using Reasons = std::vector<FinishReason>;
using Texts = std::vector<std::string>;

TEST(FinishRule, EndOfGenerationStopsUnlessIgnoredAndShowsNoText) {
  ASSERT_EQ(bytes().eog_ids(), std::vector<int32_t>{kEos});
  Fed r = feed(params(100), {'h', 'i', kEos, 'x'});
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kStop}));
  EXPECT_EQ(r.texts, (Texts{"h", "i", ""}));
  EXPECT_EQ(r.text(), "hi");
  EXPECT_STREQ(finish_reason_name(R::kStop), "stop");
  EXPECT_STREQ(finish_reason_name(R::kLength), "length");
  // A control token that is not end of generation goes on (with no text).
  r = feed(params(100), {'h', kCtl, 'i'});
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kNone}));
  EXPECT_EQ(r.text(), "hi");
  sample::SamplingParams sp = params(100);
  sp.ignore_eos = true;
  r = feed(sp, {'h', kEos, 'i'});
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kNone}));
  EXPECT_EQ(r.text(), "hi");
}

TEST(FinishRule, StopTokenIdsStopEvenWithIgnoreEos) {
  sample::SamplingParams sp = params(100);
  sp.stop_token_ids = {'!', kCtl};
  sp.ignore_eos = true;
  Fed r = feed(sp, ids("ok!more"));
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kStop}));
  EXPECT_EQ(r.text(), "ok");  // the stop token's own text is not shown
  r = feed(sp, {'a', kCtl});
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kStop}));
  EXPECT_EQ(r.text(), "a");
}

TEST(FinishRule, StopStringAcrossTokensStopsOnTheTokenThatCompletesIt) {
  sample::SamplingParams sp = params(100);
  sp.stop = {"lo W"};
  // "lo W" is spelled by tokens 3..6; the text that could still begin it is held back.
  const Fed r = feed(sp, ids("Hello World"));
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kNone, R::kNone, R::kNone, R::kNone, R::kStop}));
  EXPECT_EQ(r.texts, (Texts{"H", "e", "", "l", "", "", ""}));
  EXPECT_EQ(r.flushed, "");
  EXPECT_EQ(r.text(), "Hel");
  // A false alarm is released by the next token, and the held tail at the end by flush.
  const Fed f = feed(sp, ids("lo Xlo"));
  EXPECT_EQ(f.reasons, Reasons(6, R::kNone));
  EXPECT_EQ(f.texts, (Texts{"", "", "", "lo X", "", ""}));
  EXPECT_EQ(f.flushed, "lo");
}

TEST(FinishRule, GrammarDoneStopsAfterShowingTheTokenText) {
  const Fed r = feed(params(100), ids("{}x"), 4, kNoContext, /*grammar_done_at=*/2);
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kStop}));
  EXPECT_EQ(r.text(), "{}");
}

TEST(FinishRule, LengthAtMaxTokensOrAFullContext) {
  Fed r = feed(params(3), ids("abcdef"));
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kLength}));
  EXPECT_EQ(r.text(), "abc");
  // The context: 4 prompt tokens + 2 outputs fill 6, before max_tokens.
  r = feed(params(100), ids("abcdef"), 4, /*context_length=*/6);
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kLength}));
  // No limit at all: never length.
  r = feed(params(0), std::vector<int32_t>(1000, 'a'));
  EXPECT_EQ(r.reasons, Reasons(1000, R::kNone));
  // Length with a partial stop string held back: flush shows it.
  sample::SamplingParams sp = params(3);
  sp.stop = {"xyz"};
  r = feed(sp, ids("abxy"));
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kLength}));
  EXPECT_EQ(r.texts, (Texts{"a", "b", ""}));
  EXPECT_EQ(r.flushed, "x");
}

// The max_tokens-th token also stops (each way): stop wins, as before issue 34.
TEST(FinishRule, StopOnTheLastAllowedTokenWinsOverLength) {
  EXPECT_EQ(feed(params(3), {'a', 'b', kEos}).reasons, (Reasons{R::kNone, R::kNone, R::kStop}));
  sample::SamplingParams sp = params(3);
  sp.stop_token_ids = {'c'};
  EXPECT_EQ(feed(sp, ids("abc")).reasons, (Reasons{R::kNone, R::kNone, R::kStop}));
  sp = params(3);
  sp.stop = {"bc"};
  const Fed r = feed(sp, ids("abc"));
  EXPECT_EQ(r.reasons, (Reasons{R::kNone, R::kNone, R::kStop}));
  EXPECT_EQ(r.text(), "a");
  EXPECT_EQ(feed(params(3), ids("abc"), 4, kNoContext, 3).reasons, (Reasons{R::kNone, R::kNone, R::kStop}));
  // A full context too.
  EXPECT_EQ(feed(params(100), {'a', kEos}, 4, 6).reasons, (Reasons{R::kNone, R::kStop}));
}

// Through the engine: the reason decided for a token is the one the request
// ends with. Forced tokens place the end-of-generation token (stories260K's
// eos) at exactly the max_tokens-th output.
TEST(EngineFinish, ReasonOfTheLastTokenEndsTheRequest) {
  const Reference ref = load_references().at(0);
  auto e = stories_engine();
  ASSERT_TRUE(e);
  const tok::Tokenizer& tk = e->tokenizer();
  ASSERT_FALSE(tk.eog_ids().empty());
  const int32_t eos = tk.eog_ids().front();
  const int k = 6;
  ASSERT_GE(ref.generated_tokens.size(), static_cast<size_t>(k));
  std::vector<int32_t> forced(ref.generated_tokens.begin(), ref.generated_tokens.begin() + (k - 1));
  for (int32_t t : forced) ASSERT_FALSE(tk.is_eog(t));
  forced.push_back(eos);
  const std::string body = tk.decode(std::vector<int32_t>(forced.begin(), forced.end() - 1),
                                     {.render_special = false, .strip_leading_space = false});
  auto run = [&](int max_tokens, bool ignore_eos) {
    RequestParams p = greedy(ref.prompt_tokens, max_tokens, ignore_eos);
    p.forced_tokens = forced;
    return run_alone(e.get(), p);
  };
  // eos on the last allowed token: stop (not length), its text not shown.
  ChoiceResult r = run(k, false);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.tokens, forced);
  EXPECT_EQ(r.text, body);
  // eos before max_tokens: stop on it.
  r = run(k + 3, false);
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.tokens, forced);
  // One short: length, on token k - 1.
  r = run(k - 1, false);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(forced.begin(), forced.end() - 1));
  EXPECT_EQ(r.text, body);
  // ignore_eos: eos is an ordinary token; length at max_tokens.
  r = run(k, true);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.tokens, forced);
  EXPECT_EQ(e->stats().blocks_used, 0);
}

}  // namespace
}  // namespace pagoda::enginetest
