// KvManager: per-sequence block tables over a BlockPool, with automatic prefix
// caching. Pure bookkeeping on integer ids; the runner owns the K/V bytes.
//
// A sequence (SeqId handle) has a block table and num_computed_tokens: the
// tokens whose K/V are in its blocks. Life of a sequence:
//   can_allocate / allocate  reuse cached full blocks of its known tokens, and
//                            get slots for the first chunk to compute
//   mark_computed            after a step: tokens now in the cache; full blocks
//                            get their prefix key (are committed to the cache)
//   append_slots             before a step: room for the next tokens
//   fork                     n > 1 sampling: the child shares every block
//   free                     blocks go back; cached ones stay findable until reused
// Every mutating call checks first and mutates only when it can complete: a
// refusal leaves no partial state. Not thread-safe.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/hash.h"
#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "kv/types.h"

namespace pagoda::kv {

struct KvConfig {
  int32_t num_blocks = 0;          // including the null block 0; usable = num_blocks - 1
  int32_t block_size = 16;         // tokens per block, 1..256
  double watermark = 0.01;         // fraction of usable blocks admission leaves free
  uint64_t model_fingerprint = 0;  // part of every block key: caches of different models never mix
  bool enable_prefix_caching = true;
};

struct KvStats {
  int32_t num_blocks_total = 0;      // usable blocks (null block excluded)
  int32_t num_free = 0;              // ref 0 and no key
  int32_t num_used = 0;              // ref > 0
  int32_t num_cached_evictable = 0;  // ref 0 with a key: free, but a prefix hit can revive it
  int32_t num_cached = 0;            // blocks with a key, used or not
  int64_t prefix_query_tokens = 0;   // tokens offered to lookups by allocate()
  int64_t prefix_hit_tokens = 0;     // of those, served from the cache
  int64_t num_evictions = 0;         // cached blocks whose key was dropped for reuse
  int64_t num_cow_copies = 0;        // copy-on-write block copies requested
  int64_t collisions_refused = 0;    // key matches refused by the token / parent check
};

class KvManager {
 public:
  // Precondition: num_blocks >= 2, 1 <= block_size <= 256, 0 <= watermark < 1.
  explicit KvManager(const KvConfig& config);

  const KvConfig& config() const { return config_; }
  int32_t block_size() const { return config_.block_size; }
  int32_t num_usable_blocks() const { return pool_.num_usable_blocks(); }
  int32_t num_free_blocks() const { return pool_.num_free(); }  // incl. cached-evictable
  int32_t watermark_blocks() const { return watermark_blocks_; }
  int32_t num_blocks_for(int64_t num_tokens) const { return blocks_for_tokens(num_tokens, config_.block_size); }

  // --- queries (no state change) ---
  // Tokens of `tokens` that allocate() would take from the cache: the longest
  // run of cached full blocks from the start, confirmed token by token, never
  // covering the last token (a step must compute at least one to get logits).
  int32_t num_cached_prefix_tokens(std::span<const TokenId> tokens, std::string_view cache_salt) const;
  // Appends to *keys the keys of the full blocks of `tokens` beyond keys->size()
  // (callers keep the vector per request and extend it as tokens arrive).
  void extend_block_keys(std::span<const TokenId> tokens, std::string_view cache_salt,
                         std::vector<Hash128>* keys) const;

  // --- admission ---
  // Whether allocate(seq, tokens, num_new_tokens, salt) would succeed while
  // leaving watermark_blocks() free.
  bool can_allocate(std::span<const TokenId> tokens, int32_t num_new_tokens, std::string_view cache_salt) const;
  // Creates sequence `seq`: takes the cached prefix of `tokens` (see
  // num_cached_prefix_tokens), and slots for num_new_tokens more. Returns the
  // number of cached tokens (== the sequence's num_computed_tokens). Fails,
  // changing nothing, when seq exists or !can_allocate(...).
  // Precondition: num_new_tokens >= 0 and cached + num_new_tokens >= 1.
  Expected<int32_t> allocate(SeqId seq, std::span<const TokenId> tokens, int32_t num_new_tokens,
                             std::string_view cache_salt);

  // --- running ---
  // Room for num_new_tokens more tokens after num_computed_tokens: new blocks,
  // and copy-on-write for shared blocks about to be written (pairs appended to
  // *copies when the source holds computed tokens). Ignores the watermark.
  // Returns false, changing nothing, when the pool cannot supply the blocks.
  bool append_slots(SeqId seq, int32_t num_new_tokens, std::vector<BlockCopy>* copies);
  // Whether append_slots(seq, num_new_tokens, ...) would succeed.
  bool can_append_slots(SeqId seq, int32_t num_new_tokens) const;
  // The sequence now has num_computed_tokens computed; `tokens` are its known
  // tokens (at least num_computed_tokens of them). Full computed blocks are
  // committed to the prefix cache. Precondition: current <= num_computed_tokens
  // <= slots in its table.
  void mark_computed(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed_tokens);
  // The child shares all of parent's blocks (ref counts +1), its computed count
  // and committed keys. Never allocates. Fails when parent is unknown or child exists.
  Status fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks, last block first onto the free queue so a
  // sequence's tail is evicted before its head. Returns false for unknown seq.
  bool free(SeqId seq);

  // --- access ---
  bool has_seq(SeqId seq) const { return seqs_.count(seq) != 0; }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }
  // Precondition for these: has_seq(seq).
  std::span<const BlockId> block_table(SeqId seq) const;
  int32_t num_computed_tokens(SeqId seq) const;
  int32_t num_committed_blocks(SeqId seq) const;  // leading full blocks already committed
  int32_t num_slots(SeqId seq) const;             // block_table(seq).size() * block_size

  KvStats stats() const;
  // Every invariant: free + used + cached-evictable == total; ref counts ==
  // references from block tables; no block both free and referenced; the
  // cache map agrees with its records; tables cover their computed tokens.
  // Returns "" when all hold, else the first violation. O(blocks + table entries).
  std::string check_invariants() const;

  // For tests.
  const BlockPool& pool() const { return pool_; }
  const PrefixCache& cache() const { return cache_; }
  PrefixCache& mutable_cache_for_testing() { return cache_; }

 private:
  struct Seq {
    std::vector<BlockId> blocks;
    int32_t num_computed = 0;
    std::string salt;
    std::vector<Hash128> keys;     // keys of the committed leading full blocks
    std::vector<EntryId> entries;  // cache entry standing for the prefix through each of them
  };
  struct Match {
    std::vector<BlockId> blocks;
    std::vector<Hash128> keys;
    std::vector<EntryId> entries;
  };
  Match match_prefix(std::span<const TokenId> tokens, std::string_view salt) const;
  // Blocks that allocate() takes from the free queue for this match.
  int32_t blocks_needed(const Match& m, int32_t num_new_tokens, int32_t* revived) const;
  int32_t cow_blocks_needed(const Seq& s, int32_t num_new_tokens, int32_t* fresh) const;
  BlockId take_block();  // pop + evict the key of a cached block
  const Seq& seq_ref(SeqId seq) const;

  KvConfig config_;
  int32_t watermark_blocks_ = 0;
  BlockPool pool_;
  PrefixCache cache_;
  std::unordered_map<SeqId, Seq> seqs_;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t num_evictions_ = 0;
  int64_t num_cow_copies_ = 0;
};

}  // namespace pagoda::kv
