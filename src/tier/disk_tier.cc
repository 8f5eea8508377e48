#include "tier/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "base/log.h"

namespace pagoda::tier {

namespace fs = std::filesystem;

constexpr size_t kMaxPending = 64;  // stores in one synced batch at most

bool is_entry_name(const std::string& name) {
  return name.size() == 32 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

DiskTier::DiskTier(DiskTierOptions opt) : opt_(std::move(opt)) {
  std::error_code ec;
  fs::create_directories(opt_.dir, ec);
  if (ec) {
    disable("cannot create the directory", ec.value());
    return;
  }
  struct Found {
    std::string name;
    uint64_t size;
    fs::file_time_type mtime;
    EntryHead head;
    std::string bytes;  // its first bytes (read_heads)
  };
  std::vector<Found> found;
  for (const auto& de : fs::directory_iterator(opt_.dir, ec)) {
    const std::string n = de.path().filename().string();
    std::error_code e2;
    if (n.rfind(".tmp-", 0) == 0) {
      fs::remove(de.path(), e2);  // a store cut short by a crash (a link to something else: only the link goes)
      continue;
    }
    if (!is_entry_name(n)) continue;
    // lstat, not stat: a symlink (to a huge file) or a hard link is not an entry this tier wrote.
    struct stat st {};
    if (::lstat(de.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) continue;
    Found f{n, static_cast<uint64_t>(st.st_size), de.last_write_time(e2), {}, {}};
    // The header (expiry, namespace), and with read_heads the meta after it.
    const size_t want = std::min<uint64_t>(f.size, opt_.read_heads ? EntryCodec::kMaxHeadBytes : 128);
    const int fd = ::open(de.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
      f.bytes.resize(want);
      const ssize_t got = ::pread(fd, f.bytes.data(), want, 0);
      f.bytes.resize(got > 0 ? static_cast<size_t>(got) : 0);
      ::close(fd);
    }
    f.head = EntryCodec::parse_head(f.bytes);
    if (f.head.expiry_ms != 0 && f.head.expiry_ms <= now()) {  // expired while no one ran
      fs::remove(de.path(), e2);
      continue;
    }
    if (!opt_.read_heads) f.bytes.clear();
    found.push_back(std::move(f));
  }
  if (ec) {
    disable("cannot list the directory", ec.value());
    return;
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (const Found& f : found) add_index(f.name, f.size, f.head.expiry_ms, f.head.ns);
  evict_to(opt_.max_bytes);
  if (opt_.read_heads) {
    for (Found& f : found) {
      if (index_.count(f.name)) note_found(f.name, std::move(f.bytes));
    }
  }
  PAGODA_LOG_INFO("kv disk tier %s: %zu entries, %llu of %llu bytes", opt_.dir.c_str(), index_.size(),
                  static_cast<unsigned long long>(bytes_), static_cast<unsigned long long>(opt_.max_bytes));
}

void DiskTier::disable(const char* what, int err) {
  if (disabled_) return;
  disabled_ = true;
  PAGODA_LOG_ERROR("kv disk tier %s: %s: %s; the disk tier is off, serving goes on without it", opt_.dir.c_str(),
                   what, std::strerror(err));
}

void DiskTier::touch(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  lru_.splice(lru_.end(), lru_, it->second.lru);
}

uint64_t DiskTier::now() const { return opt_.now_ms ? opt_.now_ms() : unix_now_ms(); }

void DiskTier::add_index(const std::string& name, uint64_t size, uint64_t expiry_ms, uint64_t ns) {
  lru_.push_back(name);
  index_[name] = Entry{size, std::prev(lru_.end()), expiry_ms, ns};
  bytes_ += size;
  if (expiry_ms != 0) ++num_expiring_;
}

void DiskTier::forget(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  if (it->second.expiry_ms != 0) --num_expiring_;
  bytes_ -= it->second.size;
  lru_.erase(it->second.lru);
  index_.erase(it);
  note_dropped(name);
}

void DiskTier::evict_to(uint64_t limit) {
  // Entries without an expiry first (least recent first), then pinned ones.
  const uint64_t t = num_expiring_ ? now() : 0;
  for (auto it = lru_.begin(); bytes_ > limit && it != lru_.end();) {
    const std::string victim = *it++;
    const uint64_t e = index_[victim].expiry_ms;
    if (e != 0 && e > t) continue;
    ::unlink(path(victim).c_str());
    forget(victim);
  }
  while (bytes_ > limit && !lru_.empty()) {
    const std::string victim = lru_.front();
    ::unlink(path(victim).c_str());
    forget(victim);
  }
}

DiskTier::Pending* DiskTier::pending(const std::string& name) {
  for (Pending& p : pending_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

bool DiskTier::write_expiry(const std::string& p, uint64_t expiry_ms) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  const bool ok = ::pwrite(fd, &expiry_ms, sizeof(expiry_ms), EntryCodec::kExpiryOffset) ==
                  static_cast<ssize_t>(sizeof(expiry_ms));
  ::close(fd);
  return ok;
}

bool DiskTier::renew(const std::string& name, uint64_t expiry_ms) {
  if (disabled_) return false;
  if (Pending* p = pending(name)) {
    if (!write_expiry(opt_.dir + "/.tmp-" + name, expiry_ms)) return false;
    p->expiry_ms = expiry_ms;
    return true;
  }
  auto it = index_.find(name);
  if (it == index_.end() || !write_expiry(path(name), expiry_ms)) return false;
  if ((it->second.expiry_ms != 0) != (expiry_ms != 0)) num_expiring_ += expiry_ms != 0 ? 1 : -1;
  it->second.expiry_ms = expiry_ms;
  return true;
}

uint64_t DiskTier::expiry_of(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? 0 : it->second.expiry_ms;
}

void DiskTier::sweep(uint64_t now_ms) {
  if (num_expiring_ == 0) return;
  std::vector<std::string> gone;
  for (const auto& [name, e] : index_) {
    if (e.expiry_ms != 0 && e.expiry_ms <= now_ms) gone.push_back(name);
  }
  std::sort(gone.begin(), gone.end());  // a deterministic order of events
  for (const std::string& n : gone) drop(n);
}

int64_t DiskTier::clear(uint64_t ns) {
  int64_t n = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->ns != ns) {
      ++it;
      continue;
    }
    ::unlink((opt_.dir + "/.tmp-" + it->name).c_str());
    note_dropped(it->name);
    it = pending_.erase(it);
    ++n;
  }
  std::vector<std::string> gone;
  for (const std::string& name : lru_) {
    if (index_[name].ns == ns) gone.push_back(name);
  }
  for (const std::string& name : gone) drop(name);
  return n + static_cast<int64_t>(gone.size());
}

bool DiskTier::is_pending(const std::string& name) const {
  return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.name == name; });
}

TierGet DiskTier::get(const std::string& name, uint64_t max_bytes) {
  TierGet g;
  // A store waiting for its batch's sync is read from its tmp file (whole and
  // closed; only its durability waits): a read never waits for a sync.
  const bool pending = is_pending(name);
  if (disabled_ || (!pending && index_.count(name) == 0)) return g;  // the index is the directory's content
  if (!pending) {
    const uint64_t e = index_[name].expiry_ms;
    if (e != 0 && e <= now()) {  // expired: dropped, a miss
      drop(name);
      return g;
    }
  }
  const std::string p = pending ? opt_.dir + "/.tmp-" + name : path(name);
  // O_NOFOLLOW: a symlink planted at an entry's name is not followed (ELOOP);
  // O_NONBLOCK: nor does a FIFO block the open.
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ELOOP) {
      g.status = TierGet::kRejected;
    } else {
      if (errno != ENOENT) g.status = TierGet::kError;
      if (!pending) forget(name);
    }
    return g;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    g.status = TierGet::kRejected;  // never read: the caller drops it
    return g;
  }
  g.value.resize(static_cast<size_t>(st.st_size));
  size_t off = 0;
  bool ok = true;
  while (off < g.value.size()) {
    const ssize_t n = ::read(fd, g.value.data() + off, g.value.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  if (!ok) {
    g.value.clear();
    g.status = TierGet::kError;
    return g;
  }
  // Recency on disk too: a restart rebuilds the LRU order from mtimes.
  ::utimensat(AT_FDCWD, p.c_str(), nullptr, 0);
  touch(name);
  g.status = TierGet::kHit;
  return g;
}

static bool is_full(int e) { return e == ENOSPC || e == EDQUOT; }
static bool is_pausing_write_error(int e) { return is_full(e) || e == EROFS || e == EACCES || e == EPERM; }

void DiskTier::write_failed(const char* what, int err) {
  if (!is_pausing_write_error(err)) return;
  if (!writes_paused_) {
    PAGODA_LOG_WARN("kv disk tier %s: %s: %s; stores pause (loads go on) and are retried later", opt_.dir.c_str(),
                    what, std::strerror(err));
  }
  writes_paused_ = true;
  write_backoff_ms_ = write_backoff_ms_ == 0 ? opt_.write_retry_ms : std::min(60000, write_backoff_ms_ * 2);
  retry_at_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(write_backoff_ms_);
}

int DiskTier::write_tmp(const std::string& tmp, const std::string& value) {
  if (opt_.inject_write_errno != 0) return opt_.inject_write_errno;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return errno;
  int err = 0;
  size_t off = 0;
  while (off < value.size()) {
    const ssize_t n = ::write(fd, value.data() + off, value.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) ::unlink(tmp.c_str());
  return err;
}

TierBackend::Put DiskTier::put(const std::string& name, const std::string& value, uint64_t expiry_ms) {
  if (disabled_) return Put::kSkipped;  // not an error each time: it was logged once
  if (Pending* p = pending(name)) {
    if (expiry_ms != 0 && p->expiry_ms != expiry_ms) renew(name, expiry_ms);  // a pin of an entry waiting for its sync
    return Put::kSkipped;
  }
  if (index_.count(name)) {  // already stored (the same prefix computed again, or now pinned)
    if (index_[name].expiry_ms != expiry_ms && expiry_ms != 0) renew(name, expiry_ms);
    touch(name);
    return Put::kSkipped;
  }
  if (writes_paused_ && std::chrono::steady_clock::now() < retry_at_) return Put::kSkipped;
  const uint64_t ns = EntryCodec::parse_head(value).ns;
  if (value.size() > opt_.max_bytes) return Put::kSkipped;  // never fits
  const std::string tmp = opt_.dir + "/.tmp-" + name;
  int err = write_tmp(tmp, value);
  // A full disk: evict the least recently used entries (this entry's size,
  // then four times more) and try again.
  for (uint64_t need = std::max<uint64_t>(value.size(), 1); is_full(err) && !lru_.empty(); need *= 4) {
    evict_to(bytes_ > need ? bytes_ - need : 0);
    err = write_tmp(tmp, value);
  }
  if (err == 0 && opt_.fsync) {  // synced and renamed with its batch
    pending_.push_back({name, value.size(), expiry_ms, ns});
    if (pending_.size() >= kMaxPending) flush();
  } else if (err == 0 && ::rename(tmp.c_str(), path(name).c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
  }
  if (err != 0) {
    write_failed("cannot write an entry", err);
    return Put::kError;
  }
  if (writes_paused_) {
    PAGODA_LOG_INFO("kv disk tier %s: stores succeed again", opt_.dir.c_str());
    writes_paused_ = false;
    write_backoff_ms_ = 0;
  }
  if (opt_.fsync) return Put::kStored;
  add_index(name, value.size(), expiry_ms, ns);
  evict_to(opt_.max_bytes);
  return Put::kStored;
}

DiskTier::~DiskTier() { flush(); }

void DiskTier::flush() {
  if (pending_.empty()) return;
  std::vector<Pending> batch;
  batch.swap(pending_);
  // The data of the whole batch before any of its names: one syncfs (the
  // filesystem's dirty data) instead of one fdatasync per file.
  const int dfd = ::open(opt_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::syncfs(dfd) != 0) {
    for (const Pending& p : batch) {
      const int fd = ::open((opt_.dir + "/.tmp-" + p.name).c_str(), O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        ::fdatasync(fd);
        ::close(fd);
      }
    }
  }
  for (const Pending& p : batch) {
    const std::string tmp = opt_.dir + "/.tmp-" + p.name;
    if (::rename(tmp.c_str(), path(p.name).c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      write_failed("cannot rename an entry", err);
      continue;
    }
    add_index(p.name, p.size, p.expiry_ms, p.ns);
  }
  evict_to(opt_.max_bytes);
  if (dfd >= 0) {
    ::fsync(dfd);  // the names; best effort (the entries are whole either way)
    ::close(dfd);
  }
}

void DiskTier::drop(const std::string& name) {
  ::unlink(path(name).c_str());
  forget(name);
}

}  // namespace pagoda::tier
