// KvManager: per-sequence block tables over a BlockPool, with automatic prefix
// caching. Pure bookkeeping on integer ids; the runner owns the K/V bytes.
// The KvManager is the one owner of a sequence's cache state, with one GroupManager per KV
// group (kv/group_manager.h) owning that group's block tables: the KvManager keeps its
// num_computed_tokens (the tokens whose K/V are in its blocks) and the keys of its full blocks.
// The scheduler keeps the tokens and asks for the rest. Files: kv_manager.cc
// (admission, append, commit, fork, free, truncate), kv_prefix.cc (prefix
// walks), kv_import.cc (tier import), kv_check.cc (stats, invariants).
// Life of a sequence:
//   match_prefix             the one walk of the prefix cache for its tokens
//   can_allocate / allocate  check the match against the pool (an Admission),
//                            then take the cached blocks and slots for the first
//                            chunk to compute
//   mark_computed            after a step: tokens now in the cache; full blocks
//                            get their prefix key (are committed to the cache)
//   append_slots             before a step: room for the next tokens
//   fork                     n > 1 sampling: the child shares every block
//   free                     blocks go back; cached ones stay findable until reused
// Every mutating call checks first and mutates only when it can complete: a
// refusal leaves no partial state. Not thread-safe.
// KV cache groups (vLLM's hybrid KV cache manager). Layers of one attention
// kind (full context, or sliding window W) share a group; every group has one
// block table per sequence over the ONE pool (its GroupManager's), and every
// block has the same bytes (the runner gives each group's layers the same
// number of layer slots; kv::plan_pool sizes both).
// Logical entry i of a table covers tokens [i*bs, (i+1)*bs) in every group. A
// window group holds only what its layers read: before a step computing from
// position `start`, every block whose tokens all lie before start - W + 1 (the
// first key that step's first token sees) goes back to the pool (cached-
// evictable when committed) and its entry becomes the null block 0. With one
// full-context group (the default) everything is as without groups.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/hash.h"
#include "base/status.h"
#include "kv/admission.h"
#include "kv/block_pool.h"
#include "kv/group_manager.h"
#include "kv/kv_config.h"
#include "kv/prefix_cache.h"
#include "kv/prefix_miss.h"
#include "kv/types.h"

namespace pagoda::kv {

struct PoolPlan;

// KvConfig, KvStats: kv/kv_config.h; PrefixMatch, Admission: kv/admission.h.

class KvManager {
 public:
  // Precondition: num_blocks >= 2, 1 <= block_size <= 256, 0 <= watermark < 1.
  explicit KvManager(const KvConfig& config);

  const KvConfig& config() const { return config_; }
  int32_t block_size() const { return config_.block_size; }
  int32_t num_usable_blocks() const { return blocks_->pool.num_usable_blocks(); }
  int32_t num_free_blocks() const { return blocks_->pool.num_free(); }  // incl. cached-evictable
  int32_t watermark_blocks() const { return watermark_blocks_; }
  int32_t num_blocks_for(int64_t num_tokens) const { return blocks_for_tokens(num_tokens, config_.block_size); }
  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  int32_t group_window(int32_t group) const { return groups_[static_cast<size_t>(group)]->spec().sliding_window; }
  // Group g's manager: its tables and its kind's rules (kv/group_manager.h).
  const GroupManager& group(int32_t g) const { return *groups_[static_cast<size_t>(g)]; }
  // Blocks of all groups a sequence of num_tokens tokens holds at most when it
  // is computed in chunks of up to max_chunk tokens (kv/sizing's
  // kv_group_blocks_for_sequence summed over groups). One full group: num_blocks_for.
  int64_t max_blocks_for_sequence(int64_t num_tokens, int32_t max_chunk) const;

