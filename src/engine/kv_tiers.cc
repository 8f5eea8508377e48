#include "engine/kv_tiers.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "base/hash.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "kv/kv_manager.h"
#include "runtime/kv_storage.h"
#include "tier/disk_tier.h"
#include "tier/redis_tier.h"

namespace pagoda::engine {

std::vector<size_t> parents_first(const std::vector<AnnounceRef>& blocks) {
  const size_t n = blocks.size();
  std::unordered_map<uint64_t, size_t> by_chain;  // group 0's blocks: the only parents
  for (size_t i = 0; i < n; ++i)
    if (blocks[i].group == 0) by_chain.emplace(blocks[i].chain, i);
  auto less = [&](size_t a, size_t b) {
    return std::make_pair(blocks[a].group, blocks[a].chain) < std::make_pair(blocks[b].group, blocks[b].chain);
  };
  std::vector<std::vector<size_t>> children(n);
  std::vector<size_t> roots;
  for (size_t i = 0; i < n; ++i) {
    auto p = blocks[i].parent ? by_chain.find(*blocks[i].parent) : by_chain.end();
    if (p != by_chain.end() && p->second != i) children[p->second].push_back(i);
    else roots.push_back(i);
  }
  std::sort(roots.begin(), roots.end(), less);
  std::vector<size_t> out;
  out.reserve(n);
  std::vector<bool> seen(n, false);
  std::vector<size_t> stack;
  auto walk = [&](size_t root) {
    stack.push_back(root);
    while (!stack.empty()) {
      const size_t i = stack.back();
      stack.pop_back();
      if (seen[i]) continue;
      seen[i] = true;
      out.push_back(i);
      std::vector<size_t>& c = children[i];
      std::sort(c.begin(), c.end(), less);
      for (auto it = c.rbegin(); it != c.rend(); ++it) stack.push_back(*it);  // the first child pops first
    }
  };
  for (size_t r : roots) walk(r);
  // Only a cycle of parents (no root above it: hash collisions) is left; announced as it comes.
  for (size_t i = 0; i < n; ++i)
    if (!seen[i]) walk(i);
  return out;
}

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
  auto link = std::unique_ptr<KvTierLink>(new KvTierLink());
  link->kv_ = kv;
  link->storage_ = storage;
  if (c.kv_tier_secret.empty())
    PAGODA_LOG_WARN("kv tiers without --kv-tier-secret: entries are checked, but whoever can read the store can "
                    "read them and whoever can write it can plant them");
  link->codec_ = std::make_shared<const tier::EntryCodec>(c.kv_tier_secret);
  link->disk_dir_ = c.kv_disk_dir;
  // The group layout is part of what a block's bytes mean: with and without
  // the hybrid manager, group 0's block holds other layers.
  std::vector<uint64_t> layout = {model_fingerprint, static_cast<uint64_t>(kv->num_groups()), storage->block_bytes()};
  for (int32_t g = 0; g < kv->num_groups(); ++g) layout.push_back(static_cast<uint64_t>(kv->group_window(g)));
  const Hash128 lh = xxh3_128(layout.data(), layout.size() * sizeof(uint64_t));
  link->fingerprint_ = lh.lo ^ lh.hi;
  link->kv_dtype_ = tier_kv_dtype(c.kv_dtype);
  link->block_size_ = kv->block_size();
  link->block_bytes_ = storage->block_bytes();
  link->state_group_ = kv->state_group();
  if (link->state_group_ >= 0) {
    link->ckpt_interval_ = kv->checkpoint_tokens() / kv->block_size();
    link->ckpt_bytes_ = static_cast<uint64_t>(kv->group(link->state_group_).spec().state_blocks) * link->block_bytes_;
  }
  link->ns_ = link->codec_->namespace_tag(link->key_for(Hash128{}, "", 0));
  std::vector<std::unique_ptr<tier::TierBackend>> backends;
  if (!c.kv_disk_dir.empty()) {
    if (c.kv_disk_size <= 0) return errorf("--kv-disk-dir needs a positive --kv-disk-size, got %lld",
                                           static_cast<long long>(c.kv_disk_size));
    tier::DiskTierOptions o;
    o.dir = c.kv_disk_dir;
    o.max_bytes = static_cast<uint64_t>(c.kv_disk_size);
    o.inject_write_errno = c.kv_disk_inject_errno;
    o.fsync = c.kv_disk_fsync;
    o.read_heads = !c.kv_events_config.empty();  // a restart announces what the directory holds
    backends.push_back(std::make_unique<tier::DiskTier>(o));
  }
  if (!c.kv_redis.empty()) {
    PAGODA_ASSIGN_OR_RETURN(auto seeds, tier::parse_redis_url(c.kv_redis));
    if (c.kv_redis_ttl < 0) return errorf("--kv-redis-ttl must be >= 0, got %d", c.kv_redis_ttl);
    tier::RedisTierOptions o;
    o.seeds = std::move(seeds);
    o.ttl_seconds = c.kv_redis_ttl;
    char ns[24];
    std::snprintf(ns, sizeof(ns), "%016llx", static_cast<unsigned long long>(link->ns_));
    o.key_prefix = std::string("pagoda:kv:") + ns + ":";  // this engine's keys: what a reset clears
    o.key_events = !c.kv_events_config.empty();  // expired and evicted keys reported (keyspace notifications)
    backends.push_back(std::make_unique<tier::RedisTier>(o));
  }
  link->tiers_ = std::make_unique<tier::TierSet>(std::move(backends), link->codec_);
  kv->set_commit_log(true);
  kv->set_tiers_configured(true);  // an evicted key now reads tier_miss (kv/prefix_miss.h)
  return link;
}

