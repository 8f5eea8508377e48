// The single-sequence path (`pagoda run`, `pagoda bench`, golden tests) until the
// continuous-batching engine lands: one sequence, its own block table, driven
// through the same ModelRunner::execute(StepPlan) the engine will use.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "runtime/model_runner.h"
#include "sched/step_plan.h"

namespace pagoda::runtime {

// Block table of one sequence: hands out blocks 1, 2, 3, ... (block 0 is the kv
// manager's reserved null block) from a storage of num_blocks blocks.
class SequenceKv {
 public:
  SequenceKv(int32_t num_blocks, int32_t block_size) : num_blocks_(num_blocks), block_size_(block_size) {}
  // Grows the table to cover n_tokens; error (table unchanged) if the storage is too small.
  Status ensure(int64_t n_tokens);
  void clear() { blocks_.clear(); }
  const std::vector<sched::BlockId>& block_ids() const { return blocks_; }
  int32_t capacity_tokens() const { return (num_blocks_ - 1) * block_size_; }

 private:
  int32_t num_blocks_;
  int32_t block_size_;
  std::vector<sched::BlockId> blocks_;
};

// One sequence: its tokens, its KV blocks, and how many of them are computed.
class SequenceSession {
 public:
  // recompute = true is the no-KV-cache baseline: every feed() recomputes the
  // whole sequence from position 0 into the same blocks.
  // Precondition: `runner` outlives the session, and nothing else uses its KV.
  explicit SequenceSession(ModelRunner& runner, bool recompute = false, sched::RequestId id = 1);

  // Appends `tokens` and computes them in steps of at most max_tokens_per_step
  // tokens; returns the logits [n_vocab] after the last one (valid until the
  // next call). Error (sequence unchanged) if the KV storage cannot hold it.
  Expected<std::span<const float>> feed(std::span<const int32_t> tokens);

  const std::vector<int32_t>& tokens() const { return tokens_; }
  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t capacity_tokens() const { return kv_.capacity_tokens(); }
  // KV bytes of the blocks this sequence holds.
  uint64_t kv_bytes_held() const;
  void reset();

 private:
  ModelRunner& runner_;
  bool recompute_;
  sched::RequestId id_;
  SequenceKv kv_;
  std::vector<int32_t> tokens_;
  int32_t n_computed_ = 0;
  sched::StepPlan plan_;
};

}  // namespace pagoda::runtime