  // --- admission ---
  // The one walk of the prefix cache for `tokens` (see PrefixMatch). Changes
  // no cache state; counts in KvStats::prefix_lookups.
  PrefixMatch match_prefix(std::span<const TokenId> tokens, std::string_view cache_salt) const;
  // Brings a match made before later calls up to date, without hashing: the
  // hit ends at the first block that is no longer cached as it was (evicted,
  // or its key taken over). Entry ids are never reused, so an unchanged entry
  // means the block still holds exactly the matched tokens. The result may
  // miss blocks committed since the match was made (mark_computed); it never
  // claims one that is gone. O(match blocks). Precondition: made by this KvManager.
  void revalidate(PrefixMatch* match) const;
  // Checks a current match (made or revalidated since the last change) for
  // num_new_tokens slots past the hit while leaving watermark_blocks() +
  // reserve_blocks free, and returns the Admission for allocate(). Errors,
  // with the numbers: a stale match (or another KvManager's), too few free blocks.
  // Blocks count over all groups (reserve_blocks too: one per group per child at a fork).
  //
  // Prefill reservation (target_tokens > 0): the sequence will compute up to
  // target_tokens (its known tokens: the prompt) in chunks of up to max_chunk,
  // and admission keeps free, on top of the first chunk's blocks, what the
  // rest of that prefill can take at its peak: per group
  // kv_group_blocks_for_sequence(target_tokens, max_chunk) (a full group its
  // whole prompt, a window group only W + chunk tokens' blocks, never its
  // prompt) minus what it holds, and the same for every running sequence still
  // in its prefill (num_reserved_blocks()). So admitted prompts finish their
  // prefill without preemption; decode growth past target_tokens is not
  // reserved (it preempts, as in vLLM). target_tokens = 0: only the first
  // chunk counts and the sequence reserves nothing later (the old rule).
  // Precondition: num_new_tokens >= 0, reserve_blocks >= 0, cached + num_new_tokens >= 1,
  // target_tokens = 0 or >= cached + num_new_tokens, max_chunk >= 1.
  Expected<Admission> can_allocate(PrefixMatch match, int32_t num_new_tokens, int32_t reserve_blocks = 0,
                                   int32_t target_tokens = 0, int32_t max_chunk = 1) const;
  // Blocks the running sequences still in their prefill (fewer computed tokens
  // than the target they were admitted with) may take from the pool before it
  // ends, over all groups: a full group up to ceil(target / bs) entries; a
  // window group up to kv_group_blocks_for_sequence(target, max_chunk) blocks
  // it holds alone (a block shared with another sequence frees nothing when
  // released). O(prefilling sequences x window blocks).
  int64_t num_reserved_blocks() const;
  // Creates sequence `seq` from an admission made since the last change: takes
  // the matched blocks (num_computed_tokens = the hit) and num_new_tokens more
  // slots. Returns the hit tokens. Fails, changing nothing, when seq exists or
  // the admission is stale.
  // A hit that ends at a state checkpoint (PrefixMatch::checkpoint_blocks)
  // appends one copy per state block (checkpoint block -> the sequence's fresh
  // state block) to *copies, to run before the sequence's first forward; the
  // checkpoint blocks are held until its next mark_computed (or free), so
  // nothing can take them before the copy. Precondition: copies != nullptr
  // when the admission's match has a checkpoint.
  Expected<int32_t> allocate(SeqId seq, const Admission& admission, std::vector<BlockCopy>* copies = nullptr);
  // match_prefix + can_allocate + allocate: one walk, for callers without a
  // decision between the lookup and the allocation.
  Expected<int32_t> allocate(SeqId seq, std::span<const TokenId> tokens, int32_t num_new_tokens,
                             std::string_view cache_salt);

  // --- running ---
  // Room for num_new_tokens more tokens after num_computed_tokens: first the
  // window groups release their blocks before the window of the step's first
  // token (num_computed_tokens), then new blocks in every group, and
  // copy-on-write for shared blocks about to be written (pairs appended to
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
  // The keys of the sequence's full blocks of `tokens` that are not committed
  // yet: blocks it is still to compute. `tokens` are its known tokens, those it
  // was allocated with plus any appended since (a sequence's tokens only grow).
  // Each block is hashed once: the keys are kept with the sequence and reused
  // by mark_computed. Precondition: has_seq(seq).
  std::span<const Hash128> uncommitted_block_keys(SeqId seq, std::span<const TokenId> tokens);
  // The child shares all of parent's blocks (ref counts +1), its computed count
  // and its block keys (so the child's known tokens start with the parent's
  // now: fork before either appends). Never allocates. Fails when parent is
  // unknown or child exists.
  Status fork(SeqId parent, SeqId child);
  // Releases the sequence's blocks, last block first onto the free queue so a
  // sequence's tail is evicted before its head. Returns false for unknown seq.
  bool free(SeqId seq);
  // Rolls the sequence back to its first num_tokens tokens (speculative
  // decoding: the slots of rejected draft tokens). num_computed becomes
  // min(num_computed, num_tokens); every group's table keeps
  // num_blocks_for(num_tokens) entries and gives the rest back, last first
  // (never-committed blocks become plain free); committed blocks wholly past
  // num_tokens are forgotten by the sequence but stay in the prefix cache
  // (they hold verified tokens), and block keys past num_tokens are dropped.
  // Returns false, changing nothing, for an unknown sequence, num_tokens < 0
  // or past its slots, inside a committed block (the cache's; it must not be
  // rewritten), or when a window group already released a block the shorter
  // sequence would need again. Speculative decoding truncates to its computed
  // tokens, past every committed block.
  bool truncate(SeqId seq, int32_t num_tokens);

