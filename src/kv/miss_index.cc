#include "kv/miss_index.h"

#include <algorithm>

#include "base/check.h"
#include "base/timer.h"

namespace pagoda::kv {

void MissIndex::add(BlockId b, EntryId parent, const Hash128& unsalted, bool salted) {
  Node& n = nodes_[static_cast<size_t>(b)];
  PAGODA_CHECK(!n.in && b != kNullBlock);
  n = Node{true, salted, parent, kNullBlock, kNullBlock, unsalted};
  auto [it, fresh] = first_child_.emplace(parent, b);
  if (!fresh) {
    n.next = it->second;
    nodes_[static_cast<size_t>(it->second)].prev = b;
    it->second = b;
  }
  if (salted) ++salted_[unsalted];
}

void MissIndex::remove(BlockId b) {
  Node& n = nodes_[static_cast<size_t>(b)];
  if (!n.in) return;
  if (n.next != kNullBlock) nodes_[static_cast<size_t>(n.next)].prev = n.prev;
  if (n.prev != kNullBlock) {
    nodes_[static_cast<size_t>(n.prev)].next = n.next;
  } else if (n.next != kNullBlock) {
    first_child_[n.parent] = n.next;
  } else {
    first_child_.erase(n.parent);
  }
  if (n.salted) {
    auto it = salted_.find(n.unsalted);
    PAGODA_CHECK(it != salted_.end() && it->second > 0);
    if (--it->second == 0) salted_.erase(it);
  }
  n = Node{};
}

int32_t MissIndex::salted_count(const Hash128& unsalted) const {
  auto it = salted_.find(unsalted);
  return it == salted_.end() ? 0 : it->second;
}

void MissIndex::for_each_child(EntryId parent, const std::function<void(BlockId)>& fn) const {
  auto it = first_child_.find(parent);
  for (BlockId b = it == first_child_.end() ? kNullBlock : it->second; b != kNullBlock;
       b = nodes_[static_cast<size_t>(b)].next) {
    fn(b);
  }
}

EvictionLog::EvictionLog(int32_t capacity) : ring_(static_cast<size_t>(std::max(capacity, 1))) {}

double EvictionLog::now() const { return clock_ ? clock_() : now_seconds(); }

void EvictionLog::record(const Hash128& key) {
  Slot& s = ring_[head_];
  if (s.serial != 0) {
    // The oldest record leaves; its key is forgotten unless evicted again since.
    auto it = at_.find(s.key);
    if (it != at_.end() && it->second.serial == s.serial) at_.erase(it);
  }
  s = Slot{key, ++serial_};
  at_[key] = At{now(), s.serial};
  head_ = (head_ + 1) % ring_.size();
}

std::optional<double> EvictionLog::evicted_at(const Hash128& key) const {
  auto it = at_.find(key);
  if (it == at_.end()) return std::nullopt;
  return it->second.t;
}

}  // namespace pagoda::kv
