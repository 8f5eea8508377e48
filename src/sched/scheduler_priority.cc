// Scheduler's priority policy (kPriority, issue 36) and preempt_all: the
// admission order, the preemption victim and preemption on behalf of a
// better waiting request. See scheduler.h ("kPriority").
#include <algorithm>
#include <map>

#include "base/check.h"
#include "sched/scheduler.h"

namespace pagoda::sched {

namespace {
// Worse = higher priority value, then later arrival.
bool worse(const Request& a, const Request& b) {
  return a.priority != b.priority ? a.priority > b.priority : a.arrival > b.arrival;
}
}  // namespace

int32_t eviction_class(int32_t priority) {
  if (priority < 0) return 0;
  if (priority == 0) return 1;
  if (priority < 10) return 2;
  if (priority < 100) return 3;
  return 4;
}

RequestId Scheduler::pick_victim() const {
  PAGODA_CHECK(!running_.empty());
  if (config_.policy != SchedulePolicy::kPriority) return running_.back();
  RequestId victim = running_.back();
  for (RequestId id : running_) {
    if (worse(requests_.at(id), requests_.at(victim))) victim = id;
  }
  return victim;
}

bool Scheduler::preempt_for(const Request& w, const std::unordered_set<RequestId>& admitted,
                            std::vector<Slice>* slices, int32_t* budget, StepPlan* plan) {
  const Request* victim = nullptr;
  for (RequestId id : running_) {
    const Request& r = requests_.at(id);
    if (admitted.count(id) || r.priority <= w.priority) continue;
    if (!victim || worse(r, *victim)) victim = &r;
  }
  if (!victim) return false;
  preempt(req(victim->id), slices, budget, plan);
  return true;
}

void Scheduler::sort_by_priority(std::vector<Candidate>* order) const {
  std::stable_sort(order->begin(), order->end(), [&](const Candidate& a, const Candidate& b) {
    const Request& ra = requests_.at(a.id);
    const Request& rb = requests_.at(b.id);
    return ra.priority != rb.priority ? ra.priority < rb.priority : ra.arrival < rb.arrival;
  });
}

int32_t Scheduler::preempt_all() {
  const auto n = static_cast<int32_t>(running_.size());
  std::vector<Slice> slices;
  int32_t budget = 0;
  StepPlan plan;
  while (!running_.empty()) preempt(req(running_.back()), &slices, &budget, &plan);
  return n;
}

void Scheduler::count_by_priority(std::vector<std::pair<int32_t, int32_t>>* waiting,
                                  std::vector<std::pair<int32_t, int32_t>>* running) const {
  std::map<int32_t, int32_t> w, r;
  for (RequestId id : waiting_) ++w[requests_.at(id).priority];
  for (RequestId id : running_) ++r[requests_.at(id).priority];
  waiting->assign(w.begin(), w.end());
  running->assign(r.begin(), r.end());
}

}  // namespace pagoda::sched
