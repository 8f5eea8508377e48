// The disk tier: files, LRU by size, restart, torn and flipped files, a full
// disk and a read-only directory; and TierSet's load path over it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <utime.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "tier/disk_tier.h"
#include "tier/tier.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

constexpr uint64_t kAny = 1 << 20;  // a bound no test value reaches

using tiertest::TempDir;
using tiertest::test_bytes;
using tiertest::test_key;
namespace fs = std::filesystem;

DiskTierOptions opts(const std::string& dir, uint64_t max_bytes) {
  DiskTierOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  return o;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

TEST(DiskTier, PutGetAndOneFilePerEntry) {
  TempDir d;
  DiskTier t(opts(d.path, 1 << 20));
  EXPECT_EQ(t.get("00000000000000000000000000000001", kAny).status, TierGet::kMiss);
  EXPECT_EQ(t.put("00000000000000000000000000000001", "hello"), TierBackend::Put::kStored);
  EXPECT_EQ(t.put("00000000000000000000000000000001", "hello"), TierBackend::Put::kSkipped);  // already there
  t.flush();  // synced and renamed (the TierSet worker does it when its store queue runs empty)
  EXPECT_EQ(t.put("00000000000000000000000000000001", "hello"), TierBackend::Put::kSkipped);
  const TierGet g = t.get("00000000000000000000000000000001", kAny);
  EXPECT_EQ(g.status, TierGet::kHit);
  EXPECT_EQ(g.value, "hello");
  EXPECT_EQ(read_file(d.path + "/00000000000000000000000000000001"), "hello");
  // Written to a tmp file and renamed: none is left behind.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(d.path)) files += e.path().filename().string()[0] != '.' ? 1 : 100;
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(t.bytes_used(), 5u);
}

std::string name_of(int i) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%032x", i);
  return buf;
}