  // --- recurrent-state checkpoints (kv/state_checkpoint.cc, issue 38) ---
  // Tokens between checkpoints: interval x block_size with a recurrent state
  // group and prefix caching on, else 0 (no checkpoints).
  int32_t checkpoint_tokens() const { return checkpoint_tokens_; }
  // A chunk of n tokens from `computed` cut so that it ends at the latest
  // checkpoint boundary inside it when it crosses one and does not end at one
  // (the state at a boundary must exist at the end of a step to be copied);
  // n when it crosses none or checkpoints are off. pin_tokens > 0 (a request
  // pinning its first pin_tokens): the chunk ends first at the pin's last
  // boundary when it crosses it, so the pinned prefix has a checkpoint to pin.
  int32_t checkpoint_chunk(int32_t computed, int32_t n, int32_t pin_tokens = 0) const;
  // mark_computed makes a checkpoint when a sequence's computed tokens reach a
  // boundary: S blocks are taken (only when S + watermark blocks are free),
  // committed to the cache under the boundary block's chain key and held
  // together with the sequence's state blocks until this call copies the state
  // into them through copy(src, dst) and releases both (the checkpoint blocks
  // become cached-evictable, LRU like any cached block). The engine calls it
  // right after each step's update, before any other block is taken. Returns
  // the copies made.
  int32_t flush_checkpoints(const std::function<void(BlockId src, BlockId dst)>& copy);
  int32_t num_pending_checkpoint_copies() const { return static_cast<int32_t>(ckpt_pending_.size()); }
  // The index of the recurrent state group; -1 when there is none.
  int32_t state_group() const { return state_group_; }

  // --- access ---
  bool has_seq(SeqId seq) const { return seqs_.count(seq) != 0; }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }
  // Precondition for these: has_seq(seq).
  std::span<const BlockId> block_table(SeqId seq) const;  // group 0's
  std::span<const BlockId> block_table(SeqId seq, int32_t group) const;
  int32_t num_computed_tokens(SeqId seq) const;
  int32_t num_committed_blocks(SeqId seq) const;  // leading full blocks already committed
  int32_t num_slots(SeqId seq) const;             // block_table(seq).size() * block_size

