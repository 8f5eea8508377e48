// PrefixCache: the map from a full block's key to the block that holds it.
//
// key(block i) = XXH3-128 over (key of block i-1 (zero for the first block),
//                model fingerprint, cache_salt, the block's token ids)
// so equal keys mean "same tokens after the same prefix, same model, same tenant".
// A hash is never trusted alone: every cached block keeps a copy of its token
// ids, its cache salt and the id of the cache entry of its parent block, and
// find() confirms all three (the salt is what isolates tenants, so a forced
// collision between two salts must not leak a block across them). Salts are
// interned with a reference count: most entries share a few short salts, so
// each entry holds one pointer, and the empty salt none at all. Entry ids are never reused, so a chain of confirmed entries pins the
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
#include "kv/event_sink.h"
#include "kv/miss_index.h"
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

  // The cached block under `key` whose parent entry is `parent`, whose tokens
  // equal `tokens` and whose salt equals `cache_salt`, or kNullBlock. A key
  // match with other tokens, another salt or another (live) parent counts in
  // collisions_refused().
  BlockId find(const Hash128& key, EntryId parent, std::span<const TokenId> tokens,
               std::string_view cache_salt) const;

  // The chain a block's entry belongs to, for KV events (kv/event_sink.h):
  // its KV group, its chain key (group 0's; `key` is a hash of it for other
  // groups) and its parent's chain key (root: a first block).
  struct ChainRef {
    int32_t group = 0;
    Hash128 chain;
    Hash128 parent;
    bool root = true;
    // false: not a K/V block (a hybrid model's state checkpoint,
    // kv/state_checkpoint.cc): neither its entry nor its removal is reported
    // (vLLM's KV events announce K/V blocks only; S checkpoint blocks share one chain).
    bool announce = true;
  };
  // Commits full block b. Returns the entry that now stands for this prefix: a
  // new one, the existing one when identical content is already cached, or
  // kNoEntry when parent is kNoEntry or the key is taken by other content.
  // Precondition: b is not already cached under another key.
  // `ref` names its chain for the event sink (nullptr: group 0, chain = key,
  // the parent's chain looked up from its entry).
  EntryId insert(BlockId b, const Hash128& key, EntryId parent, std::span<const TokenId> tokens,
                 std::string_view cache_salt, const ChainRef* ref = nullptr);
  // Removes b's key (eviction). No-op when b is not cached.
  void erase(BlockId b);

  // Every new entry and every erased one is reported to `sink` (nullptr: off).
  void set_event_sink(KvEventSink* sink) { sink_ = sink; }
  KvEventSink* event_sink() const { return sink_; }
  // A cached block's KV group and chain key (as given to insert).
  int32_t group_of(BlockId b) const { return slots_[static_cast<size_t>(b)].group; }
  const Hash128& chain_of(BlockId b) const { return slots_[static_cast<size_t>(b)].chain; }

  bool contains(BlockId b) const { return slots_[static_cast<size_t>(b)].entry != kNoEntry; }
  EntryId entry_of(BlockId b) const { return slots_[static_cast<size_t>(b)].entry; }
  const Hash128& key_of(BlockId b) const { return slots_[static_cast<size_t>(b)].key; }
  std::span<const TokenId> tokens_of(BlockId b) const { return slots_[static_cast<size_t>(b)].tokens; }
  std::string_view salt_of(BlockId b) const { return salt_view(slots_[static_cast<size_t>(b)]); }
  // Distinct non-empty salts held by cached blocks (the interned table's size).
  int32_t num_salts() const { return static_cast<int32_t>(salts_.size()); }
  int32_t size() const { return static_cast<int32_t>(map_.size()); }
  int64_t collisions_refused() const { return collisions_refused_; }

  // Read-only views for the dashboard (engine snapshot): the parent entry a
  // cached block extends (kRootEntry for a first block; kNoEntry when not
  // cached), the block standing for a live entry (kNullBlock when none), and
  // how many admissions reused the block since it was committed. Hits are a
  // statistic only: nothing decides on them.
  EntryId parent_of(BlockId b) const { return slots_[static_cast<size_t>(b)].parent; }
  BlockId block_of_entry(EntryId e) const {
    auto it = live_.find(e);
    return it == live_.end() ? kNullBlock : it->second;
  }
  int64_t hits_of(BlockId b) const { return slots_[static_cast<size_t>(b)].hits; }
  // One more admission served block b from the cache (KvManager::allocate). No-op when not cached.
  void count_hit(BlockId b) {
    Slot& s = slots_[static_cast<size_t>(b)];
    if (s.entry != kNoEntry) ++s.hits;
  }

  // The cached block under `key` as the map holds it, unconfirmed (kNullBlock
  // when none); no side effect. For miss diagnostics only (kv/prefix_miss.cc).
  BlockId block_of_key(const Hash128& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? kNullBlock : it->second;
  }
  // Children and salt-free keys of cached blocks (kv/miss_index.h), for miss diagnostics.
  const MissIndex& miss_index() const { return miss_index_; }

  // Map, per-block records and salt reference counts agree; "" when fine.
  std::string check() const;

 private:
  struct Slot {
    EntryId entry = kNoEntry;  // kNoEntry: not cached
    EntryId parent = kNoEntry;
    Hash128 key;
    std::vector<TokenId> tokens;
    // The interned salt (a key of salts_, whose nodes never move), or nullptr
    // for the empty salt.
    const std::string* salt = nullptr;
    int64_t hits = 0;  // admissions served from this block since its commit (count_hit)
    Hash128 chain;     // chain key (group 0's) and KV group, for KV events
    int32_t group = 0;
    bool announce = true;  // ChainRef::announce
  };
  static std::string_view salt_view(const Slot& s) { return s.salt ? std::string_view(*s.salt) : std::string_view(); }
  // Takes / drops one reference to an interned salt; nullptr for "".
  const std::string* intern_salt(std::string_view salt);
  void release_salt(const std::string* salt);
  uint64_t model_fingerprint_;
  HashFn hash_fn_;
  std::vector<Slot> slots_;
  bool live(EntryId e) const { return e == kRootEntry || live_.count(e) != 0; }

  std::unordered_map<Hash128, BlockId, Hash128Hasher> map_;
  std::unordered_map<EntryId, BlockId> live_;  // entries of cached blocks
  // Looks salts up by string_view without building a std::string.
  struct SaltHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Non-empty salt -> number of cached blocks holding it.
  std::unordered_map<std::string, int64_t, SaltHash, std::equal_to<>> salts_;
  EntryId next_entry_ = 1;
  MissIndex miss_index_;
  mutable int64_t collisions_refused_ = 0;
  KvEventSink* sink_ = nullptr;
};

}  // namespace pagoda::kv
