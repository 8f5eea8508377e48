#include <algorithm>

#include "tier/tier.h"

namespace pagoda::tier {

uint64_t unix_now_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

TierSet::TierSet(std::vector<std::unique_ptr<TierBackend>> backends, std::shared_ptr<const EntryCodec> codec,
                 TierSetOptions opt)
    : codec_(std::move(codec)), opt_(opt) {
  for (auto& b : backends) {
    auto t = std::make_unique<Tier>();
    t->stats.kind = b->kind();
    t->backend = std::move(b);
    tiers_.push_back(std::move(t));
  }
  // Threads start once every Tier exists: a worker may hand a load to the next tier.
  for (size_t i = 0; i < tiers_.size(); ++i) tiers_[i]->thread = std::thread([this, i] { run(i); });
}

TierSet::~TierSet() {
  drain();  // a clean shutdown keeps what was queued (the disk tier survives the restart)
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : tiers_) t->thread.join();
}

void TierSet::enqueue_load(size_t i, LoadRequest r) {
  if (i >= tiers_.size()) {
    LoadResult res;
    res.ticket = r.ticket;
    done_.push_back(std::move(res));
    done_cv_.notify_all();
    return;
  }
  Tier& t = *tiers_[i];
  if (t.loads.size() >= opt_.max_queued_loads) {
    ++t.stats.errors;  // overloaded: this tier is skipped for this load
    enqueue_load(i + 1, std::move(r));
    return;
  }
  t.loads.push_back(std::move(r));
  work_cv_.notify_all();
}

void TierSet::load(LoadRequest r) {
  std::lock_guard<std::mutex> l(mu_);
  enqueue_load(0, std::move(r));
}

void TierSet::store(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes,
                    const Hash128* parent, uint64_t expiry_ms) {
  if (tiers_.empty()) return;
  // A copy here (memcpy speed); the encoding (AES-CTR and HMAC-SHA256 over
  // the block) runs once, on the first tier worker that takes the job.
  auto job = std::make_shared<StoreJob>();
  job->key = key;
  job->tokens.assign(tokens.begin(), tokens.end());
  job->kv_bytes.assign(kv_bytes);
  if (parent) job->parent = *parent;
  job->root = parent == nullptr;
  job->expiry_ms = expiry_ms;
  job->queued_bytes = EntryCodec::entry_size(kv_bytes.size(), tokens.size());
  std::lock_guard<std::mutex> l(mu_);
  for (auto& t : tiers_) {
    if (t->queued_store_bytes + job->queued_bytes > opt_.max_queued_store_bytes) {
      ++t->stats.stores_dropped;
      if (record_events_) {
        events_.push_back(TierEvent{TierEvent::kNotStored, static_cast<uint32_t>(&t - tiers_.data()),
                                    codec_->name(key), {}});
      }
      continue;
    }
    t->queued_store_bytes += job->queued_bytes;
    t->stores.push_back(Store{job, {}, 0});
  }
  work_cv_.notify_all();
}

void TierSet::renew(const std::string& name, uint64_t expiry_ms) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& t : tiers_) t->stores.push_back(Store{nullptr, name, expiry_ms});
  work_cv_.notify_all();
}

std::vector<int64_t> TierSet::clear(uint64_t ns) {
  drain();  // the stores queued before the reset are cleared too
  std::unique_lock<std::mutex> l(mu_);
  for (auto& t : tiers_) {
    t->clear_asked = true;
    t->clear_ns = ns;
    t->cleared = -1;
  }
  work_cv_.notify_all();
  done_cv_.wait(l, [&] { return std::all_of(tiers_.begin(), tiers_.end(), [](const auto& t) { return t->cleared >= 0; }); });
  std::vector<int64_t> out;
  for (auto& t : tiers_) out.push_back(t->cleared);
  return out;
}

void TierSet::set_record_events(bool on) {
  std::lock_guard<std::mutex> l(mu_);
  record_events_ = on;
  // Workers may run: a backend's start-up list is its own until taken here,
  // and only the constructor (before any worker job) wrote it.
  for (size_t i = 0; i < tiers_.size(); ++i) {
    for (auto& [name, head] : tiers_[i]->backend->take_found()) {
      if (on) events_.push_back(TierEvent{TierEvent::kFound, static_cast<uint32_t>(i), name, std::move(head)});
    }
  }
}

std::vector<LoadResult> TierSet::poll() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<LoadResult> out;
  out.swap(done_);
  return out;
}

bool TierSet::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return done_cv_.wait_for(l, timeout, [&] { return !done_.empty(); });
}

void TierSet::drain() {
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] {
    return std::all_of(tiers_.begin(), tiers_.end(),
                       [](const auto& t) { return !t->busy && t->loads.empty() && t->stores.empty(); });
  });
}

std::vector<TierStats> TierSet::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<TierStats> out;
  for (const auto& t : tiers_) out.push_back(t->stats);
  return out;
}

void TierSet::collect_dropped(size_t i) {
  std::vector<std::string> names = tiers_[i]->backend->take_dropped();
  if (!record_events_) return;
  for (std::string& n : names) {
    events_.push_back(TierEvent{TierEvent::kDropped, static_cast<uint32_t>(i), std::move(n), {}});
  }
}

