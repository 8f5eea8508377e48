#include "sched/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "base/check.h"

namespace pagoda::sched {

const char* request_state_name(RequestState s) {
  switch (s) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kRunning: return "running";
    case RequestState::kPreempted: return "preempted";
    case RequestState::kFinished: return "finished";
    case RequestState::kAborted: return "aborted";
  }
  return "?";
}

const char* schedule_policy_name(SchedulePolicy p) {
  switch (p) {
    case SchedulePolicy::kFcfs: return "fcfs";
    case SchedulePolicy::kLpm: return "lpm";
    case SchedulePolicy::kPriority: return "priority";
  }
  return "?";
}

namespace {
unsigned long long ull(RequestId id) { return static_cast<unsigned long long>(id); }
// The tokens a request pins, for KvManager::checkpoint_chunk's cut (0: no pin).
int32_t pin_cut(const Request& r) { return r.pin_ttl_s > 0 ? r.pin_tokens : 0; }
using KeySet = std::unordered_set<Hash128, Hash128Hasher>;
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvManager* kv) : config_(config), kv_(kv) {
  PAGODA_CHECK(kv != nullptr);
  PAGODA_CHECK(config.max_num_batched_tokens >= 1 && config.max_num_seqs >= 1 && config.max_model_len >= 1);
}

Request& Scheduler::req(RequestId id) {
  auto it = requests_.find(id);
  PAGODA_CHECK_MSG(it != requests_.end(), "unknown request %llu", ull(id));
  return it->second;
}

const Request* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

int32_t Scheduler::num_computed_tokens(RequestId id) const {
  return kv_->has_seq(id) ? kv_->num_computed_tokens(id) : 0;
}

Status Scheduler::check_request(const NewRequest& r) const {
  auto reject = [](Error e) { return Status(std::move(e)); };
  // The caller's ids first: a clash is a bug in the caller, not the client's input.
  auto in_use = [&](RequestId id) { return requests_.count(id) != 0 || pending_children_.count(id) != 0; };
  if (in_use(r.id)) return reject(errorf("request %llu: id already in use", ull(r.id)));
  for (size_t i = 0; i < r.fork_ids.size(); ++i) {
    const RequestId c = r.fork_ids[i];
    if (c == r.id || in_use(c) || std::find(r.fork_ids.begin(), r.fork_ids.begin() + static_cast<long>(i), c) !=
                                      r.fork_ids.begin() + static_cast<long>(i)) {
      return reject(errorf("request %llu: choice id %llu already in use", ull(r.id), ull(c)));
    }
  }
  // The client's input: messages name the numbers, never an internal id.
  if (r.prompt.empty()) return reject(errorf("the prompt is empty"));
  for (TokenId t : r.prompt) {
    if (t < 0 || (config_.vocab_size > 0 && t >= config_.vocab_size)) {
      return reject(config_.vocab_size > 0
                        ? errorf("token id %d is not in the vocabulary (size %d)", t, config_.vocab_size)
                        : errorf("token id %d is negative", t));
    }
  }
  if (r.max_tokens < 1) return reject(errorf("max_tokens must be >= 1, got %d", r.max_tokens));
  const auto group = static_cast<int64_t>(r.fork_ids.size()) + 1;
  if (group > config_.max_num_seqs) {
    return reject(errorf("n = %lld choices exceed max_num_seqs %d (all choices run together)",
                         static_cast<long long>(group), config_.max_num_seqs));
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > config_.max_model_len) {
    return reject(errorf("prompt (%zu tokens) + max_tokens (%d) = %lld exceeds the context length %d",
                         r.prompt.size(), r.max_tokens, static_cast<long long>(total), config_.max_model_len));
  }
  // Every group's blocks at the peak of a chunk (window groups hold the window
  // plus a step's tokens); one full group: ceil(total / block_size).
  const int64_t need = kv_->max_blocks_for_sequence(total, config_.max_num_batched_tokens);
  const int32_t usable = kv_->num_usable_blocks() - kv_->watermark_blocks();
  if (need > usable) {
    return reject(errorf("prompt (%zu tokens) + max_tokens (%d) = %lld tokens need %lld KV blocks of %d tokens, but "
                         "the whole cache admits %d",
                         r.prompt.size(), r.max_tokens, static_cast<long long>(total), static_cast<long long>(need),
                         kv_->block_size(),
                         usable));
  }
  // Admission reserves one block per child on top of the prompt's (see schedule()).
  const int64_t group_need =
      kv_->max_blocks_for_sequence(static_cast<int64_t>(r.prompt.size()), config_.max_num_batched_tokens) +
      (group - 1) * kv_->num_groups();
  if (group_need > usable) {
    return reject(errorf("a prompt of %zu tokens with n = %lld choices needs %lld KV blocks at its fork, but the "
                         "whole cache admits %d",
                         r.prompt.size(), static_cast<long long>(group), static_cast<long long>(group_need), usable));
  }
  return Status::Ok();
}

