// Speculative decoding by prompt lookup (vLLM's "ngram" method, llama.cpp's
// lookup decoding): the draft for a sequence is what followed the latest
// earlier occurrence of its longest recent n-gram. Drafts cost no model: the
// engine verifies them in the sequence's next decode step, which computes
// [last token, drafts...] in one forward (sched::Scheduler::set_draft), and
// keeps the longest prefix the sampler confirms plus one token of its own.
// Plain data and functions: the engine owns the per-sequence state.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sched/step_cost.h"

namespace pagoda::engine {

// vLLM's --speculative-config for method "ngram".
struct SpeculativeConfig {
  int num_speculative_tokens = 0;  // K: draft tokens per step; 0 = off
  int prompt_lookup_max = 5;       // longest n-gram matched (vLLM: 5 when neither bound is given)
  int prompt_lookup_min = 5;       // shortest
  // Trim each draft to the length expected to pay, from measured step times
  // (best_draft_length). Timing-dependent, so greedy outputs are unchanged but
  // how many tokens are drafted is not reproducible; false drafts every proposed
  // token (the engine tests, which must not depend on wall-clock time).
  bool adaptive_length = true;
  bool enabled() const { return num_speculative_tokens > 0; }
};

// Limits: K <= kMaxSpeculativeTokens, 1 <= min <= max <= kMaxPromptLookup.
constexpr int kMaxSpeculativeTokens = 32;
constexpr int kMaxPromptLookup = 64;
// "" when valid, else the message.
std::string check_speculative_config(const SpeculativeConfig& c);

// Up to k tokens proposed to follow `tokens`: for n from max_n down to min_n,
// if the last n tokens also occur earlier (ending before the last token), the
// tokens after the latest such occurrence (at most k, never past the end).
// Empty when no n-gram of at least min_n repeats. O(tokens x max_n).
std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int min_n, int max_n, int k);

// The forward pass's cost by step size (sched/step_cost.h), for choosing how
// many draft tokens pay. A verify step of 1 + k tokens costs more than a
// decode (how much depends on the kernels: on AVX-512 with 2 threads two tokens
// cost about one, nine about five), so a draft is worth its length only when
// enough of it is expected to be accepted.
using sched::StepCostModel;

// Per-sequence acceptance estimate: the chance that the next draft token is
// accepted given the previous ones were (geometric model), from decayed
// counts of accepted tokens and of drafts that ended in a rejection. Kept in
// two states, by how the sequence's previous draft ended: after a draft taken
// whole the output is most likely still copying a span (the next draft is
// taken whole too), after a rejection it has left one. One pooled estimate
// mixes the two and trims the drafts of a copy run to ~3 tokens (session 9:
// 1.63x vs 1.84x untrimmed on the copy workload).
class AcceptanceEstimate {
 public:
  double alpha() const { return state_[last_whole_].alpha(); }
  void record(int k, int accepted);
  // A step without a draft: the estimate drifts back towards the prior, so a
  // sequence that stopped drafting tries again later.
  void decay();

 private:
  struct Counts {
    // The prior (alpha 0.6): a repeated n-gram is a fair bet, so a new
    // sequence tries a short draft and learns from it.
    double accepted = 2.0;
    double rejected = 1.0;
    double alpha() const { return (accepted + 1.0) / (accepted + rejected + 2.0); }
  };
  Counts state_[2];       // [0]: after a rejected draft (or none yet), [1]: after a draft taken whole
  int last_whole_ = 0;
};

// The draft length in 0..max_k that maximises expected tokens per unit of
// time for a sequence decoding among `batch` decodes (the others without
// drafts): (batch - 1 + sum_{i=0..k} alpha^i) / cost(batch + k).
int best_draft_length(const StepCostModel& cost, double alpha, int batch, int max_k);

// Adaptive off-switch of one sequence: when fewer than kMinAcceptRate of the
// draft tokens of its last kWindow drafts were accepted, drafting pauses for a
// number of decode steps that doubles on every pause in a row (up to
// kMaxPause) and goes back to kFirstPause after a window that does better.
class DraftThrottle {
 public:
  static constexpr int kWindow = 8;
  static constexpr double kMinAcceptRate = 0.1;
  static constexpr int kFirstPause = 16;
  static constexpr int kMaxPause = 1024;

  // Whether to draft in this decode step (a paused step counts down).
  bool should_draft();
  // Records one verified draft: k tokens proposed, `accepted` of them taken.
  void record(int k, int accepted);
  int paused_steps() const { return pause_left_; }

 private:
  int drafts_ = 0;  // in the current window
  int proposed_ = 0;
  int accepted_ = 0;
  int pause_left_ = 0;
  int next_pause_ = kFirstPause;
};

}  // namespace pagoda::engine
