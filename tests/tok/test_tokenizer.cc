#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tok/pretokenize.h"
#include "tok/tok_test_util.h"
#include "tok/tokenizer.h"
#include "tok/unicode.h"

using namespace pagoda;
using namespace pagoda::tok;
using pagoda::tok::testing::read_file;

namespace {

const Tokenizer& stories_or_die() {
  std::string why;
  const Tokenizer* t = pagoda::tok::testing::stories(&why);
  if (t == nullptr) {
    ADD_FAILURE() << "stories260K tokenizer: " << why;
    std::abort();
  }
  return *t;
}

#define SMOLLM2_OR_SKIP(var)                                             \
  std::string why_##var;                                                 \
  const Tokenizer* var = pagoda::tok::testing::smollm2(&why_##var);      \
  if (var == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why_##var

std::vector<std::string> split_words(const PreTokenizer& p, std::string_view s) {
  std::vector<std::string_view> w;
  p.split(s, &w);
  return std::vector<std::string>(w.begin(), w.end());
}

struct Reference {
  std::string prompt;
  std::vector<TokenId> prompt_tokens;
  std::vector<TokenId> generated_tokens;
  std::string text;
};

std::vector<Reference> stories_reference() {
  std::vector<Reference> out;
  std::istringstream in(read_file(PAGODA_TEST_DATA "/stories260K.reference.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    out.push_back({j["prompt"], j["prompt_tokens"], j["generated_tokens"], j["text"]});
  }
  return out;
}

}  // namespace

// ---- UTF-8 helpers -------------------------------------------------------------

TEST(TokUnicode, ValidLengthRejectsOverlongsSurrogatesAndTruncation) {
  EXPECT_EQ(utf8_valid_len("a", 0), 1u);
  EXPECT_EQ(utf8_valid_len("\xC3\xA9", 0), 2u);
  EXPECT_EQ(utf8_valid_len("\xE2\x96\x81", 0), 3u);
  EXPECT_EQ(utf8_valid_len("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(utf8_valid_len("\xC0\x80", 0), 0u);          // overlong NUL
  EXPECT_EQ(utf8_valid_len("\xE0\x80\x80", 0), 0u);      // overlong
  EXPECT_EQ(utf8_valid_len("\xED\xA0\x80", 0), 0u);      // surrogate D800
  EXPECT_EQ(utf8_valid_len("\xF4\x90\x80\x80", 0), 0u);  // > U+10FFFF
  EXPECT_EQ(utf8_valid_len("\xF0\x9F\x98", 0), 0u);      // truncated
  EXPECT_EQ(utf8_valid_len("\x80", 0), 0u);
}

TEST(TokUnicode, IncompleteTailCountsOnlyValidPrefixes) {
  EXPECT_EQ(utf8_incomplete_tail("ab"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98\x80"), 0u);  // complete
  EXPECT_EQ(utf8_incomplete_tail("a\xE0\x80"), 0u);          // can never be valid
  EXPECT_EQ(utf8_incomplete_tail("\xFF"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("\x80\x80"), 0u);
}

TEST(TokUnicode, ByteMapIsABijectionOntoPrintableCodePoints) {
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(byte_to_unicode('A'), "A");
  for (int b = 0; b < 256; ++b) {
    const std::string& u = byte_to_unicode(static_cast<uint8_t>(b));
    const size_t len = utf8_valid_len(u, 0);
    ASSERT_EQ(len, u.size()) << b;
    EXPECT_EQ(unicode_to_byte(utf8_decode(u, 0, len)), b);
  }
}

// ---- Pre-tokenizer ---------------------------------------------------------------

TEST(TokPreTokenizer, Gpt2SplitsWordsContractionsAndWhitespaceRuns) {
  auto p = PreTokenizer::for_name("gpt2");
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(split_words(*p, "Hello world's  end\n\n  \tx 12345!?"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " end", "\n\n  ", "\t", "x",
                                      " 12345", "!?"}));
}

TEST(TokPreTokenizer, SmollmIsolatesEveryDigit) {
  auto p = PreTokenizer::for_name("smollm");
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(split_words(*p, "ab 123x"),
            (std::vector<std::string>{"ab", " ", "1", "2", "3", "x"}));
}

TEST(TokPreTokenizer, Llama3GroupsDigitsByThreeAndNewlines) {
  auto p = PreTokenizer::for_name("llama-bpe");
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(split_words(*p, "I'M 1234567 ok\n\nnext"),
            (std::vector<std::string>{"I", "'M", " ", "123", "456", "7", " ok", "\n\n", "next"}));
}

TEST(TokPreTokenizer, InvalidUtf8BytesBecomeTheirOwnWords) {
  auto p = PreTokenizer::for_name("gpt2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(split_words(*p, "ab\xFF" "cd\xC3"),
            (std::vector<std::string>{"ab", "\xFF", "cd", "\xC3"}));
}

TEST(TokPreTokenizer, UnknownNameIsAnError) {
  auto p = PreTokenizer::for_name("no-such-pre");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.message().find("no-such-pre"), std::string::npos);
}

// ---- stories260K: SentencePiece-style -----------------------------------------

TEST(TokStories, VocabularyFromGguf) {
  const Tokenizer& t = stories_or_die();
  EXPECT_EQ(t.kind(), VocabKind::kSpm);
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.pad_id(), kNoToken);  // stored as 0xFFFFFFFF
  EXPECT_TRUE(t.add_bos());
  EXPECT_FALSE(t.add_eos());
  EXPECT_TRUE(t.adds_space_prefix());
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(1));
  EXPECT_EQ(t.token_type(1), TokenType::kControl);
  EXPECT_EQ(t.token_to_piece(1), "");
  EXPECT_EQ(t.token_to_piece(1, /*render_special=*/true), "<s>");
  EXPECT_EQ(t.token_to_piece(3 + 'A'), "A");  // byte token <0x41>
  EXPECT_EQ(t.token_to_piece(265), " the");   // "▁the"
}

TEST(TokStories, ReproducesReferencePromptTokens) {
  const Tokenizer& t = stories_or_die();
  const auto refs = stories_reference();
  ASSERT_EQ(refs.size(), 3u);
  for (const Reference& r : refs) {
    EXPECT_EQ(t.encode(r.prompt, /*add_special=*/true, /*parse_special=*/false), r.prompt_tokens)
        << r.prompt;
  }
}

TEST(TokStories, DecodingPromptAndGeneratedGivesPromptPlusText) {
  const Tokenizer& t = stories_or_die();
  for (const Reference& r : stories_reference()) {
    std::vector<TokenId> all = r.prompt_tokens;
    all.insert(all.end(), r.generated_tokens.begin(), r.generated_tokens.end());
    EXPECT_EQ(t.decode(all), r.prompt + r.text);
    EXPECT_EQ(t.decode(r.prompt_tokens), r.prompt);
    // A continuation keeps its first space (llama.cpp prints pieces as they come).
    DecodeOptions cont;
    cont.strip_leading_space = false;
    EXPECT_EQ(t.decode(r.generated_tokens, cont), r.text);
  }
}

TEST(TokStories, AddSpecialAndParseSpecial) {
  const Tokenizer& t = stories_or_die();
  const auto with_bos = t.encode("The cat sat", true, false);
  const auto without = t.encode("The cat sat", false, false);
  ASSERT_EQ(with_bos.size(), without.size() + 1);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<TokenId>(with_bos.begin() + 1, with_bos.end()), without);
  EXPECT_EQ(t.encode("", true, false), (std::vector<TokenId>{1}));
  EXPECT_TRUE(t.encode("", false, false).empty());
  // "</s>" in the text is EOS only when special tokens are parsed.
  const auto parsed = t.encode("The cat</s>", false, true);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed.back(), 2);
  for (TokenId id : t.encode("The cat</s>", false, false)) EXPECT_NE(id, 2);
}

TEST(TokStories, ByteFallbackForCharactersOutsideTheVocabulary) {
  const Tokenizer& t = stories_or_die();
  const TokenId space = t.find_token("\xE2\x96\x81");
  ASSERT_NE(space, kNoToken);
  // "中" (E4 B8 AD) is not in the 512-token vocabulary ("é" is: one token).
  EXPECT_EQ(t.encode("\xE4\xB8\xAD", false, false),
            (std::vector<TokenId>{space, 3 + 0xE4, 3 + 0xB8, 3 + 0xAD}));
  EXPECT_EQ(t.encode("\xC3\xA9", false, false), (std::vector<TokenId>{space, t.find_token("\xC3\xA9")}));
}

TEST(TokStories, RoundTripsVariedText) {
  const Tokenizer& t = stories_or_die();
  const char* cases[] = {
      "Once upon a time",  "Lily said, \"Hello!\"\nTom smiled.",  "  two leading spaces",
      "trailing space ",   "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87",
      "tabs\tand\nnewlines\n\n", "x", "12345 + 678 = 13023",
  };
  for (const char* s : cases) {
    EXPECT_EQ(t.decode(t.encode(s, true, false)), s) << s;
    EXPECT_EQ(t.decode(t.encode(s, false, false)), s) << s;
  }
}

// ---- SmolLM2: byte-level BPE against HF tokenizers ----------------------------

TEST(TokSmolLM2, VocabularyFromGguf) {
  SMOLLM2_OR_SKIP(t);
  EXPECT_EQ(t->kind(), VocabKind::kBpe);
  EXPECT_EQ(t->vocab_size(), 49152);
  EXPECT_EQ(t->vocab().pre, "smollm");
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->eot_id(), 2);  // <|im_end|>
  EXPECT_FALSE(t->add_bos());
  EXPECT_FALSE(t->adds_space_prefix());
  EXPECT_TRUE(t->is_eog(0));   // <|endoftext|>
  EXPECT_TRUE(t->is_eog(2));   // <|im_end|>
  EXPECT_FALSE(t->is_eog(1));  // <|im_start|>
  EXPECT_EQ(t->eog_ids(), (std::vector<TokenId>{0, 2}));
  EXPECT_EQ(t->token_to_piece(2), "");
  EXPECT_EQ(t->token_to_piece(2, true), "<|im_end|>");
  EXPECT_EQ(t->encode("hi", true, false), t->encode("hi", false, false));  // add_bos false
}

TEST(TokSmolLM2, MatchesHuggingFaceTokenizersFixture) {
  SMOLLM2_OR_SKIP(t);
  const auto doc = nlohmann::json::parse(
      read_file(PAGODA_SOURCE_DIR "/tests/tok/fixtures/smollm2_tokens.json"));
  ASSERT_EQ(doc["n_vocab"].get<int>(), t->vocab_size());
  ASSERT_GE(doc["cases"].size(), 30u);
  DecodeOptions render;
  render.render_special = true;
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"];
    const std::vector<TokenId> want = c["ids"];
    const std::vector<TokenId> got = t->encode(text, /*add_special=*/false, /*parse_special=*/true);
    EXPECT_EQ(got, want) << "text: " << text;
    EXPECT_EQ(t->decode(got, render), text);
  }
}