  // --- tiers below RAM (tier/, issue 16) ---
  // A full block of one KV group newly committed to the prefix cache, for
  // write-through. `key` is the chain key (group 0's); the tier entry adds the group.
  struct CommittedBlock {
    BlockId block = kNullBlock;
    Hash128 key;
    std::vector<TokenId> tokens;
    std::string salt;
    int32_t group = 0;
    Hash128 parent;     // the previous block's chain key (KV events)
    bool root = true;   // the first block of its sequence: no parent
  };
  // When on, mark_computed logs every block it commits under a new entry
  // (not a hit, not a duplicate), in every group; take_committed() hands the
  // log over. The blocks' K/V are valid until the next allocation.
  void set_commit_log(bool on) { commit_log_on_ = on; }
  std::vector<CommittedBlock> take_committed() { return std::exchange(commit_log_, {}); }
  // A state checkpoint newly committed (kv/state_checkpoint.cc), logged while
  // the commit log is on: its S blocks in order, at the end of the block with
  // chain key `key` (tokens: that block's; parent: the block before's chain).
  // Their state is valid once flush_checkpoints has copied it, until the next
  // allocation; `entries` are their cache entries when made (a caller checks
  // the blocks still hold them).
  struct CommittedCheckpoint {
    std::vector<BlockId> blocks;
    std::vector<EntryId> entries;
    Hash128 key;
    std::vector<TokenId> tokens;
    std::string salt;
    Hash128 parent;
    bool root = true;
  };
  std::vector<CommittedCheckpoint> take_committed_checkpoints() { return std::exchange(checkpoint_log_, {}); }
  // The keys of the full blocks of `tokens` a prefix hit may cover (never the
  // last token's block), in chain order. Changes nothing.
  std::vector<Hash128> chain_keys(std::span<const TokenId> tokens, std::string_view cache_salt) const;
  // Which full blocks of `tokens` a hit may cover each group holds in the
  // cache now ([group][block], 1: held): group 0 along its chain (nothing past
  // its first miss), group g under its own key parented on group 0's chain;
  // the recurrent state group's row says whether the state checkpoint at the
  // end of block i is cached (all its S blocks). Changes nothing.
  std::vector<std::vector<int8_t>> cached_blocks(std::span<const TokenId> tokens, std::string_view cache_salt) const;
  // First logical block a window group needs before computing from `start`:
  // the block of key start - W + 1; 0 for a full group.
  int32_t first_needed_block(int32_t group, int64_t start) const;
  // The per-group prefix-hit rule: the longest hit point j <= k (blocks) such
  // that no window group g >= 1 misses a block of [first_needed_block(g, j*bs), j)
  // (group 0, the chain, is the caller's: k is where it ends). `missing(g, i)`
  // may be called more than once per block. One group: k.
  int32_t longest_hit(int32_t k, const std::function<bool(int32_t group, int32_t index)>& missing) const;
  // Puts blocks loaded from a tier into the prefix cache as cached-evictable
  // blocks, for a hit of up to num_blocks blocks of `tokens`: group 0's chain
  // is walked as in match_prefix and each block the cache lacks but `loaded(0,
  // i)` has is taken from the free queue (never below the watermark), filled
  // by fill(0, i, block) and committed; the walk stops at a block neither has.
  // Then the hit h is longest_hit over what the cache or `loaded` holds, and
  // each window group's blocks of [first_needed_block(g, h*bs), h) the cache
  // lacks are imported the same way. Blocks found or imported are pinned during
  // the call and released last block first, group 0 last (the chain's head is
  // evicted last). Best effort: a refused insert or the watermark stops a
  // group's imports (the next match_prefix finds a shorter hit, never a wrong
  // one). Returns the blocks imported, all groups.
  // With a recurrent state group (issue 38) the hit must also end at a state
  // checkpoint: h is the latest checkpoint boundary c <= the chain's hit whose
  // checkpoint the cache holds or `loaded(state_group(), c - 1)` has (and
  // every window group serves c), 0 when none; a loaded checkpoint's S blocks
  // are taken (never below the watermark, all or none), filled by
  // fill_checkpoint(c - 1, part, block) for part 0..S-1 and committed under
  // its checkpoint keys, as make_checkpoint does; released first. Without
  // fill_checkpoint only cached checkpoints count.
  int32_t import_blocks(std::span<const TokenId> tokens, std::string_view cache_salt, int32_t num_blocks,
                        const std::function<bool(int32_t group, int32_t index)>& loaded,
                        const std::function<void(int32_t group, int32_t index, BlockId block)>& fill,
                        const std::function<void(int32_t index, int32_t part, BlockId block)>& fill_checkpoint = {});