Status Scheduler::add_request(NewRequest r) {
  if (Status st = check_request(r); !st.ok()) {
    ++stats_.num_rejected;
    return st;
  }
  for (RequestId c : r.fork_ids) pending_children_.emplace(c, r.id);
  Request q;
  q.id = r.id;
  q.fork_ids = std::move(r.fork_ids);
  q.num_prompt_tokens = static_cast<int32_t>(r.prompt.size());
  q.tokens = std::move(r.prompt);
  q.max_tokens = r.max_tokens;
  q.cache_salt = std::move(r.cache_salt);
  q.priority = r.priority;
  q.pin_tokens = std::min<int32_t>(r.pin_tokens, q.num_prompt_tokens);
  q.pin_ttl_s = r.pin_ttl_s;
  q.arrival = next_arrival_++;
  requests_.emplace(q.id, std::move(q));
  waiting_.push_back(r.id);
  return Status::Ok();
}

void Scheduler::erase_running(RequestId id) {
  auto it = std::find(running_.begin(), running_.end(), id);
  if (it != running_.end()) running_.erase(it);
}

bool Scheduler::abort(RequestId id) {
  if (auto p = pending_children_.find(id); p != pending_children_.end()) {
    std::erase(req(p->second).fork_ids, id);
    pending_children_.erase(p);
    ++stats_.num_aborted;
    return true;
  }
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request& r = it->second;
  for (RequestId c : r.fork_ids) pending_children_.erase(c);
  if (r.state == RequestState::kRunning) {
    kv_->free(id);
    erase_running(id);
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), id);
    if (w != waiting_.end()) waiting_.erase(w);
  }
  requests_.erase(it);
  ++stats_.num_aborted;
  return true;
}

void Scheduler::preempt(Request& r, std::vector<Slice>* slices, int32_t* budget, StepPlan* plan) {
  // A victim already given tokens this step gives them back.
  auto s = std::find_if(slices->begin(), slices->end(), [&](const Slice& x) { return x.id == r.id; });
  if (s != slices->end()) {
    *budget += s->num_tokens;
    slices->erase(s);
  }
  kv_->free(r.id);  // its computed tokens go with its blocks: readmission starts from a prefix hit
  erase_running(r.id);
  r.state = RequestState::kPreempted;
  ++r.num_preemptions;
  waiting_.push_front(r.id);
  plan->preempted.push_back(r.id);
  ++stats_.num_preemptions;
}

