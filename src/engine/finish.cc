#include "engine/finish.h"

#include <algorithm>

namespace pagoda::engine {

FinishRule::FinishRule(const sample::SamplingParams& params, const tok::Tokenizer& tok, int32_t num_prompt,
                       int32_t context_length)
    : eog_ids_(tok.eog_ids()),
      stop_token_ids_(params.stop_token_ids),
      ignore_eos_(params.ignore_eos),
      max_tokens_(params.max_tokens),
      num_prompt_(num_prompt),
      context_length_(context_length),
      detok_(tok),
      stop_(params.stop) {}

FinishReason FinishRule::accept(int32_t token, int32_t n_output, bool grammar_done, std::string* text) {
  auto has = [token](std::span<const int32_t> ids) { return std::find(ids.begin(), ids.end(), token) != ids.end(); };
  // 1. A stop token: the request ends on it, and its text is not part of the output.
  if (has(stop_token_ids_) || (!ignore_eos_ && has(eog_ids_))) return FinishReason::kStop;
  // 2. Its text completes a stop string.
  *text += stop_.push(detok_.push(token));
  if (stop_.stopped()) return FinishReason::kStop;
  // 3. The constraint is complete: nothing may follow.
  if (grammar_done) return FinishReason::kStop;
  // 4. No room for another token.
  const bool max_tokens = max_tokens_ > 0 && n_output >= max_tokens_;
  const bool context_full = context_length_ > 0 && static_cast<int64_t>(num_prompt_) + n_output >= context_length_;
  return max_tokens || context_full ? FinishReason::kLength : FinishReason::kNone;
}

std::string FinishRule::flush() {
  if (stop_.stopped()) return {};
  std::string out = stop_.push(detok_.flush());
  out += stop_.flush();
  return out;
}

}  // namespace pagoda::engine
