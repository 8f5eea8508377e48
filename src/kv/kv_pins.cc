// KvManager's pins with a TTL (issue 36): a committed prefix kept out of
// eviction until ttl seconds after its last touch, capped at a fraction of the
// pool, plus reset_prefix_cache. See kv_manager.h ("pins with a TTL").
//
// A pin holds ONE pool reference per block however many pins share the block
// (pin_count_ counts them), so a pinned block is never in the free queue: it
// cannot be evicted, and num_free_blocks() (what admission counts) excludes it.
// Releasing the last pin of a block puts it at the free queue's tail as a
// cached-evictable block: from then on it ages like any other.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/check.h"
#include "kv/kv_manager.h"

namespace pagoda::kv {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void KvManager::set_clock(std::function<double()> clock) { clock_ = std::move(clock); }

double KvManager::now() const { return clock_ ? clock_() : steady_seconds(); }

void KvManager::pin_prefix(SeqId seq, int32_t pin_tokens, double ttl_s) {
  auto it = seqs_.find(seq);
  PAGODA_CHECK_MSG(it != seqs_.end(), "pin of unknown sequence %llu", static_cast<unsigned long long>(seq));
  if (!config_.enable_prefix_caching || !(ttl_s > 0) || pin_tokens < config_.block_size) return;
  Seq& s = it->second;
  s.pin_blocks = pin_tokens / config_.block_size;
  s.pin_ttl = ttl_s;
  maybe_pin(seq, &s);
}

void KvManager::maybe_pin(SeqId id, Seq* s) {
  if (s->pin_blocks <= 0 || static_cast<int32_t>(s->entries.size()) < s->pin_blocks) return;
  // The committed chain up to the first block a refused collision cut off.
  int32_t n = 0;
  while (n < s->pin_blocks && s->entries[static_cast<size_t>(n)] != kNoEntry) ++n;
  const double ttl = s->pin_ttl;
  s->pin_blocks = 0;  // done: a sequence pins once (its readmission asks again)
  s->pin_ttl = 0;
  if (n == 0) return;
  const PrefixCache& cache = blocks_->cache;
  // Every group's cached blocks of entries [0, n), group 0's being the
  // entries' own blocks (a block computed twice maps to the first copy), and
  // the checkpoint cached at the end of each block (its S blocks).
  struct Part {
    std::vector<BlockId> kv, ck;
    std::vector<EntryId> kv_e, ck_e;
  };
  auto part_of = [&](int32_t i, Part* p) {
    const EntryId e = s->entries[static_cast<size_t>(i)];
    const BlockId b0 = cache.block_of_entry(e);
    if (b0 == kNullBlock) return false;  // not cached any more: the chain ends here
    p->kv.push_back(b0);
    p->kv_e.push_back(e);
    for (size_t g = 1; g < groups_.size(); ++g) {
      // A recurrent state's table is its S blocks, not one per prefix block: its checkpoints (below) are pinned.
      if (static_cast<int32_t>(g) == state_group_) continue;
      const BlockId b = groups_[g]->table(id)[static_cast<size_t>(i)];
      if (b == kNullBlock || !cache.contains(b) ||
          !(cache.key_of(b) == group_key(s->keys[static_cast<size_t>(i)], static_cast<int32_t>(g)))) {
        continue;
      }
      p->kv.push_back(b);
      p->kv_e.push_back(cache.entry_of(b));
    }
    if (checkpoint_tokens_ > 0 && (i + 1) % config_.state_checkpoint_interval == 0) {
      const EntryId parent = i == 0 ? kRootEntry : s->entries[static_cast<size_t>(i - 1)];
      if (find_checkpoint_blocks(s->keys[static_cast<size_t>(i)], parent, cache.tokens_of(b0), s->salt, &p->ck)) {
        for (BlockId b : p->ck) p->ck_e.push_back(cache.entry_of(b));
      } else {
        p->ck.clear();  // none, or only some of its S blocks cached: no checkpoint
      }
    }
    return true;
  };
  std::vector<Part> parts;
  int64_t total = 0;
  for (int32_t i = 0; i < n; ++i) {
    Part p;
    if (!part_of(i, &p)) break;
    total += static_cast<int64_t>(p.kv.size() + p.ck.size());
    parts.push_back(std::move(p));
  }
  n = static_cast<int32_t>(parts.size());
  // Blocks [0, m) with their checkpoints (only the one at m's end when last_only), chain order.
  Pin pin;
  auto take = [&](int32_t m, bool last_only) {
    for (int32_t i = 0; i < m; ++i) {
      const Part& p = parts[static_cast<size_t>(i)];
      pin.blocks.insert(pin.blocks.end(), p.kv.begin(), p.kv.end());
      pin.entries.insert(pin.entries.end(), p.kv_e.begin(), p.kv_e.end());
      if (last_only && i != m - 1) continue;
      pin.blocks.insert(pin.blocks.end(), p.ck.begin(), p.ck.end());
      pin.entries.insert(pin.entries.end(), p.ck_e.begin(), p.ck_e.end());
    }
    n = m;
  };
  if (total <= pin_cap_blocks_) {
    take(n, false);
  } else {
    // A pin alone never exceeds the cap. A hybrid model's hit ends at a checkpoint, so the pin keeps the
    // longest head that ends at one and fits with that one alone (the earlier ones serve only prompts that
    // leave the prefix sooner); else, as for other models, the longest head that fits.
    int32_t m = 0;
    std::vector<int64_t> kv_before(static_cast<size_t>(n) + 1, 0);
    for (size_t i = 0; i < parts.size(); ++i) kv_before[i + 1] = kv_before[i] + static_cast<int64_t>(parts[i].kv.size());
    for (int32_t j = n; j >= 1 && m == 0; --j) {
      const auto& ck = parts[static_cast<size_t>(j - 1)].ck;
      if (!ck.empty() && kv_before[static_cast<size_t>(j)] + static_cast<int64_t>(ck.size()) <= pin_cap_blocks_) m = j;
    }
    if (m > 0) {
      take(m, true);
    } else {
      int64_t size = 0;
      while (m < n) {
        const Part& p = parts[static_cast<size_t>(m)];
        if (size + static_cast<int64_t>(p.kv.size() + p.ck.size()) > pin_cap_blocks_) break;
        size += static_cast<int64_t>(p.kv.size() + p.ck.size());
        ++m;
      }
      take(m, false);
    }
  }
  if (n == 0) return;
  const EntryId end = s->entries[static_cast<size_t>(n - 1)];
  const double t = now();
  if (auto p = pins_.find(end); p != pins_.end()) {
    p->second.last_touch = t;
    p->second.ttl = std::max(p->second.ttl, ttl);
    ++pin_stats_.renewed;
    log_pin(p->second);
    return;
  }
  ++generation_;  // the free queue changes
  pin.order = next_pin_order_++;
  pin.ttl = ttl;
  pin.last_touch = t;
  for (BlockId b : pin.blocks) {
    if (pin_count_[static_cast<size_t>(b)]++ == 0) {
      blocks_->pool.incref(b);
      ++num_pinned_blocks_;
    }
  }
  log_pin(pins_.emplace(end, std::move(pin)).first->second);
  ++pin_stats_.created;
  // The cap: demote the least recently touched pins (never the new one: it fits alone).
  while (num_pinned_blocks_ > pin_cap_blocks_) {
    EntryId oldest = kNoEntry;
    const Pin* o = nullptr;
    for (const auto& [e, p] : pins_) {
      if (e == end) continue;
      if (!o || p.last_touch < o->last_touch || (p.last_touch == o->last_touch && p.order < o->order)) {
        o = &p;
        oldest = e;
      }
    }
    PAGODA_CHECK(o != nullptr);
    release_pin(oldest);
    ++pin_stats_.demoted;
  }
}

void KvManager::pin_new_checkpoint(BlockId boundary, std::span<const BlockId> ckpt) {
  if (boundary == kNullBlock || pin_count_[static_cast<size_t>(boundary)] == 0) return;
  // Best effort, as the checkpoint itself: never past the cap (no pin is demoted for it).
  if (num_pinned_blocks_ + static_cast<int32_t>(ckpt.size()) > pin_cap_blocks_) {
    ++pin_stats_.checkpoints_over_cap;
    return;
  }
  const PrefixCache& cache = blocks_->cache;
  ++generation_;
  for (auto& [end, p] : pins_) {
    auto at = std::find(p.blocks.begin(), p.blocks.end(), boundary);
    if (at == p.blocks.end()) continue;
    // After the boundary block's other groups' blocks: chain order, as maybe_pin lays it out.
    auto pos = static_cast<size_t>(at - p.blocks.begin()) + 1;
    while (pos < p.blocks.size() && cache.group_of(p.blocks[pos]) != 0) ++pos;
    std::vector<EntryId> ents;
    for (BlockId b : ckpt) {
      ents.push_back(cache.entry_of(b));
      if (pin_count_[static_cast<size_t>(b)]++ == 0) {
        blocks_->pool.incref(b);
        ++num_pinned_blocks_;
      }
    }
    p.blocks.insert(p.blocks.begin() + static_cast<std::ptrdiff_t>(pos), ckpt.begin(), ckpt.end());
    p.entries.insert(p.entries.begin() + static_cast<std::ptrdiff_t>(pos), ents.begin(), ents.end());
    log_pin(p);  // the tiers store it with the pin's expiry (after the flush that copies it)
  }
  ++pin_stats_.checkpoints_added;
}

void KvManager::log_pin(const Pin& p) {
  if (commit_log_on_) pin_log_.push_back({p.blocks, p.entries, p.last_touch + p.ttl});
}

void KvManager::release_pin(EntryId end) {
  auto it = pins_.find(end);
  PAGODA_CHECK(it != pins_.end());
  ++generation_;
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (--pin_count_[static_cast<size_t>(*b)] == 0) {
      blocks_->pool.decref(*b);
      --num_pinned_blocks_;
    }
  }
  pins_.erase(it);
}

