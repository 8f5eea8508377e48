// BlockPool: reference counts and the free queue of a fixed pool of KV blocks.
//
// The free queue holds every block with ref count 0 (plain free blocks and
// cached-but-evictable ones) in eviction order: allocation pops the head (the
// least recently freed block), release appends at the tail. It is an intrusive
// doubly linked list over block ids, so a prefix-cache hit on a free block
// removes it from the middle in O(1). Block 0 (kNullBlock) is never in it.
//
// The pool knows nothing about the prefix cache: the KvManager evicts the key
// of a cached block when it pops it. Not thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kv/types.h"

namespace pagoda::kv {

class BlockPool {
 public:
  // Precondition: num_blocks >= 2 (block 0 is the null block).
  explicit BlockPool(int32_t num_blocks);

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

  // Head (next to be allocated) or -1 when empty.
  BlockId free_head() const { return num_free_ ? next_[sentinel()] : -1; }
  // Free queue from head (evicted first) to tail, for tests and debugging. O(n).
  std::vector<BlockId> free_queue() const;
  // Internal consistency of links, flags and counts; "" when fine.
  std::string check() const;

 private:
  size_t sentinel() const { return static_cast<size_t>(num_blocks_); }
  void unlink(BlockId b);
  void push_back(BlockId b);

  int32_t num_blocks_;
  int32_t num_free_ = 0;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> in_free_;
  // Circular list with a sentinel at index num_blocks_.
  std::vector<int32_t> prev_, next_;
};

}  // namespace pagoda::kv