void TierSet::run(size_t i) {
  Tier& t = *tiers_[i];
  std::unique_lock<std::mutex> l(mu_);
  const auto sweep_every = std::chrono::milliseconds(std::max(1, opt_.sweep_ms));
  auto next_sweep = std::chrono::steady_clock::now() + sweep_every;
  for (;;) {
    work_cv_.wait_until(l, next_sweep, [&] { return stop_ || !t.loads.empty() || !t.stores.empty() || t.clear_asked; });
    if (stop_) return;
    t.busy = true;
    if (std::chrono::steady_clock::now() >= next_sweep) {  // expired entries (pins' TTLs) go, loads or not
      l.unlock();
      t.backend->sweep(unix_now_ms());
      l.lock();
      const std::vector<std::string> gone = t.backend->take_dropped();
      t.stats.expired += static_cast<int64_t>(gone.size());
      if (record_events_) {
        for (const std::string& n : gone) events_.push_back(TierEvent{TierEvent::kDropped, static_cast<uint32_t>(i), n, {}});
      }
      next_sweep = std::chrono::steady_clock::now() + sweep_every;
    }
    if (t.clear_asked && t.loads.empty() && t.stores.empty()) {
      t.clear_asked = false;
      const uint64_t ns = t.clear_ns;
      l.unlock();
      const int64_t n = t.backend->clear(ns);
      l.lock();
      collect_dropped(i);
      t.stats.cleared += n;
      t.cleared = n;
    } else if (!t.loads.empty()) {  // loads first: a request is waiting for them
      LoadRequest r = std::move(t.loads.front());
      t.loads.pop_front();
      ++t.stats.lookups;
      l.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      const std::string name = codec_->name(r.key);
      TierGet g = t.backend->get(name, EntryCodec::entry_size(r.kv_bytes, r.tokens.size()));
      // An entry past its expiry (a tier that keeps it a little longer: Redis's clock) is a miss.
      if (g.status == TierGet::kHit) {
        const EntryHead head = EntryCodec::parse_head(g.value);
        if (head.ours && head.expiry_ms != 0 && head.expiry_ms <= unix_now_ms()) {
          t.backend->drop(name);
          g = TierGet{};
        }
      }
      LoadResult res;
      res.ticket = r.ticket;
      DecodeResult dr = DecodeResult::kCorrupt;
      if (g.status == TierGet::kHit) dr = codec_->decode(g.value, r.key, r.tokens, r.kv_bytes, &res.kv_bytes);
      const bool corrupt = g.status == TierGet::kRejected || (g.status == TierGet::kHit && dr == DecodeResult::kCorrupt);
      if (corrupt) t.backend->drop(name);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      l.lock();
      collect_dropped(i);
      t.stats.bytes_read += static_cast<int64_t>(g.value.size());
      if (g.status == TierGet::kError) ++t.stats.errors;
      if (g.status == TierGet::kMiss || g.status == TierGet::kError) ++t.stats.misses;
      if (corrupt) ++t.stats.corrupt;
      if (g.status == TierGet::kRejected) ++t.stats.rejected;
      if (g.status == TierGet::kHit && dr == DecodeResult::kMismatch) ++t.stats.mismatches;
      if (g.status == TierGet::kHit && dr == DecodeResult::kOk) {
        if (r.key.kind == TierKey::kCheckpoint) {
          ++t.stats.checkpoint_hits;
        } else {
          ++t.stats.hits;
          t.stats.hit_tokens += static_cast<int64_t>(r.tokens.size());
        }
        size_t b = 0;
        while (b + 1 < kNumLatencyBuckets && secs > kLoadLatencyBounds[b]) ++b;
        ++t.stats.load_latency_buckets[b];
        t.stats.load_latency_sum += secs;
        res.hit = true;
        res.tier = static_cast<int>(i);
        done_.push_back(std::move(res));
        done_cv_.notify_all();
      } else {
        enqueue_load(i + 1, std::move(r));  // the next tier, or a miss
      }
    } else if (!t.stores.empty() && t.stores.front().job == nullptr) {  // a renewal
      Store s = std::move(t.stores.front());
      t.stores.pop_front();
      l.unlock();
      t.backend->renew(s.name, s.expiry_ms);
      l.lock();
      collect_dropped(i);
    } else if (!t.stores.empty()) {
      Store s = std::move(t.stores.front());
      t.stores.pop_front();
      l.unlock();
      StoreJob& job = *s.job;
      std::call_once(job.once, [&] {
        job.name = codec_->name(job.key);
        job.blob = codec_->encode(job.key, job.tokens, job.kv_bytes, job.root ? nullptr : &job.parent, job.expiry_ms);
        std::string().swap(job.kv_bytes);
      });
      const TierBackend::Put put = t.backend->put(job.name, job.blob, job.expiry_ms);
      l.lock();
      if (record_events_) {
        events_.push_back(TierEvent{put == TierBackend::Put::kStored ? TierEvent::kStored : TierEvent::kNotStored,
                                    static_cast<uint32_t>(i), job.name, {}});
      }
      collect_dropped(i);  // after the store: an entry it evicted is dropped after this one is stored
      t.queued_store_bytes -= job.queued_bytes;
      if (put == TierBackend::Put::kStored) {
        ++t.stats.stores;
        if (job.key.kind == TierKey::kCheckpoint) ++t.stats.checkpoint_stores;
        t.stats.bytes_written += static_cast<int64_t>(job.blob.size());
      } else if (put == TierBackend::Put::kError) {
        ++t.stats.errors;
      }
      if (t.stores.empty()) {  // the end of a burst (still busy: drain() waits for it)
        l.unlock();
        t.backend->flush();
        l.lock();
        collect_dropped(i);
      }
    }
    t.busy = false;
    done_cv_.notify_all();
  }
}

}  // namespace pagoda::tier