TEST(TokSmolLM2, ControlTokensInUserTextStayText) {
  SMOLLM2_OR_SKIP(t);
  const std::string s = "<|im_start|>user\nhi<|im_end|><|endoftext|>";
  const auto plain = t->encode(s, false, /*parse_special=*/false);
  for (TokenId id : plain) EXPECT_FALSE(t->is_control(id)) << id;
  EXPECT_EQ(t->decode(plain), s);
  const auto parsed = t->encode(s, false, /*parse_special=*/true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed[parsed.size() - 2], 2);
  EXPECT_EQ(parsed.back(), 0);
  EXPECT_EQ(t->decode(parsed), "user\nhi");  // control tokens hidden by default
}

TEST(TokSmolLM2, InvalidUtf8RoundTripsThroughByteTokens) {
  SMOLLM2_OR_SKIP(t);
  const std::string s = "ok \x80\xBF mid \xC3 end\xE2\x82";
  EXPECT_EQ(t->decode(t->encode(s, false, true)), s);
  // Bytes that no UTF-8 text contains (C0, C1, F5-FF) have no token in SmolLM2's
  // vocabulary: they are dropped, as llama.cpp does.
  EXPECT_EQ(t->find_token(byte_to_unicode(0xFF)), kNoToken);
  EXPECT_EQ(t->decode(t->encode("a\xFF" "b", false, false)), "ab");
}

