#include "engine/snapshot_fill.h"

#include <algorithm>
#include <unordered_map>

#include "engine/engine.h"
#include "kv/kv_manager.h"
#include "sched/scheduler.h"

namespace pagoda::engine {

void copy_counters(const EngineStats& s, DashboardSnapshot* out) {
  out->blocks_total = s.blocks_total;
  out->blocks_used = s.blocks_used;
  out->blocks_cached = s.blocks_cached;
  out->blocks_free = s.blocks_free;
  out->prefix_queries_tokens = s.prefix_queries_tokens;
  out->prefix_hits_tokens = s.prefix_hits_tokens;
  out->num_preemptions = s.num_preemptions;
  out->prompt_tokens_total = s.prompt_tokens_total;
  out->generation_tokens_total = s.generation_tokens_total;
  out->num_running = s.num_running;
  out->num_waiting = s.num_waiting;
}

namespace {

// Why a waiting request is not running, from what admission checks in order
// (Scheduler::schedule): seats, the in-flight dedup deferral, free blocks above
// the watermark, then its place in the queue. A reading of the state now, not
// a record of the last step's decision; the block need ignores prefix hits, so
// it is an upper bound.
std::string why_waiting(const sched::Request& r, const sched::Scheduler& s, const kv::KvManager& kv,
                        size_t queue_pos, int seats_free) {
  std::string why;
  if (r.state == sched::RequestState::kPreempted)
    why = "preempted (" + std::to_string(r.num_preemptions) + "x), recomputes first; ";
  if (seats_free <= 0)
    return why + "max_num_seqs (" + std::to_string(s.config().max_num_seqs) + ") requests running";
  if (r.deferred_steps > 0 && s.kv().cache().size() > 0)
    why += "deferred " + std::to_string(r.deferred_steps) + " step(s): a running request computes its next block; ";
  const int64_t need = kv.max_blocks_for_sequence(r.num_tokens() + 1, std::max(1, s.config().max_num_batched_tokens));
  const int64_t free_above = static_cast<int64_t>(kv.num_free_blocks()) - kv.watermark_blocks();
  if (need > free_above)
    return why + "KV cache: needs up to " + std::to_string(need) + " blocks, " +
           std::to_string(std::max<int64_t>(0, free_above)) + " free above the watermark";
  if (queue_pos > 0) return why + "queued behind " + std::to_string(queue_pos) + " request(s)";
  return why + "admitted at the next step";
}

}  // namespace

void fill_snapshot(const sched::Scheduler& sched, const kv::KvManager& kv, const ChoiceOf& choice_of,
                   const SnapshotOptions& opt, DashboardSnapshot* out) {
  const kv::BlockPool& pool = kv.pool();
  const kv::PrefixCache& cache = kv.cache();
  const int32_t nb = pool.num_blocks();
  out->block_size = kv.block_size();
  out->num_groups = kv.num_groups();
  out->block_state.assign(static_cast<size_t>(nb), static_cast<uint8_t>(BlockState::kFree));
  out->block_owner.assign(static_cast<size_t>(nb), -1);
  out->requests.clear();
  out->prefix_nodes.clear();
  out->block_state[0] = static_cast<uint8_t>(BlockState::kNull);
  // A cached block is visible when its salt is the tenant's (always, unfiltered).
  auto visible_cached = [&](kv::BlockId b) { return cache.contains(b) && salt_visible(opt, cache.salt_of(b)); };
  int32_t cached_blocks = 0;
  for (kv::BlockId b = 1; b < nb; ++b) {
    const bool keyed = visible_cached(b);
    cached_blocks += keyed ? 1 : 0;
    BlockState st = pool.ref_count(b) > 0 ? BlockState::kUsed : keyed ? BlockState::kCached : BlockState::kFree;
    // Another tenant's: cached under its salt, or used (until a request of this
    // tenant is found holding it below).
    if (opt.only_tenant && (st == BlockState::kUsed || (st == BlockState::kFree && cache.contains(b))))
      st = BlockState::kOther;
    out->block_state[static_cast<size_t>(b)] = static_cast<uint8_t>(st);
  }
  out->prefix_cached_blocks = cached_blocks;
  auto mark_own = [&](sched::RequestId sid) {
    if (!opt.only_tenant || !kv.has_seq(sid)) return;
    for (int32_t g = 0; g < kv.num_groups(); ++g)
      for (kv::BlockId b : kv.block_table(sid, g))
        if (b != kv::kNullBlock) out->block_state[static_cast<size_t>(b)] = static_cast<uint8_t>(BlockState::kUsed);
  };
  auto own = [&](sched::RequestId sid) -> const sched::Request* {
    const sched::Request* r = sched.find(sid);
    return r && salt_visible(opt, r->cache_salt) ? r : nullptr;
  };

  auto add_request = [&](sched::RequestId sid, size_t queue_pos, int seats_free) {
    const sched::Request* r = own(sid);
    if (!r) return;
    SnapshotRequest q;
    q.seq_id = sid;
    if (!choice_of(sid, &q.id, &q.index)) q.id = sid;
    q.state = sched::request_state_name(r->state);
    q.num_prompt_tokens = r->num_prompt_tokens;
    q.num_output_tokens = r->num_output_tokens();
    q.num_cached_tokens = r->num_cached_tokens;
    q.num_preemptions = r->num_preemptions;
    if (r->num_cached_tokens >= 0) {
      q.prefix_miss = kv::miss_cause_name(r->prefix_miss.cause);
      if (r->prefix_miss.position >= 0) q.prefix_miss.append(1, '@').append(std::to_string(r->prefix_miss.position));
    }
    if (kv.has_seq(sid)) {
      q.num_computed_tokens = kv.num_computed_tokens(sid);
      for (int32_t g = 0; g < kv.num_groups(); ++g) {
        std::span<const kv::BlockId> t = kv.block_table(sid, g);
        q.block_tables.emplace_back(t.begin(), t.end());
      }
    }
    if (r->state != sched::RequestState::kRunning) q.why = why_waiting(*r, sched, kv, queue_pos, seats_free);
    const int32_t index = static_cast<int32_t>(out->requests.size());
    for (const auto& t : q.block_tables) {
      for (kv::BlockId b : t) {
        if (b == kv::kNullBlock) continue;
        int32_t& o = out->block_owner[static_cast<size_t>(b)];
        o = (o == -1 || o == index) ? index : -2;
      }
    }
    out->requests.push_back(std::move(q));
  };
  const std::vector<sched::RequestId> waiting = sched.waiting_ids();
  // Every block a request of the tenant holds is its own, listed or not.
  for (const auto* ids : {&sched.running_ids(), &waiting})
    for (sched::RequestId sid : *ids)
      if (own(sid)) mark_own(sid);
  for (sched::RequestId sid : sched.running_ids()) add_request(sid, 0, 0);
  const int seats_free = sched.config().max_num_seqs - sched.num_running();
  int listed = 0;
  for (size_t i = 0; i < waiting.size() && listed < opt.max_waiting_listed; ++i) {
    if (!own(waiting[i])) continue;
    add_request(waiting[i], i, seats_free);
    ++listed;
  }

  // The prefix tree: the most hit cached blocks, then their ancestors (hits
  // only grow towards the root, so they are mostly listed already).
  if (opt.max_prefix_nodes > 0 && cached_blocks > 0) {
    std::vector<kv::BlockId> keyed;
    keyed.reserve(static_cast<size_t>(cached_blocks));
    for (kv::BlockId b = 1; b < nb; ++b)
      if (visible_cached(b)) keyed.push_back(b);
    const size_t k = std::min(keyed.size(), static_cast<size_t>(opt.max_prefix_nodes));
    auto more_hits = [&](kv::BlockId a, kv::BlockId b) {
      const int64_t ha = cache.hits_of(a), hb = cache.hits_of(b);
      return ha != hb ? ha > hb : a < b;
    };
    std::partial_sort(keyed.begin(), keyed.begin() + static_cast<std::ptrdiff_t>(k), keyed.end(), more_hits);
    keyed.resize(k);
    std::unordered_map<kv::BlockId, int32_t> depth;  // listed block -> depth (-1: not known yet)
    for (kv::BlockId b : keyed) depth.emplace(b, -1);
    // Ancestors of the listed blocks (bounded: at most 2 x max_prefix_nodes in all).
    for (size_t i = 0; i < keyed.size() && keyed.size() < 2 * k; ++i) {
      const kv::BlockId p = cache.block_of_entry(cache.parent_of(keyed[i]));
      if (p != kv::kNullBlock && visible_cached(p) && depth.emplace(p, -1).second) keyed.push_back(p);
    }
    // Depths by walking each chain up to the root (or a parent not cached).
    auto depth_of = [&](kv::BlockId b) -> int32_t {
      auto it = depth.find(b);
      if (it != depth.end() && it->second >= 0) return it->second;
      int32_t d = 0;
      for (kv::BlockId p = cache.block_of_entry(cache.parent_of(b)); p != kv::kNullBlock;
           p = cache.block_of_entry(cache.parent_of(p))) {
        auto pit = depth.find(p);
        if (pit != depth.end() && pit->second >= 0) {
          d += pit->second + 1;
          break;
        }
        ++d;
      }
      if (it != depth.end()) it->second = d;
      return d;
    };
    for (kv::BlockId b : keyed) {
      PrefixNode n;
      n.block = b;
      const kv::BlockId p = cache.block_of_entry(cache.parent_of(b));
      n.parent_block = (p != kv::kNullBlock && depth.count(p)) ? p : -1;
      n.hits = cache.hits_of(b);
      n.depth = depth_of(b);
      n.in_use = pool.ref_count(b) > 0;
      if (const double exp = kv.pin_expiry(b); exp > 0) n.pin_ttl_s = static_cast<float>(std::max(0.0, exp - kv.now()));
      out->prefix_nodes.push_back(n);
    }
    std::stable_sort(out->prefix_nodes.begin(), out->prefix_nodes.end(),
                     [](const PrefixNode& a, const PrefixNode& b) { return a.depth < b.depth; });
  }
}

}  // namespace pagoda::engine
