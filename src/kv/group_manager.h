// One KV cache group's block tables (vLLM's single-type KV cache managers).
//
// The KvManager coordinates one GroupManager per group. A GroupManager owns
// its group's block table of every sequence (logical entry i covers tokens
// [i*bs, (i+1)*bs)) and its kind's rules:
//   first_needed_block  which entries a step from `start` reads (the rest may go)
//   peak_blocks         the most blocks a sequence holds (kv/sizing's arithmetic)
//   held_blocks         the reservation rule: what a sequence's table counts
//                       against that peak
//   release_before      the release rule: entries a step no longer reads go back
// The table mechanics (adopt a hit, grow, copy-on-write, fork, free, truncate)
// are the same for every kind and live here. All groups draw from the one
// SharedBlocks (pool + prefix cache), owned by the KvManager.
//
// A kind is one file (full_attention_group.cc, sliding_window_group.cc,
// recurrent_state_group.cc) that defines a GroupManager subclass and its
// GroupKind; group_kinds.cc lists them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_cache.h"
#include "kv/types.h"

namespace pagoda::kv {

// One KV cache group: 0 = full context, else the sliding window in tokens (a
// token at p sees keys p - window < j <= p). state_blocks > 0: a recurrent
// state group (recurrent_state_group.cc): every sequence holds exactly that
// many blocks, whatever its length, for its fixed-size state.
struct KvGroupSpec {
  int32_t sliding_window = 0;
  int32_t state_blocks = 0;
};

// The blocks every group draws from: the one pool and the one prefix cache.
struct SharedBlocks {
  SharedBlocks(int32_t num_blocks, uint64_t model_fingerprint, int32_t eviction_classes = 1)
      : pool(num_blocks, eviction_classes), cache(num_blocks, model_fingerprint), evicted(num_blocks) {
    if (eviction_classes > 1) pool.set_keyed_fn([this](BlockId b) { return cache.contains(b); });
  }
  SharedBlocks(const SharedBlocks&) = delete;
  SharedBlocks& operator=(const SharedBlocks&) = delete;
  BlockPool pool;
  PrefixCache cache;
  EvictionLog evicted;  // keys recently evicted, with when (kv/miss_index.h)
  int64_t num_evictions = 0;   // cached blocks whose key was dropped for reuse
  int64_t num_cow_copies = 0;  // copy-on-write block copies requested
  // [num_blocks] 1: the block is the first state block of a cached checkpoint
  // (kv/state_checkpoint.cc), so its eviction counts one checkpoint evicted.
  std::vector<uint8_t> checkpoint_head = std::vector<uint8_t>(static_cast<size_t>(pool.num_blocks()), 0);
  int64_t num_checkpoint_evictions = 0;
  // Pops the head of the free queue; a cached block loses its key (an eviction).
  BlockId take();
};

class GroupManager {
 public:
  GroupManager(const KvGroupSpec& spec, int32_t block_size, SharedBlocks* blocks)
      : spec_(spec), block_size_(block_size), blocks_(blocks) {}
  virtual ~GroupManager() = default;
  GroupManager(const GroupManager&) = delete;
  GroupManager& operator=(const GroupManager&) = delete;

  const KvGroupSpec& spec() const { return spec_; }
  int32_t block_size() const { return block_size_; }
  virtual const char* kind() const = 0;

