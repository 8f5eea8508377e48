// Continuous-batching scheduler over a KvManager.
//
// One rule replaces separate prefill and decode modes: every running request
// has num_computed_tokens catching up with its known tokens (prompt + outputs).
// The scheduler owns the tokens; the KvManager owns everything about the cache
// (block table, computed count, block keys) and is asked, never mirrored.
// schedule() hands out a token budget per step:
//   1. running requests with one token left (decodes), in admission order;
//   2. running requests with more (prefill chunks: a long prompt is split
//      across steps), in admission order;
//   3. waiting requests in FIFO order, while max_num_seqs and the budget allow
//      and the KvManager can allocate above its watermark, keeping free what
//      the rest of each admitted prompt's prefill can take (KvManager::
//      can_allocate's target_tokens = its known tokens). Prefix-cache hits
//      count as computed (the last token is always computed, for logits).
//      Each admission walks the prefix cache once (KvManager::match_prefix):
//      the match decides the dedup check and the chunk, can_allocate turns it
//      into the Admission that allocate consumes, with no change to the
//      KvManager in between.
// Hybrid models with state checkpoints (kv/state_checkpoint.cc): a prefill
// chunk (2 and 3) ends at the latest checkpoint boundary inside it
// (KvManager::checkpoint_chunk), or first at the last boundary of the prefix
// it pins (so that the pin holds a checkpoint), so the state there exists at a step's end; an
// admission whose hit ends at a checkpoint carries the copies restoring it
// (KvManager::allocate) in its slice's block copies.
// Steps 2-3 share what the decodes leave of the budget; with auto_budget, at
// most auto_prefill_budget of it (sched/step_cost.h: a step with prefill stays
// within a multiple of a pure decode step's measured time, and advances at
// least a minimum chunk), so a wave of arrivals does not stall running streams.
// When a running request cannot get a block, the most recently admitted
// running request is preempted by recompute: its blocks are freed (full ones
// stay cached), it goes to the FRONT of the waiting queue, and its outputs so
// far become part of its prompt on readmission. No admission happens in a step
// that preempted.
//
// n > 1 sampling (NewRequest::fork_ids): the request prefills its prompt once.
// The slice that completes the prompt carries the children's ids
// (ScheduledSeq::fork_ids); in update() the request forks into them through
// KvManager::fork, so every child shares all prompt blocks, the partial last
// block included, and each gets its first token from the same logits row. The
// shared partial block is copied on the first write (append_slots' copy-on-
// write, executed through StepPlan::block_copies before the forward pass).
// From then on a child is an ordinary running request: it finishes, aborts
// and is preempted on its own (a preempted child recomputes its prompt and its
// own outputs, with prefix-cache hits on the prompt's full blocks). Admission
// counts the group: 1 + children seats against max_num_seqs, and one free
// block per child (for its first decode's copy-on-write or new block) on top
// of the KvManager's watermark.
//
// Admission order (SchedulerConfig::policy): kFcfs takes the waiting queue in
// order. kLpm (longest prefix match, as SGLang's cache-aware policy) takes
// preempted requests first, then requests overtaken in max_lpm_overtake_steps
// steps already (in queue order), then the rest by most prefix-cache hit
// tokens first (queue order among equals): requests whose prompt is mostly
// cached get their first token after a short prefill instead of queueing
// behind long cold prompts. A request is "overtaken" in a step when it is not
// admitted while one behind it in the queue is.
//
// kPriority (vLLM's --scheduling-policy priority; scheduler_priority.cc):
// admission takes the lowest priority value first (ties by arrival, preempted
// requests keep theirs); the victim of a preemption is the running request
// with the worst priority (highest value, latest arrival); and a waiting
// request that does not fit (seats or blocks) preempts running requests of a
// strictly worse priority, worst first, until it fits (never one admitted in
// the same step). Eviction prefers cached blocks last released by
// worse-priority requests (eviction_class), LRU within a class.
//
// Pins (issue 36): a request with pin_tokens asks the KvManager to pin its
// prompt's prefix at each admission (KvManager::pin_prefix); expired pins are
// released at the start of every schedule(); and when a waiting request does
// not fit while nothing runs, pins are released oldest first until it does
// (pins never deadlock an accepted request).
//
// In-flight prefix dedup: a waiting request whose first uncached full block is
// being computed by a running request (same key, not committed yet) is passed
// over, so the block is computed once and then hit; a request is passed over
// at most max_dedup_defer_steps steps in all, after which it computes the
// block itself. FIFO fairness: a waiting request is overtaken by requests
// behind it only in steps where it was deferred this way. Off when the
// KvManager does not cache prefixes (a deferred request could never hit).
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
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "kv/kv_manager.h"
#include "sched/request.h"
#include "sched/step_cost.h"
#include "sched/step_plan.h"