  // --- KV events (issue 37, kv/event_sink.h) ---
  // Every prefix-cache entry made or dropped from now on is reported to sink
  // (nullptr: off, the default). The caller keeps the sink alive.
  void set_event_sink(KvEventSink* sink) { blocks_->cache.set_event_sink(sink); }
  // The hook for a reset of the whole prefix cache (/reset_prefix_cache): the
  // resetting code calls it once every entry is gone, and the sink publishes
  // AllBlocksCleared. No-op without a sink.
  void notify_all_cleared() {
    if (KvEventSink* s = blocks_->cache.event_sink()) s->all_cleared();
  }
  // --- why a prefix missed (kv/prefix_miss.h, issue 36) ---
  // Explains where `match` (current: made or revalidated since the last
  // change) of `tokens` ends. Changes nothing; hashes only past a miss.
  PrefixMiss explain_miss(const PrefixMatch& match, std::span<const TokenId> tokens, std::string_view cache_salt) const;
  // A tier below RAM is configured: an evicted key reads tier_miss.
  void set_tiers_configured(bool on) { tiers_configured_ = on; }
  // The clock of the eviction log (seconds; default: steady clock), for tests.
  void set_clock_for_testing(std::function<double()> clock) { blocks_->evicted.set_clock(std::move(clock)); }
  // The eviction class seq's blocks are released into (clamped to
  // config().eviction_classes; higher = evicted sooner). Forks inherit it.
  void set_eviction_class(SeqId seq, int32_t c);

  // --- pins with a TTL (kv_pins.cc, issue 36) ---
  // A pin holds one pool reference on every block of a committed prefix (all groups' blocks still in the
  // cache), so pinned blocks are neither free nor evictable and admission's arithmetic counts them as taken. A
  // pin is keyed by group 0's cache entry of its last block, so it follows the cache salt (entries never match
  // across salts). It lives until ttl seconds after its last touch (creation, or an allocate() whose hit covers
  // its whole prefix); pinned blocks never exceed pin_cap_blocks(): past it the least recently touched pins are
  // demoted (released to the free queue as cached blocks). With a recurrent state group (issue 38) a pin also
  // holds the state checkpoints cached at boundaries inside its prefix, the ones cached when it is made and the
  // ones made or imported later while it lives (pin_new_checkpoint), each one's S blocks right after its
  // boundary block's in Pin::blocks.
  struct PinStats {
    int32_t num_pins = 0;
    int32_t num_pinned_blocks = 0;
    int32_t cap_blocks = 0;
    int64_t created = 0;   // pins made
    int64_t renewed = 0;   // touches of a live pin (hits, repeated pin requests)
    int64_t expired = 0;   // released by their TTL
    int64_t demoted = 0;   // released by the cap, or by unpin_oldest (admission)
    int64_t cleared = 0;   // released by reset_prefix_cache
    int64_t checkpoints_added = 0;     // checkpoints made or imported inside a live pin, pinned with it
    int64_t checkpoints_over_cap = 0;  // such checkpoints left unpinned: the cap had no room for them
  };
  // The clock of TTLs, in seconds (default: steady clock). Tests inject theirs.
  void set_clock(std::function<double()> clock);
  double now() const;
  // Asks to pin the first pin_tokens / block_size full blocks of seq's tokens for ttl_s seconds: at once if
  // they are committed, else when mark_computed commits the last of them. A chain cut by a refused collision pins
  // what precedes the cut. No-op when pin_tokens < block_size, ttl_s <= 0 or prefix caching is off.
  // Precondition: has_seq(seq).
  void pin_prefix(SeqId seq, int32_t pin_tokens, double ttl_s);
  // Releases the pins whose TTL passed (now() - last touch >= ttl). Returns how many.
  int32_t expire_pins();
  // Releases the least recently touched pin; false when there is none. The
  // scheduler calls it when pins leave an accepted request no room.
  bool unpin_oldest();
  int32_t pin_cap_blocks() const { return pin_cap_blocks_; }
  int32_t num_pinned_blocks() const { return num_pinned_blocks_; }
  bool has_pins() const { return !pins_.empty(); }
  PinStats pin_stats() const;
  // The latest expiry time (now() clock) among the pins holding block b; 0 when not pinned.
  double pin_expiry(BlockId b) const;
  // Pins made or renewed since the last call, logged while the commit log is on:
  // the tiers keep their blocks until `expiry` (now() clock). Blocks as Pin's.
  struct PinLogEntry { std::vector<BlockId> blocks; std::vector<EntryId> entries; double expiry = 0; };
  std::vector<PinLogEntry> take_pin_log() { return std::exchange(pin_log_, {}); }
  // Drops every pin and the key of every cached block no sequence holds; the blocks become plain free ones.
  // Refused (false, nothing changed) while any sequence holds blocks: the caller preempts them first.
  bool reset_prefix_cache();

