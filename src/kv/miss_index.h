// Indexes PrefixCache keeps only to explain a miss (issue 36, kv/prefix_miss.h),
// never to decide a hit:
//  - MissIndex: the cached children of each cache entry (an intrusive sibling
//    list per parent entry, O(1) add/remove), and a count of salted blocks per
//    salt-free chain key (the key the same tokens after the same token prefix
//    have under the empty salt), so a miss can tell "another tenant holds it".
//  - EvictionLog: the last `capacity` keys evicted from the cache with the time
//    of their eviction (a ring; a key evicted again is remembered at its last
//    eviction). KvManager sizes it to the pool's block count: a key is
//    remembered until about one pool turnover of evictions has happened since.
// Diagnostics trust the 128-bit hash (they answer "why", never serve bytes).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/hash.h"
#include "kv/types.h"

namespace pagoda::kv {

using EntryId = uint64_t;

class MissIndex {
 public:
  explicit MissIndex(int32_t num_blocks) : nodes_(static_cast<size_t>(num_blocks)) {}
  // Block b was committed under parent entry `parent` with salt-free chain key
  // `unsalted` (its own key when its salt is empty; `salted`: it is not).
  void add(BlockId b, EntryId parent, const Hash128& unsalted, bool salted);
  // Block b's key was dropped. No-op when b was not added.
  void remove(BlockId b);
  // The salt-free chain key of a cached block (zero when not cached).
  const Hash128& unsalted_of(BlockId b) const { return nodes_[static_cast<size_t>(b)].unsalted; }
  // Cached blocks with a non-empty salt whose salt-free chain key is `unsalted`.
  int32_t salted_count(const Hash128& unsalted) const;
  // Calls fn(block) for each cached block whose parent entry is `parent`.
  void for_each_child(EntryId parent, const std::function<void(BlockId)>& fn) const;

 private:
  struct Node {
    bool in = false;
    bool salted = false;
    EntryId parent = 0;
    BlockId prev = kNullBlock, next = kNullBlock;  // siblings (kNullBlock: none; block 0 is never cached)
    Hash128 unsalted;
  };
  std::vector<Node> nodes_;
  std::unordered_map<EntryId, BlockId> first_child_;
  std::unordered_map<Hash128, int32_t, Hash128Hasher> salted_;
};

class EvictionLog {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  explicit EvictionLog(int32_t capacity);
  void set_clock(Clock clock) { clock_ = std::move(clock); }
  double now() const;
  void record(const Hash128& key);
  // When `key` was last evicted, if it is still remembered.
  std::optional<double> evicted_at(const Hash128& key) const;
  int32_t capacity() const { return static_cast<int32_t>(ring_.size()); }
  int32_t size() const { return static_cast<int32_t>(at_.size()); }

 private:
  struct Slot {
    Hash128 key;
    uint64_t serial = 0;  // 0: empty
  };
  Clock clock_;
  std::vector<Slot> ring_;
  size_t head_ = 0;
  uint64_t serial_ = 0;
  struct At {
    double t = 0;
    uint64_t serial = 0;  // the ring slot that holds its last eviction
  };
  std::unordered_map<Hash128, At, Hash128Hasher> at_;
};

}  // namespace pagoda::kv
