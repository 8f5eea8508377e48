// What the KvManager's prefix walk finds (PrefixMatch) and what admission
// hands to allocate (Admission); both made and read only by KvManager
// (kv_manager.h, kv_prefix.cc).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/hash.h"
#include "kv/prefix_cache.h"
#include "kv/types.h"

namespace pagoda::kv {

class KvManager;

// The result of one walk of the prefix cache over a sequence's tokens: the
// longest run of cached full blocks from the start, confirmed token by token,
// never covering the last token (a step must compute at least one to get
// logits). Made by KvManager::match_prefix; can_allocate turns it into an
// Admission that allocate consumes, so admitting a sequence walks the cache
// once. A match describes the KvManager as it was when made (its generation);
// KvManager::revalidate brings an older one up to date without hashing.
//
// With groups, the hit h is the longest block-aligned prefix (<= group 0's
// confirmed chain) that every group can serve: a full group needs all its
// blocks before h, a window group W only those holding a token in
// [h - W + 1, h) (the keys the first computed token, at h, sees); its other
// entries are the null block.
class PrefixMatch {
 public:
  int32_t num_cached_tokens() const { return num_blocks_ * block_size_; }
  int32_t num_blocks() const { return num_blocks_; }
  // Group 0's table of the hit ([num_blocks]); group g's: blocks(g).
  std::span<const BlockId> blocks() const { return tables_.empty() ? std::span<const BlockId>() : tables_[0]; }
  std::span<const BlockId> blocks(int32_t group) const { return tables_[static_cast<size_t>(group)]; }
  // The key of the first full block past the hit when a hit there was possible
  // (it is not the block of the last token) but the cache lacks it; nullptr
  // otherwise. In-flight dedup compares it with blocks being computed.
  const Hash128* next_block_key() const { return has_next_key_ ? &next_key_ : nullptr; }
  // With a recurrent state group: the S blocks of the state checkpoint the hit
  // ends at (allocate copies them into the sequence's own state blocks);
  // empty when there is no hit. The state group's table in the match is empty.
  std::span<const BlockId> checkpoint_blocks() const { return ckpt_blocks_; }

 private:
  friend class KvManager;
  int32_t num_blocks_ = 0;
  std::vector<BlockId> ckpt_blocks_;    // [S] or empty
  std::vector<EntryId> ckpt_entries_;   // their cache entries when matched
  // [n_groups][num_blocks] the cached blocks in sequence order (kNullBlock where
  // a window group does not need one) and their cache entries (kNoEntry there).
  std::vector<std::vector<BlockId>> tables_;
  std::vector<std::vector<EntryId>> table_entries_;
  std::vector<Hash128> keys_;     // [num_blocks] the chain keys of the hit's blocks
  std::vector<EntryId> entries_;  // [num_blocks] group 0's entry standing for the prefix through each
  Hash128 next_key_;
  bool has_next_key_ = false;
  std::string salt_;
  int64_t num_query_tokens_ = 0;  // tokens offered to the lookup (for KvStats)
  int32_t block_size_ = 1;
  const KvManager* owner_ = nullptr;  // the KvManager that made it
  uint64_t generation_ = 0;           // owner_->generation_ the blocks were confirmed in
};

// A PrefixMatch checked against the pool for num_new_tokens more slots: what
// allocate() takes. Valid only until the KvManager next changes (allocate
// refuses a stale one); the scheduler makes and consumes it in one admission.
class Admission {
 public:
  int32_t num_cached_tokens() const { return match_.num_cached_tokens(); }
  int32_t num_new_tokens() const { return num_new_tokens_; }
  // Blocks allocate() takes from the free queue: fresh ones plus cached hits
  // revived from it (ref count 0).
  int32_t num_blocks_needed() const { return num_blocks_needed_; }
  // Blocks kept free for the rest of the sequence's prefill once allocated
  // (its growth to target_tokens; see KvManager::num_reserved_blocks).
  int32_t num_blocks_reserved() const { return num_blocks_reserved_; }
  const PrefixMatch& match() const { return match_; }

 private:
  friend class KvManager;
  PrefixMatch match_;
  int32_t num_new_tokens_ = 0;
  int32_t num_blocks_needed_ = 0;
  int32_t num_blocks_reserved_ = 0;
  int32_t target_tokens_ = 0;
  int32_t max_chunk_ = 1;
};

}  // namespace pagoda::kv