uint32_t tier_kv_dtype(KvTypes t) {
  const auto k = static_cast<uint32_t>(t.k), v = static_cast<uint32_t>(t.v);
  const uint32_t rotated = kv_dtype_rotated(t.k) || kv_dtype_rotated(t.v) ? 1u << 17 : 0u;
  return (t.same() ? k : k | v << 8 | 1u << 16) | rotated;
}

tier::TierKey KvTierLink::key_for(const Hash128& chain, const std::string& salt, int32_t group, uint32_t kind) const {
  tier::TierKey k;
  k.model_fingerprint = fingerprint_;
  k.kv_dtype = kv_dtype_;
  k.block_size = static_cast<uint32_t>(block_size_);
  k.group = static_cast<uint32_t>(group);
  k.cache_salt = salt;
  k.chain = chain;
  k.kind = kind;
  return k;
}

void KvTierLink::request(Wait& w, int32_t g, int32_t j) {
  const auto ug = static_cast<size_t>(g);
  const auto uj = static_cast<size_t>(j);
  w.state[ug][uj] = kPending;
  const auto i = static_cast<size_t>(w.first + j);
  const auto bs = static_cast<size_t>(block_size_);
  const bool ckpt = g == state_group_;  // the checkpoint at the end of block i
  tier::TierKey key = key_for(w.keys[i], w.r.cache_salt, g, ckpt ? tier::TierKey::kCheckpoint : tier::TierKey::kBlock);
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
  lr.kv_bytes = ckpt ? ckpt_bytes_ : block_bytes_;
  tiers_->load(std::move(lr));
}

bool KvTierLink::start(sched::NewRequest& r) {
  std::vector<Hash128> keys = kv_->chain_keys(r.prompt, r.cache_salt);
  const int32_t first = kv_->match_prefix(r.prompt, r.cache_salt).num_blocks();
  auto k = static_cast<int32_t>(keys.size());
  // A hybrid's hit ends at a checkpoint boundary: nothing past the last one is asked for.
  if (state_group_ >= 0) k = ckpt_interval_ > 0 ? k - k % ckpt_interval_ : 0;
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
    if (g == state_group_) {  // the latest checkpoint, at k (decide() asks for earlier ones after a miss)
      if (w.state[static_cast<size_t>(g)][static_cast<size_t>(k - 1 - first)] == kUnasked) request(w, g, k - 1 - first);
      continue;
    }
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
  const std::function<bool(int32_t, int32_t)> missing = [&](int32_t g, int32_t i) {
    return i >= w.first && w.state[static_cast<size_t>(g)][static_cast<size_t>(i - w.first)] == kMiss;
  };
  const int32_t h = kv_->longest_hit(w.first + e, missing);
  if (state_group_ >= 0) return checkpoint_hit(w, h, missing);
  return windows_ready(w, h) ? h : -1;
}