  KvStats stats() const;
  // KvStats' prefix counters without stats()' O(blocks) census (per-step traces).
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  // Every invariant: free + used + cached-evictable == total; ref counts == references from block tables; no
  // block both free and referenced; the cache map agrees with its records; tables cover their computed tokens.
  // Returns "" when all hold, else the first violation. O(blocks + table entries).
  std::string check_invariants() const;

  // For tests.
  const BlockPool& pool() const { return blocks_->pool; }
  const PrefixCache& cache() const { return blocks_->cache; }
  PrefixCache& mutable_cache_for_testing() { return blocks_->cache; }

 private:
  // A sequence's state shared by its groups; each group's table is its
  // GroupManager's.
  struct Seq {
    int32_t num_computed = 0;
    std::string salt;
    // Keys of its leading full blocks: the first entries.size() are committed,
    // the rest hashed ahead by uncommitted_block_keys. keys.size() >= entries.size().
    std::vector<Hash128> keys;
    std::vector<EntryId> entries;  // group 0's cache entry standing for the prefix through each committed block
    int32_t target = 0;     // admission's target_tokens (0: no prefill reservation)
    int32_t max_chunk = 1;  // admission's max_chunk
    int32_t pin_blocks = 0;  // pin_prefix: blocks to pin once committed (0: none or done)
    double pin_ttl = 0;
    int32_t eviction_class = 0;
    // A checkpoint's blocks its first step restores from (held until mark_computed or free).
    std::vector<BlockId> restore_hold;
  };
  struct Pin {
    uint64_t order = 0;               // creation order (ties of last_touch)
    std::vector<BlockId> blocks;      // every group's pinned blocks, chain order, group 0 first per index
    std::vector<EntryId> entries;     // their cache entries when pinned (check_invariants)
    double ttl = 0;
    double last_touch = 0;
  };
  // Pins seq's committed prefix when its pin_blocks are all committed.
  void maybe_pin(SeqId id, Seq* s);
  void log_pin(const Pin& p);  // into pin_log_ while the commit log is on
  // A checkpoint (its S blocks) just committed at the end of cached block `boundary` (group 0's): every pin
  // holding `boundary` pins it too, unless that would pass the cap.
  void pin_new_checkpoint(BlockId boundary, std::span<const BlockId> ckpt);
  // Releases pin `end` (its blocks last first, so the head is evicted last).
  void release_pin(EntryId end);
  // Renews the pins whose whole prefix a hit covers.
  void touch_pins(const PrefixMatch& m);
  // The pins' invariants (check_invariants); "" when they hold. *pin_refs: per block, 1 when pinned.
  std::string check_pins(std::vector<int32_t>* pin_refs) const;
  // What s may still take from the pool before its prefill ends (0 once it has).
  int64_t prefill_reserve(SeqId id, const Seq& s) const;
  // The key of group g's block for chain key `k` (group 0: k itself).
  static Hash128 group_key(const Hash128& k, int32_t group);
  // Whether hit point j (blocks) is served by every group of m (its tables and
  // their entries still as matched).
  bool hit_valid(const PrefixMatch& m, int32_t j) const;
  // Truncates m to its first j blocks, nulling window-group entries before
  // their needed range.
  void truncate_match(PrefixMatch* m, int32_t j) const;
  // Blocks allocate() takes from the free queue for this match.
  int32_t blocks_needed(const PrefixMatch& m, int32_t num_new_tokens) const;
  // Ok when m was made by this KvManager at its current generation.
  Status check_current(const PrefixMatch& m, const char* what) const;
  // Hashes s's keys up to its first num_blocks full blocks of `tokens`.
  void extend_keys(Seq* s, std::span<const TokenId> tokens, size_t num_blocks) const;
  // Over all groups: *fresh = new table entries, the result = shared blocks to copy.
  int32_t cow_blocks_needed(SeqId seq, const Seq& s, int32_t num_new_tokens, int32_t* fresh) const;
  // Blocks the groups' release rules give back before a step from `start`.
  int32_t releasable_blocks(SeqId seq, int64_t start) const;
  const Seq& seq_ref(SeqId seq) const;
  // Takes a free block (above the watermark), fills it and commits it under
  // `key`; the block comes back held (ref 1) for the caller to release;
  // kNullBlock when it cannot (watermark, refused insert).
  BlockId import_one(const Hash128& key, EntryId parent, std::span<const TokenId> tokens, std::string_view salt,
                     const std::function<void(BlockId)>& fill, const PrefixCache::ChainRef& ref);
  // Checkpoints (state_checkpoint.cc).
  // The key of state block `index` of the checkpoint at the end of the block with chain key `chain`.
  Hash128 checkpoint_key(const Hash128& chain, int32_t index) const;
  // The S cached blocks of the checkpoint after the first j blocks of m
  // (their chain is m's), in *blocks / *entries; false when one is missing.
  bool find_checkpoint(const PrefixMatch& m, int32_t j, std::span<const TokenId> tokens,
                       std::vector<BlockId>* blocks, std::vector<EntryId>* entries) const;
  // The S cached blocks of the checkpoint at the end of the block with chain
  // key `chain`, whose group 0 parent entry is `parent`; false when one is missing.
  bool find_checkpoint_blocks(const Hash128& chain, EntryId parent, std::span<const TokenId> block_tokens,
                              std::string_view salt, std::vector<BlockId>* blocks) const;
  // Takes S free blocks (only when S + watermark are free), fills them by
  // fill(part, block) and commits them as the checkpoint at the end of the
  // block with chain key `chain` (prev: the chain before it, nullptr at the
  // first block). All or none: true and the blocks held (ref 1, appended to
  // *held) when every insert took.
  bool import_checkpoint(const Hash128& chain, const Hash128* prev, EntryId parent, std::span<const TokenId> block_tokens,
                         std::string_view salt, const std::function<void(int32_t part, BlockId block)>& fill,
                         std::vector<BlockId>* held);
  // The longest hit j <= k ending at a checkpoint that every other group serves (sets m's checkpoint).
  int32_t checkpoint_hit(PrefixMatch* m, int32_t k, std::span<const TokenId> tokens,
                         const std::function<bool(int32_t, int32_t)>& missing) const;
  // After mark_computed brought s to a boundary: takes and commits a checkpoint (see flush_checkpoints).
  void make_checkpoint(SeqId seq, const Seq& s, std::span<const TokenId> tokens);
  void release_restore_hold(Seq* s);
  // The invariants of one sequence's tables (check_invariants); "" when they hold.
  std::string check_seq(SeqId id, const Seq& s, std::vector<int32_t>* refs, std::vector<int32_t>* group_of) const;