bool Scheduler::schedule_running(Request& r, int32_t num_tokens, std::vector<Slice>* slices, int32_t* budget,
                                 StepPlan* plan, int32_t num_draft) {
  std::vector<kv::BlockCopy> copies;
  // Draft slots are optional: when the pool cannot give them at once the
  // decode goes without (preempting another request for a guess never pays).
  if (num_draft > 0 && !kv_->can_append_slots(r.id, num_tokens + num_draft)) num_draft = 0;
  num_tokens += num_draft;
  while (!kv_->append_slots(r.id, num_tokens, &copies)) {
    const RequestId victim = pick_victim();  // most recently admitted (kPriority: the worst)
    preempt(req(victim), slices, budget, plan);
    if (victim == r.id) return false;
  }
  slices->push_back(Slice{r.id, num_tokens, std::move(copies), num_draft});
  *budget -= num_tokens;
  return true;
}

bool Scheduler::set_draft(RequestId id, std::span<const TokenId> draft) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.state != RequestState::kRunning) return false;
  it->second.draft.assign(draft.begin(), draft.end());
  return true;
}

int32_t Scheduler::draft_len(const Request& r, int32_t budget) const {
  // accepted + 1 bonus token <= what max_tokens and max_model_len leave.
  if (!r.fork_ids.empty()) return 0;  // the prompt's last slice forks: its one row serves every child
  const int32_t room = std::min(r.max_tokens - r.num_output_tokens(), config_.max_model_len - r.num_tokens()) - 1;
  return std::max(0, std::min({static_cast<int32_t>(r.draft.size()), budget - 1, room}));
}

void Scheduler::limit_prefill(int32_t decode_tokens, int32_t* budget) {
  const int32_t prefill = auto_prefill_budget(step_cost_, config_.auto_budget_config, decode_tokens,
                                              config_.max_num_batched_tokens);
  if (prefill >= *budget) return;
  *budget = prefill;
  prefill_limited_ = true;
}

std::vector<Scheduler::Candidate> Scheduler::admission_order() const {
  std::vector<Candidate> out;
  out.reserve(waiting_.size());
  const bool lpm = config_.policy == SchedulePolicy::kLpm;
  for (RequestId id : waiting_) {
    Candidate c{id, std::nullopt};
    if (lpm) {
      const Request& w = requests_.at(id);
      c.match = kv_->match_prefix(w.tokens, w.cache_salt);
    }
    out.push_back(std::move(c));
  }
  if (config_.policy == SchedulePolicy::kPriority) sort_by_priority(&out);
  if (lpm) {
    // Rank 0: preempted; 1: overtaken too often; 2: the rest, by hit tokens.
    auto rank = [&](const Candidate& c) {
      const Request& w = requests_.at(c.id);
      if (w.state == RequestState::kPreempted) return 0;
      return w.overtaken_steps >= config_.max_lpm_overtake_steps ? 1 : 2;
    };
    std::stable_sort(out.begin(), out.end(), [&](const Candidate& a, const Candidate& b) {
      const int ra = rank(a), rb = rank(b);
      if (ra != rb) return ra < rb;
      return ra == 2 && a.match->num_cached_tokens() > b.match->num_cached_tokens();
    });
  }
  return out;
}

