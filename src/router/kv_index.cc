#include "router/kv_index.h"

#include <algorithm>
#include <cctype>

#include "base/hash.h"

namespace pagoda::router {

KvMedium parse_kv_medium(const std::string& name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "cpu" || n == "gpu") return KvMedium::kCpu;
  if (n == "disk") return KvMedium::kDisk;
  if (n == "redis") return KvMedium::kRedis;
  return KvMedium::kOther;
}

const char* kv_medium_name(KvMedium m) {
  switch (m) {
    case KvMedium::kCpu: return "cpu";
    case KvMedium::kDisk: return "disk";
    case KvMedium::kRedis: return "redis";
    case KvMedium::kOther: return "other";
  }
  return "";
}

uint64_t router_block_hash(std::optional<uint64_t> parent, const int32_t* tokens, size_t n) {
  constexpr uint64_t kRootSeed = 0x6b76726f75746572ull;  // "kvrouter": any fixed value, hashes stay in this process
  return xxh3_64(tokens, n * sizeof(int32_t), parent ? *parent : kRootSeed);
}

std::vector<uint64_t> router_chain(const std::vector<int32_t>& tokens, int block_size, size_t max_blocks) {
  std::vector<uint64_t> chain;
  if (block_size < 1) return chain;
  const size_t bs = static_cast<size_t>(block_size);
  const size_t n = std::min(tokens.size() / bs, max_blocks);
  chain.reserve(n);
  std::optional<uint64_t> parent;
  for (size_t b = 0; b < n; ++b) {
    parent = router_block_hash(parent, tokens.data() + b * bs, bs);
    chain.push_back(*parent);
  }
  return chain;
}

KvIndex::KvIndex(int num_replicas)
    : engine_(static_cast<size_t>(num_replicas)), counts_(static_cast<size_t>(num_replicas)) {
  for (auto& c : counts_) c.fill(0);
}

void KvIndex::add(int replica, uint64_t router_hash, KvMedium m) {
  auto& hs = holders_[router_hash];
  auto it = std::find_if(hs.begin(), hs.end(), [&](const Holder& h) { return h.replica == replica; });
  if (it == hs.end()) {
    hs.push_back(Holder{replica, {}});
    it = hs.end() - 1;
  }
  ++it->count[static_cast<size_t>(m)];
  ++counts_[static_cast<size_t>(replica)][static_cast<size_t>(m)];
}

void KvIndex::remove(int replica, uint64_t router_hash, KvMedium m) {
  auto hit = holders_.find(router_hash);
  if (hit == holders_.end()) return;
  auto& hs = hit->second;
  auto it = std::find_if(hs.begin(), hs.end(), [&](const Holder& h) { return h.replica == replica; });
  if (it == hs.end() || it->count[static_cast<size_t>(m)] == 0) return;
  --it->count[static_cast<size_t>(m)];
  --counts_[static_cast<size_t>(replica)][static_cast<size_t>(m)];
  if (std::all_of(it->count.begin(), it->count.end(), [](uint32_t c) { return c == 0; })) hs.erase(it);
  if (hs.empty()) holders_.erase(hit);
}