  KvConfig config_;
  int32_t watermark_blocks_ = 0;
  std::unique_ptr<SharedBlocks> blocks_;  // the pool and the prefix cache every group draws from
  std::vector<std::unique_ptr<GroupManager>> groups_;  // [n_groups]: config_.groups, or one full group
  std::unordered_map<SeqId, Seq> seqs_;
  // Bumped by every change to sequences, the pool or the cache: a PrefixMatch
  // or Admission made at another generation must be revalidated / remade.
  uint64_t generation_ = 1;
  mutable int64_t prefix_lookups_ = 0;  // a statistic: lookups stay const
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  // Pins (kv_pins.cc), keyed by group 0's entry of their last block.
  std::unordered_map<EntryId, Pin> pins_;
  std::vector<int32_t> pin_count_;  // [num_blocks] pins holding each block (one pool reference while > 0)
  int32_t num_pinned_blocks_ = 0;
  int32_t pin_cap_blocks_ = 0;
  uint64_t next_pin_order_ = 0;
  PinStats pin_stats_;
  std::function<double()> clock_;
  bool commit_log_on_ = false;
  std::vector<CommittedBlock> commit_log_;
  std::vector<CommittedCheckpoint> checkpoint_log_;
  std::vector<PinLogEntry> pin_log_;
  bool tiers_configured_ = false;
  // Checkpoints: the state group (-1: none), tokens between checkpoints (0: off),
  // copies waiting for flush_checkpoints (each holds a reference on src and dst).
  int32_t state_group_ = -1;
  int32_t checkpoint_tokens_ = 0;
  std::vector<BlockCopy> ckpt_pending_;
  int64_t checkpoints_stored_ = 0;
  int64_t checkpoints_hit_ = 0;
};

}  // namespace pagoda::kv