  // ---- the kind's rules ----
  // First logical entry a step computing from position `start` reads; entries
  // before it may be released (the null block). 0 for a full group.
  virtual int32_t first_needed_block(int64_t start) const = 0;
  // Blocks a sequence of num_tokens tokens holds at most when computed in
  // chunks of up to max_chunk (kv_group_blocks_for_sequence).
  virtual int64_t peak_blocks(int64_t num_tokens, int32_t max_chunk) const = 0;
  // Reservation rule: the blocks of seq's table that count against its peak.
  virtual int64_t held_blocks(SeqId seq) const = 0;
  // The same for a sequence about to be created from a prefix hit `hit` (its
  // entries before first_live are null) and grown to total_blocks entries.
  virtual int64_t held_after_allocate(std::span<const BlockId> hit, int32_t first_live,
                                      int32_t total_blocks) const = 0;
  // Release rule: how many of seq's blocks release_before(seq, start) would
  // give back to the free queue (held alone), and the release itself.
  virtual int32_t releasable_blocks(SeqId seq, int64_t start) const = 0;
  virtual void release_before(SeqId seq, int64_t start) = 0;
  // Table shape: the entries a sequence's table has when the attention groups'
  // tables have `logical` (ceil(tokens / bs)) entries; the first entry a step
  // from num_computed writes (copy-on-write starts there); whether entry j
  // holds data a copy-on-write must copy. Attention kinds: logical, the block
  // of num_computed, j * bs < num_computed. A recurrent state group: a fixed
  // count (0 before the first token), every entry, every entry once a token is computed.
  virtual int32_t table_entries(int32_t logical) const { return logical; }
  virtual int32_t first_written_entry(int32_t num_computed) const { return num_computed / block_size_; }
  virtual bool entry_computed(int32_t j, int32_t num_computed) const { return j * block_size_ < num_computed; }
  // Whether the group's data can be rolled back to fewer computed tokens
  // (truncate below num_computed): attention yes, a recurrent state no.
  virtual bool can_roll_back() const { return true; }

  // ---- tables ----
  bool has(SeqId seq) const { return tables_.count(seq) != 0; }
  int32_t num_seqs() const { return static_cast<int32_t>(tables_.size()); }
  // Preconditions for these: has(seq).
  std::span<const BlockId> table(SeqId seq) const { return ref(seq).blocks; }
  int32_t num_entries(SeqId seq) const { return static_cast<int32_t>(ref(seq).blocks.size()); }
  int32_t first_live(SeqId seq) const { return ref(seq).first_live; }

  // Creates seq's table from a prefix hit (null entries allowed) and touches
  // its blocks (ref + 1: a hit on a free block leaves the free queue).
  // Precondition: !has(seq).
  void adopt(SeqId seq, std::span<const BlockId> hit, int32_t first_live);
  // Appends fresh blocks until the table has num_entries entries.
  void grow(SeqId seq, int32_t num_entries);
  // Shared blocks (ref > 1) among entries [from, to).
  int32_t shared_blocks(SeqId seq, int32_t from, int32_t to) const;
  // Replaces each shared block of entries [from, to) by a fresh one; a block
  // holding computed tokens (entry * bs < num_computed) is copied (src, dst).
  void copy_on_write(SeqId seq, int32_t from, int32_t to, int32_t num_computed, std::vector<BlockCopy>* copies);
  // child's table is parent's, every block shared (ref + 1).
  void fork(SeqId parent, SeqId child);
  // Gives the table's blocks back, last first, and forgets seq.
  void free(SeqId seq);
  // Gives back the entries past the first num_entries, last first.
  void truncate(SeqId seq, int32_t num_entries);
  // Whether entries [from, to) of seq's table are all real blocks.
  bool holds(SeqId seq, int32_t from, int32_t to) const;
  // Calls f(seq, table, first_live) for every sequence.
  template <typename F>
  void for_each(F&& f) const {
    for (const auto& [id, t] : tables_) f(id, std::span<const BlockId>(t.blocks), t.first_live);
  }

 protected:
  struct Table {
    std::vector<BlockId> blocks;  // kNullBlock before first_live (released or never taken)
    int32_t first_live = 0;       // first entry that may be a real block
  };
  const Table& ref(SeqId seq) const;
  Table& mut(SeqId seq);
  // Blocks of entries [from, to) that only this table holds (ref 1).
  int32_t held_alone(const Table& t, int32_t from, int32_t to) const;
  BlockPool& pool() const { return blocks_->pool; }

  KvGroupSpec spec_;
  int32_t block_size_;
  SharedBlocks* blocks_;
  std::unordered_map<SeqId, Table> tables_;
};

// A registered kind: which specs it serves and how to make its manager.
struct GroupKind {
  const char* name;
  bool (*serves)(const KvGroupSpec& spec);
  std::unique_ptr<GroupManager> (*make)(const KvGroupSpec& spec, int32_t block_size, SharedBlocks* blocks);
};
// The manager of the first registered kind that serves `spec` (group_kinds.cc).
std::unique_ptr<GroupManager> make_group_manager(const KvGroupSpec& spec, int32_t block_size, SharedBlocks* blocks);

}  // namespace pagoda::kv