namespace pagoda::sched {

// Order in which waiting requests are considered for admission.
enum class SchedulePolicy {
  kFcfs,  // arrival order (preempted requests first)
  kLpm,   // longest cached prefix first (SGLang's "lpm"), bounded overtaking
  kPriority,  // lowest Request::priority first, ties by arrival (scheduler_priority.cc)
};
const char* schedule_policy_name(SchedulePolicy p);
// kPriority: the KvManager eviction class of a request's blocks (higher is
// evicted sooner): 0 for priority < 0, 1 for 0, 2 for 1..9, 3 for 10..99, 4
// for 100 and more. Blocks that hold no prefix go to kNumEvictionClasses - 1.
inline constexpr int32_t kNumEvictionClasses = 6;
int32_t eviction_class(int32_t priority);

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;  // token budget per step
  int32_t max_num_seqs = 64;              // cap on running requests
  int32_t max_model_len = 2048;           // prompt + max_tokens limit (the context length)
  int32_t vocab_size = 0;                 // prompt token ids must be in [0, vocab_size); 0: no upper bound
  int32_t max_dedup_defer_steps = 16;     // 0 disables in-flight prefix dedup
  SchedulePolicy policy = SchedulePolicy::kFcfs;
  int32_t max_lpm_overtake_steps = 16;    // kLpm: steps a request may be overtaken before it goes first
  // --max-num-batched-tokens auto (sched/step_cost.h): after the decodes, prefill
  // chunks and admissions get auto_prefill_budget(step_cost(), auto_budget, decode
  // tokens, max_num_batched_tokens) tokens, so running streams keep their
  // inter-token latency when a wave arrives; max_num_batched_tokens stays the
  // hard cap. false: prefill gets all the cap leaves (a fixed budget).
  bool auto_budget = false;
  AutoBudgetConfig auto_budget_config = {};
};

// The sampled result for one scheduled request (those with wants_logits).
struct SeqOutput {
  RequestId request_id = 0;
  TokenId token = -1;  // appended to the request's tokens when >= 0; -1 only with a finish
  // Why the request ends after this token (kNone: it goes on), decided by the
  // caller (the engine: engine/finish.h), max_tokens and the context included:
  // the scheduler ends the request with this reason and decides none itself.
  FinishReason finish = FinishReason::kNone;
  // A slice with draft tokens: the verified prefix of its drafts, appended
  // (and counted computed) before `token`, the bonus or correction token.
  std::vector<TokenId> accepted = {};
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
  int64_t num_forks = 0;        // children created by fork (n > 1)
  // auto_budget: steps whose prefill used all of an auto budget that was lower
  // than what the cap left (prefill held back to keep the step-time target).
  int64_t num_budget_capped_steps = 0;
};

class Scheduler {
 public:
  // Precondition: kv outlives the scheduler and is used by nothing else.
  Scheduler(const SchedulerConfig& config, kv::KvManager* kv);

  // Queues a request. The one place a request is validated: every error is
  // the client's (HTTP 400), names the numbers and no internal id, and queues
  // nothing. In order: an empty prompt, a token id outside the vocabulary,
  // max_tokens < 1, a group (1 + fork_ids) larger than max_num_seqs, prompt +
  // max_tokens > max_model_len, more blocks than the whole pool could ever
  // give it, a group the pool cannot admit (prompt blocks + one per child).
  // A duplicate id (also among fork_ids and pending children) is the
  // caller's bug, reported with the id.
  Status add_request(NewRequest r);
  // add_request's checks alone: whether it would accept r now. Changes nothing
  // (the engine holds a request waiting for tier loads before queueing it).
  Status check_request(const NewRequest& r) const;
  // Frees everything of the request at once, in any state. A parent not yet
  // forked takes its pending children with it; a pending child id is dropped
  // from its parent's fork. Forked children are independent requests: abort
  // each id of a group to abort the group. False if unknown.
  bool abort(RequestId id);

  // Speculative decoding: proposes `draft` to follow the running request's
  // known tokens in the next schedule() only. A decode slice then carries
  // [last token, drafts...] (ScheduledSeq::num_draft_tokens), capped so the
  // step stays within the token budget, max_tokens and max_model_len, and
  // dropped when the pool lacks the slots (a draft never preempts). Slots of
  // rejected drafts are rolled back in update() (KvManager::truncate), so
  // only verified tokens are ever computed or committed to the prefix cache.
  // False (nothing kept) for an unknown or not running request.
  bool set_draft(RequestId id, std::span<const TokenId> draft);