bool KvTierLink::windows_ready(Wait& w, int32_t h) {
  auto have = [](int8_t s) { return s == kHit || s == kRam; };
  bool pending = false;
  for (int32_t g = 1; g < kv_->num_groups(); ++g) {
    if (g == state_group_) continue;
    const int32_t lo = std::max(w.first, kv_->first_needed_block(g, static_cast<int64_t>(h) * block_size_));
    for (int32_t i = lo; i < h; ++i) {
      int8_t& s = w.state[static_cast<size_t>(g)][static_cast<size_t>(i - w.first)];
      if (s == kUnasked) request(w, g, i - w.first);
      pending = pending || !have(s);
    }
  }
  return !pending;
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
          [&](int32_t g, int32_t i, kv::BlockId b) { storage_->import_block(b, *loaded(g, i)); },
          [&](int32_t i, int32_t part, kv::BlockId b) {  // part `part` of the checkpoint at the end of block i
            storage_->import_block(b, std::string_view(*loaded(state_group_, i)).substr(part * block_bytes_, block_bytes_));
          });
    }
    out.push_back(std::move(w.r));
    waits_.erase(wit);
    oit = order_.erase(oit);
  }
  return out;
}

void KvTierLink::abort(sched::RequestId id) { waits_.erase(id); }

void KvTierLink::stored(const tier::TierKey& key) {
  // A load of it asked for before this store may answer a miss: a request from
  // now on asks again rather than sharing it (its earlier waiters keep it).
  if (!load_by_name_.empty()) load_by_name_.erase(codec_->name(key));
}

void KvTierLink::store_committed() {
  std::string bytes;
  for (const kv::KvManager::CommittedBlock& cb : kv_->take_committed()) {
    storage_->export_block(cb.block, &bytes);
    const tier::TierKey key = key_for(cb.key, cb.salt, cb.group);
    const Hash128* parent = cb.root ? nullptr : &cb.parent;
    if (events_) {  // the entry's name maps the tiers' reports back to its chain
      know(codec_->name(key), cb.key, parent, cb.group, cb.tokens).outstanding += static_cast<int32_t>(tiers_->size());
    }
    stored(key);
    tiers_->store(key, cb.tokens, bytes, parent);
  }
  store_checkpoints();
  store_pins();
}

KvTierLink::Known& KvTierLink::know(const std::string& name, const Hash128& chain, const Hash128* parent,
                                    int32_t group, std::span<const int32_t> tokens) {
  Known& k = known_[name];
  k.chain = chain;
  k.parent = parent ? *parent : Hash128{};
  k.root = parent == nullptr;
  k.group = group;
  k.tokens.assign(tokens.begin(), tokens.end());
  return k;
}

void KvTierLink::store_pins() {
  const std::vector<kv::KvManager::PinLogEntry> pins = kv_->take_pin_log();
  const uint64_t wall = tier::unix_now_ms();
  if (pins.empty() && wall < next_prune_ms_) return;
  const double kv_now = kv_->now();
  const kv::PrefixCache& cache = kv_->cache();
  std::string bytes;
  for (const kv::KvManager::PinLogEntry& p : pins) {
    const double left = p.expiry - kv_now;
    if (!(left > 0)) continue;
    const uint64_t expiry = wall + static_cast<uint64_t>(left * 1000.0);
    // Blocks in chain order, group 0's first per index: a block's parent is
    // group 0's block of the index before.
    Hash128 prev, parent;
    bool have_prev = false, root = true;
    for (size_t i = 0; i < p.blocks.size(); ++i) {
      const kv::BlockId b = p.blocks[i];
      if (!cache.contains(b) || cache.entry_of(b) != p.entries[i]) break;  // released and reused since
      const int32_t g = cache.group_of(b);
      const Hash128 chain = cache.chain_of(b);
      if (g == state_group_) {  // a checkpoint at the end of the block before: its S blocks, one entry
        i = store_pinned_checkpoint(p.blocks, p.entries, i, root ? nullptr : &parent, expiry) - 1;
        continue;
      }
      if (g == 0) {
        root = !have_prev;
        parent = prev;
        prev = chain;
        have_prev = true;
      }
      const tier::TierKey key = key_for(chain, std::string(cache.salt_of(b)), g);
      const std::string name = codec_->name(key);
      auto it = pin_sent_.find(name);
      if (it == pin_sent_.end()) {  // stored again with the expiry (a held entry only takes the expiry)
        storage_->export_block(b, &bytes);
        const std::span<const int32_t> tokens = cache.tokens_of(b);
        if (events_) {
          know(name, chain, root ? nullptr : &parent, g, tokens).outstanding += static_cast<int32_t>(tiers_->size());
        }
        tiers_->store(key, tokens, bytes, root ? nullptr : &parent, expiry);
        stored(key);
        pin_sent_[name] = expiry;
      } else if (expiry >= it->second + 1000) {  // a renewal that moved by a second or more
        tiers_->renew(name, expiry);
        it->second = expiry;
      }
    }
  }
  if (wall >= next_prune_ms_) {  // forget the pins long expired (a later pin stores them again)
    for (auto it = pin_sent_.begin(); it != pin_sent_.end();) it = it->second < wall ? pin_sent_.erase(it) : std::next(it);
    next_prune_ms_ = wall + 10000;
  }
}

