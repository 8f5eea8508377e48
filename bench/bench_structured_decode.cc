// 32 streams of decode through the engine, constrained by a JSON schema vs
// unconstrained: same prompts, same max_tokens (the schema needs more tokens
// than max_tokens to complete, so every stream runs to the limit in both),
// rounds interleaved, medians reported. Then the mask cost per token (p50/p99):
// the constrained outputs are replayed step by step, all streams in lockstep,
// through a fresh CompiledGrammar (so the first stream meeting a context pays
// for computing it, as in the engine), timing fill_mask plus the masking of a
// logits row the sampler does.
//   bench_structured_decode [model.gguf] [streams=32] [max_tokens=48] [rounds=3] [threads=2]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/cache.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"
#include "tok/tokenizer.h"

using namespace pagoda;
using Clock = std::chrono::steady_clock;

namespace {

// minItems 300: no output of max_tokens completes it, so no stream ends early.
const char* kSchema = R"({"type":"object","properties":{"people":{"type":"array","minItems":300,"items":{
  "type":"object","properties":{"name":{"type":"string","maxLength":16},"age":{"type":"integer","minimum":0,
  "maximum":120},"city":{"type":"string","maxLength":16},"member":{"type":"boolean"}},
  "required":["name","age","city","member"]}}},"required":["people"]})";

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct RoundResult {
  double decode_tok_s = 0;
  double mask_ns_per_token = 0;  // the engine's own count (constrained rounds)
  std::vector<std::vector<int32_t>> outputs;  // [stream] tokens
};

