#include <algorithm>

#include "tier/tier.h"

namespace pagoda::tier {

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

void TierSet::store(const TierKey& key, std::span<const int32_t> tokens, std::string_view kv_bytes) {
  if (tiers_.empty()) return;
  // A copy here (memcpy speed); the encoding (AES-CTR and HMAC-SHA256 over
  // the block) runs once, on the first tier worker that takes the job.
  auto job = std::make_shared<StoreJob>();
  job->key = key;
  job->tokens.assign(tokens.begin(), tokens.end());
  job->kv_bytes.assign(kv_bytes);
  job->queued_bytes = EntryCodec::entry_size(kv_bytes.size());
  std::lock_guard<std::mutex> l(mu_);
  for (auto& t : tiers_) {
    if (t->queued_store_bytes + job->queued_bytes > opt_.max_queued_store_bytes) {
      ++t->stats.stores_dropped;
      if (record_events_) {
        events_.push_back(TierEvent{TierEvent::kNotStored, static_cast<uint32_t>(&t - tiers_.data()),
                                    codec_->name(key)});
      }
      continue;
    }
    t->queued_store_bytes += job->queued_bytes;
    t->stores.push_back(Store{job});
  }
  work_cv_.notify_all();
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
  for (std::string& n : names) events_.push_back(TierEvent{TierEvent::kDropped, static_cast<uint32_t>(i), std::move(n)});
}

void TierSet::run(size_t i) {
  Tier& t = *tiers_[i];
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [&] { return stop_ || !t.loads.empty() || !t.stores.empty(); });
    if (stop_) return;
    t.busy = true;
    if (!t.loads.empty()) {  // loads first: a request is waiting for them
      LoadRequest r = std::move(t.loads.front());
      t.loads.pop_front();
      ++t.stats.lookups;
      l.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      const std::string name = codec_->name(r.key);
      TierGet g = t.backend->get(name, EntryCodec::entry_size(r.kv_bytes));
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
        ++t.stats.hits;
        t.stats.hit_tokens += static_cast<int64_t>(r.tokens.size());
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
    } else {
      Store s = std::move(t.stores.front());
      t.stores.pop_front();
      l.unlock();
      StoreJob& job = *s.job;
      std::call_once(job.once, [&] {
        job.name = codec_->name(job.key);
        job.blob = codec_->encode(job.key, job.tokens, job.kv_bytes);
        std::string().swap(job.kv_bytes);
      });
      const TierBackend::Put put = t.backend->put(job.name, job.blob);
      l.lock();
      if (record_events_) {
        events_.push_back(TierEvent{put == TierBackend::Put::kStored ? TierEvent::kStored : TierEvent::kNotStored,
                                    static_cast<uint32_t>(i), job.name});
      }
      collect_dropped(i);  // after the store: an entry it evicted is dropped after this one is stored
      t.queued_store_bytes -= job.queued_bytes;
      if (put == TierBackend::Put::kStored) {
        ++t.stats.stores;
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
