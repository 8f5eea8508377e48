// Priority scheduling under a saturated pool (issue 36): priority-0 requests'
// time to first token on an idle engine vs. on one whose seats and KV pool are
// full of priority-10 requests, with --scheduling-policy priority. Drives the
// Engine directly (one thread, as AsyncEngine's loop), so it needs no HTTP
// field for `priority` (the API layer sets RequestParams::priority).
//
// A priority-0 request is added between two steps; its TTFT counts from the
// start of the step before (the worst case of a request arriving just after a
// step began and waiting for it) to the end of the step that gives its first
// token. Rounds interleave idle and loaded measurements; each round reports
// p50/p99 and the ratio loaded p99 / idle p99. Every priority-10 request must
// complete with exactly max_tokens tokens (finish "length"): else exit 1.
//
//   bench_priority [MODEL.gguf] [--rounds 3] [--low 32] [--high 12] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/rng.h"
#include "engine/engine.h"

using namespace pagoda;
using namespace pagoda::engine;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> prompt(Rng& rng, int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(rng.uniform_int(100, 20000)));
  return p;
}

RequestParams params(std::vector<int32_t> p, int max_tokens, int priority) {
  RequestParams r;
  r.prompt = std::move(p);
  r.max_tokens = max_tokens;
  r.temperature = 0;
  r.ignore_eos = true;
  r.priority = priority;
  return r;
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::min<double>(static_cast<double>(v.size() - 1), q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

struct Opts {
  std::string model;
  int rounds = 3, low = 32, high = 12, threads = 2;
  int low_prompt = 256, low_tokens = 96, high_prompt = 128, high_tokens = 4;
};

// TTFT of `high` priority-0 requests one after another on an idle engine.
std::vector<double> idle_ttft(Engine* e, const Opts& o, Rng& rng) {
  std::vector<double> out;
  for (int i = 0; i < o.high; ++i) {
    double t_prev_step = now_s();
    e->step();  // an empty step: the "step before" of the worst case (nothing runs)
    auto id = e->add_request(params(prompt(rng, o.high_prompt), o.high_tokens, 0));
    if (!id.ok()) { std::fprintf(stderr, "add: %s\n", id.message().c_str()); std::exit(2); }
    bool first = false;
    while (e->has_unfinished()) {
      for (const TokenEvent& ev : e->step()) {
        if (ev.id == *id && !first && !ev.tokens.empty()) {
          first = true;
          out.push_back(now_s() - t_prev_step);
        }
      }
    }
  }
  return out;
}

// The pool saturated by `low` priority-10 requests; a priority-0 request every
// few steps. Returns the priority-0 TTFTs; checks every priority-10 output.
std::vector<double> loaded_ttft(Engine* e, const Opts& o, Rng& rng, bool* ok, int* preemptions) {
  std::map<RequestId, int> low_tokens;  // priority-10 id -> tokens seen
  std::map<RequestId, FinishReason> low_finish;
  for (int i = 0; i < o.low; ++i) {
    auto id = e->add_request(params(prompt(rng, o.low_prompt), o.low_tokens, 10));
    if (!id.ok()) { std::fprintf(stderr, "add: %s\n", id.message().c_str()); std::exit(2); }
    low_tokens[*id] = 0;
  }
  const int64_t preempt0 = e->stats().num_preemptions;
  std::map<RequestId, double> high_start;  // id -> the start of the step before its arrival
  std::vector<double> out;
  int added = 0, step = 0;
  double t_prev = now_s();
  while (e->has_unfinished()) {
    const double t_step = now_s();
    // Once the engine is saturated, one priority-0 arrival every 4 steps.
    if (added < o.high && step >= 8 && step % 4 == 0) {
      auto id = e->add_request(params(prompt(rng, o.high_prompt), o.high_tokens, 0));
      if (!id.ok()) { std::fprintf(stderr, "add: %s\n", id.message().c_str()); std::exit(2); }
      high_start[*id] = t_prev;
      ++added;
    }
    const std::vector<TokenEvent> evs = e->step();
    const double t_end = now_s();
    for (const TokenEvent& ev : evs) {
      if (auto it = low_tokens.find(ev.id); it != low_tokens.end()) {
        it->second += static_cast<int>(ev.tokens.size());
        if (ev.finish != FinishReason::kNone) low_finish[ev.id] = ev.finish;
      } else if (auto h = high_start.find(ev.id); h != high_start.end() && !ev.tokens.empty()) {
        out.push_back(t_end - h->second);
        high_start.erase(h);
      }
    }
    t_prev = t_step;
    ++step;
  }
  *preemptions = static_cast<int>(e->stats().num_preemptions - preempt0);
  for (const auto& [id, n] : low_tokens) {
    if (n != o.low_tokens || low_finish[id] != FinishReason::kLength) {
      std::fprintf(stderr, "priority-10 request %llu: %d of %d tokens, finish %s\n",
                   static_cast<unsigned long long>(id), n, o.low_tokens, finish_reason_name(low_finish[id]));
      *ok = false;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  o.model = std::string(PAGODA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (!std::strcmp(argv[i], "--rounds")) o.rounds = next();
    else if (!std::strcmp(argv[i], "--low")) o.low = next();
    else if (!std::strcmp(argv[i], "--high")) o.high = next();
    else if (!std::strcmp(argv[i], "--threads")) o.threads = next();
    else if (argv[i][0] != '-') o.model = argv[i];
    else { std::fprintf(stderr, "unknown flag %s\n", argv[i]); return 2; }
  }
  EngineConfig c;
  c.model_path = o.model;
  c.threads = o.threads;
  c.scheduling_policy = "priority";
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 2048;
  // 16 seats x (256 + 96) tokens = 352 blocks of 16 at their peak: a pool of
  // 300 is saturated by the priority-10 requests (they preempt each other too).
  c.num_kv_blocks = 301;
  c.enable_prefix_caching = false;  // random prompts: nothing to share; TTFT is pure scheduling + compute
  auto e = Engine::create(c);
  if (!e.ok()) { std::fprintf(stderr, "%s\n", e.message().c_str()); return 2; }
  Rng rng(36);
  bool ok = true;
  std::vector<double> ratios;
  std::printf("round  idle_p50_ms  idle_p99_ms  loaded_p50_ms  loaded_p99_ms  p99_ratio  low_preemptions\n");
  for (int r = 0; r < o.rounds; ++r) {
    const std::vector<double> idle = idle_ttft(e->get(), o, rng);
    int pre = 0;
    const std::vector<double> loaded = loaded_ttft(e->get(), o, rng, &ok, &pre);
    const double ratio = pct(loaded, 0.99) / pct(idle, 0.99);
    ratios.push_back(ratio);
    std::printf("%5d  %11.1f  %11.1f  %13.1f  %13.1f  %9.2f  %15d\n", r, 1e3 * pct(idle, 0.5), 1e3 * pct(idle, 0.99),
                1e3 * pct(loaded, 0.5), 1e3 * pct(loaded, 0.99), ratio, pre);
  }
  const double med = pct(ratios, 0.5);
  std::printf("median p99 ratio %.2f (target <= 2.00): %s; every priority-10 request complete: %s\n", med,
              med <= 2.0 ? "PASS" : "FAIL", ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