TEST(DiskTier, LeastRecentlyUsedGoesFirstBySize) {
  TempDir d;
  DiskTier t(opts(d.path, 300));  // three entries of 100 bytes
  for (int i = 0; i < 3; ++i) ASSERT_EQ(t.put(name_of(i), std::string(100, 'a' + i)), TierBackend::Put::kStored);
  t.flush();  // each batch (the TierSet worker flushes when its store queue runs empty)
  EXPECT_EQ(t.get(name_of(0), kAny).status, TierGet::kHit);  // 0 is now the most recent: 1 is the oldest
  ASSERT_EQ(t.put(name_of(3), std::string(100, 'd')), TierBackend::Put::kStored);
  t.flush();
  EXPECT_EQ(t.get(name_of(1), kAny).status, TierGet::kMiss);
  EXPECT_FALSE(fs::exists(d.path + "/" + name_of(1)));
  EXPECT_EQ(t.get(name_of(0), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.get(name_of(2), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.get(name_of(3), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.bytes_used(), 300u);
  // One entry of 250 bytes pushes out the three least recent (0, 2, 3 were read in that order).
  ASSERT_EQ(t.put(name_of(4), std::string(250, 'e')), TierBackend::Put::kStored);
  t.flush();
  EXPECT_EQ(t.num_entries(), 1u);
  EXPECT_EQ(t.get(name_of(4), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.put(name_of(5), std::string(301, 'f')), TierBackend::Put::kSkipped);  // larger than the tier
}

TEST(DiskTier, SyncedStoresWaitAsTmpFilesUntilTheirBatchIsFlushed) {
  TempDir d;
  const auto exists = [&](const std::string& f) { return fs::exists(d.path + "/" + f); };
  {
    DiskTier t(opts(d.path, 1 << 20));  // fsync on (the default)
    ASSERT_EQ(t.put(name_of(1), "a"), TierBackend::Put::kStored);
    ASSERT_EQ(t.put(name_of(2), "b"), TierBackend::Put::kStored);
    EXPECT_EQ(t.put(name_of(1), "a"), TierBackend::Put::kSkipped);  // waiting in the batch
    EXPECT_FALSE(exists(name_of(1)));
    EXPECT_TRUE(exists(".tmp-" + name_of(1)));
    EXPECT_EQ(t.num_entries(), 0u);
    t.flush();  // synced, renamed, the directory synced
    EXPECT_TRUE(exists(name_of(1)));
    EXPECT_TRUE(exists(name_of(2)));
    EXPECT_FALSE(exists(".tmp-" + name_of(2)));
    EXPECT_EQ(t.num_entries(), 2u);
    // A batch is flushed by its 64th store.
    for (int i = 10; i < 73; ++i) ASSERT_EQ(t.put(name_of(i), "c"), TierBackend::Put::kStored);
    EXPECT_EQ(t.num_entries(), 2u);
    ASSERT_EQ(t.put(name_of(73), "c"), TierBackend::Put::kStored);
    EXPECT_EQ(t.num_entries(), 66u);
    ASSERT_EQ(t.put(name_of(74), "d"), TierBackend::Put::kStored);
    EXPECT_EQ(t.get(name_of(74), kAny).value, "d");  // read from its tmp file, no sync
    EXPECT_EQ(t.num_entries(), 66u);
    EXPECT_FALSE(exists(name_of(74)));
    ASSERT_EQ(t.put(name_of(75), "e"), TierBackend::Put::kStored);
  }  // the destructor flushes
  EXPECT_EQ(read_file(d.path + "/" + name_of(75)), "e");
  EXPECT_FALSE(exists(".tmp-" + name_of(75)));
  // Without fsync a store is renamed at once.
  DiskTierOptions o = opts(d.path, 1 << 20);
  o.fsync = false;
  DiskTier t(o);
  ASSERT_EQ(t.put(name_of(80), "f"), TierBackend::Put::kStored);
  EXPECT_TRUE(exists(name_of(80)));
}

TEST(DiskTier, RestartRebuildsTheIndexInMtimeOrder) {
  TempDir d;
  {
    DiskTier t(opts(d.path, 1 << 20));
    for (int i = 0; i < 3; ++i) ASSERT_EQ(t.put(name_of(i), std::string(100, 'a')), TierBackend::Put::kStored);
  }
  // Entry 2 oldest, then 0, then 1; plus a stray tmp file and an unrelated file.
  const auto set_mtime = [&](int i, time_t when) {
    utimbuf ut{when, when};
    ASSERT_EQ(::utime((d.path + "/" + name_of(i)).c_str(), &ut), 0);
  };
  set_mtime(2, 1000);
  set_mtime(0, 2000);
  set_mtime(1, 3000);
  std::ofstream(d.path + "/.tmp-" + name_of(9)) << "torn";
  std::ofstream(d.path + "/README") << "not an entry";
  DiskTier t(opts(d.path, 250));  // holds two: the oldest (2) goes at start
  EXPECT_EQ(t.num_entries(), 2u);
  EXPECT_FALSE(fs::exists(d.path + "/" + name_of(2)));
  EXPECT_FALSE(fs::exists(d.path + "/.tmp-" + name_of(9)));
  EXPECT_TRUE(fs::exists(d.path + "/README"));
  EXPECT_EQ(t.get(name_of(0), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.get(name_of(1), kAny).status, TierGet::kHit);
}

// A full disk that eviction cannot help (the injected errno stays): the
// store fails, writes pause while loads go on, and the first store after the
// pause that succeeds ends it.
TEST(DiskTier, FullDiskPausesWritesAndRecovers) {
  for (int err : {ENOSPC, EDQUOT}) {
    TempDir d;
    DiskTierOptions o = opts(d.path, 1 << 20);
    o.fsync = false;
    o.write_retry_ms = 0;  // retried at the next store
    DiskTier t(o);
    ASSERT_EQ(t.put(name_of(1), "old"), TierBackend::Put::kStored);
    t.set_inject_write_errno(err);
    EXPECT_EQ(t.put(name_of(2), "x"), TierBackend::Put::kError);
    EXPECT_TRUE(t.writes_paused());
    EXPECT_FALSE(t.disabled());
    // Evicted to make room and retried: the old entry went for it.
    EXPECT_EQ(t.num_entries(), 0u);
    EXPECT_FALSE(fs::exists(d.path + "/.tmp-" + name_of(2)));
    t.set_inject_write_errno(0);  // space again
    EXPECT_EQ(t.put(name_of(3), "y"), TierBackend::Put::kStored);
    EXPECT_FALSE(t.writes_paused());
    EXPECT_EQ(t.get(name_of(3), kAny).value, "y");
  }
}

TEST(DiskTier, ReadOnlyDirectoryPausesWritesNotReads) {
  TempDir d;
  DiskTierOptions o = opts(d.path, 1 << 20);
  o.fsync = false;
  o.write_retry_ms = 3600 * 1000;  // an hour: within this test, every store is skipped
  DiskTier t(o);
  ASSERT_EQ(t.put(name_of(1), "kept"), TierBackend::Put::kStored);
  t.set_inject_write_errno(EROFS);  // the tests may run as root, where chmod does not stop a write
  EXPECT_EQ(t.put(name_of(2), "x"), TierBackend::Put::kError);
  EXPECT_TRUE(t.writes_paused());
  EXPECT_FALSE(t.disabled());
  EXPECT_EQ(t.get(name_of(1), kAny).value, "kept");  // a read-only directory still serves loads
  EXPECT_EQ(t.num_entries(), 1u);                  // and EROFS evicts nothing
  t.set_inject_write_errno(0);
  EXPECT_EQ(t.put(name_of(3), "x"), TierBackend::Put::kSkipped);  // paused: not one error per store
  // A directory that cannot be created: a path under a regular file. The whole tier is off.
  std::ofstream(d.path + "/file") << "x";
  DiskTier bad(opts(d.path + "/file/sub", 1 << 20));
  EXPECT_TRUE(bad.disabled());
  EXPECT_EQ(bad.put(name_of(1), "x"), TierBackend::Put::kSkipped);
}

// At start the tier counts only regular files with one link: symlinks (six to
// a 1 GiB file would have filled a 1 MiB tier and evicted every entry), FIFOs
// and hard links are left out, neither read nor deleted.
TEST(DiskTier, StartSkipsSymlinksFifosAndHardLinks) {
  TempDir d, outside;
  {
    DiskTier t(opts(d.path, 1 << 20));
    for (int i = 0; i < 2; ++i) ASSERT_EQ(t.put(name_of(i), std::string(100, 'a')), TierBackend::Put::kStored);
  }
  const std::string big = outside.path + "/big";
  { std::ofstream(big) << "x"; }
  fs::resize_file(big, uint64_t{1} << 30);  // sparse
  for (int i = 10; i < 16; ++i) fs::create_symlink(big, d.path + "/" + name_of(i));
  ASSERT_EQ(::mkfifo((d.path + "/" + name_of(20)).c_str(), 0644), 0);
  fs::create_hard_link(big, d.path + "/" + name_of(21));
  fs::create_directory(d.path + "/" + name_of(22));
  DiskTier t(opts(d.path, 1 << 20));
  EXPECT_EQ(t.num_entries(), 2u);
  EXPECT_EQ(t.bytes_used(), 200u);
  EXPECT_EQ(t.get(name_of(0), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.get(name_of(1), kAny).status, TierGet::kHit);
  for (int i : {10, 20, 21, 22}) EXPECT_EQ(t.get(name_of(i), kAny).status, TierGet::kMiss) << i;
  EXPECT_TRUE(fs::is_symlink(d.path + "/" + name_of(10)));
  EXPECT_EQ(fs::file_size(big), uint64_t{1} << 30);
}

// An entry replaced by a symlink after start is not followed (O_NOFOLLOW),
// and one larger than the key implies is not read: both are rejected and the
// name dropped, the target untouched.
TEST(DiskTier, ReadsNeverFollowASymlinkNorReadMoreThanAsked) {
  TempDir d, outside;
  DiskTierOptions o = opts(d.path, 1 << 20);
  o.fsync = false;
  DiskTier t(o);
  ASSERT_EQ(t.put(name_of(1), std::string(100, 'a')), TierBackend::Put::kStored);
  ASSERT_EQ(t.put(name_of(2), std::string(100, 'b')), TierBackend::Put::kStored);
  const std::string secret = outside.path + "/secret";
  std::ofstream(secret) << std::string(100, 's');
  fs::remove(d.path + "/" + name_of(1));
  fs::create_symlink(secret, d.path + "/" + name_of(1));
  const TierGet g = t.get(name_of(1), kAny);
  EXPECT_EQ(g.status, TierGet::kRejected);
  EXPECT_TRUE(g.value.empty());
  // Larger than asked: not read.
  fs::resize_file(d.path + "/" + name_of(2), 8 << 20);
  const TierGet big = t.get(name_of(2), 100);
  EXPECT_EQ(big.status, TierGet::kRejected);
  EXPECT_TRUE(big.value.empty());
  EXPECT_EQ(t.get(name_of(2), 8 << 20).status, TierGet::kHit);  // within the bound: read
  t.drop(name_of(1));
  EXPECT_FALSE(fs::exists(fs::symlink_status(d.path + "/" + name_of(1))));
  EXPECT_EQ(read_file(secret), std::string(100, 's'));
}

// A real full filesystem (a 1 MiB tmpfs; mounting needs root): stores evict the
// oldest entries and retry; space taken by another file pauses writes until it
// is freed; a read-only remount pauses them until it is writable again.
TEST(DiskTier, RealFullAndReadOnlyFilesystem) {
  TempDir d;
  if (::system(("mount -t tmpfs -o size=1m tmpfs " + d.path + " 2>/dev/null").c_str()) != 0) {
    const char* ci = std::getenv("CI");
    if (ci != nullptr && std::string(ci) == "true") FAIL() << "cannot mount a tmpfs (CI needs root for this test)";
    GTEST_SKIP() << "cannot mount a tmpfs (not root?)";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { (void)::system(("umount " + path).c_str()); }
  } unmount{d.path};
  DiskTierOptions o = opts(d.path + "/kv", 64 << 20);  // the limit is far above what the filesystem holds
  o.fsync = false;
  o.write_retry_ms = 0;
  DiskTier t(o);
  const std::string value(100 << 10, 'v');
  for (int i = 0; i < 30; ++i) ASSERT_EQ(t.put(name_of(i), value), TierBackend::Put::kStored) << i;
  EXPECT_FALSE(t.writes_paused());
  EXPECT_LT(t.num_entries(), 11u);  // 1 MiB holds at most ten
  EXPECT_GE(t.num_entries(), 5u);
  EXPECT_EQ(t.get(name_of(29), kAny).status, TierGet::kHit);
  EXPECT_EQ(t.get(name_of(0), kAny).status, TierGet::kMiss);  // evicted for space
  // Someone else's file fills the filesystem: eviction cannot help.
  for (int i = 0; i < 30; ++i) t.drop(name_of(i));
  ASSERT_EQ(t.num_entries(), 0u);
  {
    std::ofstream f(d.path + "/other", std::ios::binary);
    const std::string chunk(64 << 10, 'o');
    for (int i = 0; i < 32 && f; ++i) f << chunk;
  }
  EXPECT_EQ(t.put(name_of(100), value), TierBackend::Put::kError);
  EXPECT_TRUE(t.writes_paused());
  EXPECT_EQ(t.num_entries(), 0u);
  fs::remove(d.path + "/other");
  EXPECT_EQ(t.put(name_of(101), value), TierBackend::Put::kStored);
  EXPECT_FALSE(t.writes_paused());
  // Read-only, then writable again.
  ASSERT_EQ(::system(("mount -o remount,ro " + d.path).c_str()), 0);
  EXPECT_EQ(t.put(name_of(102), value), TierBackend::Put::kError);
  EXPECT_TRUE(t.writes_paused());
  EXPECT_EQ(t.get(name_of(101), kAny).status, TierGet::kHit);  // loads go on
  ASSERT_EQ(::system(("mount -o remount,rw " + d.path).c_str()), 0);
  EXPECT_EQ(t.put(name_of(103), value), TierBackend::Put::kStored);
  EXPECT_FALSE(t.writes_paused());
}

// TierSet over a disk tier: a good entry loads; a torn or flipped file is a
// miss, counted as corrupt and deleted.
TEST(TierSetDisk, LoadsVerifiesAndDropsCorruptFiles) {
  TempDir d;
  std::vector<std::unique_ptr<TierBackend>> b;
  b.push_back(std::make_unique<DiskTier>(opts(d.path, 1 << 20)));
  const auto codec = std::make_shared<const EntryCodec>("a test secret, 16+ bytes");
  TierSet set(std::move(b), codec);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::string kv = test_bytes(512, 9);
  for (uint64_t c = 1; c <= 3; ++c) set.store(test_key(c), tokens, kv);
  set.drain();
  // Entry 2 torn (cut in half), entry 3 with one flipped byte.
  const std::string p2 = d.path + "/" + codec->name(test_key(2)), p3 = d.path + "/" + codec->name(test_key(3));
  fs::resize_file(p2, fs::file_size(p2) / 2);
  {
    std::fstream f(p3, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300);
    f.put('\x7f');
  }
  for (uint64_t c = 1; c <= 4; ++c) {
    LoadRequest r;
    r.ticket = c;
    r.key = test_key(c);
    r.tokens = tokens;
    r.kv_bytes = kv.size();
    set.load(r);
  }
  set.drain();
  std::vector<LoadResult> res = set.poll();
  ASSERT_EQ(res.size(), 4u);
  std::sort(res.begin(), res.end(), [](const LoadResult& a, const LoadResult& b) { return a.ticket < b.ticket; });
  EXPECT_TRUE(res[0].hit);
  EXPECT_EQ(res[0].kv_bytes, kv);
  EXPECT_FALSE(res[1].hit);
  EXPECT_FALSE(res[2].hit);
  EXPECT_FALSE(res[3].hit);  // never stored
  EXPECT_FALSE(fs::exists(p2));
  EXPECT_FALSE(fs::exists(p3));
  const TierStats st = set.stats()[0];
  EXPECT_EQ(st.kind, "disk");
  // (lookups, hits, hit tokens, corrupt, misses, stores, errors)
  EXPECT_EQ(std::make_tuple(st.lookups, st.hits, st.hit_tokens, st.corrupt, st.misses, st.stores, st.errors),
            std::make_tuple(4, 1, 4, 2, 1, 3, 0));
  uint64_t latencies = 0;
  for (uint64_t n : st.load_latency_buckets) latencies += n;
  EXPECT_EQ(latencies, 1u);
  // An entry file grown far past the size its key implies: dropped unread.
  const std::string p1 = d.path + "/" + codec->name(test_key(1));
  fs::resize_file(p1, 256 << 20);
  LoadRequest big;
  big.ticket = 8;
  big.key = test_key(1);
  big.tokens = tokens;
  big.kv_bytes = kv.size();
  const int64_t read_before = set.stats()[0].bytes_read;
  set.load(big);
  set.drain();
  res = set.poll();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_FALSE(res[0].hit);
  EXPECT_FALSE(fs::exists(p1));
  EXPECT_EQ(set.stats()[0].rejected, 1);
  EXPECT_EQ(set.stats()[0].corrupt, 3);
  EXPECT_EQ(set.stats()[0].bytes_read, read_before);
  // Another model's key on the same store: its name differs, so a plain miss.
  LoadRequest other;
  other.ticket = 9;
  other.key = test_key(1);
  other.key.model_fingerprint ^= 0xff;
  other.tokens = tokens;
  other.kv_bytes = kv.size();
  set.load(other);
  set.drain();
  res = set.poll();
  ASSERT_EQ(res.size(), 1u);
  EXPECT_FALSE(res[0].hit);
}

}  // namespace
}  // namespace pagoda::tier
