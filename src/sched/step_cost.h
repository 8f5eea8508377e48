// A step's forward time by its number of tokens, measured, and the burst-aware
// prefill budget built on it (--max-num-batched-tokens auto, issue 23).
//
// StepCostModel keeps an average of measured step times per step size: one
// bin per token count up to kExactTokens, then bins kWideBin tokens wide (each
// remembers the average size it saw) up to kMaxTokens, larger steps in the
// last bin. Speculative decoding asks it what a verify step of 1 + k tokens
// costs (engine/speculative.h best_draft_length); the scheduler's auto budget
// asks how many prefill tokens fit next to this step's decodes.
//
// The auto budget (auto_prefill_budget): with D decode tokens in the step
// (drafts included), prefill chunks and admissions get the largest P with
// cost(D + P) <= target_factor x cost(D), at least min_prefill_tokens (so a
// waiting request always advances) and at most what the hard cap leaves. With
// no decode running nothing is protected: the whole cap goes to prefill. So a
// wave of arrivals is spread over several steps, each at most about
// target_factor times a pure decode step, instead of one step of thousands of
// tokens that stalls every running stream. Greedy outputs do not depend on it
// (chunking and batching do not change a token: batch-invariant kernels); the
// measurements are injectable (record), so tests are deterministic.
#pragma once
#include <cstdint>

namespace pagoda::sched {

class StepCostModel {
 public:
  static constexpr int kExactTokens = 128;
  static constexpr int kWideBin = 32;
  static constexpr int kMaxTokens = 8192;
  // Records one forward of n tokens that took ms milliseconds (ignored: n < 1, ms <= 0).
  void record(int n, double ms);
  // Estimated milliseconds for n tokens: the measured average, else linear
  // between the nearest measured sizes, else from the largest measured one at
  // the slope between it and the smallest (with one size measured: half its
  // cost per token), else (below every measurement) the smallest's cost.
  // Sizes up to kExactTokens look only at exact bins (no line from a small
  // step to a large prefill: the kernels' regimes differ).
  // Relative units (decode = 1) before any measurement.
  double cost(int n) const;
  bool measured() const { return num_records_ > 0; }

 private:
  static constexpr int kNumBins = kExactTokens + (kMaxTokens - kExactTokens) / kWideBin + 1;
  static int bin_of(int n);
  double ms_[kNumBins] = {};  // 0: not measured
  double n_[kNumBins] = {};   // average size of the steps in the bin (exact bins: the size)
  int64_t num_records_ = 0;
};

struct AutoBudgetConfig {
  double target_factor = 2.0;        // a step with prefill takes at most this x a pure decode step
  int32_t min_prefill_tokens = 64;   // per step while requests wait for prefill (no starvation)
};

// Prefill tokens (chunks of running prompts plus admissions) a step with
// decode_tokens decode tokens may carry, in [min(min_prefill_tokens, cap -
// decode_tokens), cap - decode_tokens]; cap - decode_tokens when decode_tokens == 0.
int32_t auto_prefill_budget(const StepCostModel& cost, const AutoBudgetConfig& cfg, int32_t decode_tokens,
                            int32_t cap);

}  // namespace pagoda::sched
