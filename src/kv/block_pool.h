// BlockPool: reference counts and the free queue of a fixed pool of KV blocks.
//
// The free queue holds every block with ref count 0 (plain free blocks and
// cached-but-evictable ones) in eviction order: allocation pops the head (the
// least recently freed block), release appends at the tail. It is an intrusive
// doubly linked list over block ids, so a prefix-cache hit on a free block
// removes it from the middle in O(1). Block 0 (kNullBlock) is never in it.
//
// Eviction classes (issue 36, --scheduling-policy priority): with
// num_classes > 1 the free queue is one LRU list per class, and pop_free
// takes the head of the highest non-empty class first (class = how readily
// a block is evicted: the KvManager releases a worse-priority request's
// blocks into a higher class). With one class (the default) it is the one
// LRU list described above.
//
// The pool knows nothing about the prefix cache: the KvManager evicts the key
// of a cached block when it pops it. Not thread-safe.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv/types.h"

namespace pagoda::kv {

class BlockPool {
 public:
  // Precondition: num_blocks >= 2 (block 0 is the null block).
  explicit BlockPool(int32_t num_blocks, int32_t num_classes = 1);

  int32_t num_blocks() const { return num_blocks_; }         // including the null block
  int32_t num_usable_blocks() const { return num_blocks_ - 1; }
  int32_t num_free() const { return num_free_; }              // blocks in the free queue

  int32_t ref_count(BlockId b) const { return ref_[static_cast<size_t>(b)]; }
  bool in_free_queue(BlockId b) const { return in_free_[static_cast<size_t>(b)] != 0; }

  // Pops the head of the free queue and gives it ref count 1.
  // Precondition: num_free() > 0.
  BlockId pop_free();
  // ref += 1; a block at ref 0 leaves the free queue (prefix-cache hit "touch").
  // Precondition: b is not the null block.
  void incref(BlockId b);
  // ref -= 1; at 0 the block is appended at the tail of the free queue.
  // Returns true when it reached 0. Precondition: ref_count(b) > 0.
  bool decref(BlockId b);
  // The class decref() releases blocks into (clamped to the classes there are).
  // With classes: blocks for which keyed(b) is false (they hold no prefix) go
  // to the highest class whatever the release class: evicting them costs nothing.
  void set_keyed_fn(std::function<bool(BlockId)> keyed) { keyed_ = std::move(keyed); }
  void set_release_class(int32_t c) { release_class_ = c < 0 ? 0 : c >= num_classes_ ? num_classes_ - 1 : c; }
  int32_t num_classes() const { return num_classes_; }

  // Head (next to be allocated) or -1 when empty.
  BlockId free_head() const;
  // Free queue in eviction order (highest class first, each from head to tail), for tests and debugging. O(n).
  std::vector<BlockId> free_queue() const;
  // Internal consistency of links, flags and counts; "" when fine.
  std::string check() const;

 private:
  size_t sentinel(int32_t c = 0) const { return static_cast<size_t>(num_blocks_ + c); }
  bool class_empty(int32_t c) const { return next_[sentinel(c)] == static_cast<int32_t>(sentinel(c)); }
  void unlink(BlockId b);
  void push_back(BlockId b, int32_t c);

  int32_t num_blocks_;
  int32_t num_classes_ = 1;
  int32_t release_class_ = 0;
  std::function<bool(BlockId)> keyed_;
  int32_t num_free_ = 0;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> in_free_;
  // One circular list per class, with its sentinel at index num_blocks_ + class.
  std::vector<int32_t> prev_, next_;
};

}  // namespace pagoda::kv
