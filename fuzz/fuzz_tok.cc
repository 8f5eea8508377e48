// libFuzzer target for tok/: the input is text. It is encoded by the stories260K
// (SentencePiece-style) tokenizer and, when present, the SmolLM2 (byte-level BPE)
// one, with and without special-token parsing, decoded back in one piece and
// through the incremental detokenizer, and used as chat message content and as a
// chat template source. Checks round trips where they must hold, and that streamed
// text is always valid UTF-8.
//
// Model paths: $PAGODA_TEST_DATA/stories260K.gguf, else
// tests/data/stories260K.gguf from the working directory (the repo root in
// CI); $PAGODA_SMOLLM2_GGUF, else models/SmolLM2-135M-Instruct.Q4_1.gguf.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "tok/chat_template.h"
#include "tok/detokenizer.h"
#include "tok/tokenizer.h"
#include "tok/unicode.h"

using namespace pagoda;
using namespace pagoda::tok;

namespace {

struct Model {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  bool byte_ok[256] = {};  // BPE: the byte has a token, so it survives a round trip
};

std::unique_ptr<Model> load(const std::string& path, bool required) {
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) {
    if (required) {
      std::fprintf(stderr, "fuzz_tok: cannot open %s: %s\n", path.c_str(), f.message().c_str());
      std::abort();
    }
    return nullptr;
  }
  auto m = std::make_unique<Model>();
  m->file = std::move(f).value();
  auto t = Tokenizer::from_gguf(*m->file);
  if (!t.ok()) {
    std::fprintf(stderr, "fuzz_tok: tokenizer of %s: %s\n", path.c_str(), t.message().c_str());
    std::abort();
  }
  m->tok = std::move(t).value();
  for (int b = 0; b < 256; ++b) {
    m->byte_ok[b] = m->tok->find_token(byte_to_unicode(static_cast<uint8_t>(b))) != kNoToken;
  }
  return m;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

void check(bool ok, const char* what, std::string_view input) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_tok: %s failed for input of %zu bytes\n", what, input.size());
  std::abort();
}

bool is_valid_utf8(std::string_view s) { return utf8_sanitize(s) == s; }

void exercise(const Model& m, std::string_view text) {
  const Tokenizer& t = *m.tok;
  for (bool parse_special : {false, true}) {
    const std::vector<TokenId> ids = t.encode(text, /*add_special=*/true, parse_special);
    for (TokenId id : ids) check(id >= 0 && id < t.vocab_size(), "id in range", text);
    const std::string decoded = t.decode(ids);

    // Streaming: valid UTF-8 pieces; equal to decode() when that is valid UTF-8.
    DetokenizerOptions opts;
    opts.at_sequence_start = true;
    IncrementalDetokenizer d(t, opts);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = d.push(id);
      check(is_valid_utf8(piece), "streamed piece is valid UTF-8", text);
      streamed += piece;
    }
    streamed += d.flush();
    if (is_valid_utf8(decoded)) check(streamed == decoded, "stream == decode", text);

    if (!parse_special) {
      for (TokenId id : ids) {
        if (id != t.bos_id() && id != t.eos_id()) check(!t.is_control(id), "no control token", text);
      }
      if (t.kind() == VocabKind::kSpm) {
        // Every byte has a token; U+2581 in the input would decode as a space.
        if (text.find("\xE2\x96\x81") == std::string_view::npos) {
          check(decoded == text, "SPM round trip", text);
        }
      } else {
        bool representable = true;
        for (char c : text) representable = representable && m.byte_ok[static_cast<uint8_t>(c)];
        if (representable) check(decoded == text, "BPE round trip", text);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Model> stories =
      load(env_or("PAGODA_TEST_DATA", "tests/data") + "/stories260K.gguf", true);
  static const std::unique_ptr<Model> smol =
      load(env_or("PAGODA_SMOLLM2_GGUF", "models/SmolLM2-135M-Instruct.Q4_1.gguf"), false);
  static const std::unique_ptr<ChatTemplate> smol_chat = [] {
    if (!smol) return std::unique_ptr<ChatTemplate>();
    auto c = ChatTemplate::from_tokenizer(*smol->tok);
    return c.ok() ? std::make_unique<ChatTemplate>(std::move(c).value()) : nullptr;
  }();

  const std::string_view text(reinterpret_cast<const char*>(data), size);
  exercise(*stories, text);
  if (smol) exercise(*smol, text);

  // Chat templates: the input as message content, and as a template source.
  if (smol_chat) {
    const ChatMessage msgs[] = {{"user", std::string(text)}, {"assistant", "ok"}};
    auto out = smol_chat->render(msgs, true);
    check(out.ok() && out->find(std::string(text)) != std::string::npos, "ChatML render", text);
  }
  auto parsed = ChatTemplate::parse(text, "<s>", "</s>");
  if (parsed.ok()) {
    const ChatMessage msgs[] = {{"system", "s"}, {"user", "u"}};
    (void)parsed->render(msgs, true);
  }
  (void)py_strip(text);
  return 0;
}
