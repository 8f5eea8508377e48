// Scheduler::update: a step's results applied. Computed tokens (committing
// full blocks to the prefix cache), verified drafts (the rejected ones rolled
// back), the fork of n > 1 children at the end of the prompt, the sampled
// tokens, and the end of each request its output says ends (SeqOutput::finish,
// decided by the caller: engine/finish.h). See scheduler.h.
#include <algorithm>

#include "base/check.h"
#include "sched/scheduler.h"

namespace pagoda::sched {

namespace {
unsigned long long ull(RequestId id) { return static_cast<unsigned long long>(id); }
}  // namespace

void Scheduler::finish(Request& r, FinishReason reason, std::vector<FinishedRequest>* out) {
  FinishedRequest f;
  f.id = r.id;
  f.reason = reason;
  f.num_prompt_tokens = r.num_prompt_tokens;
  f.output_tokens.assign(r.tokens.begin() + r.num_prompt_tokens, r.tokens.end());
  f.num_cached_tokens = std::max(0, r.num_cached_tokens);
  f.num_preemptions = r.num_preemptions;
  kv_->free(r.id);
  erase_running(r.id);
  ++stats_.num_finished;
  const RequestId id = r.id;
  requests_.erase(id);  // r dangles from here
  out->push_back(std::move(f));
}

namespace {
const SeqOutput& output_of(RequestId id, std::span<const SeqOutput> outputs) {
  for (const SeqOutput& o : outputs) {
    if (o.request_id == id) return o;
  }
  PAGODA_CHECK_MSG(false, "request %llu: no output for a step that wanted logits", ull(id));
  return outputs[0];  // unreachable
}
}  // namespace

void Scheduler::apply_output(Request& r, const SeqOutput& out, std::vector<FinishedRequest>* done) {
  PAGODA_CHECK_MSG(out.token >= 0 || out.finish != FinishReason::kNone, "request %llu: no token and no finish",
                   ull(r.id));
  if (out.token >= 0) r.tokens.push_back(out.token);
  if (out.finish != FinishReason::kNone) return finish(r, out.finish, done);
  // The caller decides every finish, "length" included: a request it lets go on has room for a token.
  PAGODA_CHECK_MSG(r.num_output_tokens() < r.max_tokens && r.num_tokens() < config_.max_model_len,
                   "request %llu: %d outputs of max_tokens %d, %d tokens of max_model_len %d, and no finish",
                   ull(r.id), r.num_output_tokens(), r.max_tokens, r.num_tokens(), config_.max_model_len);
}

void Scheduler::fork_children(Request& parent, std::span<const SeqOutput> outputs,
                              std::vector<FinishedRequest>* done) {
  // parent.fork_ids, not the plan's: a child aborted since schedule() is gone.
  const std::vector<RequestId> ids = std::move(parent.fork_ids);
  parent.fork_ids.clear();
  for (RequestId cid : ids) {
    Status st = kv_->fork(parent.id, cid);
    PAGODA_CHECK_MSG(st.ok(), "request %llu: fork into %llu: %s", ull(parent.id), ull(cid), st.message().c_str());
    Request c;
    c.id = cid;
    c.tokens = parent.tokens;  // the prompt: the parent's first token is appended after the fork
    c.num_prompt_tokens = parent.num_prompt_tokens;
    c.max_tokens = parent.max_tokens;
    c.cache_salt = parent.cache_salt;
    c.priority = parent.priority;
    c.arrival = parent.arrival;
    c.state = RequestState::kRunning;  // its computed tokens and keys came with kv_->fork
    c.num_cached_tokens = parent.num_cached_tokens;
    c.prefix_miss = parent.prefix_miss;
    c.num_preemptions = parent.num_preemptions;
    c.forked_from = parent.id;
    pending_children_.erase(cid);
    requests_.emplace(cid, std::move(c));  // references into requests_ stay valid (node-based map)
    running_.push_back(cid);
    ++stats_.num_forks;
  }
  for (RequestId cid : ids) apply_output(req(cid), output_of(cid, outputs), done);
}

std::vector<FinishedRequest> Scheduler::update(const StepPlan& plan, std::span<const SeqOutput> outputs) {
  std::vector<FinishedRequest> done;
  for (const ScheduledSeq& seq : plan.seqs) {
    auto it = requests_.find(seq.request_id);
    if (it == requests_.end()) continue;  // aborted after schedule()
    Request& r = it->second;
    PAGODA_CHECK_MSG(r.state == RequestState::kRunning && kv_->num_computed_tokens(r.id) == seq.start_pos,
                     "request %llu: update for a plan it is not in", ull(r.id));
    if (seq.num_draft_tokens > 0) {
      // Verified drafts join the tokens and count as computed; the slots of
      // the rejected ones go back, so they never reach the prefix cache.
      const SeqOutput& out = output_of(r.id, outputs);
      const auto k = static_cast<size_t>(seq.num_draft_tokens);
      const auto drafts = std::span<const TokenId>(seq.token_ids).last(k);
      PAGODA_CHECK_MSG(out.accepted.size() <= k && std::equal(out.accepted.begin(), out.accepted.end(), drafts.begin()),
                       "request %llu: accepted tokens are not a prefix of its drafts", ull(r.id));
      r.tokens.insert(r.tokens.end(), out.accepted.begin(), out.accepted.end());
      const int32_t computed = seq.start_pos + 1 + static_cast<int32_t>(out.accepted.size());
      kv_->mark_computed(r.id, r.tokens, computed);
      const bool truncated = kv_->truncate(r.id, computed);
      PAGODA_CHECK_MSG(truncated, "request %llu: rollback of rejected drafts failed", ull(r.id));
      apply_output(r, out, &done);
      continue;
    }
    kv_->mark_computed(r.id, r.tokens, seq.start_pos + static_cast<int32_t>(seq.token_ids.size()));
    if (!seq.wants_logits) continue;
    // Fork before the parent's token is appended: the children share the prompt only.
    if (!r.fork_ids.empty()) fork_children(r, outputs, &done);
    apply_output(r, output_of(r.id, outputs), &done);
  }
  return done;
}

}  // namespace pagoda::sched
