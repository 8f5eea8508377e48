// The vocabulary of a generated token that sched/, sample/, engine/, server/ and
// cli/ share: why a sequence stopped, and a token's log-probability.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace pagoda {

enum class FinishReason : uint8_t {
  kNone,    // still running
  kStop,    // an end-of-generation token, a stop token or a stop string
  kLength,  // max_tokens generated, or the context is full
  kAbort,   // aborted by the caller
  kError,   // the engine failed the request (e.g. a forward pass error)
};

// OpenAI's finish_reason words: "stop", "length", "abort", "error"; "" for kNone.
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

// A generated token: its log-probability and the most likely alternatives.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // [top_logprobs] (token, logprob), best first (ties: lowest id)
};

}  // namespace pagoda
