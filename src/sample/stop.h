// Stop strings over the decoded text, holding back any tail that could still
// become a stop string so that no part of a stop string is ever emitted. Why a
// request ends (stop tokens, a stop string, max_tokens...) is decided in one
// place, engine/finish.h, which uses this filter.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sample/params.h"

namespace pagoda::sample {

struct StopScan {
  bool stopped = false;  // a stop string was found; generation ends
  size_t emit_end = 0;   // text[emitted .. emit_end) may be emitted now
};

// text: the whole decoded generated text so far; emitted: bytes of it already
// emitted (precondition: no stop string ends within them and emitted <= size).
// Finds the earliest stop string occurrence starting at or after `emitted`;
// if none, holds back the longest tail that is a proper prefix of some stop.
StopScan scan_stop_strings(std::string_view text, size_t emitted, std::span<const std::string> stops);

// Stateful wrapper for one choice: push decoded text pieces, get what to show.
// It shares the request's stop list (no copy per choice).
class StopStringFilter {
 public:
  explicit StopStringFilter(StopStrings stops) : stops_(std::move(stops)) {}
  // Appends a decoded piece; returns the text that may be emitted now (possibly
  // empty). After stopped() is true, further pushes return "".
  std::string push(std::string_view piece);
  // End of generation without a stop string: releases the held-back tail.
  std::string flush();
  bool stopped() const { return stopped_; }
  // Everything emitted so far (the request's final text).
  std::string_view emitted_text() const { return std::string_view(text_).substr(0, emitted_); }
  const StopStrings& stops() const { return stops_; }

 private:
  StopStrings stops_;
  std::string text_;
  size_t emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace pagoda::sample
