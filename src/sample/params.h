// Per-request sampling parameters (OpenAI / vLLM / llama.cpp vocabulary).
// Defaults are neutral (plain softmax sampling at temperature 1); `pagoda run`
// sets llama.cpp's CLI defaults on top.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pagoda::sample {

// An immutable list of stop strings shared by reference: copying it copies a
// pointer, so the prompts of one HTTP request and the n choices of each (up to
// 64 x 16 x 16 stop strings of 1 KiB) all point at one list. Set it from a
// vector or a braced list; never changed in place.
class StopStrings {
 public:
  StopStrings() = default;
  StopStrings(std::vector<std::string> list)  // NOLINT(google-explicit-constructor): p.stop = list
      : list_(list.empty() ? nullptr : std::make_shared<const std::vector<std::string>>(std::move(list))) {}
  StopStrings(std::initializer_list<std::string> list)  // NOLINT(google-explicit-constructor): p.stop = {"a"}
      : StopStrings(std::vector<std::string>(list)) {}

  const std::vector<std::string>& list() const { return list_ ? *list_ : empty_list(); }
  std::span<const std::string> view() const { return list(); }
  bool empty() const { return list_ == nullptr; }
  size_t size() const { return list_ ? list_->size() : 0; }
  // The shared list itself (nullptr when empty): equal for every copy.
  const std::vector<std::string>* get() const { return list_.get(); }
  // Holders of the shared list (0 when empty).
  long use_count() const { return list_.use_count(); }

 private:
  static const std::vector<std::string>& empty_list() {
    static const std::vector<std::string> kEmpty;
    return kEmpty;
  }
  std::shared_ptr<const std::vector<std::string>> list_;  // nullptr: no stop strings
};

struct SamplingParams {
  float temperature = 1.0f;         // 0 (or below): greedy argmax, ties -> lowest id
  int32_t top_k = 0;                // <= 0: off
  float top_p = 1.0f;               // >= 1: off
  float min_p = 0.0f;               // <= 0: off; keeps p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; over prompt + generated tokens (HF/vLLM/llama.cpp rule)
  float presence_penalty = 0.0f;    // over generated tokens (OpenAI/vLLM rule)
  float frequency_penalty = 0.0f;   // over generated tokens, times the count
  uint64_t seed = 0;                // per-request RNG seed
  int32_t max_tokens = 256;         // generated tokens; <= 0: unlimited (context bound)
  StopStrings stop;                 // stop strings (text level; not included in the output)
  std::vector<int32_t> stop_token_ids;  // extra stop tokens (honoured even with ignore_eos)
  bool ignore_eos = false;
  bool logprobs = false;            // report the chosen token's logprob
  int32_t top_logprobs = 0;         // and this many most likely alternatives
  // OpenAI's logit_bias: (token id, bias) added to that token's logit before the
  // penalties and every later stage. Ids must be inside the vocabulary (the
  // engine checks); an id past the logits row is skipped.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// llama.cpp CLI defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05.
inline SamplingParams llama_cpp_defaults() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  return p;
}

}  // namespace pagoda::sample
