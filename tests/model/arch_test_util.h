// One sequence driven through ModelRunner::execute for the architecture tests:
// feed() appends tokens, computes them in one step and returns the logits of the
// last one. Blocks 1, 2, ... in order (block 0 is the null block).
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "runtime/model_runner.h"
#include "sched/step_plan.h"

namespace pagoda::archtest {

class OneSeq {
 public:
  // state_table: a hybrid model's recurrent state blocks (the layout's group 1,
  // after the one attention group); empty for the others.
  explicit OneSeq(runtime::ModelRunner& runner, int32_t block_size, std::vector<int32_t> state_table = {})
      : runner_(runner), block_size_(block_size) {
    plan_.seqs.resize(1);
    plan_.seqs[0].request_id = 1;
    plan_.seqs[0].wants_logits = true;
    if (!state_table.empty()) plan_.seqs[0].group_block_ids.push_back(std::move(state_table));
  }

  // Logits [n_vocab] after the last of `tokens`; empty (and a test failure) on error.
  std::vector<float> feed(std::span<const int32_t> tokens) {
    sched::ScheduledSeq& q = plan_.seqs[0];
    q.start_pos = n_;
    q.token_ids.assign(tokens.begin(), tokens.end());
    n_ += static_cast<int32_t>(tokens.size());
    while (static_cast<int32_t>(q.block_ids.size()) * block_size_ < n_)
      q.block_ids.push_back(static_cast<int32_t>(q.block_ids.size()) + 1);
    auto l = runner_.execute(plan_);
    if (!l.ok()) {
      ADD_FAILURE() << l.message();
      return {};
    }
    const std::span<const float> row = l->row(0);
    return std::vector<float>(row.begin(), row.end());
  }

 private:
  runtime::ModelRunner& runner_;
  int32_t block_size_;
  int32_t n_ = 0;
  sched::StepPlan plan_;
};

}  // namespace pagoda::archtest
