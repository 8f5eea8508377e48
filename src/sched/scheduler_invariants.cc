// Scheduler::check_invariants: queues vs request states vs the KvManager,
// checked by the tests after every step. See scheduler.h.
#include <unordered_set>

#include "sched/scheduler.h"

namespace pagoda::sched {

namespace {
unsigned long long ull(RequestId id) { return static_cast<unsigned long long>(id); }
}  // namespace

std::string Scheduler::check_invariants() const {
  if (num_seats() > config_.max_num_seqs) {
    return errorf("%zu running + their children to fork = %d > max_num_seqs %d", running_.size(), num_seats(),
                  config_.max_num_seqs)
        .message;
  }
  size_t num_pending = 0;
  for (const auto& [id, r] : requests_) {
    if (r.fork_ids.empty()) continue;
    if (r.num_output_tokens() != 0) return errorf("request %llu: outputs before its fork", ull(id)).message;
    for (RequestId c : r.fork_ids) {
      auto p = pending_children_.find(c);
      if (p == pending_children_.end() || p->second != id || requests_.count(c)) {
        return errorf("request %llu: child %llu not pending or already a request", ull(id), ull(c)).message;
      }
    }
    num_pending += r.fork_ids.size();
  }
  if (num_pending != pending_children_.size()) {
    return errorf("%zu pending children listed by requests, %zu recorded", num_pending, pending_children_.size())
        .message;
  }
  if (requests_.size() != running_.size() + waiting_.size()) {
    return errorf("%zu requests but %zu running + %zu waiting", requests_.size(), running_.size(), waiting_.size())
        .message;
  }
  if (kv_->num_seqs() != static_cast<int32_t>(running_.size())) {
    return errorf("kv holds %d sequences, %zu running", kv_->num_seqs(), running_.size()).message;
  }
  std::unordered_set<RequestId> seen;
  for (RequestId id : running_) {
    const Request* r = find(id);
    if (!r || r->state != RequestState::kRunning || !seen.insert(id).second) {
      return errorf("running request %llu missing, duplicated or not running", ull(id)).message;
    }
    if (!kv_->has_seq(id)) return errorf("running request %llu holds no KV blocks", ull(id)).message;
    // Between steps a running request has at least one token to compute (the
    // last one, for logits): the KvManager's count is behind the tokens.
    if (kv_->num_computed_tokens(id) >= r->num_tokens()) {
      return errorf("request %llu: running with %d of %d tokens computed", ull(id), kv_->num_computed_tokens(id),
                    r->num_tokens())
          .message;
    }
  }
  for (RequestId id : waiting_) {
    const Request* r = find(id);
    if (!r || (r->state != RequestState::kWaiting && r->state != RequestState::kPreempted) ||
        !seen.insert(id).second) {
      return errorf("waiting request %llu missing, duplicated or in state %s", ull(id),
                    r ? request_state_name(r->state) : "-")
          .message;
    }
    if (kv_->has_seq(id)) return errorf("waiting request %llu still holds KV blocks", ull(id)).message;
  }
  if (std::string e = kv_->check_invariants(); !e.empty()) return "kv: " + e;
  return "";
}

}  // namespace pagoda::sched