void KvManager::touch_pins(const PrefixMatch& m) {
  if (pins_.empty()) return;
  const double t = now();
  for (EntryId e : m.entries_) {
    auto p = pins_.find(e);
    if (p == pins_.end()) continue;
    p->second.last_touch = t;
    ++pin_stats_.renewed;
    log_pin(p->second);
  }
}

int32_t KvManager::expire_pins() {
  if (pins_.empty()) return 0;
  const double t = now();
  std::vector<std::pair<uint64_t, EntryId>> gone;  // by creation order: deterministic release order
  for (const auto& [e, p] : pins_) {
    if (t - p.last_touch >= p.ttl) gone.emplace_back(p.order, e);
  }
  std::sort(gone.begin(), gone.end());
  for (const auto& [order, e] : gone) release_pin(e);
  pin_stats_.expired += static_cast<int64_t>(gone.size());
  return static_cast<int32_t>(gone.size());
}

bool KvManager::unpin_oldest() {
  if (pins_.empty()) return false;
  auto o = pins_.begin();
  for (auto it = pins_.begin(); it != pins_.end(); ++it) {
    const Pin& p = it->second;
    if (p.last_touch < o->second.last_touch ||
        (p.last_touch == o->second.last_touch && p.order < o->second.order)) {
      o = it;
    }
  }
  release_pin(o->first);
  ++pin_stats_.demoted;
  return true;
}

