// KvTierLink: the engine's side of the KV tiers below RAM (tier/, issue 16).
//
// Write-through: after each step, every full block newly committed to the
// prefix cache (KvManager's commit log) is exported from KvStorage and queued
// to every tier (TierSet::store; the engine thread never waits on I/O).
//
// Read: a new request's prompt is looked up in RAM first (match_prefix); when
// full blocks past the RAM hit remain, the request is held here ("waiting for
// KV load", it holds no blocks and no step), and a load goes out for each of
// those blocks (one in-flight load per entry, shared by every request waiting
// for it that came after the entry's last store: a load asked for before a
// store may miss). Once every block up to its first miss is back, the loaded blocks
// (verified against key, tokens and checksum by the tier worker) are written
// into free blocks and committed to the prefix cache (KvManager::import_blocks)
// and the request goes to the scheduler, whose RAM match takes them like any
// other hit. A block whose load missed, and every block after it, is computed.
//
// KV groups (the hybrid manager's window groups): an entry is one block of one
// group; stores cover every group's committed blocks. A load asks for group
// 0's blocks past the RAM hit and each window group's blocks of the full hit's
// window; the hit h is the longest prefix every group can serve
// (KvManager::longest_hit: a window group needs only its blocks of the last W
// tokens before h); when a miss lowers h, the window blocks the lower h needs
// are asked for in turn. The request waits until every block h needs is back.
//
// Hybrid models (issue 38, kv/state_checkpoint.cc): a hit needs the recurrent
// state at its end, so the state group has no block entries; each state
// checkpoint is written through as one entry of kind kCheckpoint (its S
// blocks; kv_tier_checkpoints.cc) right after flush_checkpoints copied it. A
// load asks for group 0's blocks as above plus the checkpoint at the latest
// boundary (every state_checkpoint_interval blocks) past the RAM hit; the hit
// is the latest boundary <= group 0's hit whose checkpoint RAM or a tier has
// (a checkpoint missing there asks for the one before, down to the RAM hit),
// and import_blocks brings in the K/V and that checkpoint. K/V without a
// usable checkpoint are never imported: no wrong state, only recompute.
// K/V loaded past the hit's checkpoint are dropped, not imported (typically
// the < interval blocks a turn computed after its last checkpoint; all of
// them when the tier has no checkpoint). Not loading them would need the
// checkpoint's answer before asking for K/V: one more round trip on every tier
// hit, and one per boundary down a prompt with no checkpoint; not done.
// A pinned checkpoint is written with the pin's expiry (store_pins).
// Checkpoint entries are not announced as KV events (vLLM announces K/V
// blocks only): a router scores prefixes by blocks.
//
// Entries are keyed by a fingerprint of the model file (hyper-parameters,
// tensor table and a sample of every tensor's bytes) mixed with the KV group
// layout (group count, windows, bytes per block: a run with
// --disable-hybrid-kv-cache-manager never reads a hybrid run's entries), the
// K and V types (tier_kv_dtype), the block size, the KV group, the cache salt and the chain hash,
// under the deployment's --kv-tier-secret (tier/entry.h: keyed names,
// encrypted K/V, a MAC over key, tokens and payload).
//
// Pins (issue 36): each pin made or renewed (KvManager's pin log) writes its
// blocks to every tier with the pin's expiry (wall clock): a new pin stores
// them again with it (a held entry only takes the expiry), a renewal sends
// the new expiry (Redis PEXPIRE, the disk header's 8 bytes) when it moved by
// a second or more. So a pinned prefix outlives RAM and a restart, until its
// TTL. Entries are one engine's: namespace_tag (model, KV types, block size)
// in every header and in the Redis key prefix; clear_tiers() removes exactly those.
// KV events (issue 37): this class is the one owner of the tier media: the
// tiers' stores, drops (eviction, expiry, reset) and, at start, the disk
// entries found (their encrypted meta: chain, parent, tokens) become
// BlockStored / BlockRemoved with medium "disk" / "redis".
// Not thread-safe: the engine thread only.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "engine/kv_events_link.h"
#include "sched/request.h"
#include "tier/tier.h"

namespace pagoda::gguf { class GgufFile; }
namespace pagoda::kv { class KvManager; }
namespace pagoda::runtime { class KvStorage; }

