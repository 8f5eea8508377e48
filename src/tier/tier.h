// KV tiers below the RAM prefix cache (issue 16): the backend interface and
// TierSet, which runs the backends off the engine thread.
//
// A TierBackend is a plain synchronous key-value store (disk files, Redis). It
// is only ever called from its own worker thread. TierSet owns one worker
// thread per backend, each with a bounded queue: loads first (a request waits
// for them), then stores (write-through, droppable). The engine thread only
// enqueues and polls; it never blocks on I/O. A load walks the tiers in order
// (disk, then Redis): a miss, an error or an entry that fails verification in
// one tier goes on to the next; every load gets exactly one LoadResult.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tier/entry.h"
#include "tier/tier_stats.h"

namespace pagoda::tier {

struct TierGet {
  // kRejected: something at the name that is not an entry (larger than asked,
  // not a regular file); it was not read, and the caller drops it.
  enum Status { kHit, kMiss, kError, kRejected } status = kMiss;
  std::string value;
};

class TierBackend {
 public:
  virtual ~TierBackend() = default;
  virtual const char* kind() const = 0;  // "disk", "redis": the metrics label
  // The entry `name`, read only when it holds at most `max_bytes` (the size
  // its key implies): a larger value is never transferred whole (kRejected).
  virtual TierGet get(const std::string& name, uint64_t max_bytes) = 0;
  enum class Put { kStored, kSkipped, kError };  // kSkipped: already there, or the tier is off
  // `expiry_ms`: unix ms after which the entry is gone (a pinned prefix's
  // TTL, issue 36); 0: none. Storing an entry already held sets its expiry.
  virtual Put put(const std::string& name, const std::string& value, uint64_t expiry_ms = 0) = 0;
  // A renewed pin: sets a held entry's expiry. False when not held.
  virtual bool renew(const std::string& name, uint64_t expiry_ms) {
    (void)name, (void)expiry_ms;
    return false;
  }
  // Drops the entries whose expiry passed (the worker calls it about once a
  // second, and they are dropped on lookup too).
  virtual void sweep(uint64_t now_ms) { (void)now_ms; }
  // Removes every entry of namespace `ns` (EntryCodec::namespace_tag): a
  // reset of this engine's tiers. Returns how many went.
  virtual int64_t clear(uint64_t ns) {
    (void)ns;
    return 0;
  }
  // Drops an entry that failed verification (a corrupt file); best effort.
  virtual void drop(const std::string& name) = 0;
  // Called by the worker when its store queue runs empty: a backend may batch
  // durability work there (the disk tier syncs and renames its waiting batch).
  virtual void flush() {}
  // KV events (issue 37): the names of the entries this backend dropped since
  // the last call (LRU eviction, a corrupt entry). Worker thread only.
  std::vector<std::string> take_dropped() { return std::exchange(dropped_, {}); }
  // The entries found at start-up with their first bytes (the disk tier, when
  // asked to read them: a restarted replica announces what it holds).
  std::vector<std::pair<std::string, std::string>> take_found() { return std::exchange(found_, {}); }

 protected:
  void note_dropped(const std::string& name) { dropped_.push_back(name); }
  void note_found(const std::string& name, std::string head) { found_.emplace_back(name, std::move(head)); }

 private:
  std::vector<std::string> dropped_;
  std::vector<std::pair<std::string, std::string>> found_;
};

// Unix time in ms: the clock of entry expiries.
uint64_t unix_now_ms();

// What a tier did with an entry, for KV events (TierSet::take_events).
struct TierEvent {
  // kFound: held at start-up (head: its first bytes, for EntryCodec::decode_meta).
  enum Kind : uint8_t { kStored, kNotStored, kDropped, kFound } kind = kStored;
  uint32_t tier = 0;  // index in the TierSet
  std::string name;
  std::string head;
};

struct LoadRequest {
  uint64_t ticket = 0;  // the caller's id, returned in the result
  TierKey key;
  std::vector<int32_t> tokens;
  uint64_t kv_bytes = 0;  // the K/V size the entry must hold
};

struct LoadResult {
  uint64_t ticket = 0;
  bool hit = false;
  int tier = -1;          // the tier that served it
  std::string kv_bytes;   // verified K/V bytes (hit only)
};

struct TierSetOptions {
  size_t max_queued_loads = 1 << 16;         // per tier; over it a load is a miss at once
  uint64_t max_queued_store_bytes = 256u << 20;  // per tier; over it a store is dropped
  int sweep_ms = 1000;  // how often an idle worker sweeps its tier's expired entries
};

class TierSet {
 public:
  // `codec` holds the deployment's keys (entry.h): names, encoding, verification.
  TierSet(std::vector<std::unique_ptr<TierBackend>> backends, std::shared_ptr<const EntryCodec> codec,
          TierSetOptions opt = {});
  ~TierSet();
  TierSet(const TierSet&) = delete;
  TierSet& operator=(const TierSet&) = delete;

