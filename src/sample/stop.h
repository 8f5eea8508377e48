// Stop conditions. Token level: end-of-generation tokens (passed in as data, the
// tokenizer's is_eog set), stop token ids, max_tokens. Text level: stop strings
// over the decoded text, holding back any tail that could still become a stop
// string so that no part of a stop string is ever emitted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sample/params.h"

namespace pagoda::sample {

enum class FinishReason : uint8_t {
  None = 0,
  Eos,        // an end-of-generation token
  StopToken,  // one of params.stop_token_ids
  StopString, // one of params.stop
  Length,     // max_tokens reached
};
// OpenAI finish_reason: "stop" (Eos, StopToken, StopString), "length", or "" for None.
const char* finish_reason_name(FinishReason r);

// After `token` became the n_generated-th generated token (n_generated counts it).
FinishReason check_token(const SamplingParams& params, int32_t token, int32_t n_generated,
                         std::span<const int32_t> eog_ids);

struct StopScan {
  bool stopped = false;  // a stop string was found; generation ends
  size_t emit_end = 0;   // text[emitted .. emit_end) may be emitted now
};

// text: the whole decoded generated text so far; emitted: bytes of it already
// emitted (precondition: no stop string ends within them and emitted <= size).
// Finds the earliest stop string occurrence starting at or after `emitted`;
// if none, holds back the longest tail that is a proper prefix of some stop.
StopScan scan_stop_strings(std::string_view text, size_t emitted, std::span<const std::string> stops);

// Stateful wrapper for one request: push decoded text pieces, get what to show.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::span<const std::string> stops) : stops_(stops.begin(), stops.end()) {}
  // Appends a decoded piece; returns the text that may be emitted now (possibly
  // empty). After stopped() is true, further pushes return "".
  std::string push(std::string_view piece);
  // End of generation without a stop string: releases the held-back tail.
  std::string flush();
  bool stopped() const { return stopped_; }
  // Everything emitted so far (the request's final text).
  std::string_view emitted_text() const { return std::string_view(text_).substr(0, emitted_); }

 private:
  std::vector<std::string> stops_;
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace pagoda::sample