void KvTierLink::announce(const std::vector<std::pair<const Known*, uint32_t>>& items) {
  std::vector<AnnounceRef> refs;
  refs.reserve(items.size());
  for (const auto& [k, tier] : items)
    refs.push_back({k->group, k->chain.lo, k->root ? std::nullopt : std::optional<uint64_t>(k->parent.lo)});
  for (size_t i : parents_first(refs)) {
    const Known& k = *items[i].first;
    const uint32_t tier = items[i].second;
    events_->tier_stored(tier < media_.size() ? media_[tier] : "disk", k.chain, k.root ? nullptr : &k.parent,
                         k.tokens, k.group);
  }
}

void KvTierLink::reannounce() {
  if (!events_) return;
  std::vector<std::pair<const Known*, uint32_t>> items;
  for (const auto& [name, k] : known_) {
    for (uint32_t i = 0; i < media_.size(); ++i) {
      if (k.held & (1u << i)) items.emplace_back(&k, i);
    }
  }
  announce(items);  // known_'s order is a hash's: parents first
}

std::vector<std::pair<std::string, int64_t>> KvTierLink::clear_tiers() {
  const std::vector<int64_t> n = tiers_->clear(ns_);
  const std::vector<tier::TierStats> st = tiers_->stats();
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i < n.size() && i < st.size(); ++i) out.emplace_back(st[i].kind, n[i]);
  pin_sent_.clear();
  poll_events();  // their BlockRemoved, now
  return out;
}

std::vector<std::pair<int32_t, uint64_t>> KvTierLink::redis_blocks() const {
  std::vector<std::pair<int32_t, uint64_t>> out;
  for (size_t i = 0; i < media_.size(); ++i) {
    if (std::string(media_[i]) != "redis") continue;
    for (const auto& [name, k] : known_) {
      if (k.held & (1u << i)) out.emplace_back(k.group, k.chain.lo);
    }
  }
  return out;
}

void KvTierLink::set_event_link(KvEventLink* events) {
  events_ = events;
  media_.clear();
  for (const tier::TierStats& t : tiers_->stats()) media_.push_back(t.kind == "redis" ? "redis" : "disk");
  tiers_->set_record_events(events != nullptr);
}

void KvTierLink::poll_events() {
  if (!events_) return;
  // Entries found at start-up, announced together, parents first (the tier finds
  // them in mtime order, which a clock tick shared by several stores leaves open),
  // before any later event of the same poll.
  std::vector<std::pair<const Known*, uint32_t>> found;
  for (const tier::TierEvent& e : tiers_->take_events()) {
    if (e.kind == tier::TierEvent::kFound) {  // held at start-up: announced from its meta
      tier::EntryMeta m;
      if (tier::EntryCodec::parse_head(e.head).ns != ns_ || !codec_->decode_meta(e.name, e.head, &m)) continue;
      if (m.kind != tier::TierKey::kBlock) continue;  // a state checkpoint: not a block (kv_tiers.h)
      Known& k = know(e.name, m.chain, m.root ? nullptr : &m.parent, static_cast<int32_t>(m.group), m.tokens);
      const uint32_t bit = 1u << e.tier;
      if (!(k.held & bit)) found.emplace_back(&k, e.tier);
      k.held |= bit;
      continue;
    }
    if (!found.empty()) {
      announce(found);
      found.clear();
    }
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
  announce(found);
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

std::vector<KvTierStats> KvTierLink::stats() const { return tiers_->stats(); }

}  // namespace pagoda::engine
