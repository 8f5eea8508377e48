#include "engine/driver.h"

#include <algorithm>
#include <utility>

#include "base/timer.h"

namespace pagoda::engine {

Expected<RequestId> Driver::submit(const RequestParams& params, double submitted) {
  // One record per request: the choices of n > 1 would interleave in its tokens.
  if (options_.accumulate && params.n != 1)
    return errorf("the accumulating driver follows one choice per request (n = %d)", params.n);
  if (submitted < 0) submitted = now_seconds();
  PAGODA_ASSIGN_OR_RETURN(RequestId id, eng_.add_request(params));
  DrivenRequest r;
  r.id = id;
  r.n = std::max(1, params.n);
  r.max_tokens = params.max_tokens;
  r.submitted = submitted;
  r.prompt_tokens = static_cast<int64_t>(params.prompt.size());
  live_.emplace(id, std::move(r));
  return id;
}

void Driver::abort(RequestId id) {
  eng_.abort(id);
  live_.erase(id);
}

const DrivenRequest* Driver::find(RequestId id) const {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : &it->second;
}

bool Driver::fold(DrivenRequest& r, const TokenEvent& ev, DrivenEvent& out) {
  DriverStep& st = step_;
  if (!ev.tokens.empty()) {
    const auto k = static_cast<int64_t>(ev.tokens.size());
    const bool new_in_step = r.last_token_step != steps_;  // the request's first event with tokens in this step
    if (r.first_token < 0) {
      r.first_token = st.end;
      out.first_token = true;
    } else if (r.decode_steps == 0 && r.last_token_step == steps_) {
      // Another choice's first token, from the step that gave the request its first:
      // prefill, not decode (gap 0).
    } else {
      out.gap = st.end - r.last_token;
      if (options_.accumulate) r.itl.push_back(out.gap);
      if (new_in_step) ++r.decode_steps;
      r.decode_tokens += k;
    }
    if (new_in_step) ++st.advanced;
    r.last_token = st.end;
    r.last_token_step = steps_;
    r.num_kv_blocks = ev.num_kv_blocks;
    r.output_tokens += k;
    if (options_.accumulate) r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    st.tokens += k;
  }
  if (options_.accumulate) r.text += ev.text;
  r.cached_tokens = std::max<int64_t>(r.cached_tokens, ev.num_cached_tokens);  // given on the first event
  if (ev.num_prompt_tokens > 0) r.prompt_tokens = ev.num_prompt_tokens;
  if (ev.finish == FinishReason::kNone) return false;
  if (ev.finish == FinishReason::kError) {
    // One failed choice fails the request: its other choices stop here too.
    r.finish = FinishReason::kError;
    r.error = ev.error;
    if (++r.choices_finished < r.n) eng_.abort(r.id);
    return true;
  }
  r.finish = ev.finish;
  return ++r.choices_finished >= r.n;
}

const DriverStep& Driver::step() {
  DriverStep& st = step_;
  st.finished.clear();
  st.dropped.clear();
  st.driven.clear();
  st.in_flight = live_.size();
  st.all_decoding = std::all_of(live_.begin(), live_.end(), [](const auto& kv) { return kv.second.first_token >= 0; });
  st.advanced = 0;
  st.tokens = 0;
  ++steps_;
  st.start = now_seconds();
  st.events = eng_.step();
  st.end = now_seconds();
  const double dt = st.seconds();
  // Every request in flight waited for the whole step: its time is prefill up to
  // (and with) the step that gives the first token, decode after it.
  for (auto& [id, r] : live_) (r.first_token < 0 ? r.prefill_s : r.decode_s) += dt;
  // Queue time ends at the step that first scheduled a request (vLLM's), not at its
  // admission: one waiting behind a full pool or max_num_seqs keeps queueing until then.
  for (RequestId id : eng_.newly_scheduled()) {
    auto it = live_.find(id);
    if (it != live_.end() && it->second.scheduled < 0) it->second.scheduled = st.start;
  }

  for (const TokenEvent& ev : st.events) {  // one event per choice and step
    auto it = live_.find(ev.id);
    if (it == live_.end()) continue;
    DrivenEvent& de = st.driven.emplace_back();
    de.event = &ev;
    if (fold(it->second, ev, de)) {
      de.done = true;
      st.finished.push_back(std::move(it->second));
      live_.erase(it);
    }
  }
  // An engine with nothing left to do cannot finish the requests still in flight.
  if (!live_.empty() && !eng_.has_unfinished()) {
    st.dropped.reserve(live_.size());  // DrivenEvent::event points into it
    for (auto& [id, r] : live_) {
      TokenEvent& ev = st.dropped.emplace_back();
      ev.id = id;
      ev.finish = FinishReason::kError;
      ev.error = "the engine dropped the request";
      r.finish = ev.finish;
      r.error = ev.error;
      st.finished.push_back(std::move(r));
    }
    live_.clear();
    for (const TokenEvent& ev : st.dropped) {
      DrivenEvent& de = st.driven.emplace_back();
      de.event = &ev;
      de.done = true;
    }
  }
  // The records, now that st.finished no longer grows: a request that finished later
  // in the step is found there for its earlier events too.
  for (DrivenEvent& de : st.driven) {
    auto it = live_.find(de.event->id);
    if (it != live_.end()) {
      de.request = &it->second;
      continue;
    }
    for (const DrivenRequest& r : st.finished)
      if (r.id == de.event->id) de.request = &r;
  }
  return st;
}

}  // namespace pagoda::engine