KvManager::PinStats KvManager::pin_stats() const {
  PinStats st = pin_stats_;
  st.num_pins = static_cast<int32_t>(pins_.size());
  st.num_pinned_blocks = num_pinned_blocks_;
  st.cap_blocks = pin_cap_blocks_;
  return st;
}

double KvManager::pin_expiry(BlockId b) const {
  if (b <= kNullBlock || b >= blocks_->pool.num_blocks() || pin_count_[static_cast<size_t>(b)] == 0) return 0;
  double latest = 0;
  for (const auto& [e, p] : pins_) {
    if (std::find(p.blocks.begin(), p.blocks.end(), b) != p.blocks.end()) {
      latest = std::max(latest, p.last_touch + p.ttl);
    }
  }
  return latest;
}

bool KvManager::reset_prefix_cache() {
  if (!seqs_.empty()) return false;
  ++generation_;
  std::vector<EntryId> ends;
  for (const auto& [e, p] : pins_) ends.push_back(e);
  for (EntryId e : ends) release_pin(e);
  pin_stats_.cleared += static_cast<int64_t>(ends.size());
  pin_log_.clear();
  // No sequence holds a block: every cached block is in the free queue.
  for (BlockId b = 1; b < blocks_->pool.num_blocks(); ++b) blocks_->cache.erase(b);
  std::fill(blocks_->checkpoint_head.begin(), blocks_->checkpoint_head.end(), uint8_t{0});
  notify_all_cleared();  // KV events: AllBlocksCleared after the removals
  return true;
}

std::string KvManager::check_pins(std::vector<int32_t>* pin_refs) const {
  const PrefixCache& cache = blocks_->cache;
  const int32_t n = blocks_->pool.num_blocks();
  std::vector<int32_t> counts(static_cast<size_t>(n), 0);
  for (const auto& [end, p] : pins_) {
    if (p.blocks.empty() || p.blocks.size() != p.entries.size()) return "a pin with no blocks or unmatched entries";
    if (cache.block_of_entry(end) == kNullBlock) return "a pin's last entry is not cached";
    for (size_t i = 0; i < p.blocks.size(); ++i) {
      const BlockId b = p.blocks[i];
      if (b <= kNullBlock || b >= n) return errorf("a pin holds invalid block %d", b).message;
      if (cache.entry_of(b) != p.entries[i]) return errorf("pinned block %d is not cached as pinned", b).message;
      ++counts[static_cast<size_t>(b)];
    }
  }
  int32_t pinned = 0;
  for (BlockId b = 1; b < n; ++b) {
    const int32_t c = counts[static_cast<size_t>(b)];
    if (c != pin_count_[static_cast<size_t>(b)]) {
      return errorf("block %d: pin count %d but %d pins hold it", b, pin_count_[static_cast<size_t>(b)], c).message;
    }
    (*pin_refs)[static_cast<size_t>(b)] = c > 0 ? 1 : 0;
    pinned += c > 0 ? 1 : 0;
  }
  if (pinned != num_pinned_blocks_) return errorf("%d pinned blocks counted %d", pinned, num_pinned_blocks_).message;
  if (num_pinned_blocks_ > pin_cap_blocks_) {
    return errorf("%d pinned blocks over the cap of %d", num_pinned_blocks_, pin_cap_blocks_).message;
  }
  return "";
}

}  // namespace pagoda::kv
