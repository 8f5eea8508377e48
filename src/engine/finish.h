// The one place a generated token's finish reason is decided (issue 34).
//
// Every sampled (or forced, or verified) token of a choice goes through its
// FinishRule::accept, which says whether the request ends after it and why; the
// engine hands that reason to the scheduler with the token (sched::SeqOutput::
// finish) and the scheduler only ends the request it is told to end, with that
// reason, which comes back on the TokenEvent unchanged. The other ends are not a
// token's: the caller's abort (Engine::abort: gone at once, no event) and the
// engine's errors (a failed forward pass, a constraint that allows no token;
// FinishReason::kError, decided where they happen).
//
// Rules, the first that holds wins (so a stop on the max_tokens-th token is kStop):
//   1. a stop token id (even with ignore_eos) or an end-of-generation token
//      (unless ignore_eos): kStop; the token's text is not shown;
//   2. a stop string completed by the token's text: kStop; the text before the
//      stop string is shown, the stop string and what follows are not;
//   3. the constrained output is complete and nothing may follow (grammar_done):
//      kStop, without spending a step on the end-of-generation token;
//   4. max_tokens outputs, or prompt + outputs fill the context: kLength.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/generation.h"
#include "sample/params.h"
#include "sample/stop.h"
#include "tok/detokenizer.h"

namespace pagoda::engine {

class FinishRule {
 public:
  // params: stop_token_ids, ignore_eos, stop and max_tokens (<= 0: no limit) are
  // read; end-of-generation tokens are tok's (Tokenizer::eog_ids). context_length:
  // prompt + outputs may not exceed it (<= 0: no limit). tok outlives the rule.
  FinishRule(const sample::SamplingParams& params, const tok::Tokenizer& tok, int32_t num_prompt,
             int32_t context_length);

  // `token` became output number n_output (counting it). Returns why the choice
  // ends after it (kNone: it goes on) and appends the text it lets show to *text.
  // grammar_done: the choice's constraint is complete after the token.
  // Precondition: no earlier token ended the choice.
  FinishReason accept(int32_t token, int32_t n_output, bool grammar_done, std::string* text);
  // When the choice ends (for any reason): the text still held back (bytes of an
  // unfinished character, a tail that could have begun a stop string); "" after
  // a stop string.
  std::string flush();

 private:
  std::span<const int32_t> eog_ids_;
  std::vector<int32_t> stop_token_ids_;
  bool ignore_eos_ = false;
  int32_t max_tokens_ = 0;      // <= 0: no limit
  int32_t num_prompt_ = 0;
  int32_t context_length_ = 0;  // <= 0: no limit
  tok::IncrementalDetokenizer detok_;
  sample::StopStringFilter stop_;
};

}  // namespace pagoda::engine
