#include "runtime/sequence.h"

#include <algorithm>

namespace pagoda::runtime {

Status SequenceKv::ensure(int64_t n_tokens) {
  const int64_t need = (n_tokens + block_size_ - 1) / block_size_;
  if (need > num_blocks_ - 1) {
    return errorf("sequence of %lld tokens needs %lld KV blocks of %d tokens, storage has %d (context %d tokens)",
                  static_cast<long long>(n_tokens), static_cast<long long>(need), block_size_, num_blocks_ - 1,
                  capacity_tokens());
  }
  while (static_cast<int64_t>(blocks_.size()) < need) blocks_.push_back(static_cast<sched::BlockId>(blocks_.size() + 1));
  return Status::Ok();
}

SequenceSession::SequenceSession(ModelRunner& runner, bool recompute, sched::RequestId id)
    : runner_(runner),
      recompute_(recompute),
      id_(id),
      kv_(runner.kv().spec().num_blocks, runner.kv().spec().block_size) {
  plan_.seqs.resize(1);
}

uint64_t SequenceSession::kv_bytes_held() const {
  return static_cast<uint64_t>(kv_.block_ids().size()) * runner_.kv().spec().bytes_per_block();
}

void SequenceSession::reset() {
  tokens_.clear();
  kv_.clear();
  n_computed_ = 0;
}

Expected<std::span<const float>> SequenceSession::feed(std::span<const int32_t> tokens) {
  if (tokens.empty() && n_computed_ == n_tokens()) return errorf("sequence: nothing to compute");
  PAGODA_TRY(kv_.ensure(static_cast<int64_t>(tokens_.size() + tokens.size())));
  const size_t old_size = tokens_.size();
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (recompute_) n_computed_ = 0;

  const int32_t chunk = std::max(1, runner_.options().max_tokens_per_step);
  sched::ScheduledSeq& s = plan_.seqs[0];
  s.request_id = id_;
  s.block_ids = kv_.block_ids();
  StepLogits out;
  while (n_computed_ < n_tokens()) {
    const int32_t n = std::min(chunk, n_tokens() - n_computed_);
    s.start_pos = n_computed_;
    s.token_ids.assign(tokens_.begin() + n_computed_, tokens_.begin() + n_computed_ + n);
    s.wants_logits = n_computed_ + n == n_tokens();
    Expected<StepLogits> r = runner_.execute(plan_);
    if (!r.ok()) {
      tokens_.resize(old_size);
      n_computed_ = std::min(n_computed_, static_cast<int32_t>(old_size));
      return r.error();
    }
    n_computed_ += n;
    out = *r;
  }
  return out.row(0);
}

}  // namespace pagoda::runtime
