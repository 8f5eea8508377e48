// The scheduler's decision for one engine step, as plain data. plan/ turns it
// (with the KV manager's block tables) into a kernels::BatchView; sim/ feeds it
// to a cost model instead. No pointers into the scheduler survive the step.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace pagoda::sched {

using RequestId = uint64_t;
using BlockId = int32_t;

struct ScheduledSeq {
  RequestId request_id = 0;
  int32_t start_pos = 0;              // == num_computed_tokens before this step
  std::vector<int32_t> token_ids;     // the new tokens computed this step (positions start_pos..)
  std::vector<BlockId> block_ids;     // the sequence's whole block table after allocation (KV group 0)
  // KV groups 1.. (kv::KvManager groups; empty with one group): each a whole
  // table of the same length as block_ids, window groups with the null block 0
  // before their window.
  std::vector<std::vector<BlockId>> group_block_ids;
  bool wants_logits = false;          // true when this slice reaches the end of the known tokens
  // n > 1 sampling: non-empty only on the slice that completes the prompt of a
  // request with more than one choice. After this step the request forks into
  // these child requests, which share all its blocks (KvManager::fork). The
  // slice's one logits row is sampled once per id: request_id, then fork_ids
  // in order, each with its own sampler; SeqOutputs come for all of them.
  std::vector<RequestId> fork_ids;
  // Speculative decoding: the last num_draft_tokens of token_ids are draft
  // tokens (Scheduler::set_draft) after the one real token of a decode. The
  // step computes logits at all 1 + num_draft_tokens positions (wants_logits
  // is set); the engine verifies the drafts against them and reports the
  // accepted prefix in SeqOutput::accepted. 0: an ordinary slice.
  int32_t num_draft_tokens = 0;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  // Copy-on-write block copies to perform before the forward pass (src, dst).
  std::vector<std::pair<BlockId, BlockId>> block_copies;
  std::vector<RequestId> preempted;   // requests preempted while building this step
  // Waiting requests passed over this step because a running request is computing
  // their next prefix block (in-flight prefix dedup). Informational; the runner ignores it.
  std::vector<RequestId> deferred;
  int32_t num_tokens() const {
    int32_t n = 0;
    for (const auto& s : seqs) n += static_cast<int32_t>(s.token_ids.size());
    return n;
  }
};

}  // namespace pagoda::sched