TEST(TokSmolLM2, LongPromptRoundTrips) {
  SMOLLM2_OR_SKIP(t);
  std::string s;
  for (int i = 0; i < 400; ++i) {
    s += "Paragraph " + std::to_string(i) + ": the quick brown fox, caf\xC3\xA9 \xF0\x9F\x98\x80\n";
  }
  s += std::string(3000, ' ') + std::string(2000, 'a');  // long runs are single words
  const auto ids = t->encode(s, false, false);
  EXPECT_GT(ids.size(), 5000u);
  EXPECT_EQ(t->decode(ids), s);
}

// ---- Built from a hand-made Vocab (no GGUF) ------------------------------------

TEST(TokBpe, MergesApplyByRankNotByPosition) {
  Vocab v;
  v.kind = VocabKind::kBpe;
  v.model = "gpt2";
  v.pre = "gpt2";
  v.tokens = {"a", "b", "c", "ab", "bc", "abc"};
  // "b c" has the better rank, so "abc" -> "a" + "bc" -> no "a bc" merge -> [a, bc].
  v.merges = {"b c", "a b"};
  auto t = Tokenizer::create(v);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ((*t)->encode("abc", false, false), (std::vector<TokenId>{0, 4}));
  v.merges = {"a b", "ab c"};
  t = Tokenizer::create(v);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->encode("abc", false, false), (std::vector<TokenId>{5}));
}

TEST(TokVocab, RejectsBadVocabularies) {
  Vocab v;
  v.model = "gpt2";
  v.kind = VocabKind::kBpe;
  v.pre = "gpt2";
  v.tokens = {"a", "a"};
  auto t = Tokenizer::create(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("duplicate"), std::string::npos);
  v.tokens = {"a", "b"};
  v.scores = {0.0f};
  EXPECT_FALSE(Tokenizer::create(v).ok());
  v.scores.clear();
  v.pre = "mystery";
  t = Tokenizer::create(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("mystery"), std::string::npos);
}
