#include "engine/speculative.h"

#include <algorithm>

#include "base/status.h"

namespace pagoda::engine {

std::string check_speculative_config(const SpeculativeConfig& c) {
  if (c.num_speculative_tokens < 0 || c.num_speculative_tokens > kMaxSpeculativeTokens)
    return errorf("num_speculative_tokens must be in 0..%d, got %d", kMaxSpeculativeTokens, c.num_speculative_tokens)
        .message;
  if (c.prompt_lookup_min < 1 || c.prompt_lookup_max > kMaxPromptLookup || c.prompt_lookup_min > c.prompt_lookup_max)
    return errorf("prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max <= %d, got min %d, max %d",
                  kMaxPromptLookup, c.prompt_lookup_min, c.prompt_lookup_max)
        .message;
  return "";
}

std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int min_n, int max_n, int k) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || min_n < 1 || max_n < min_n || len < min_n + 1) return {};
  // One pass over candidate continuations: position e follows an occurrence
  // ending at e - 1 < len - 1; its match is the common suffix of tokens[..e)
  // and tokens[..len), capped at max_n. The longest wins; among equals the
  // latest (the nearest context), found first scanning backwards.
  int best_n = 0;
  int64_t best_e = -1;
  for (int64_t e = len - 1; e >= min_n; --e) {
    int n = 0;
    while (n < max_n && n < e && tokens[static_cast<size_t>(e - 1 - n)] == tokens[static_cast<size_t>(len - 1 - n)]) ++n;
    if (n > best_n) {
      best_n = n;
      best_e = e;
      if (n == max_n) break;
    }
  }
  if (best_n < min_n) return {};
  const int64_t end = std::min(len, best_e + k);
  return {tokens.begin() + best_e, tokens.begin() + end};
}

void AcceptanceEstimate::record(int k, int accepted) {
  Counts& c = state_[last_whole_];
  c.accepted = 0.9 * c.accepted + accepted;
  c.rejected = 0.9 * c.rejected + (accepted < k ? 1.0 : 0.0);
  last_whole_ = accepted >= k ? 1 : 0;
}

void AcceptanceEstimate::decay() {
  for (Counts& c : state_) {
    c.accepted = 0.95 * c.accepted + 0.05;
    c.rejected = 0.95 * c.rejected + 0.05;
  }
  last_whole_ = 0;  // no draft this step: the run (if any) is over
}

int best_draft_length(const StepCostModel& cost, double alpha, int batch, int max_k) {
  batch = std::max(batch, 1);
  int best = 0;
  double expected = 1.0, term = 1.0;
  double best_rate = (batch - 1 + expected) / cost.cost(batch);
  for (int k = 1; k <= max_k; ++k) {
    term *= alpha;
    expected += term;
    const double rate = (batch - 1 + expected) / cost.cost(batch + k);
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

bool DraftThrottle::should_draft() {
  if (pause_left_ == 0) return true;
  --pause_left_;
  return false;
}

void DraftThrottle::record(int k, int accepted) {
  ++drafts_;
  proposed_ += k;
  accepted_ += accepted;
  if (drafts_ < kWindow) return;
  if (accepted_ < kMinAcceptRate * proposed_) {
    pause_left_ = next_pause_;
    next_pause_ = std::min(kMaxPause, next_pause_ * 2);
  } else {
    next_pause_ = kFirstPause;
  }
  drafts_ = proposed_ = accepted_ = 0;
}

}  // namespace pagoda::engine