namespace pagoda::engine {

// Whether the config asks for any tier.
bool kv_tiers_enabled(const EngineConfig& c);
// The tier key's KV dtype (tier::TierKey::kv_dtype): K's KvDtype when K and V
// share it (the value of a same-type cache is what it always was), else
// k | v << 8 | 1 << 16 (the flag bit keeps V = f32, 0, apart from a same-type
// key). An entry of other K/V types never matches. Bit 17 is set when K or V
// is a type whose rows are Hadamard-rotated (base/kv_dtype.h kv_dtype_rotated,
// issue 39): an entry written before the rotation (unrotated q4_0 rows, key
// without the bit) is never loaded into a rotated cache, nor the reverse.
uint32_t tier_kv_dtype(KvTypes t);
// The tier key's model fingerprint: the model's own (hyper-parameters) mixed
// with the file's tensor table and the first and last bytes of every tensor.
uint64_t tier_model_fingerprint(const gguf::GgufFile& f, uint64_t model_fingerprint);

// The order in which to announce tier blocks (KV events) so that a block comes
// after its parent whenever the parent is among them: a consumer that drops a
// block whose parent it does not hold (the router's index, kv_index.h) must meet
// the parent first. Neither a directory's order nor file mtimes (a clock tick
// covers several stores) give that. `parent` is group 0's chain of the block
// before (nullopt for a sequence's first block); a block of another group is
// never a parent. Returns indices into `blocks`: a preorder walk from the blocks
// whose parent is not among them, siblings by (group, chain), each index once.
struct AnnounceRef {
  int32_t group = 0;
  uint64_t chain = 0;
  std::optional<uint64_t> parent;
};
std::vector<size_t> parents_first(const std::vector<AnnounceRef>& blocks);

class KvTierLink {
 public:
  // Opens the tiers of `c` (disk, then Redis). Errors: a bad --kv-redis URL,
  // --kv-disk-dir without a size. A tier that is down is not an error.
  static Expected<std::unique_ptr<KvTierLink>> create(const EngineConfig& c, uint64_t model_fingerprint,
                                                      kv::KvManager* kv, runtime::KvStorage* storage);
  // Takes r when blocks past its RAM hit may be in a tier (loads started);
  // false leaves r with the caller, to queue at once.
  bool start(sched::NewRequest& r);
  // Requests whose loads are done, their loaded blocks now in the prefix
  // cache; in the order they were started.
  std::vector<sched::NewRequest> take_ready();
  void abort(sched::RequestId id);
  // Write-through of the blocks committed since the last call.
  void store_committed();
  int32_t num_waiting() const { return static_cast<int32_t>(waits_.size()); }
  // Blocks until a load finishes or `timeout` passes (only when nothing else can run).
  void wait(std::chrono::milliseconds timeout) { tiers_->wait(timeout); }
  std::vector<KvTierStats> stats() const;
  // KV events (issue 37): from now on every entry a tier stores or drops is
  // reported to `events` (medium = the tier's kind) by poll_events(). nullptr: off.
  void set_event_link(KvEventLink* events);
  // Reports the tiers' stores and drops since the last call (engine thread, each step).
  void poll_events();
  // BlockStored again for every entry the tiers hold (after an AllBlocksCleared
  // of the RAM cache: a subscriber forgets every medium).
  void reannounce();
  // Removes this engine's entries from every tier (a reset with tiers; blocks
  // until done) and reports their removal. Returns (tier kind, entries removed).
  std::vector<std::pair<std::string, int64_t>> clear_tiers();
  // The Redis tier's entries this process knows it holds (stored, not dropped
  // since), as (group, chain.lo). Debug view, O(entries).
  std::vector<std::pair<int32_t, uint64_t>> redis_blocks() const;
  // The disk tier's entries, listed from its directory, as (group, chain.lo),
  // for those this process stored (an earlier run's entry is left out: its
  // name, a keyed hash, does not say its chain). Debug view, O(files).
  std::vector<std::pair<int32_t, uint64_t>> disk_blocks() const;