RoundResult run_round(engine::Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                      std::shared_ptr<const grammar::CompiledGrammar> g) {
  const engine::EngineStats s0 = e.stats();
  std::map<engine::RequestId, size_t> stream_of;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    p.temperature = 0.7f;
    p.seed = 1000 + i;
    p.has_seed = true;
    p.ignore_eos = true;
    p.grammar = g;
    auto id = e.add_request(p);
    if (!id.ok()) {
      std::fprintf(stderr, "add_request: %s\n", id.message().c_str());
      std::exit(1);
    }
    stream_of[*id] = i;
  }
  RoundResult r;
  r.outputs.resize(prompts.size());
  // Step 1 prefills every prompt and samples each stream's first token; the
  // decode rate is over the steps after it.
  int step = 0;
  int64_t decode_tokens = 0;
  Clock::time_point t_decode;
  while (e.has_unfinished()) {
    auto evs = e.step();
    if (++step == 1) t_decode = Clock::now();
    for (const auto& ev : evs) {
      auto& out = r.outputs[stream_of[ev.id]];
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      if (step > 1) decode_tokens += static_cast<int64_t>(ev.tokens.size());
    }
  }
  r.decode_tok_s = static_cast<double>(decode_tokens) / secs(t_decode, Clock::now());
  const engine::EngineStats s1 = e.stats();
  const int64_t gt = s1.grammar_tokens_total - s0.grammar_tokens_total;
  if (gt > 0) r.mask_ns_per_token = static_cast<double>(s1.grammar_mask_ns_total - s0.grammar_mask_ns_total) / gt;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : PAGODA_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  const int streams = argc > 2 ? std::atoi(argv[2]) : 32;
  const int max_tokens = argc > 3 ? std::atoi(argv[3]) : 48;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 3;
  const int threads = argc > 5 ? std::atoi(argv[5]) : 2;

  engine::EngineConfig c;
  c.model_path = path;
  c.threads = threads;
  c.max_num_seqs = streams;
  c.num_kv_blocks = streams * 8 + 8;  // 128 tokens per stream: no preemption
  c.enable_prefix_caching = false;    // every round computes its prompts again
  auto created = engine::Engine::create(c);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.message().c_str());
    return 1;
  }
  engine::Engine& e = **created;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < streams; ++i)
    prompts.push_back(e.tokenizer().encode("List people as JSON, batch " + std::to_string(i) + ":", true, false));

  auto ti = grammar::TokenIndex::from_tokenizer(e.tokenizer());
  auto gr = grammar::compile_constraint({grammar::ConstraintKind::kJsonSchema, kSchema, {}, "", ""}, {});
  if (!ti.ok() || !gr.ok()) {
    std::fprintf(stderr, "grammar: %s\n", !ti.ok() ? ti.message().c_str() : gr.message().c_str());
    return 1;
  }

  std::vector<double> free_rate, json_rate, engine_mask, ratios;
  RoundResult last_json;
  for (int r = 0; r < rounds; ++r) {
    // A fresh CompiledGrammar per round: each round pays for its contexts, as
    // the first request with a new schema does.
    auto g = std::make_shared<const grammar::CompiledGrammar>(*gr, *ti);
    RoundResult a = run_round(e, prompts, max_tokens, nullptr);
    RoundResult b = run_round(e, prompts, max_tokens, g);
    free_rate.push_back(a.decode_tok_s);
    json_rate.push_back(b.decode_tok_s);
    engine_mask.push_back(b.mask_ns_per_token);
    ratios.push_back(b.decode_tok_s / a.decode_tok_s);
    std::printf("round %d: unconstrained %.1f tok/s, json schema %.1f tok/s (%.3fx), engine mask pass %.1f us/token\n",
                r, a.decode_tok_s, b.decode_tok_s, b.decode_tok_s / a.decode_tok_s, b.mask_ns_per_token / 1e3);
    std::fflush(stdout);
    last_json = std::move(b);
  }
  const double ratio = median(json_rate) / median(free_rate);
  std::printf("\n%d streams x %d tokens, %d rounds (medians): unconstrained %.1f tok/s, json schema %.1f tok/s, "
              "ratio of medians %.3f, median of per-round ratios %.3f\n",
              streams, max_tokens, rounds, median(free_rate), median(json_rate), ratio, median(ratios));

  // Mask cost per token, replaying the last constrained round in lockstep:
  // "cold" on a fresh CompiledGrammar (contexts computed on first use, as a new
  // schema's first request), "warm" again over the same one (later requests).
  auto g = std::make_shared<const grammar::CompiledGrammar>(*gr, *ti);
  for (const char* pass : {"cold", "warm"}) {
    std::vector<grammar::Matcher> ms(static_cast<size_t>(streams), grammar::Matcher(g));
    std::vector<uint32_t> mask(ti.value()->mask_words());
    const size_t n_vocab = static_cast<size_t>(e.model_info().vocab_size);
    std::vector<float> row(n_vocab, 0.5f), work(n_vocab);
    std::vector<double> cost_us;
    for (size_t t = 0;; ++t) {
      bool any = false;
      for (size_t s = 0; s < ms.size(); ++s) {
        if (t >= last_json.outputs[s].size()) continue;
        any = true;
        const auto t0 = Clock::now();
        ms[s].fill_mask(mask);
        work.assign(row.begin(), row.end());
        for (size_t i = 0; i < n_vocab; ++i)
          if (!((mask[i >> 5] >> (i & 31)) & 1)) work[i] = -std::numeric_limits<float>::infinity();
        cost_us.push_back(secs(t0, Clock::now()) * 1e6);
        if (!ms[s].accept(last_json.outputs[s][t])) {
          std::fprintf(stderr, "replay: stream %zu token %zu refused\n", s, t);
          return 1;
        }
      }
      if (!any) break;
    }
    std::sort(cost_us.begin(), cost_us.end());
    std::printf("mask + masking per token (%s replay, %zu tokens): p50 %.1f us, p99 %.1f us, max %.1f us; contexts %zu\n",
                pass, cost_us.size(), cost_us[cost_us.size() / 2], cost_us[cost_us.size() * 99 / 100], cost_us.back(),
                g->stats().contexts);
  }
  std::printf("engine: mask pass wall time per constrained token (median of rounds): %.1f us\n",
              median(engine_mask) / 1e3);
  return 0;
}
