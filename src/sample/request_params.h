// The parameters of one generation request: the contract between the API layer
// (openai/ parses a body into it), the engine (engine::RequestParams is this type)
// and, through the engine, the scheduler and the KV manager. Plain data; it lives
// here, below engine/ and openai/, so that request parsing needs no engine.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sample/params.h"

namespace pagoda::grammar { class CompiledGrammar; }

namespace pagoda::sample {

struct RequestParams {
  std::vector<int32_t> prompt;       // token ids (BOS included if wanted)
  int max_tokens = 16;
  float temperature = 1.0f;          // 0: greedy
  int top_k = 0;                     // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  bool has_seed = false;
  // Stop strings (text-level): shared, immutable; copies of these params (one
  // per prompt in the server) and every choice point at the same list.
  sample::StopStrings stop;
  bool ignore_eos = false;
  // Parallel samples: the prompt is prefilled once, then forked into n choices
  // sharing its KV blocks (copy-on-write). Choice i samples with seed + i (the
  // seed drawn from the engine's stream when !has_seed), so with a seed it gives
  // the tokens of a lone n = 1 request with seed + i. n <= max_num_seqs.
  int n = 1;
  int logprobs = -1;                 // -1: off; k >= 0: chosen token logprob + top-k alternatives
  std::string cache_salt;            // tenant isolation for the prefix cache
  // OpenAI's logit_bias: (token id, bias) added to the logits before sampling
  // (sample::SamplingParams::logit_bias); ids outside the vocabulary are refused.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Teacher forcing: output token i < forced_tokens.size() is forced_tokens[i]
  // whatever the sampler would pick (the sampler still records it, so penalties
  // count it); the event carries the greedy pick in `argmax`. Not with logprobs.
  std::vector<int32_t> forced_tokens;
  bool return_logits = false;        // copy each step's logits row into TokenEvent::logits
  // Structured output (grammar/): every generated token keeps the output a
  // prefix of the grammar's language; end-of-generation only where it is
  // complete, and the choice finishes with kStop as soon as nothing else may
  // follow. Shared by every request with the same constraint (its token masks
  // are cached inside); each choice owns a Matcher. Prompt tokens are not
  // constrained. Built over this engine's tokenizer (vocabulary checked); not
  // with forced_tokens. nullptr: unconstrained, at no cost.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // Scheduling priority (vLLM's `priority`): lower is served first. Used only
  // with EngineConfig::scheduling_policy == "priority"; 0 under fcfs.
  int priority = 0;
  // Cache retention (Anthropic cache_control, OpenAI prompt_cache_retention):
  // keep the prompt's first `pin_tokens` tokens (whole blocks of them) out of
  // eviction for `pin_ttl_s` seconds after this request last touched them.
  // 0 tokens: no pin (ordinary LRU caching).
  int32_t pin_tokens = 0;
  double pin_ttl_s = 0;
};

}  // namespace pagoda::sample
