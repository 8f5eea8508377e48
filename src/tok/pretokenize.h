// Pre-tokenizer for byte-level BPE: splits text into words with a chain of PCRE2
// regexes chosen by tokenizer.ggml.pre (UTF mode, Unicode properties). Each regex
// splits every piece left by the previous one; both matches and the text between
// matches become pieces, and lookaheads never see past the piece they run on
// (llama.cpp's unicode_regex_split and HF tokenizers' Sequence of Split agree).
// Thread-safety: immutable after create(); split() may run concurrently.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace pagoda::tok {

class PreTokenizer {
 public:
  // Known names: "gpt2"/"gpt-2"; "default" and "" (llama.cpp's fallback set);
  // "smollm", "starcoder", "refact", "command-r", "codeshell" (digits split one by
  // one, then GPT-2); "llama3"/"llama-bpe"/"llama-v3"/"dbrx"/"smaug-bpe"; "qwen2"/
  // "stablelm2"/"deepseek-r1-qwen". Anything else is an error.
  static Expected<PreTokenizer> for_name(std::string_view pre);
  static Expected<PreTokenizer> from_patterns(const std::vector<std::string>& patterns);

  // Appends the words of text to *words (views into text). Bytes that are not
  // well-formed UTF-8 become one-byte words of their own; the words always
  // concatenate back to text.
  void split(std::string_view text, std::vector<std::string_view>* words) const;

  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  struct Compiled;
  std::vector<std::string> patterns_;
  std::vector<std::shared_ptr<const Compiled>> compiled_;
};

}  // namespace pagoda::tok
