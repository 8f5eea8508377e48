#include "engine/kv_tiers.h"

#include <algorithm>
#include <filesystem>

#include "base/hash.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "kv/kv_manager.h"
#include "runtime/kv_storage.h"
#include "tier/disk_tier.h"
#include "tier/redis_tier.h"

namespace pagoda::engine {

bool kv_tiers_enabled(const EngineConfig& c) { return !c.kv_disk_dir.empty() || !c.kv_redis.empty(); }

uint64_t tier_model_fingerprint(const gguf::GgufFile& f, uint64_t model_fingerprint) {
  Hasher128 h(0x6b7674696572ull);  // "kvtier"
  const uint64_t head[3] = {model_fingerprint, f.file_size(), f.data_offset()};
  h.update(head, sizeof(head));
  // The weights themselves, sampled: two fine-tunes of one architecture have
  // the same hyper-parameters but never the same tensor bytes.
  constexpr uint64_t kSample = 256;
  for (const gguf::TensorInfo& t : f.tensors()) {
    h.update(t.name.data(), t.name.size());
    const uint64_t meta[3] = {static_cast<uint64_t>(t.type), t.offset, t.n_bytes};
    h.update(meta, sizeof(meta));
    h.update(t.dims.data(), t.dims.size() * sizeof(uint64_t));
    if (t.data == nullptr) continue;
    const uint64_t n = std::min(kSample, t.n_bytes);
    h.update(t.data, n);
    h.update(t.data + (t.n_bytes - n), n);
  }
  const Hash128 d = h.digest();
  return d.lo ^ d.hi;
}

Expected<std::unique_ptr<KvTierLink>> KvTierLink::create(const EngineConfig& c, uint64_t model_fingerprint,
                                                         kv::KvManager* kv, runtime::KvStorage* storage) {
  std::vector<std::unique_ptr<tier::TierBackend>> backends;
  if (!c.kv_disk_dir.empty()) {
    if (c.kv_disk_size <= 0) return errorf("--kv-disk-dir needs a positive --kv-disk-size, got %lld",
                                           static_cast<long long>(c.kv_disk_size));
    tier::DiskTierOptions o;
    o.dir = c.kv_disk_dir;
    o.max_bytes = static_cast<uint64_t>(c.kv_disk_size);
    o.inject_write_errno = c.kv_disk_inject_errno;
    o.fsync = c.kv_disk_fsync;
    backends.push_back(std::make_unique<tier::DiskTier>(o));
  }
  if (!c.kv_redis.empty()) {
    PAGODA_ASSIGN_OR_RETURN(auto seeds, tier::parse_redis_url(c.kv_redis));
    if (c.kv_redis_ttl < 0) return errorf("--kv-redis-ttl must be >= 0, got %d", c.kv_redis_ttl);
    tier::RedisTierOptions o;
    o.seeds = std::move(seeds);
    o.ttl_seconds = c.kv_redis_ttl;
    backends.push_back(std::make_unique<tier::RedisTier>(o));
  }
  auto link = std::unique_ptr<KvTierLink>(new KvTierLink());
  link->kv_ = kv;
  link->storage_ = storage;
  if (c.kv_tier_secret.empty())
    PAGODA_LOG_WARN("kv tiers without --kv-tier-secret: entries are checked, but whoever can read the store can "
                    "read them and whoever can write it can plant them");
  link->codec_ = std::make_shared<const tier::EntryCodec>(c.kv_tier_secret);
  link->disk_dir_ = c.kv_disk_dir;
  link->tiers_ = std::make_unique<tier::TierSet>(std::move(backends), link->codec_);
  // The group layout is part of what a block's bytes mean: with and without
  // the hybrid manager, group 0's block holds other layers.
  std::vector<uint64_t> layout = {model_fingerprint, static_cast<uint64_t>(kv->num_groups()), storage->block_bytes()};
  for (int32_t g = 0; g < kv->num_groups(); ++g) layout.push_back(static_cast<uint64_t>(kv->group_window(g)));
  const Hash128 lh = xxh3_128(layout.data(), layout.size() * sizeof(uint64_t));
  link->fingerprint_ = lh.lo ^ lh.hi;
  link->kv_dtype_ = tier_kv_dtype(c.kv_dtype);
  link->block_size_ = kv->block_size();
  link->block_bytes_ = storage->block_bytes();
  kv->set_commit_log(true);
  kv->set_tiers_configured(true);  // an evicted key now reads tier_miss (kv/prefix_miss.h)
  return link;
}

uint32_t tier_kv_dtype(KvTypes t) {
  const auto k = static_cast<uint32_t>(t.k), v = static_cast<uint32_t>(t.v);
  const uint32_t rotated = kv_dtype_rotated(t.k) || kv_dtype_rotated(t.v) ? 1u << 17 : 0u;
  return (t.same() ? k : k | v << 8 | 1u << 16) | rotated;
}

tier::TierKey KvTierLink::key_for(const Hash128& chain, const std::string& salt, int32_t group) const {
  tier::TierKey k;
  k.model_fingerprint = fingerprint_;
  k.kv_dtype = kv_dtype_;
  k.block_size = static_cast<uint32_t>(block_size_);
  k.group = static_cast<uint32_t>(group);
  k.cache_salt = salt;
  k.chain = chain;
  return k;
}

void KvTierLink::request(Wait& w, int32_t g, int32_t j) {
  const auto ug = static_cast<size_t>(g);
  const auto uj = static_cast<size_t>(j);
  w.state[ug][uj] = kPending;
  const auto i = static_cast<size_t>(w.first + j);
  const auto bs = static_cast<size_t>(block_size_);
  tier::TierKey key = key_for(w.keys[i], w.r.cache_salt, g);
  std::string name = codec_->name(key);
  std::vector<int32_t> tokens(w.r.prompt.begin() + static_cast<std::ptrdiff_t>(i * bs),
                              w.r.prompt.begin() + static_cast<std::ptrdiff_t>((i + 1) * bs));
  auto it = load_by_name_.find(name);
  if (it != load_by_name_.end() && loads_[it->second].tokens == tokens) {  // already asked for by another request
    loads_[it->second].waiters.push_back({w.r.id, g, j});
    return;
  }
  const uint64_t ticket = next_ticket_++;
  load_by_name_[name] = ticket;
  loads_[ticket] = Load{name, tokens, {{w.r.id, g, j}}};
  tier::LoadRequest lr;
  lr.ticket = ticket;
  lr.key = std::move(key);
  lr.tokens = std::move(tokens);
  lr.kv_bytes = block_bytes_;
  tiers_->load(std::move(lr));
}

bool KvTierLink::start(sched::NewRequest& r) {
  std::vector<Hash128> keys = kv_->chain_keys(r.prompt, r.cache_salt);
  const int32_t first = kv_->match_prefix(r.prompt, r.cache_salt).num_blocks();
  const auto k = static_cast<int32_t>(keys.size());
  if (k - first <= 0) return false;
  const sched::RequestId id = r.id;
  Wait w;
  w.r = std::move(r);
  w.first = first;
  w.keys = std::move(keys);
  const auto ng = static_cast<size_t>(kv_->num_groups());
  w.state.assign(ng, std::vector<int8_t>(static_cast<size_t>(k - first), kUnasked));
  w.bytes.assign(ng, std::vector<std::shared_ptr<const std::string>>(static_cast<size_t>(k - first)));
  // Group 0 past the RAM hit, and each window group's blocks of the full hit
  // (a shorter hit may need more of them: decide() asks for those later); not
  // the blocks RAM holds (with window groups, group 0's chain in RAM may go on
  // past the hit every group serves).
  const auto ram = kv_->cached_blocks(w.r.prompt, w.r.cache_salt);
  for (size_t g = 0; g < ng; ++g) {
    for (int32_t i = first; i < k; ++i) {
      if (ram[g][static_cast<size_t>(i)]) w.state[g][static_cast<size_t>(i - first)] = kRam;
    }
  }
  for (int32_t g = 0; g < kv_->num_groups(); ++g) {
    const int32_t lo = std::max(first, kv_->first_needed_block(g, static_cast<int64_t>(k) * block_size_));
    for (int32_t i = lo; i < k; ++i) {
      if (w.state[static_cast<size_t>(g)][static_cast<size_t>(i - first)] == kUnasked) request(w, g, i - first);
    }
  }
  order_.push_back(id);
  waits_.emplace(id, std::move(w));
  return true;
}

int32_t KvTierLink::decide(Wait& w) {
  const auto n = static_cast<int32_t>(w.state[0].size());
  int32_t e = 0;  // group 0's chain: hits from the RAM hit on
  auto have = [](int8_t s) { return s == kHit || s == kRam; };
  while (e < n && have(w.state[0][static_cast<size_t>(e)])) ++e;
  if (e < n && w.state[0][static_cast<size_t>(e)] != kMiss) return -1;
  // The longest hit with only the misses known so far ruled out (blocks
  // before `first` are in RAM: the RAM hit needed every one a longer hit does).
  const int32_t h = kv_->longest_hit(w.first + e, [&](int32_t g, int32_t i) {
    return i >= w.first && w.state[static_cast<size_t>(g)][static_cast<size_t>(i - w.first)] == kMiss;
  });
  bool pending = false;
  for (int32_t g = 1; g < kv_->num_groups(); ++g) {
    const int32_t lo = std::max(w.first, kv_->first_needed_block(g, static_cast<int64_t>(h) * block_size_));
    for (int32_t i = lo; i < h; ++i) {
      int8_t& s = w.state[static_cast<size_t>(g)][static_cast<size_t>(i - w.first)];
      if (s == kUnasked) request(w, g, i - w.first);
      pending = pending || !have(s);
    }
  }
  return pending ? -1 : h;
}

std::vector<sched::NewRequest> KvTierLink::take_ready() {
  for (tier::LoadResult& res : tiers_->poll()) {
    auto it = loads_.find(res.ticket);
    if (it == loads_.end()) continue;
    auto bytes = res.hit ? std::make_shared<const std::string>(std::move(res.kv_bytes)) : nullptr;
    for (const Load::Waiter& wt : it->second.waiters) {
      auto wit = waits_.find(wt.id);
      if (wit == waits_.end()) continue;  // aborted while loading
      const auto g = static_cast<size_t>(wt.group);
      const auto j = static_cast<size_t>(wt.j);
      wit->second.state[g][j] = res.hit ? kHit : kMiss;
      wit->second.bytes[g][j] = bytes;
    }
    auto nit = load_by_name_.find(it->second.name);
    if (nit != load_by_name_.end() && nit->second == res.ticket) load_by_name_.erase(nit);
    loads_.erase(it);
  }
  std::vector<sched::NewRequest> out;
  for (auto oit = order_.begin(); oit != order_.end();) {
    auto wit = waits_.find(*oit);
    if (wit == waits_.end()) {
      oit = order_.erase(oit);
      continue;
    }
    Wait& w = wit->second;
    const int32_t h = decide(w);
    if (h < 0) {
      ++oit;
      continue;
    }
    auto loaded = [&](int32_t g, int32_t i) -> const std::string* {
      if (i < w.first || i >= w.first + static_cast<int32_t>(w.state[0].size())) return nullptr;
      return w.bytes[static_cast<size_t>(g)][static_cast<size_t>(i - w.first)].get();
    };
    if (h > w.first) {
      imported_blocks_ += kv_->import_blocks(
          w.r.prompt, w.r.cache_salt, h, [&](int32_t g, int32_t i) { return loaded(g, i) != nullptr; },
          [&](int32_t g, int32_t i, kv::BlockId b) { storage_->import_block(b, *loaded(g, i)); });
    }
    out.push_back(std::move(w.r));
    waits_.erase(wit);
    oit = order_.erase(oit);
  }
  return out;
}

void KvTierLink::abort(sched::RequestId id) { waits_.erase(id); }

void KvTierLink::store_committed() {
  std::string bytes;
  for (const kv::KvManager::CommittedBlock& cb : kv_->take_committed()) {
    storage_->export_block(cb.block, &bytes);
    const tier::TierKey key = key_for(cb.key, cb.salt, cb.group);
    if (events_) {  // the entry's name maps the tiers' reports back to its chain
      Known& k = known_[codec_->name(key)];
      k.chain = cb.key;
      k.parent = cb.parent;
      k.root = cb.root;
      k.group = cb.group;
      k.tokens = cb.tokens;
      k.outstanding += static_cast<int32_t>(tiers_->size());
    }
    tiers_->store(key, cb.tokens, bytes);
  }
}

void KvTierLink::set_event_link(KvEventLink* events) {
  events_ = events;
  media_.clear();
  for (const tier::TierStats& t : tiers_->stats()) media_.push_back(t.kind == "redis" ? "redis" : "disk");
  tiers_->set_record_events(events != nullptr);
}

void KvTierLink::poll_events() {
  if (!events_) return;
  for (const tier::TierEvent& e : tiers_->take_events()) {
    auto it = known_.find(e.name);
    if (it == known_.end()) continue;  // not stored by this process (an earlier run's entry)
    Known& k = it->second;
    const char* medium = e.tier < media_.size() ? media_[e.tier] : "disk";
    const uint32_t bit = 1u << e.tier;
    if (e.kind == tier::TierEvent::kDropped) {
      if (k.held & bit) events_->tier_removed(medium, k.chain, k.group);
      k.held &= ~bit;
    } else {
      --k.outstanding;
      if (e.kind == tier::TierEvent::kStored && !(k.held & bit)) {
        events_->tier_stored(medium, k.chain, k.root ? nullptr : &k.parent, k.tokens, k.group);
        k.held |= bit;
      }
    }
    if (k.outstanding <= 0 && k.held == 0) known_.erase(it);
  }
}

std::vector<std::pair<int32_t, uint64_t>> KvTierLink::disk_blocks() const {
  std::vector<std::pair<int32_t, uint64_t>> out;
  if (disk_dir_.empty()) return out;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(disk_dir_, ec)) {
    const std::string name = f.path().filename().string();
    if (!tier::is_entry_name(name)) continue;
    auto it = known_.find(name);
    if (it != known_.end()) out.emplace_back(it->second.group, it->second.chain.lo);
  }
  return out;
}

std::vector<KvTierStats> KvTierLink::stats() const {
  std::vector<KvTierStats> out;
  for (const tier::TierStats& t : tiers_->stats()) {
    KvTierStats s;
    s.kind = t.kind;
    s.lookups = t.lookups;
    s.hits = t.hits;
    s.hit_tokens = t.hit_tokens;
    s.misses = t.misses;
    s.corrupt = t.corrupt;
    s.rejected = t.rejected;
    s.mismatches = t.mismatches;
    s.errors = t.errors;
    s.stores = t.stores;
    s.stores_dropped = t.stores_dropped;
    s.bytes_read = t.bytes_read;
    s.bytes_written = t.bytes_written;
    s.load_latency_bounds.assign(std::begin(tier::kLoadLatencyBounds), std::end(tier::kLoadLatencyBounds));
    s.load_latency_buckets = t.load_latency_buckets;
    s.load_latency_sum = t.load_latency_sum;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace pagoda::engine