KvIndex::Applied KvIndex::apply(int replica, const KvEvent& ev) {
  Applied out;
  auto& engine = engine_[static_cast<size_t>(replica)];
  if (ev.kind == KvEventKind::kCleared) {
    out.blocks = 0;
    for (size_t m = 0; m < kNumKvMedia; ++m) out.blocks += counts_[static_cast<size_t>(replica)][m];
    clear(replica);
    return out;
  }
  if (ev.group_idx != 0) {
    out.ignored = true;
    return out;
  }
  const KvMedium medium = parse_kv_medium(ev.medium);
  const unsigned bit = 1u << static_cast<unsigned>(medium);
  if (ev.kind == KvEventKind::kRemoved) {
    for (uint64_t h : ev.block_hashes) {
      auto it = engine.find(h);
      if (it == engine.end() || !(it->second.media & bit)) {
        ++out.unknown;
        continue;
      }
      remove(replica, it->second.router_hash, medium);
      it->second.media &= ~bit;
      if (it->second.media == 0) engine.erase(it);
      ++out.blocks;
    }
    return out;
  }
  // BlockStored.
  if (block_size_ == 0) block_size_ = static_cast<int>(ev.block_size);
  if (ev.block_size != block_size_) {
    out.refused = "block_size " + std::to_string(ev.block_size) + " differs from the " +
                  std::to_string(block_size_) + " learned from earlier events";
    return out;
  }
  std::optional<uint64_t> parent;
  if (ev.parent_hash) {
    auto it = engine.find(*ev.parent_hash);
    if (it == engine.end()) {  // the chain hangs from a block not held here: nothing of it can match
      out.orphans = ev.block_hashes.size();
      return out;
    }
    parent = it->second.router_hash;
  }
  const size_t bs = static_cast<size_t>(block_size_);
  for (size_t i = 0; i < ev.block_hashes.size(); ++i) {
    const uint64_t rh = router_block_hash(parent, ev.token_ids.data() + i * bs, bs);
    parent = rh;
    auto [it, fresh] = engine.try_emplace(ev.block_hashes[i], EngineEntry{rh, 0});
    if (!fresh && it->second.router_hash != rh) {
      // The engine reused the hash for other tokens (a 64-bit collision, or a
      // block we missed the removal of): the new tokens win on every medium.
      for (size_t m = 0; m < kNumKvMedia; ++m)
        if (it->second.media & (1u << m)) remove(replica, it->second.router_hash, static_cast<KvMedium>(m));
      it->second = EngineEntry{rh, 0};
    }
    if (it->second.media & bit) continue;  // already held there (a replayed event): idempotent
    it->second.media |= bit;
    add(replica, rh, medium);
    ++out.blocks;
  }
  return out;
}

void KvIndex::clear(int replica) {
  auto& engine = engine_[static_cast<size_t>(replica)];
  for (const auto& [h, e] : engine)
    for (size_t m = 0; m < kNumKvMedia; ++m)
      if (e.media & (1u << m)) remove(replica, e.router_hash, static_cast<KvMedium>(m));
  engine.clear();
}

std::vector<PrefixMatch> KvIndex::match(const std::vector<uint64_t>& chain) const {
  const size_t n = engine_.size();
  std::vector<PrefixMatch> out(n);
  std::vector<bool> ram_open(n, true), any_open(n, true);
  size_t open = n;
  for (size_t b = 0; b < chain.size() && open > 0; ++b) {
    auto hit = holders_.find(chain[b]);
    std::vector<bool> ram(n, false), any(n, false);
    if (hit != holders_.end()) {
      for (const Holder& h : hit->second) {
        any[static_cast<size_t>(h.replica)] = true;
        ram[static_cast<size_t>(h.replica)] = h.count[static_cast<size_t>(KvMedium::kCpu)] > 0;
      }
    }
    for (size_t r = 0; r < n; ++r) {
      if (ram_open[r] && ram[r]) ++out[r].ram_blocks;
      else ram_open[r] = false;
      if (any_open[r] && any[r]) ++out[r].any_blocks;
      else if (any_open[r]) {
        any_open[r] = false;
        --open;
      }
    }
  }
  return out;
}

std::optional<uint64_t> KvIndex::router_hash_of(int replica, uint64_t engine_hash) const {
  const auto& engine = engine_[static_cast<size_t>(replica)];
  auto it = engine.find(engine_hash);
  if (it == engine.end()) return std::nullopt;
  return it->second.router_hash;
}

