// Continuous-batching scheduler over a KvManager.
//
// One rule replaces separate prefill and decode modes: every running request
// has num_computed_tokens catching up with its known tokens (prompt + outputs).
// schedule() hands out a token budget per step:
//   1. running requests with one token left (decodes), in admission order;
//   2. running requests with more (prefill chunks: a long prompt is split
//      across steps), in admission order;
//   3. waiting requests in FIFO order, while max_num_seqs and the budget allow
//      and the KvManager can allocate above its watermark. Prefix-cache hits
//      count as computed (the last token is always computed, for logits).
// When a running request cannot get a block, the most recently admitted
// running request is preempted by recompute: its blocks are freed (full ones
// stay cached), it goes to the FRONT of the waiting queue, and its outputs so
// far become part of its prompt on readmission. No admission happens in a step
// that preempted.
//
// In-flight prefix dedup: a waiting request whose first uncached full block is
// being computed by a running request (same key, not committed yet) is passed
// over, so the block is computed once and then hit; a request is passed over
// at most max_dedup_defer_steps steps in all, after which it computes the
// block itself. FIFO fairness: a waiting request is overtaken by requests
// behind it only in steps where it was deferred this way.
//
// The scheduler owns the request bookkeeping but not sampling. Each step the
// engine calls:
//   StepPlan plan = scheduler.schedule();
//   run plan (block_copies first, then the forward pass) and sample one token
//     for every ScheduledSeq with wants_logits;
//   auto done = scheduler.update(plan, outputs);   // one SeqOutput per wants_logits seq
// add_request / abort may be called between steps (abort also between
// schedule and update: update skips requests that are gone). Not thread-safe.
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/kv_manager.h"
#include "sched/request.h"
#include "sched/step_plan.h"

namespace pagoda::sched {

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;  // token budget per step
  int32_t max_num_seqs = 64;              // cap on running requests
  int32_t max_model_len = 2048;           // prompt + max_tokens limit
  int32_t max_dedup_defer_steps = 16;     // 0 disables in-flight prefix dedup
};

// The sampled result for one scheduled request (those with wants_logits).
struct SeqOutput {
  RequestId request_id = 0;
  TokenId token = -1;     // appended to the request's tokens when >= 0; -1 only with finished
  bool finished = false;  // stop condition met (EOS, stop string...): finish after this token
};

struct FinishedRequest {
  RequestId id = 0;
  FinishReason reason = FinishReason::kNone;
  int32_t num_prompt_tokens = 0;
  std::vector<TokenId> output_tokens;
  int32_t num_cached_tokens = 0;  // prefix-cache hit at first admission
  int32_t num_preemptions = 0;
};

struct SchedulerStats {
  int64_t num_steps = 0;
  int64_t num_admissions = 0;   // incl. readmissions after preemption
  int64_t num_preemptions = 0;
  int64_t num_deferrals = 0;    // request-steps passed over by in-flight dedup
  int64_t num_finished = 0;
  int64_t num_aborted = 0;
  int64_t num_rejected = 0;     // add_request errors
};

class Scheduler {
 public:
  // Precondition: kv outlives the scheduler and is used by nothing else.
  Scheduler(const SchedulerConfig& config, kv::KvManager* kv);

  // Queues a request. Errors (nothing queued): duplicate id, empty prompt,
  // max_tokens < 1, prompt + max_tokens > max_model_len, or more blocks than
  // the whole pool could ever give it.
  Status add_request(NewRequest r);
  // Frees everything of the request at once, in any state. False if unknown.
  bool abort(RequestId id);

  StepPlan schedule();
  // Applies a step's results: advances num_computed_tokens (committing full
  // blocks to the prefix cache), appends sampled tokens, finishes requests
  // (engine stop flag, max_tokens, max_model_len) and frees their blocks.
  // Precondition: outputs hold one entry for every still-known wants_logits seq.
  std::vector<FinishedRequest> update(const StepPlan& plan, std::span<const SeqOutput> outputs);

  bool has_unfinished() const { return !requests_.empty(); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // nullptr once finished or aborted (or never added).
  const Request* find(RequestId id) const;
  // Waiting queue front to back; running in admission order.
  std::vector<RequestId> waiting_ids() const { return {waiting_.begin(), waiting_.end()}; }
  const std::vector<RequestId>& running_ids() const { return running_; }
  const SchedulerConfig& config() const { return config_; }
  const SchedulerStats& stats() const { return stats_; }
  const kv::KvManager& kv() const { return *kv_; }

  // Scheduler-level invariants (queues vs states vs KvManager), then the
  // KvManager's. "" when all hold.
  std::string check_invariants() const;

 private:
  struct Slice {
    RequestId id;
    int32_t num_tokens;
    std::vector<kv::BlockCopy> copies;
  };
  bool schedule_running(Request& r, int32_t num_tokens, std::vector<Slice>* slices, int32_t* budget,
                        StepPlan* plan);
  void preempt(Request& r, std::vector<Slice>* slices, int32_t* budget, StepPlan* plan);
  void finish(Request& r, FinishReason reason, std::vector<FinishedRequest>* out);
  void erase_running(RequestId id);
  Request& req(RequestId id);

  SchedulerConfig config_;
  kv::KvManager* kv_;
  std::unordered_map<RequestId, Request> requests_;
  std::deque<RequestId> waiting_;
  std::vector<RequestId> running_;  // admission order
  uint64_t next_arrival_ = 0;
  SchedulerStats stats_;
};

}  // namespace pagoda::sched