  StepPlan schedule();
  // The measured forward time of a step of num_tokens tokens (the engine calls
  // it after each forward; tests feed fixed numbers). Read by auto_budget and
  // by speculative decoding's draft lengths.
  void record_step_time(int32_t num_tokens, double ms) { step_cost_.record(num_tokens, ms); }
  const StepCostModel& step_cost() const { return step_cost_; }
  // Applies a step's results: advances num_computed_tokens (committing full
  // blocks to the prefix cache), appends sampled tokens, ends the requests whose
  // output has a finish (with that reason) and frees their blocks.
  // Preconditions: outputs hold one entry for every still-known wants_logits
  // seq; an output without a finish leaves room for one more token (below
  // max_tokens outputs and max_model_len tokens: the caller ends a request at
  // its limits, with kLength), else the scheduler stops the process.
  std::vector<FinishedRequest> update(const StepPlan& plan, std::span<const SeqOutput> outputs);

  bool has_unfinished() const { return !requests_.empty(); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // nullptr once finished or aborted (or never added), and for a child not forked yet.
  const Request* find(RequestId id) const;
  // Tokens of a running request whose K/V are in the cache (the KvManager's
  // count, the only one); 0 for a waiting or unknown request.
  int32_t num_computed_tokens(RequestId id) const;
  // Waiting queue front to back; running in admission order.
  std::vector<RequestId> waiting_ids() const { return {waiting_.begin(), waiting_.end()}; }
  const std::vector<RequestId>& running_ids() const { return running_; }
  const SchedulerConfig& config() const { return config_; }
  const SchedulerStats& stats() const { return stats_; }
  const kv::KvManager& kv() const { return *kv_; }

  // Scheduler-level invariants (queues vs states vs KvManager), then the
  // KvManager's. "" when all hold.
  std::string check_invariants() const;

  // Preempts every running request (last admitted first, so the waiting queue
  // keeps their admission order at its front): they release their blocks and
  // recompute on readmission, their outputs kept. For reset_prefix_cache.
  // Call between steps. Returns how many.
  int32_t preempt_all();
  // Waiting and running requests per priority (kPriority; every request counts
  // as priority 0 under the other policies): fills the two maps' counts.
  void count_by_priority(std::vector<std::pair<int32_t, int32_t>>* waiting,
                         std::vector<std::pair<int32_t, int32_t>>* running) const;

 private:
  struct Candidate {
    RequestId id;
    // kLpm: the prefix lookup made for the ordering, reused (revalidated) by
    // admission; kFcfs: none, admission looks up when it reaches the request.
    std::optional<kv::PrefixMatch> match;
  };
  // The waiting requests in the order admission considers them (config_.policy).
  std::vector<Candidate> admission_order() const;
  struct Slice {
    RequestId id;
    int32_t num_tokens;
    std::vector<kv::BlockCopy> copies;
    int32_t num_draft = 0;  // of num_tokens, draft tokens after the one real token
  };
  // auto_budget: lowers *budget (what the cap leaves after decode_tokens) to the prefill budget.
  void limit_prefill(int32_t decode_tokens, int32_t* budget);
  // Draft tokens a decode of r may carry this step with `budget` tokens left.
  int32_t draft_len(const Request& r, int32_t budget) const;
  bool schedule_running(Request& r, int32_t num_tokens, std::vector<Slice>* slices, int32_t* budget,
                        StepPlan* plan, int32_t num_draft = 0);
  void preempt(Request& r, std::vector<Slice>* slices, int32_t* budget, StepPlan* plan);
  // The running request a memory preemption takes: the last admitted, or with
  // kPriority the worst priority (highest value, then latest arrival).
  RequestId pick_victim() const;
  // kPriority: preempts the worst running request whose priority is worse than
  // w's and that was not admitted this step; false when there is none.
  bool preempt_for(const Request& w, const std::unordered_set<RequestId>& admitted, std::vector<Slice>* slices,
                   int32_t* budget, StepPlan* plan);
  // kPriority's admission order (stable: by priority, then arrival).
  void sort_by_priority(std::vector<Candidate>* order) const;
  void finish(Request& r, FinishReason reason, std::vector<FinishedRequest>* out);
  // Appends out's token to r and ends r when out says so.
  void apply_output(Request& r, const SeqOutput& out, std::vector<FinishedRequest>* done);
  // Creates parent's pending children, sharing its blocks, at the end of its prompt.
  void fork_children(Request& parent, std::span<const SeqOutput> outputs, std::vector<FinishedRequest>* done);
  // Running requests plus the children they will fork: the seats held against max_num_seqs.
  int32_t num_seats() const;
  void erase_running(RequestId id);
  Request& req(RequestId id);

  SchedulerConfig config_;
  kv::KvManager* kv_;
  std::unordered_map<RequestId, Request> requests_;
  std::deque<RequestId> waiting_;
  std::vector<RequestId> running_;  // admission order (children: at their fork)
  std::unordered_map<RequestId, RequestId> pending_children_;  // child id not forked yet -> parent
  uint64_t next_arrival_ = 0;
  SchedulerStats stats_;
  StepCostModel step_cost_;
  bool prefill_limited_ = false;  // this schedule(): the auto budget lowered prefill's share
};

}  // namespace pagoda::sched