unsigned KvIndex::media_of(int replica, uint64_t router_hash) const {
  auto hit = holders_.find(router_hash);
  if (hit == holders_.end()) return 0;
  unsigned media = 0;
  for (const Holder& h : hit->second)
    if (h.replica == replica)
      for (size_t m = 0; m < kNumKvMedia; ++m)
        if (h.count[m] > 0) media |= 1u << m;
  return media;
}

std::string KvIndex::check_invariants() const {
  // Rebuild holders_ and counts_ from engine_ and compare.
  std::unordered_map<uint64_t, std::unordered_map<int, std::array<uint32_t, kNumKvMedia>>> want;
  for (size_t r = 0; r < engine_.size(); ++r) {
    std::array<size_t, kNumKvMedia> c{};
    for (const auto& [h, e] : engine_[r]) {
      if (e.media == 0) return "an engine entry with no medium on replica " + std::to_string(r);
      for (size_t m = 0; m < kNumKvMedia; ++m)
        if (e.media & (1u << m)) {
          ++c[m];
          ++want[e.router_hash][static_cast<int>(r)][m];
        }
    }
    if (c != counts_[r]) return "per-medium counts of replica " + std::to_string(r) + " disagree";
  }
  if (want.size() != holders_.size()) return "holder map size disagrees";
  for (const auto& [rh, hs] : holders_) {
    auto w = want.find(rh);
    if (w == want.end() || w->second.size() != hs.size()) return "holders of a router hash disagree";
    for (const Holder& h : hs) {
      auto wr = w->second.find(h.replica);
      if (wr == w->second.end() || wr->second != h.count) return "holder counts disagree";
    }
  }
  return "";
}

double kv_score(const PrefixMatch& m, double tier_weight) {
  return m.ram_blocks + tier_weight * (m.any_blocks - m.ram_blocks);
}

RouteChoice choose_kv(const std::vector<PrefixMatch>& matches, const KvRouting& how, const HashRing& ring,
                      uint64_t key, const std::vector<uint64_t>& chain, const std::vector<int>& in_flight,
                      const std::vector<bool>& eligible, double max_imbalance) {
  const double limit = load_limit(in_flight, eligible, max_imbalance);
  const double hold_limit =
      how.hold_imbalance < 0 ? limit : load_limit(in_flight, eligible, std::max(max_imbalance, how.hold_imbalance));
  auto under = [&](size_t i, double bound) { return i < eligible.size() && eligible[i] && in_flight[i] <= bound; };
  auto within = [&](size_t i) { return under(i, limit); };
  auto candidate = [&](size_t i) {
    return under(i, hold_limit) && i < matches.size() && matches[i].any_blocks >= std::max(1, how.min_blocks);
  };
  int longest = 0;
  for (size_t i = 0; i < matches.size(); ++i)
    if (candidate(i)) longest = std::max(longest, matches[i].any_blocks);
  if (longest == 0) return {-1, RouteKind::kKvEvents};
  // The ring's order from the prompt's key through its first block past the
  // longest match: prompts that share only a head spread by what follows it.
  const uint64_t past = chain.empty() ? key : chain[std::min(static_cast<size_t>(longest), chain.size() - 1)];
  if (!chain.empty() && longest < how.match_threshold * static_cast<double>(chain.size())) {
    // Too short a match to be worth following (SGLang's cache_threshold): the
    // ring from past the match, over every replica within the bound.
    for (int r : ring.walk(past))
      if (within(static_cast<size_t>(r))) return {r, RouteKind::kKvEvents};
    return {-1, RouteKind::kKvEvents};
  }
  RouteChoice best{-1, RouteKind::kKvEvents};
  double best_score = 0;
  // The first of equal scores met in that order wins.
  for (int r : ring.walk(past)) {
    const size_t i = static_cast<size_t>(r);
    if (!candidate(i)) continue;
    const double s = kv_score(matches[i], how.tier_weight);
    if (s > best_score) {
      best_score = s;
      best.replica = r;
    }
  }
  return best;
}

}  // namespace pagoda::router
