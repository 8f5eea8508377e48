#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tok/detokenizer.h"
#include "tok/tok_test_util.h"
#include "tok/unicode.h"

using namespace pagoda;
using namespace pagoda::tok;

namespace {

const Tokenizer* stories_tok() {
  std::string why;
  const Tokenizer* t = pagoda::tok::testing::stories(&why);
  EXPECT_NE(t, nullptr) << why;
  return t;
}

// Stories260K byte tokens: <0xNN> has id 3 + NN.
TokenId byte_token(uint8_t b) { return 3 + b; }

}  // namespace

TEST(TokDetokenizer, EmojiSplitOverByteTokensWaitsUntilComplete) {
  const Tokenizer* t = stories_tok();
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->token_to_piece(byte_token(0xF0)), "\xF0");
  IncrementalDetokenizer d(*t);
  EXPECT_EQ(d.push(byte_token(0xF0)), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(d.push(byte_token(0x9F)), "");
  EXPECT_EQ(d.push(byte_token(0x98)), "");
  EXPECT_EQ(d.pending_bytes(), 3u);
  EXPECT_EQ(d.push(byte_token(0x80)), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(d.flush(), "");
}

TEST(TokDetokenizer, TextBeforeAnIncompleteCharacterComesOutAtOnce) {
  const Tokenizer* t = stories_tok();
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(*t);
  EXPECT_EQ(d.push(265), " the");  // "▁the"
  EXPECT_EQ(d.push(byte_token('!')), "!");
  EXPECT_EQ(d.push(byte_token(0xC3)), "");
  EXPECT_EQ(d.push(byte_token(0xA9)), "\xC3\xA9");
}

TEST(TokDetokenizer, BytesThatCanNeverBeValidBecomeReplacementCharacters) {
  const Tokenizer* t = stories_tok();
  ASSERT_NE(t, nullptr);
  IncrementalDetokenizer d(*t);
  EXPECT_EQ(d.push(byte_token(0xFF)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte_token(0xF0)), "");
  EXPECT_EQ(d.push(byte_token(0x9F)), "");
  // 'A' cannot continue the sequence: both held bytes are replaced, then 'A'.
  EXPECT_EQ(d.push(byte_token('A')), "\xEF\xBF\xBD\xEF\xBF\xBD" "A");
  EXPECT_EQ(d.push(byte_token(0xE2)), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.pending_bytes(), 0u);
}

TEST(TokDetokenizer, StreamOfReferenceMatchesPromptPlusText) {
  const Tokenizer* t = stories_tok();
  ASSERT_NE(t, nullptr);
  std::istringstream in(pagoda::tok::testing::read_file(PAGODA_TEST_DATA
                                                         "/stories260K.reference.jsonl"));
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const std::vector<TokenId> prompt = j["prompt_tokens"];
    const std::vector<TokenId> gen = j["generated_tokens"];
    const std::string prompt_text = j["prompt"], text = j["text"];

    // Whole sequence from BOS: the space the encoder prepended is dropped.
    DetokenizerOptions whole;
    whole.at_sequence_start = true;
    IncrementalDetokenizer a(*t, whole);
    std::string out;
    for (TokenId id : prompt) out += a.push(id);
    EXPECT_EQ(out, prompt_text);
    for (TokenId id : gen) out += a.push(id);
    out += a.flush();
    EXPECT_EQ(out, prompt_text + text);

    // Only the continuation, as an engine streams it.
    IncrementalDetokenizer b(*t);
    std::string cont;
    for (TokenId id : gen) {
      const std::string piece = b.push(id);
      EXPECT_EQ(utf8_sanitize(piece), piece);  // always valid UTF-8
      cont += piece;
    }
    cont += b.flush();
    EXPECT_EQ(cont, text);
    ++n;
  }
  EXPECT_EQ(n, 3);
}

TEST(TokDetokenizer, SmolLM2StreamsMultiTokenCharactersAndHidesControlTokens) {
  std::string why;
  const Tokenizer* t = pagoda::tok::testing::smollm2(&why);
  if (t == nullptr) GTEST_SKIP() << "SmolLM2 not available: " << why;
  // Byte-level tokens of the four bytes of U+1F600, fed one at a time.
  std::vector<TokenId> ids;
  for (uint8_t b : std::string("\xF0\x9F\x98\x80")) {
    const TokenId id = t->find_token(byte_to_unicode(b));
    ASSERT_NE(id, kNoToken);
    ids.push_back(id);
  }
  IncrementalDetokenizer d(*t);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "");
  EXPECT_EQ(d.push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.push(2), "");  // <|im_end|> hidden by default

  DetokenizerOptions show;
  show.render_special = true;
  IncrementalDetokenizer s(*t, show);
  EXPECT_EQ(s.push(2), "<|im_end|>");

  // Whatever the split, the stream equals decode() for valid text.
  const std::string text = "Emoji \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 and \xE4\xB8\xAD\xE6\x96\x87!";
  IncrementalDetokenizer e(*t);
  std::string out;
  for (TokenId id : t->encode(text, false, false)) out += e.push(id);
  out += e.flush();
  EXPECT_EQ(out, text);
}
