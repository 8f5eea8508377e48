// PrefixCache: the map from a full block's key to the block that holds it.
//
// key(block i) = XXH3-128 over (key of block i-1 (zero for the first block),
//                model fingerprint, cache_salt, the block's token ids)
// so equal keys mean "same tokens after the same prefix, same model, same tenant".
// A hash is never trusted alone: every cached block keeps a copy of its token
// ids and the id of the cache entry of its parent block, and find() confirms
// both. Entry ids are never reused, so a chain of confirmed entries pins the
// exact token prefix, even if a forced collision made two prefixes share a key.
//
// Only the first block committed under a key is cached; a later block with the
// same key and content (computed twice concurrently) maps to the existing
// entry, one with the same key and other content (a collision) is refused. A
// cached block whose parent entry was evicted can no longer be confirmed; a
// later commit of the same content under a live parent takes its key over.
// Not thread-safe.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/hash.h"
#include "kv/types.h"

namespace pagoda::kv {

// Identifies the prefix a block extends. kRootEntry: the block is the first of
// its sequence. kNoEntry: the prefix is not in the cache (chain broken by a
// refused collision), so nothing after it can be cached.
using EntryId = uint64_t;
inline constexpr EntryId kRootEntry = 0;
inline constexpr EntryId kNoEntry = ~uint64_t{0};

class PrefixCache {
 public:
  // Signature of the block hash; replaceable for tests that force collisions.
  using HashFn = std::function<Hash128(const Hash128& parent, std::span<const TokenId> tokens,
                                       uint64_t model_fingerprint, std::string_view cache_salt)>;
  // The default XXH3-128 block hash.
  static Hash128 default_hash(const Hash128& parent, std::span<const TokenId> tokens, uint64_t model_fingerprint,
                              std::string_view cache_salt);

  PrefixCache(int32_t num_blocks, uint64_t model_fingerprint);

  // Test hook: replace the block hash (e.g. a constant to force collisions).
  // Precondition: the cache is empty.
  void set_hash_fn_for_testing(HashFn fn);

  Hash128 key(const Hash128& parent, std::span<const TokenId> tokens, std::string_view cache_salt) const;

  // The cached block under `key` whose parent entry is `parent` and whose tokens
  // equal `tokens`, or kNullBlock. A key match with other tokens or another
  // parent counts in collisions_refused().
  BlockId find(const Hash128& key, EntryId parent, std::span<const TokenId> tokens) const;

  // Commits full block b. Returns the entry that now stands for this prefix: a
  // new one, the existing one when identical content is already cached, or
  // kNoEntry when parent is kNoEntry or the key is taken by other content.
  // Precondition: b is not already cached under another key.
  EntryId insert(BlockId b, const Hash128& key, EntryId parent, std::span<const TokenId> tokens);
  // Removes b's key (eviction). No-op when b is not cached.
  void erase(BlockId b);

  bool contains(BlockId b) const { return slots_[static_cast<size_t>(b)].entry != kNoEntry; }
  EntryId entry_of(BlockId b) const { return slots_[static_cast<size_t>(b)].entry; }
  const Hash128& key_of(BlockId b) const { return slots_[static_cast<size_t>(b)].key; }
  std::span<const TokenId> tokens_of(BlockId b) const { return slots_[static_cast<size_t>(b)].tokens; }
  int32_t size() const { return static_cast<int32_t>(map_.size()); }
  int64_t collisions_refused() const { return collisions_refused_; }

  // Map and per-block records agree; "" when fine.
  std::string check() const;

 private:
  struct Slot {
    EntryId entry = kNoEntry;  // kNoEntry: not cached
    EntryId parent = kNoEntry;
    Hash128 key;
    std::vector<TokenId> tokens;
  };
  uint64_t model_fingerprint_;
  HashFn hash_fn_;
  std::vector<Slot> slots_;
  bool live(EntryId e) const { return e == kRootEntry || live_.count(e) != 0; }

  std::unordered_map<Hash128, BlockId, Hash128Hasher> map_;
  std::unordered_map<EntryId, BlockId> live_;  // entries of cached blocks
  EntryId next_entry_ = 1;
  mutable int64_t collisions_refused_ = 0;
};

}  // namespace pagoda::kv
