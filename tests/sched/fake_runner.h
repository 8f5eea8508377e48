// A fake model runner for scheduler tests. It keeps a shadow KV storage
// (token, position) per (block, offset), performs the plan's block copies,
// writes every scheduled token through the block table, and "samples" each
// next token as a hash of the request id and the whole context it reads back
// through the block table. A wrong block, a lost copy or a bad prefix hit
// changes the sampled tokens, which tests compare with expected_outputs().
// A slice with fork_ids gives one output per id from the same context.
// Like the engine (engine/finish.h), the runner decides each output's finish:
// kStop at the request's eos length, else kLength at its max_tokens.
#pragma once
#include <gtest/gtest.h>

#include <unordered_map>
#include <vector>

#include "base/hash.h"
#include "sched/scheduler.h"

namespace pagoda::sched::testing {

inline TokenId next_token(RequestId id, const std::vector<TokenId>& context, int32_t vocab) {
  const uint64_t h = xxh3_64(context.data(), context.size() * sizeof(TokenId), id * 0x9E3779B97F4A7C15ull + 1);
  return static_cast<TokenId>(h % static_cast<uint64_t>(vocab));
}

// What a request must output: tokens sampled from its own true context, with
// EOS (finished) after eos_len tokens, cut at max_tokens.
inline std::vector<TokenId> expected_outputs(RequestId id, std::vector<TokenId> context, int32_t max_tokens,
                                             int32_t eos_len, int32_t vocab) {
  std::vector<TokenId> out;
  while (static_cast<int32_t>(out.size()) < std::min(max_tokens, eos_len)) {
    const TokenId t = next_token(id, context, vocab);
    out.push_back(t);
    context.push_back(t);
  }
  return out;
}

class FakeRunner {
 public:
  FakeRunner(int32_t num_blocks, int32_t block_size, int32_t vocab)
      : bs_(block_size), vocab_(vocab), slots_(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size)) {}

  // EOS after this many output tokens (default: never).
  void set_eos_len(RequestId id, int32_t n) { eos_len_[id] = n; }

  std::vector<SeqOutput> execute(const StepPlan& plan) {
    for (const auto& [src, dst] : plan.block_copies) {
      for (int32_t o = 0; o < bs_; ++o) slot(dst, o) = slot(src, o);
    }
    std::vector<SeqOutput> outs;
    for (const ScheduledSeq& seq : plan.seqs) {
      for (size_t i = 0; i < seq.token_ids.size(); ++i) {
        const int32_t pos = seq.start_pos + static_cast<int32_t>(i);
        Slot& s = slot_at(seq, pos);
        s = Slot{seq.token_ids[i], pos};
      }
      computed_tokens_[seq.request_id] += static_cast<int64_t>(seq.token_ids.size());
      if (!seq.wants_logits) continue;
      // Attention reads the whole context back through the block table.
      const int32_t end = seq.start_pos + static_cast<int32_t>(seq.token_ids.size());
      std::vector<TokenId> context(static_cast<size_t>(end));
      for (int32_t pos = 0; pos < end; ++pos) {
        const Slot& s = slot_at(seq, pos);
        EXPECT_EQ(s.pos, pos) << "request " << seq.request_id << " reads a slot written for another position";
        context[static_cast<size_t>(pos)] = s.token;
      }
      // The request, then the children it forks into (same context, own "sampler").
      for (size_t k = 0; k <= seq.fork_ids.size(); ++k) {
        SeqOutput o;
        o.request_id = k == 0 ? seq.request_id : seq.fork_ids[k - 1];
        o.token = next_token(o.request_id, context, vocab_);
        // Outputs after this one = context beyond the original prompt, plus this token.
        const int32_t produced = end - prompt_len(o.request_id) + 1;
        auto e = eos_len_.find(o.request_id);
        const bool eos = e != eos_len_.end() && produced >= e->second;
        o.finish = eos                                   ? FinishReason::kStop
                   : produced >= max_tokens_.at(o.request_id) ? FinishReason::kLength
                                                              : FinishReason::kNone;
        outs.push_back(o);
      }
    }
    return outs;
  }

  void set_prompt_len(RequestId id, int32_t n) { prompt_len_[id] = n; }
  void set_max_tokens(RequestId id, int32_t n) { max_tokens_[id] = n; }
  int64_t computed_tokens(RequestId id) const {
    auto it = computed_tokens_.find(id);
    return it == computed_tokens_.end() ? 0 : it->second;
  }

 private:
  struct Slot {
    TokenId token = -1;
    int32_t pos = -1;
  };
  Slot& slot(BlockId b, int32_t offset) {
    return slots_[static_cast<size_t>(b) * static_cast<size_t>(bs_) + static_cast<size_t>(offset)];
  }
  Slot& slot_at(const ScheduledSeq& seq, int32_t pos) {
    const size_t bi = static_cast<size_t>(pos / bs_);
    EXPECT_LT(bi, seq.block_ids.size()) << "position " << pos << " beyond the block table";
    if (bi >= seq.block_ids.size()) return dummy_;
    return slot(seq.block_ids[bi], pos % bs_);
  }
  int32_t prompt_len(RequestId id) const {
    auto it = prompt_len_.find(id);
    return it == prompt_len_.end() ? 0 : it->second;
  }

  int32_t bs_, vocab_;
  std::vector<Slot> slots_;  // [num_blocks, block_size]
  Slot dummy_;
  std::unordered_map<RequestId, int32_t> eos_len_, prompt_len_, max_tokens_;
  std::unordered_map<RequestId, int64_t> computed_tokens_;
};

}  // namespace pagoda::sched::testing