  size_t size() const { return tiers_.size(); }
  // Queues a load; its LoadResult comes back through poll(). Never blocks.
  void load(LoadRequest r);
  // Write-through of one entry to every tier. Never blocks; dropped when a
  // tier's store queue is full. Encoded (encrypted, MACed) once, by the first
  // tier worker that takes it, not on the caller's (engine) thread.
  // `parent` and `expiry_ms` as EntryCodec::encode's.
  void store(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes,
             const Hash128* parent = nullptr, uint64_t expiry_ms = 0);
  // Sets the expiry of entry `name` in every tier that holds it (a renewed pin). Never blocks.
  void renew(const std::string& name, uint64_t expiry_ms);
  // Removes every entry of namespace `ns` from every tier, after the queued
  // jobs; blocks until done. Returns the entries removed, per tier.
  std::vector<int64_t> clear(uint64_t ns);
  // Finished loads since the last poll.
  std::vector<LoadResult> poll();
  // Waits up to `timeout` for a finished load; true when one is ready.
  bool wait(std::chrono::milliseconds timeout);
  // Waits until every queue is empty and no job runs (tests, shutdown).
  void drain();
  std::vector<TierStats> stats() const;
  // KV events (issue 37): when on, every store gets one TierEvent per tier
  // (kStored, or kNotStored: skipped, failed or dropped by a full queue) and
  // every entry a backend drops one kDropped; take_events() hands them over.
  // Turning it on first reports the entries found at start-up (kFound).
  void set_record_events(bool on);
  std::vector<TierEvent> take_events() {
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(events_, {});
  }

 private:
  // One store shared by every tier: the first worker to take it encodes it.
  struct StoreJob {
    TierKey key;
    std::vector<int32_t> tokens;
    std::string kv_bytes;  // freed once encoded
    uint64_t queued_bytes = 0;
    Hash128 parent;
    bool root = true;
    uint64_t expiry_ms = 0;
    std::once_flag once;
    std::string name, blob;
  };
  struct Store {
    std::shared_ptr<StoreJob> job;  // nullptr: a renewal of `name`
    std::string name;
    uint64_t expiry_ms = 0;
  };
  struct Tier {
    std::unique_ptr<TierBackend> backend;
    std::deque<LoadRequest> loads;
    std::deque<Store> stores;
    uint64_t queued_store_bytes = 0;
    bool busy = false;
    bool clear_asked = false;  // clear(): run once the queues are empty
    uint64_t clear_ns = 0;
    int64_t cleared = -1;      // its result (-1: not done)
    TierStats stats;
    std::thread thread;
  };
  void run(size_t i);
  // Hands a load to tier i, or finishes it as a miss when i is past the last.
  void enqueue_load(size_t i, LoadRequest r);  // mu_ held

  std::shared_ptr<const EntryCodec> codec_;
  TierSetOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // a job was queued (or stop)
  std::condition_variable done_cv_;  // a load finished, or a worker went idle
  std::vector<std::unique_ptr<Tier>> tiers_;
  std::vector<LoadResult> done_;
  bool stop_ = false;
  bool record_events_ = false;
  std::vector<TierEvent> events_;
  // Moves tier i's dropped names into events_ (mu_ held).
  void collect_dropped(size_t i);
};

}  // namespace pagoda::tier
