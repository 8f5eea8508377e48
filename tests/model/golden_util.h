// Shared helpers of the model/runtime golden tests: the stories260K reference
// file (common/reference_jsonl.h) and a greedy single-sequence generation loop
// through ModelRunner + Sampler.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/reference_jsonl.h"
#include "model/model.h"
#include "runtime/model_runner.h"
#include "runtime/sequence.h"
#include "sample/sampler.h"

namespace pagoda::golden {

// stories260K and its reference outputs: tests/common/reference_jsonl.h.
using testutil::load_references;
using testutil::Reference;
using testutil::stories_path;

struct GenOptions {
  int32_t block_size = 16;
  kernels::KvDtype kv_dtype = kernels::KvDtype::F32;
  bool recompute = false;
  model::KernelBackend backend = model::KernelBackend::Cpu;
  int32_t max_tokens_per_step = 512;
};

// Greedy generation of n tokens after `prompt`, one sequence.
inline std::vector<int32_t> generate_greedy(const model::Model& m, const std::vector<int32_t>& prompt, int n,
                                            const GenOptions& o = {}) {
  runtime::RunnerOptions ro;
  ro.block_size = o.block_size;
  ro.num_blocks = runtime::blocks_for_context(static_cast<int64_t>(prompt.size()) + n, o.block_size);
  ro.kv_dtype = o.kv_dtype;
  ro.backend = o.backend;
  ro.max_tokens_per_step = o.max_tokens_per_step;
  auto runner = runtime::ModelRunner::create(m, ro);
  if (!runner.ok()) {
    ADD_FAILURE() << runner.message();
    return {};
  }
  runtime::SequenceSession seq(**runner, o.recompute);
  sample::SamplingParams sp;
  sp.temperature = 0.0f;
  sample::Sampler sampler(sp, prompt);
  std::vector<int32_t> out;
  auto logits = seq.feed(prompt);
  for (int i = 0; i < n; ++i) {
    if (!logits.ok()) {
      ADD_FAILURE() << "step " << i << ": " << logits.message();
      return out;
    }
    const int32_t t = sampler.sample(*logits).token;
    out.push_back(t);
    if (i + 1 < n) logits = seq.feed(std::span<const int32_t>(&t, 1));
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
