// Sampler: one per request. Owns the request's seeded RNG and token counts so
// that the same seed and logits always give the same tokens (also after
// preemption: the sampler lives with the request, not with the step).
//
// Pipeline over the logits of one step (llama.cpp's order):
//   logit_bias -> penalties -> [greedy: argmax] -> top-k -> top-p -> min-p -> temperature -> draw
// top-p and min-p use the probabilities at temperature 1, as llama.cpp does.
// Logprobs are the log-softmax of the processed logits (after penalties and,
// when sampling, temperature; before the top-k/top-p/min-p truncation).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "base/generation.h"
#include "base/rng.h"
#include "sample/params.h"

namespace pagoda::sample {

// The chosen token, its logprob and the top alternatives (when params.logprobs;
// else only `token` is set). The one TokenLogprob of base/generation.h.
using SampleResult = TokenLogprob;

class Sampler {
 public:
  // prompt_tokens feed the repetition penalty (copied only when it is on).
  explicit Sampler(SamplingParams params, std::span<const int32_t> prompt_tokens = {});

  // Picks the next token from logits [n_vocab] (not modified) and records it as
  // generated. Precondition: logits non-empty.
  // allowed: a constraint's token mask (bit t % 32 of word t / 32 set = token t
  // may be picked; tokens past the mask are not allowed); empty = no constraint.
  // Disallowed tokens get -inf before penalties, so every stage (greedy, top-k,
  // top-p, min-p, the draw, logprobs) sees only the allowed ones.
  // Precondition: the mask allows at least one token of the logits.
  SampleResult sample(std::span<const float> logits, std::span<const uint32_t> allowed = {});
  // Records a token produced elsewhere (e.g. forced) for the penalties.
  void accept(int32_t token);

  // Speculative decoding: verifies one draft token against logits [n_vocab]
  // by rejection sampling. The draft of an n-gram proposer is deterministic
  // (q is a point mass on it), so it is accepted with probability p(draft)
  // under the distribution sample() draws from (same penalties, top-k/p,
  // min-p, temperature); on rejection the token is drawn from p with the draft
  // removed, renormalised. Either way `token` is distributed as p. Greedy:
  // token = the argmax, accepted iff it is the draft (bitwise what sample()
  // picks). Records `token` as generated. No mask, no logprobs.
  struct VerifyResult {
    int32_t token = -1;
    bool accepted = false;  // token == draft
  };
  VerifyResult verify(std::span<const float> logits, int32_t draft);

  const SamplingParams& params() const { return params_; }
  const std::vector<int32_t>& generated() const { return generated_; }

 private:
  bool has_repetition_penalty() const;
  bool has_penalties() const;
  void apply_penalties(std::span<float> l);
  // work_ = logits, masked (allowed non-empty), biased (logit_bias) and penalised.
  void prepare(std::span<const float> logits, std::span<const uint32_t> allowed);
  bool greedy() const;
  // The sampling distribution over work_: cand_ (top-k/p, min-p survivors;
  // only allowed tokens when constrained) and probs_ (unnormalised softmax
  // weights at the temperature); returns their sum.
  double distribution(bool constrained);
  // One draw from cand_ / probs_ with total weight sum.
  int32_t draw(double sum);
  void ensure_vocab(size_t n_vocab);

  SamplingParams params_;
  Rng rng_;
  std::vector<int32_t> prompt_;           // repetition penalty only: seeds seen_ for each vocab size
  std::vector<int32_t> generated_;
  std::vector<int32_t> counts_;           // [n_vocab] times generated
  std::vector<uint8_t> seen_;             // [n_vocab] in prompt (repetition penalty only) or generated
  std::vector<float> work_;               // [n_vocab] processed logits
  std::vector<int32_t> cand_;             // candidate ids
  std::vector<float> probs_;              // candidate probabilities
};

// Argmax with ties broken towards the lowest id. Precondition: non-empty.
int32_t argmax(std::span<const float> logits);
// Does the mask allow any of the first n tokens?
bool mask_allows_any(std::span<const uint32_t> allowed, size_t n);

}  // namespace pagoda::sample
