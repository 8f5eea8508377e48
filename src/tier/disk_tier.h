// DiskTier: KV tier entries as files in one directory (`--kv-disk-dir`),
// least recently used first out when the total passes `--kv-disk-size`.
//
// One file per entry, named by TierKey::name() (32 hex digits). A store writes
// ".tmp-<name>"; the data is made durable before the file is renamed to its
// name, so a crash leaves either no file or a whole one, then the directory is
// fsynced so that the names are durable too. Batched (an fsync costs ~20 ms on
// the test machine): stores wait as tmp files until flush() (the worker's store
// queue ran empty, 64 are waiting, or the tier is destroyed), which runs one
// syncfs() for the batch, the renames, and one directory fsync. A get() of a
// waiting store reads its tmp file (it never waits for a sync).
// A crash loses at most the waiting batch (its tmp files are deleted at the
// next start). A torn or altered file is still caught by the entry's length
// and checksum (decode_entry) and then dropped. The LRU index lives in memory
// and is rebuilt at start from the directory (oldest mtime first; a hit sets
// the file's mtime, so recency survives restarts); stray tmp files and files
// of other names are left out (tmp files are deleted), and so is anything that
// is not a regular file with one link (a symlink, a FIFO, a hard link to
// something else): the tier never counts, reads or follows what it did not
// write. Entries are opened with O_NOFOLLOW and fstat-checked before a read:
// one larger than the key implies is dropped unread.
//
// Expiry (issue 36): an entry's header holds its expiry (EntryCodec, v3; a
// pinned prefix's TTL); the index keeps it (read from each file's header at
// start). An expired entry is dropped at start, on lookup and by sweep();
// renew() rewrites the 8 bytes in place. Until it expires, an entry with an
// expiry (a pin) is evicted only after every entry without one. clear(ns)
// removes the entries whose header carries namespace ns (one engine's).
//
// A full disk (ENOSPC, EDQUOT): the least recently used entries are evicted
// and the write retried; when that does not help (the space is someone
// else's), writes pause (reads go on) and are tried again after a backoff (1 s
// doubling to 60 s); the first write that succeeds ends the pause. A directory
// that cannot be written (EROFS, EACCES, EPERM) pauses writes the same way.
// Only a directory that cannot be created or listed at start turns the whole
// tier off. The engine serves on in every case. Called from one thread (the
// TierSet worker).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "tier/tier.h"

namespace pagoda::tier {

struct DiskTierOptions {
  std::string dir;
  uint64_t max_bytes = 0;
  // Tests: every write fails with this errno (ENOSPC: a full disk; EROFS: a
  // read-only directory). 0: off.
  int inject_write_errno = 0;
  // The first pause of writes after a full disk or a read-only directory
  // (doubling per failed retry to 60 s); 0: retry at the next store (tests).
  int write_retry_ms = 1000;
  // Durable stores, batched (above). `--kv-disk-fsync off`: each store is
  // renamed at once, nothing is synced; a crash may then lose recent entries
  // (a torn one is still detected).
  bool fsync = true;
  // Read every entry's head at start and report it (take_found): a replica
  // with KV events announces what it holds. Off: only the header is read.
  bool read_heads = false;
  // The clock of expiries (unix ms); default: the system clock. Tests inject theirs.
  std::function<uint64_t()> now_ms;
};

class DiskTier final : public TierBackend {
 public:
  explicit DiskTier(DiskTierOptions opt);
  ~DiskTier() override;
  const char* kind() const override { return "disk"; }
  TierGet get(const std::string& name, uint64_t max_bytes) override;
  Put put(const std::string& name, const std::string& value, uint64_t expiry_ms = 0) override;
  void drop(const std::string& name) override;
  void flush() override;
  bool renew(const std::string& name, uint64_t expiry_ms) override;
  void sweep(uint64_t now_ms) override;
  int64_t clear(uint64_t ns) override;
  // The expiry of a held entry (0: none, or not held).
  uint64_t expiry_of(const std::string& name) const;

  bool disabled() const { return disabled_; }
  // Writes paused after a full disk or a read-only directory (until a retry succeeds).
  bool writes_paused() const { return writes_paused_; }
  void set_inject_write_errno(int e) { opt_.inject_write_errno = e; }
  uint64_t bytes_used() const { return bytes_; }
  size_t num_entries() const { return index_.size(); }

 private:
  struct Entry {
    uint64_t size = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front = least recent)
    uint64_t expiry_ms = 0;                // 0: none
    uint64_t ns = 0;                       // the header's namespace (0: not a v3 entry)
  };
  uint64_t now() const;
  // Writes `expiry_ms` into the header of the file at path p; false on an I/O error.
  static bool write_expiry(const std::string& p, uint64_t expiry_ms);
  std::string path(const std::string& name) const { return opt_.dir + "/" + name; }
  void touch(const std::string& name);
  void forget(const std::string& name);
  void add_index(const std::string& name, uint64_t size, uint64_t expiry_ms, uint64_t ns);
  void evict_to(uint64_t limit);
  void disable(const char* what, int err);
  // Writes one tmp file; 0 or the errno.
  int write_tmp(const std::string& tmp, const std::string& value);
  // A write failed with `err`: a full disk or a read-only directory pauses writes.
  void write_failed(const char* what, int err);
  bool is_pending(const std::string& name) const;

  DiskTierOptions opt_;
  bool disabled_ = false;
  bool writes_paused_ = false;  // until retry_at_, then a store tries again
  int write_backoff_ms_ = 0;
  std::chrono::steady_clock::time_point retry_at_{};
  struct Pending {
    std::string name;
    uint64_t size = 0;
    uint64_t expiry_ms = 0;
    uint64_t ns = 0;
  };
  Pending* pending(const std::string& name);
  std::vector<Pending> pending_;  // written as tmp files, not yet synced and renamed
  uint64_t bytes_ = 0;
  std::list<std::string> lru_;
  std::unordered_map<std::string, Entry> index_;
  size_t num_expiring_ = 0;  // index entries with an expiry (sweep() is free without any)
};

// Whether `name` looks like a tier entry name (32 lowercase hex digits).
bool is_entry_name(const std::string& name);

}  // namespace pagoda::tier
