#include "loadgen/serving.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_map>

#include "base/timer.h"
#include "loadgen/driver.h"

namespace pagoda::loadgen {

std::vector<RequestResult> run_offline(engine::Engine& eng, const std::vector<BenchRequest>& requests,
                                       const RunOptions& opts, RunExtras* extras) {
  const size_t n = requests.size();
  std::vector<RequestResult> results(n);
  const std::vector<double> arrivals = arrival_times(static_cast<int>(n), opts.request_rate, opts.seed);
  const size_t limit = opts.max_concurrency > 0 ? static_cast<size_t>(opts.max_concurrency) : SIZE_MAX;
  Driver driver(eng);
  std::unordered_map<engine::RequestId, size_t> index_of;  // requests in flight -> their index
  *extras = RunExtras{};
  extras->peak_kv_usage = 0;
  const int64_t preemptions0 = eng.stats().num_preemptions;
  const double t0 = now_seconds();
  double last_finish = t0;
  size_t next = 0, done = 0;

  // A finished request's Stream -> its RequestResult.
  auto finish = [&](const Stream& s, double t) {
    auto it = index_of.find(s.id);
    RequestResult& r = results[it->second];
    index_of.erase(it);
    r.ttft = s.first_token >= 0 ? s.first_token - s.submitted : 0;
    r.itl = s.itl;
    r.output_ids = s.tokens;
    r.text = s.text;
    r.cached_tokens = s.cached_tokens;
    r.prompt_tokens = s.prompt_tokens;
    r.e2e = t - s.submitted;
    if (s.finish == engine::FinishReason::kError || s.finish == engine::FinishReason::kAbort)
      r.error = s.error.empty() ? std::string("request ") + engine::finish_reason_name(s.finish) : s.error;
    r.ok = r.error.empty();
    r.output_tokens = static_cast<int64_t>(r.output_ids.size());
    r.ids_known = true;
    ++done;
    if (opts.progress) opts.progress(done, n);
  };

  while (done < n) {
    // Admit every request whose arrival time has come, in order, while there is room.
    while (next < n && arrivals[next] <= now_seconds() - t0 && driver.num_in_flight() < limit) {
      const BenchRequest& br = requests[next];
      engine::RequestParams p;
      p.prompt = br.prompt;
      p.max_tokens = br.max_tokens;
      p.temperature = 0.0f;
      p.ignore_eos = opts.ignore_eos;
      RequestResult& r = results[next];
      r.prompt_tokens = static_cast<int64_t>(br.prompt.size());
      r.cached_tokens = 0;
      r.start = now_seconds() - t0;  // the driver's clock, below, once accepted
      auto id = driver.submit(p);
      if (!id.ok()) {
        r.error = id.message();
        ++done;
        if (opts.progress) opts.progress(done, n);
      } else {
        r.start = driver.find(*id)->submitted - t0;
        index_of.emplace(*id, next);
      }
      ++next;
    }
    if (driver.num_in_flight() == 0) {
      if (next < n) {
        const double wait = t0 + arrivals[next] - now_seconds();
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      }
      continue;
    }
    const Step& st = driver.step();
    const engine::EngineStats stats = eng.stats();
    extras->peak_kv_usage = std::max(extras->peak_kv_usage, stats.kv_usage);
    if (opts.on_step) opts.on_step(stats);
    for (const Stream& s : st.finished) finish(s, st.end);
    if (!st.finished.empty()) last_finish = std::max(last_finish, st.end);
    // Steady decode: every request in flight already decoding, and each given tokens.
    if (st.all_decoding && st.advanced == st.in_flight && st.tokens > 0) {
      extras->steady_decode_tokens += static_cast<double>(st.tokens);
      extras->steady_decode_time += st.seconds();
    }
  }
  extras->duration = last_finish - t0;
  extras->num_preemptions = eng.stats().num_preemptions - preemptions0;
  return results;
}

}  // namespace pagoda::loadgen
