// A request as the scheduler tracks it: token lists and progress, no sampling
// state. Its cache state (block table, computed tokens, block keys) is the
// KvManager's, under the request id: Scheduler::num_computed_tokens asks it. States: waiting -> running -> (preempted -> waiting) -> finished | aborted.
// A child of n > 1 sampling starts in running, forked from its parent's blocks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/generation.h"
#include "kv/prefix_miss.h"
#include "sched/step_plan.h"

namespace pagoda::sched {

using TokenId = int32_t;

enum class RequestState : uint8_t {
  kWaiting,    // in the waiting queue, never admitted yet
  kRunning,    // holds KV blocks, scheduled every step it gets budget
  kPreempted,  // in the waiting queue after preemption by recompute
  kFinished,
  kAborted,
};
const char* request_state_name(RequestState s);

// The one FinishReason (base/generation.h). The scheduler ends a request with
// the reason its SeqOutput carries and decides none itself (engine/finish.h does).
using FinishReason = pagoda::FinishReason;

struct NewRequest {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  int32_t max_tokens = 16;  // >= 1
  std::string cache_salt;   // tenant isolation for the prefix cache ("" = shared)
  // n > 1 sampling: ids of choices 1..n-1 (this request is choice 0). They are
  // created when the prompt is computed, by forking this request's KV blocks,
  // and then live as ordinary requests. Empty for n == 1.
  std::vector<RequestId> fork_ids;
  // kPriority scheduling: lower is served first (vLLM's priority); ignored by the other policies.
  int32_t priority = 0;
  // Pin the prompt's first pin_tokens tokens (whole blocks) for pin_ttl_s
  // seconds from their last touch once committed (KvManager::pin_prefix). 0: none.
  int32_t pin_tokens = 0;
  double pin_ttl_s = 0;
};

struct Request {
  RequestId id = 0;
  std::vector<TokenId> tokens;  // prompt, then the outputs so far
  int32_t num_prompt_tokens = 0;
  int32_t max_tokens = 0;
  std::string cache_salt;
  uint64_t arrival = 0;  // order of add_request
  int32_t priority = 0;   // see NewRequest
  int32_t pin_tokens = 0;
  double pin_ttl_s = 0;
  RequestState state = RequestState::kWaiting;
  int32_t num_cached_tokens = -1;   // prefix-cache hit at first admission (-1: not admitted yet)
  kv::PrefixMiss prefix_miss;        // why the hit at first admission ended there (kv/prefix_miss.h)
  int32_t num_preemptions = 0;
  int32_t deferred_steps = 0;        // steps passed over for in-flight prefix dedup
  int32_t overtaken_steps = 0;       // kLpm: steps in which a request behind it was admitted first
  std::vector<RequestId> fork_ids;   // children still to fork at the end of the prompt (see NewRequest)
  RequestId forked_from = 0;         // a child: the request whose blocks it got by fork (0: none)
  // Speculative decoding: tokens proposed to follow `tokens`, set by
  // Scheduler::set_draft for the next schedule() only (which clears it).
  std::vector<TokenId> draft;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
};

}  // namespace pagoda::sched
