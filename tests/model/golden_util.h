// Shared helpers of the model/runtime golden tests: the stories260K reference
// file (common/reference_jsonl.h) and greedy generation of one sequence through
// engine::Engine, the path `pagoda run`, bench and serve take.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "base/kv_dtype.h"
#include "common/reference_jsonl.h"
#include "engine/engine.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "sample/sampler.h"
#include "sched/step_plan.h"

namespace pagoda::golden {

// stories260K and its reference outputs: tests/common/reference_jsonl.h.
using testutil::load_references;
using testutil::Reference;
using testutil::stories_path;

struct GenOptions {
  int32_t block_size = 16;
  KvDtype kv_dtype = KvDtype::F32;
  bool recompute = false;              // the engine's no-KV-cache mode
  bool ref_kernels = false;
  int32_t max_tokens_per_step = 512;   // the engine's token budget: smaller chunks the prompt
  int threads = 1;                     // results do not depend on it (kernel contract)
  std::string model_path = stories_path();
};

// Greedy generation of exactly n tokens after `prompt` (end of generation
// ignored), one request in an engine sized for it. first_logits: the logits
// row the first token was chosen from.
inline std::vector<int32_t> generate_greedy(const std::vector<int32_t>& prompt, int n, const GenOptions& o = {},
                                            std::vector<float>* first_logits = nullptr) {
  engine::EngineConfig c;
  c.model_path = o.model_path;
  c.threads = o.threads;
  c.context_length = static_cast<int>(prompt.size()) + n;
  c.kv_dtype = o.kv_dtype;
  c.block_size = o.block_size;
  c.kv_pool_one_context = true;
  c.watermark = 0;
  c.enable_prefix_caching = false;
  c.max_num_seqs = 1;
  c.max_num_batched_tokens = o.max_tokens_per_step;
  c.ref_kernels = o.ref_kernels;
  c.recompute = o.recompute;
  auto e = engine::Engine::create(c);
  if (!e.ok()) {
    ADD_FAILURE() << e.message();
    return {};
  }
  engine::RequestParams p;
  p.prompt = prompt;
  p.max_tokens = n;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.return_logits = first_logits != nullptr;
  auto id = (*e)->add_request(p);
  if (!id.ok()) {
    ADD_FAILURE() << id.message();
    return {};
  }
  std::vector<int32_t> out;
  while ((*e)->has_unfinished()) {
    for (const engine::TokenEvent& ev : (*e)->step()) {
      if (ev.finish == engine::FinishReason::kError) {
        ADD_FAILURE() << "after " << out.size() << " tokens: " << ev.error;
        return out;
      }
      if (first_logits && out.empty() && !ev.tokens.empty()) *first_logits = ev.logits;
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    }
  }
  return out;
}

// Greedy generation through ModelRunner::execute alone, for a model that is no
// file the engine could open (a GGUF edited or synthesized in memory): one
// sequence in blocks 1, 2, ... (block 0 is the null block).
inline std::vector<int32_t> runner_greedy(const model::Model& m, const std::vector<int32_t>& prompt, int n) {
  runtime::RunnerOptions ro;
  ro.num_blocks = runtime::blocks_for_context(static_cast<int64_t>(prompt.size()) + n, ro.block_size);
  auto runner = runtime::ModelRunner::create(m, ro);
  if (!runner.ok()) {
    ADD_FAILURE() << runner.message();
    return {};
  }
  sched::StepPlan plan;
  plan.seqs.resize(1);
  sched::ScheduledSeq& q = plan.seqs[0];
  q.request_id = 1;
  q.wants_logits = true;
  std::vector<int32_t> tokens = prompt, out;
  size_t computed = 0;
  for (int i = 0; i < n; ++i) {
    q.start_pos = static_cast<int32_t>(computed);
    q.token_ids.assign(tokens.begin() + static_cast<std::ptrdiff_t>(computed), tokens.end());
    while (q.block_ids.size() * static_cast<size_t>(ro.block_size) < tokens.size())
      q.block_ids.push_back(static_cast<int32_t>(q.block_ids.size()) + 1);
    auto l = (*runner)->execute(plan);
    if (!l.ok()) {
      ADD_FAILURE() << "step " << i << ": " << l.message();
      return out;
    }
    computed = tokens.size();
    out.push_back(sample::argmax(l->row(0)));
    tokens.push_back(out.back());
  }
  return out;
}

// Index of the first differing element (or -1), for readable failures.
inline int first_diff(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i >= a.size() || i >= b.size() || a[i] != b[i]) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace pagoda::golden