 private:
  // A block this process asked the tiers to store, for its KV events.
  struct Known {
    Hash128 chain, parent;
    bool root = true;
    int32_t group = 0;
    std::vector<int32_t> tokens;
    int32_t outstanding = 0;  // stores whose outcome is not reported yet (one per tier per store)
    uint32_t held = 0;        // bit i: tier i holds it (announced)
  };
  // kRam: held in RAM when the request came (not loaded; the import finds it in the cache).
  enum : int8_t { kUnasked = 0, kPending, kHit, kMiss, kRam };
  struct Wait {
    sched::NewRequest r;
    int32_t first = 0;          // first block index that may be loaded (the RAM hit's end)
    std::vector<Hash128> keys;  // chain keys of every block a hit may cover
    // [group][block index - first] load state; the hit's verified bytes.
    std::vector<std::vector<int8_t>> state;
    std::vector<std::vector<std::shared_ptr<const std::string>>> bytes;
  };
  struct Load {
    std::string name;
    std::vector<int32_t> tokens;  // a request shares the load only with these tokens (no trust in a hash alone)
    struct Waiter {
      sched::RequestId id;
      int32_t group;
      int32_t j;  // block index - first
    };
    std::vector<Waiter> waiters;
  };
  // Asks for group g's block first + j of w (shares an in-flight load of the same entry).
  void request(Wait& w, int32_t g, int32_t j);
  // The hit w can import (blocks), or -1 while blocks it needs are still
  // loading (those not yet asked for are asked for now).
  int32_t decide(Wait& w);
  tier::TierKey key_for(const Hash128& chain, const std::string& salt, int32_t group,
                        uint32_t kind = tier::TierKey::kBlock) const;
  // Whether every window group's block the hit h needs is back (those not yet
  // asked for are asked for now). The state group is not a window group.
  bool windows_ready(Wait& w, int32_t h);
  // Hybrid models (kv_tier_checkpoints.cc): the hit at the latest boundary <= h
  // whose checkpoint RAM or a tier has and every window group serves; -1
  // while one it needs is loading (the next lower is asked for after a miss).
  int32_t checkpoint_hit(Wait& w, int32_t h, const std::function<bool(int32_t, int32_t)>& missing);
  // After a store of `key`: an in-flight load of it (asked for before) is no longer shared with new requests.
  void stored(const tier::TierKey& key);
  // Write-through of the checkpoints made since the last call (flushed).
  void store_checkpoints();
  // Writes the pins made or renewed since the last call to the tiers with their expiry.
  void store_pins();
  // store_pins' part for the checkpoint whose blocks start at blocks[i] (a pin's blocks and their entries as
  // pinned; kv_tier_checkpoints.cc): stored as one kCheckpoint entry with `expiry`, or only renewed. Returns
  // the index past its blocks.
  size_t store_pinned_checkpoint(std::span<const int32_t> blocks, std::span<const uint64_t> entries, size_t i,
                                 const Hash128* parent, uint64_t expiry);
  Known& know(const std::string& name, const Hash128& chain, const Hash128* parent, int32_t group,
              std::span<const int32_t> tokens);
  // BlockStored for each (entry, tier), parents first (parents_first).
  void announce(const std::vector<std::pair<const Known*, uint32_t>>& items);

  kv::KvManager* kv_ = nullptr;
  runtime::KvStorage* storage_ = nullptr;
  std::shared_ptr<const tier::EntryCodec> codec_;  // the deployment's keys (names here, entries in tiers_)
  std::unique_ptr<tier::TierSet> tiers_;
  uint64_t fingerprint_ = 0;
  uint32_t kv_dtype_ = 0;
  int32_t block_size_ = 0;
  uint64_t block_bytes_ = 0;
  int32_t state_group_ = -1;    // the KvManager's recurrent state group (-1: none)
  int32_t ckpt_interval_ = 0;   // blocks between checkpoints (0: none)
  uint64_t ckpt_bytes_ = 0;     // a checkpoint entry's bytes: S blocks
  std::unordered_map<sched::RequestId, Wait> waits_;
  std::deque<sched::RequestId> order_;                     // start order (ids may be aborted since)
  std::unordered_map<uint64_t, Load> loads_;               // ticket -> in-flight load
  std::unordered_map<std::string, uint64_t> load_by_name_; // entry name -> its in-flight ticket
  uint64_t next_ticket_ = 1;
  int64_t imported_blocks_ = 0;
  KvEventLink* events_ = nullptr;
  std::unordered_map<std::string, Known> known_;  // entry name -> its chain (events on only)
  std::vector<const char*> media_;  // [tier] "disk" / "redis"
  uint64_t ns_ = 0;                 // namespace_tag of this engine's entries
  // Pinned entries sent to the tiers: name -> the expiry sent (unix ms).
  std::unordered_map<std::string, uint64_t> pin_sent_;
  uint64_t next_prune_ms_ = 0;
  std::string disk_dir_;
};

}  // namespace pagoda::engine
