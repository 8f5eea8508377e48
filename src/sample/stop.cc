#include "sample/stop.h"

#include <algorithm>

namespace pagoda::sample {

StopScan scan_stop_strings(std::string_view text, size_t emitted, std::span<const std::string> stops) {
  StopScan r;
  emitted = std::min(emitted, text.size());
  size_t first = std::string_view::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t at = text.find(s, emitted);
    if (at < first) first = at;
  }
  if (first != std::string_view::npos) {
    r.stopped = true;
    r.emit_end = first;
    return r;
  }
  // Hold back the longest tail of `text` (after `emitted`) that starts some stop.
  size_t hold = 0;
  for (const std::string& s : stops) {
    const size_t max_k = std::min(s.size() - (s.empty() ? 0 : 1), text.size() - emitted);
    for (size_t k = max_k; k > hold; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  r.emit_end = text.size() - hold;
  return r;
}

std::string StopStringFilter::push(std::string_view piece) {
  if (stopped_) return {};
  text_.append(piece);
  const StopScan s = scan_stop_strings(text_, emitted_, stops_.view());
  std::string out = text_.substr(emitted_, s.emit_end - emitted_);
  emitted_ = s.emit_end;
  if (s.stopped) {
    stopped_ = true;
    text_.resize(emitted_);
  }
  return out;
}

std::string StopStringFilter::flush() {
  if (stopped_) return {};
  std::string out = text_.substr(emitted_);
  emitted_ = text_.size();
  return out;
}

}  // namespace pagoda::sample
