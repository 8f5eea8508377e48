#include "loadgen/driver.h"

#include <algorithm>
#include <utility>

#include "base/timer.h"

namespace pagoda::loadgen {

Expected<engine::RequestId> Driver::submit(const engine::RequestParams& params) {
  // One record per request: the choices of n > 1 would share it.
  if (params.n != 1) return errorf("the load driver follows one choice per request (n = %d)", params.n);
  const double submitted = now_seconds();
  PAGODA_ASSIGN_OR_RETURN(engine::RequestId id, eng_.add_request(params));
  Stream s;
  s.id = id;
  s.submitted = submitted;
  s.prompt_tokens = static_cast<int64_t>(params.prompt.size());
  live_.emplace(id, std::move(s));
  return id;
}

void Driver::abort(engine::RequestId id) {
  eng_.abort(id);
  live_.erase(id);
}

const Stream* Driver::find(engine::RequestId id) const {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : &it->second;
}

const Step& Driver::step() {
  Step& st = step_;
  st.finished.clear();
  st.in_flight = live_.size();
  st.all_decoding = std::all_of(live_.begin(), live_.end(), [](const auto& kv) { return kv.second.first_token >= 0; });
  st.advanced = 0;
  st.tokens = 0;
  st.start = now_seconds();
  st.events = eng_.step();
  st.end = now_seconds();
  const double dt = st.seconds();
  // Every request in flight waited for the whole step: its time is prefill up to
  // (and with) the step that gives the first token, decode after it.
  for (auto& [id, s] : live_) (s.first_token < 0 ? s.prefill_s : s.decode_s) += dt;

  for (const engine::TokenEvent& ev : st.events) {  // one event per choice and step
    auto it = live_.find(ev.id);
    if (it == live_.end()) continue;
    Stream& s = it->second;
    if (!ev.tokens.empty()) {
      if (s.first_token < 0) {
        s.first_token = st.end;
      } else {
        s.itl.push_back(st.end - s.last_token);
        ++s.decode_steps;
        s.decode_tokens += static_cast<int64_t>(ev.tokens.size());
      }
      s.last_token = st.end;
      s.num_kv_blocks = ev.num_kv_blocks;
      s.tokens.insert(s.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      ++st.advanced;
      st.tokens += static_cast<int64_t>(ev.tokens.size());
    }
    s.text += ev.text;
    s.cached_tokens = std::max<int64_t>(s.cached_tokens, ev.num_cached_tokens);  // given on the first event
    if (ev.num_prompt_tokens > 0) s.prompt_tokens = ev.num_prompt_tokens;
    if (ev.finish != engine::FinishReason::kNone) {
      s.finish = ev.finish;
      s.error = ev.error;
      st.finished.push_back(std::move(s));
      live_.erase(it);
    }
  }
  // An engine with nothing left to do cannot finish the requests still in flight.
  if (!live_.empty() && !eng_.has_unfinished()) {
    for (auto& [id, s] : live_) {
      s.finish = engine::FinishReason::kError;
      s.error = "the engine dropped the request";
      st.finished.push_back(std::move(s));
    }
    live_.clear();
  }
  return st;
}

Expected<Stream> run_one(engine::Engine& eng, const engine::RequestParams& params, const OnStep& on_step) {
  Driver d(eng);
  PAGODA_ASSIGN_OR_RETURN(engine::RequestId id, d.submit(params));
  Stream out;
  bool done = false;
  while (d.has_unfinished()) {
    const Step& st = d.step();
    for (const Stream& s : st.finished) {
      if (s.id != id) continue;
      out = s;
      done = true;
    }
    if (on_step) PAGODA_TRY(on_step(st));
  }
  if (!done) return errorf("request %llu: the engine went idle before it finished", static_cast<unsigned long long>(id));
  if (out.finish == engine::FinishReason::kError) return errorf("%s", out.error.c_str());
  return out;
}

}  // namespace pagoda::loadgen
