#include "tok/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tok/unicode.h"

namespace pagoda::tok {

namespace {

// GPT-2's split (also HF ByteLevel(use_regex=true) without the final "|\s+",
// which changes nothing: text between matches becomes a piece anyway).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Piece {
  std::string_view text;
  bool frozen;  // invalid UTF-8 byte: never handed to a regex
};

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

Expected<PreTokenizer> PreTokenizer::for_name(std::string_view pre) {
  if (pre == "gpt2" || pre == "gpt-2" || pre == "phi-2" || pre == "mpt" || pre == "olmo") {
    return from_patterns({kGpt2});
  }
  if (pre.empty() || pre == "default") {
    return from_patterns({R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"});
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
      pre == "codeshell" || pre == "exaone" || pre == "minerva-7b") {
    return from_patterns({R"(\p{N})", kGpt2});
  }
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "dbrx" ||
      pre == "smaug-bpe" || pre == "falcon3" || pre == "pixtral") {
    return from_patterns({kLlama3});
  }
  if (pre == "qwen2" || pre == "stablelm2" || pre == "deepseek-r1-qwen" || pre == "megrez") {
    return from_patterns({kQwen2});
  }
  return errorf("tokenizer: unsupported pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
                static_cast<int>(pre.size()), pre.data());
}

Expected<PreTokenizer> PreTokenizer::from_patterns(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  p.patterns_ = patterns;
  for (const std::string& pat : patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return errorf("tokenizer: bad pre-tokenizer regex at offset %zu: %s (%s)",
                    static_cast<size_t>(err_off), reinterpret_cast<const char*>(msg), pat.c_str());
    }
    auto c = std::make_shared<Compiled>();
    c->code = code;
    c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    p.compiled_.push_back(std::move(c));
  }
  return p;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* words) const {
  // Valid UTF-8 runs and lone invalid bytes.
  std::vector<Piece> pieces;
  size_t run_start = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_valid_len(text, i);
    if (len != 0) {
      i += len;
      continue;
    }
    if (i > run_start) pieces.push_back({text.substr(run_start, i - run_start), false});
    pieces.push_back({text.substr(i, 1), true});
    run_start = ++i;
  }
  if (run_start < text.size()) pieces.push_back({text.substr(run_start), false});

  std::vector<Piece> next;
  for (const auto& compiled : compiled_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(compiled->code, nullptr);
    next.clear();
    for (const Piece& piece : pieces) {
      if (piece.frozen) {
        next.push_back(piece);
        continue;
      }
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.text.data());
      const size_t n = piece.text.size();
      size_t pos = 0;
      size_t emitted = 0;  // end of the last piece pushed
      while (pos < n) {
        uint32_t opts = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
        int rc = pcre2_match(compiled->code, subject, n, pos, opts, md, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && compiled->jit) {
          // JIT stack exhausted or similar: retry with the interpreter.
          rc = pcre2_match(compiled->code, subject, n, pos, opts | PCRE2_NO_JIT, md, nullptr);
        }
        if (rc < 0) break;  // no more matches (or a limit hit: the rest is one piece)
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t ms = ov[0], me = ov[1];
        if (me <= ms || me > n) break;  // defensive: NOTEMPTY forbids this
        if (ms > emitted) next.push_back({piece.text.substr(emitted, ms - emitted), false});
        next.push_back({piece.text.substr(ms, me - ms), false});
        emitted = me;
        pos = me;
      }
      if (emitted < n) next.push_back({piece.text.substr(emitted), false});
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  for (const Piece& p : pieces) words->push_back(p.text);
}

}  // namespace pagoda::tok