StepPlan Scheduler::schedule() {
  ++stats_.num_steps;
  kv_->expire_pins();  // pins whose TTL passed become ordinary cached blocks
  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  std::vector<Slice> slices;  // in schedule order

  // 1-2. Running requests: decodes first, then prefill chunks, each pass in
  // admission order. A snapshot, as preemption edits running_.
  const std::vector<RequestId> order = running_;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1 && config_.auto_budget) limit_prefill(config_.max_num_batched_tokens - budget, &budget);
    for (RequestId id : order) {
      if (budget <= 0) break;
      Request& r = req(id);
      if (r.state != RequestState::kRunning) continue;  // preempted this step
      const int32_t remaining = r.num_tokens() - kv_->num_computed_tokens(id);
      PAGODA_CHECK(remaining >= 1);
      if ((remaining == 1) != (pass == 0)) continue;
      // The victim of preemption may be a request scheduled earlier this step;
      // it is unscheduled, so a later pass never sees it twice.
      // A prefill chunk ends at the latest state checkpoint boundary inside it (KvManager::checkpoint_chunk).
      const int32_t n = kv_->checkpoint_chunk(kv_->num_computed_tokens(id), std::min(remaining, budget), pin_cut(r));
      schedule_running(r, n, &slices, &budget, &plan, pass == 0 ? draft_len(r, budget) : 0);
    }
  }

  // 3. Admission in policy order (see admission_order), unless memory was short this step.
  if (plan.preempted.empty()) {
    const bool dedup = config_.max_dedup_defer_steps > 0 && kv_->config().enable_prefix_caching;
    KeySet inflight;  // keys of full blocks running requests will compute but have not committed
    auto add_inflight = [&](const Request& r) {
      for (const Hash128& k : kv_->uncommitted_block_keys(r.id, r.tokens)) inflight.insert(k);
    };
    if (dedup) {
      for (RequestId id : running_) add_inflight(req(id));
    }
    int32_t seats = num_seats();
    std::vector<Candidate> order = admission_order();
    std::unordered_set<RequestId> admitted;
    const bool by_priority = config_.policy == SchedulePolicy::kPriority;
    for (Candidate& c : order) {
      Request& w = req(c.id);
      const auto num_children = static_cast<int32_t>(w.fork_ids.size());
      if (budget <= 0) break;
      // kPriority: a better request takes a worse one's seat.
      while (by_priority && seats + 1 + num_children > config_.max_num_seqs &&
             preempt_for(w, admitted, &slices, &budget, &plan)) {
        seats = num_seats();
      }
      if (seats >= config_.max_num_seqs) break;
      if (seats + 1 + num_children > config_.max_num_seqs) break;
      // The one prefix lookup of this admission. kLpm looked up for the order;
      // admissions since may have evicted some of those blocks (nothing is
      // committed during schedule()), which revalidate() drops without hashing.
      kv::PrefixMatch match;
      if (c.match) {
        match = std::move(*c.match);
        kv_->revalidate(&match);
      } else {
        match = kv_->match_prefix(w.tokens, w.cache_salt);
      }
      const int32_t cached = match.num_cached_tokens();
      if (dedup && w.deferred_steps < config_.max_dedup_defer_steps) {
        const Hash128* next = match.next_block_key();
        if (next != nullptr && inflight.count(*next)) {
          ++w.deferred_steps;
          ++stats_.num_deferrals;
          plan.deferred.push_back(w.id);
          continue;
        }
      }
      const int32_t n = kv_->checkpoint_chunk(cached, std::min(w.num_tokens() - cached, budget), pin_cut(w));
      // A group also keeps one block per child free (vLLM v0's rule: a running
      // sequence needs at most one new block per decode step): at the fork each
      // child's first decode copies the shared partial block or opens a new one.
      // It also keeps free what the rest of its prefill (and every running
      // prefill) can still take, so admitted prompts are not preempted.
      auto admission = kv_->can_allocate(std::move(match), n, num_children * kv_->num_groups(), w.num_tokens(),
                                         config_.max_num_batched_tokens);
      // Room made by releasing pins (nothing runs: only pins can hold the
      // blocks) or, with kPriority, by preempting worse requests; then the
      // lookup is made again (the cache changed).
      int32_t n_retry = n;
      while (!admission.ok() && ((running_.empty() && kv_->unpin_oldest()) ||
                                 (by_priority && preempt_for(w, admitted, &slices, &budget, &plan)))) {
        seats = num_seats();
        kv::PrefixMatch again = kv_->match_prefix(w.tokens, w.cache_salt);
        n_retry = kv_->checkpoint_chunk(again.num_cached_tokens(),
                                        std::min(w.num_tokens() - again.num_cached_tokens(), budget), pin_cut(w));
        if (n_retry <= 0) break;
        admission = kv_->can_allocate(std::move(again), n_retry, num_children * kv_->num_groups(), w.num_tokens(),
                                      config_.max_num_batched_tokens);
      }
      if (!admission.ok()) break;
      // Why the hit ends there, told once (before allocate takes blocks, which may evict).
      if (w.num_cached_tokens < 0) w.prefix_miss = kv_->explain_miss(admission->match(), w.tokens, w.cache_salt);
      const int32_t hit = admission->num_cached_tokens();
      // Nothing changed the KvManager since the lookup: allocate cannot refuse.
      std::vector<kv::BlockCopy> restore;  // a hit at a state checkpoint: its state copied in first
      auto got = kv_->allocate(w.id, *admission, &restore);
      PAGODA_CHECK_MSG(got.ok() && *got == hit, "request %llu: allocate after can_allocate failed: %s", ull(w.id),
                       got.ok() ? "hit differs" : got.message().c_str());
      if (w.num_cached_tokens < 0) w.num_cached_tokens = hit;
      if (by_priority) kv_->set_eviction_class(w.id, eviction_class(w.priority));
      if (w.pin_tokens > 0) kv_->pin_prefix(w.id, w.pin_tokens, w.pin_ttl_s);
      w.state = RequestState::kRunning;
      ++stats_.num_admissions;
      admitted.insert(w.id);
      running_.push_back(w.id);
      seats += 1 + num_children;
      slices.push_back(Slice{w.id, n_retry, std::move(restore)});
      budget -= n_retry;
      if (dedup) add_inflight(w);
    }
    if (!admitted.empty()) {
      // Overtaking (kLpm): a request still waiting with one behind it admitted.
      bool behind_admitted = false;
      for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
        if (admitted.count(*it)) {
          behind_admitted = true;
        } else if (behind_admitted) {
          ++req(*it).overtaken_steps;
        }
      }
      std::erase_if(waiting_, [&](RequestId id) { return admitted.count(id) > 0; });
    }
  }

  // The auto budget held prefill back this step: it was lower than what the cap
  // left, and the chunks and admissions used all of it.
  if (prefill_limited_ && budget == 0) ++stats_.num_budget_capped_steps;
  prefill_limited_ = false;

  plan.seqs.reserve(slices.size());
  for (Slice& s : slices) {
    const Request& r = req(s.id);
    const int32_t computed = kv_->num_computed_tokens(r.id);
    ScheduledSeq seq;
    seq.request_id = r.id;
    seq.start_pos = computed;
    const int32_t real = s.num_tokens - s.num_draft;
    seq.token_ids.assign(r.tokens.begin() + computed, r.tokens.begin() + computed + real);
    if (s.num_draft > 0) {  // a decode (real == 1): its drafts follow the last known token
      seq.token_ids.insert(seq.token_ids.end(), r.draft.begin(), r.draft.begin() + s.num_draft);
      seq.num_draft_tokens = s.num_draft;
    }
    const auto table = kv_->block_table(r.id);
    seq.block_ids.assign(table.begin(), table.end());
    for (int32_t g = 1; g < kv_->num_groups(); ++g) {
      const auto t = kv_->block_table(r.id, g);
      seq.group_block_ids.emplace_back(t.begin(), t.end());
    }
    seq.wants_logits = computed + real == r.num_tokens();
    if (seq.wants_logits) seq.fork_ids = r.fork_ids;  // non-empty only at the end of the prompt
    plan.seqs.push_back(std::move(seq));
    plan.block_copies.insert(plan.block_copies.end(), s.copies.begin(), s.copies.end());
  }
  for (RequestId id : order) {  // drafts are for this step only
    auto it = requests_.find(id);
    if (it != requests_.end()) it->second.draft.clear();
  }
  return plan;
}

int32_t Scheduler::num_seats() const {
  auto seats = static_cast<int32_t>(running_.size());
  for (RequestId id : running_) seats += static_cast<int32_t>(requests_.at(id).fork_ids.size());
  return seats;
}

}  // namespace pagoda::sched
