#include "sched/step_cost.h"

#include <algorithm>

namespace pagoda::sched {

int StepCostModel::bin_of(int n) {
  if (n <= kExactTokens) return n;
  return std::min(kNumBins - 1, kExactTokens + (n - kExactTokens + kWideBin - 1) / kWideBin);
}

void StepCostModel::record(int n, double ms) {
  if (n < 1 || !(ms > 0)) return;
  const int b = bin_of(n);
  // Recent steps weigh more: the machine's load changes.
  ms_[b] = ms_[b] == 0 ? ms : 0.8 * ms_[b] + 0.2 * ms;
  n_[b] = n_[b] == 0 ? n : 0.8 * n_[b] + 0.2 * n;
  ++num_records_;
}

double StepCostModel::cost(int n) const {
  n = std::max(n, 1);
  const double x = n;
  // The nearest measured sizes at or below x (lo) and at or above it (hi).
  // Bins cover disjoint, increasing ranges of sizes, so their averages are ordered.
  const int b = bin_of(n);
  int lo = -1, hi = -1;
  for (int i = b; i >= 1 && lo < 0; --i) {
    if (ms_[i] > 0 && n_[i] <= x) lo = i;
  }
  // A small step (exact bins) is not interpolated towards a large one: below
  // about a hundred tokens the kernels work in register tiles (a verify step of
  // 1 + k tokens costs in steps of 4), above it the weights go through the
  // packed GEMM, so a line between the two regimes underprices small steps
  // (speculative decoding would draft too long before measuring them).
  const int last = n <= kExactTokens ? kExactTokens : kNumBins - 1;
  for (int i = b; i <= last && hi < 0; ++i) {
    if (ms_[i] > 0 && n_[i] >= x) hi = i;
  }
  if (lo >= 0 && hi >= 0) {
    if (n_[hi] == n_[lo]) return ms_[lo];
    return ms_[lo] + (ms_[hi] - ms_[lo]) * (x - n_[lo]) / (n_[hi] - n_[lo]);
  }
  if (lo < 0 && hi < 0) return 1.0 + 0.5 * (x - 1);  // nothing measured
  if (lo < 0) return ms_[hi];                         // below every measurement
  // Above every measurement: the slope from the smallest measured size, or
  // with one size measured half its cost per token.
  int first = 1;
  while (ms_[first] == 0) ++first;
  const double slope = first < lo ? std::max(0.0, (ms_[lo] - ms_[first]) / (n_[lo] - n_[first]))
                                  : 0.5 * ms_[lo] / n_[lo];
  return ms_[lo] + slope * (x - n_[lo]);
}

int32_t auto_prefill_budget(const StepCostModel& cost, const AutoBudgetConfig& cfg, int32_t decode_tokens,
                            int32_t cap) {
  const int32_t room = std::max(0, cap - std::max(0, decode_tokens));
  if (decode_tokens <= 0 || room == 0) return room;  // no running stream to protect
  const double target = cfg.target_factor * cost.cost(decode_tokens);
  // The largest p in [0, room] with cost(decode + p) <= target (cost grows with
  // the step's size; a noisy non-monotone stretch only moves the answer within it).
  int32_t lo = 0, hi = room;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (cost.cost(decode_tokens + mid) <= target) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return std::clamp(lo, std::min(cfg.min_prefill_tokens, room), room);
}

}  // namespace pagoda::sched
