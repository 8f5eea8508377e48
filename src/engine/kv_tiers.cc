#include "engine/kv_tiers.h"

#include <algorithm>

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
  link->tiers_ = std::make_unique<tier::TierSet>(std::move(backends));
  link->fingerprint_ = model_fingerprint;
  link->kv_dtype_ = static_cast<uint32_t>(c.kv_dtype);
  link->block_size_ = kv->block_size();
  link->block_bytes_ = storage->block_bytes();
  kv->set_commit_log(true);
  return link;
}

tier::TierKey KvTierLink::key_for(const Hash128& chain, const std::string& salt) const {
  tier::TierKey k;
  k.model_fingerprint = fingerprint_;
  k.kv_dtype = kv_dtype_;
  k.block_size = static_cast<uint32_t>(block_size_);
  k.group = 0;
  k.cache_salt = salt;
  k.chain = chain;
  return k;
}

bool KvTierLink::start(sched::NewRequest& r) {
  const std::vector<Hash128> keys = kv_->chain_keys(r.prompt, r.cache_salt);
  const int32_t first = kv_->match_prefix(r.prompt, r.cache_salt).num_blocks();
  const auto n = static_cast<int32_t>(keys.size()) - first;
  if (n <= 0) return false;
  Wait w;
  w.first = first;
  w.state.assign(static_cast<size_t>(n), 0);
  w.bytes.resize(static_cast<size_t>(n));
  const sched::RequestId id = r.id;
  const auto bs = static_cast<size_t>(block_size_);
  for (int32_t j = 0; j < n; ++j) {
    const auto i = static_cast<size_t>(first + j);
    tier::TierKey key = key_for(keys[i], r.cache_salt);
    std::string name = key.name();
    std::vector<int32_t> tokens(r.prompt.begin() + static_cast<std::ptrdiff_t>(i * bs),
                                r.prompt.begin() + static_cast<std::ptrdiff_t>((i + 1) * bs));
    auto it = load_by_name_.find(name);
    if (it != load_by_name_.end() && loads_[it->second].tokens == tokens) {  // already asked for by another request
      loads_[it->second].waiters.emplace_back(id, j);
      continue;
    }
    const uint64_t ticket = next_ticket_++;
    load_by_name_[name] = ticket;
    loads_[ticket] = Load{name, tokens, {{id, j}}};
    tier::LoadRequest lr;
    lr.ticket = ticket;
    lr.key = std::move(key);
    lr.tokens = std::move(tokens);
    lr.kv_bytes = block_bytes_;
    tiers_->load(std::move(lr));
  }
  w.r = std::move(r);
  waits_.emplace(id, std::move(w));
  order_.push_back(id);
  return true;
}

bool KvTierLink::ready(const Wait& w) const {
  for (int8_t s : w.state) {
    if (s == 0) return false;  // pending before the first miss
    if (s == 2) return true;   // nothing after a miss is used
  }
  return true;
}

std::vector<sched::NewRequest> KvTierLink::take_ready() {
  for (tier::LoadResult& res : tiers_->poll()) {
    auto it = loads_.find(res.ticket);
    if (it == loads_.end()) continue;
    auto bytes = res.hit ? std::make_shared<const std::string>(std::move(res.kv_bytes)) : nullptr;
    for (const auto& [id, j] : it->second.waiters) {
      auto wit = waits_.find(id);
      if (wit == waits_.end()) continue;  // aborted while loading
      wit->second.state[static_cast<size_t>(j)] = res.hit ? 1 : 2;
      wit->second.bytes[static_cast<size_t>(j)] = bytes;
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
    if (!ready(w)) {
      ++oit;
      continue;
    }
    int32_t hits = 0;
    while (hits < static_cast<int32_t>(w.state.size()) && w.state[static_cast<size_t>(hits)] == 1) ++hits;
    imported_blocks_ += kv_->import_blocks(w.r.prompt, w.r.cache_salt, w.first, hits, [&](int32_t i, kv::BlockId b) {
      storage_->import_block(b, *w.bytes[static_cast<size_t>(i - w.first)]);
    });
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
    tiers_->store(key_for(cb.key, cb.salt), cb.tokens, bytes);
  }
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
