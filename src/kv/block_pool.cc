#include "kv/block_pool.h"

#include <algorithm>

#include "base/check.h"
#include "base/status.h"

namespace pagoda::kv {

BlockPool::BlockPool(int32_t num_blocks, int32_t num_classes)
    : num_blocks_(num_blocks),
      num_classes_(num_classes),
      ref_(static_cast<size_t>(num_blocks), 0),
      in_free_(static_cast<size_t>(num_blocks), 0),
      prev_(static_cast<size_t>(num_blocks) + static_cast<size_t>(std::max(1, num_classes))),
      next_(static_cast<size_t>(num_blocks) + static_cast<size_t>(std::max(1, num_classes))) {
  PAGODA_CHECK_MSG(num_blocks >= 2, "a block pool needs the null block and at least one more, got %d", num_blocks);
  PAGODA_CHECK_MSG(num_classes >= 1 && num_classes <= 16, "eviction classes %d not in 1..16", num_classes);
  for (int32_t c = 0; c < num_classes; ++c) {
    const auto s = static_cast<int32_t>(sentinel(c));
    prev_[sentinel(c)] = next_[sentinel(c)] = s;
  }
  // Initial order 1, 2, ..., n-1: fresh pools hand out ascending ids (first: the highest class).
  for (BlockId b = 1; b < num_blocks; ++b) push_back(b, num_classes - 1);
}

BlockId BlockPool::free_head() const {
  for (int32_t c = num_classes_ - 1; c >= 0; --c) {
    if (!class_empty(c)) return next_[sentinel(c)];
  }
  return -1;
}

void BlockPool::unlink(BlockId b) {
  const auto i = static_cast<size_t>(b);
  next_[static_cast<size_t>(prev_[i])] = next_[i];
  prev_[static_cast<size_t>(next_[i])] = prev_[i];
  prev_[i] = next_[i] = -1;
  in_free_[i] = 0;
  --num_free_;
}

void BlockPool::push_back(BlockId b, int32_t c) {
  const auto i = static_cast<size_t>(b);
  const int32_t tail = prev_[sentinel(c)];
  prev_[i] = tail;
  next_[i] = static_cast<int32_t>(sentinel(c));
  next_[static_cast<size_t>(tail)] = b;
  prev_[sentinel(c)] = b;
  in_free_[i] = 1;
  ++num_free_;
}

BlockId BlockPool::pop_free() {
  PAGODA_CHECK(num_free_ > 0);
  const BlockId b = free_head();
  unlink(b);
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::incref(BlockId b) {
  PAGODA_DCHECK(b > kNullBlock && b < num_blocks_);
  if (ref_[static_cast<size_t>(b)]++ == 0) unlink(b);
}

bool BlockPool::decref(BlockId b) {
  PAGODA_DCHECK(b > kNullBlock && b < num_blocks_);
  PAGODA_CHECK(ref_[static_cast<size_t>(b)] > 0);
  if (--ref_[static_cast<size_t>(b)] > 0) return false;
  push_back(b, num_classes_ > 1 && keyed_ && !keyed_(b) ? num_classes_ - 1 : release_class_);
  return true;
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(num_free_));
  for (int32_t c = num_classes_ - 1; c >= 0; --c) {
    for (int32_t b = next_[sentinel(c)]; b != static_cast<int32_t>(sentinel(c)); b = next_[static_cast<size_t>(b)]) {
      out.push_back(b);
    }
  }
  return out;
}

std::string BlockPool::check() const {
  if (ref_[0] != 0 || in_free_[0]) return "null block has a ref count or is in the free queue";
  int32_t count = 0;
  std::vector<uint8_t> seen(static_cast<size_t>(num_blocks_), 0);
  for (int32_t c = 0; c < num_classes_; ++c) {
    int32_t prev = static_cast<int32_t>(sentinel(c));
    for (int32_t b = next_[sentinel(c)]; b != static_cast<int32_t>(sentinel(c)); b = next_[static_cast<size_t>(b)]) {
      if (b <= kNullBlock || b >= num_blocks_) return errorf("free queue holds invalid block %d", b).message;
      const auto i = static_cast<size_t>(b);
      if (seen[i]) return errorf("block %d twice in the free queue", b).message;
      seen[i] = 1;
      if (prev_[i] != prev) return errorf("block %d: broken prev link", b).message;
      if (!in_free_[i]) return errorf("block %d in the free queue but not flagged free", b).message;
      if (ref_[i] != 0) return errorf("block %d in the free queue with ref count %d", b, ref_[i]).message;
      prev = b;
      if (++count > num_blocks_) return "free queue has a cycle";
    }
    if (prev_[sentinel(c)] != prev) return "free queue tail link broken";
  }
  if (count != num_free_) return errorf("free queue length %d != num_free %d", count, num_free_).message;
  for (BlockId b = 1; b < num_blocks_; ++b) {
    const auto i = static_cast<size_t>(b);
    if (ref_[i] < 0) return errorf("block %d has negative ref count %d", b, ref_[i]).message;
    if (ref_[i] == 0 && !seen[i]) return errorf("block %d has ref count 0 but is not in the free queue", b).message;
    if (ref_[i] > 0 && in_free_[i]) return errorf("block %d referenced but flagged free", b).message;
  }
  return "";
}

}  // namespace pagoda::kv
