#include "kv/kv_manager.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "kv/pool_plan.h"

namespace pagoda::kv {

KvConfig KvConfig::from_plan(const PoolPlan& plan) {
  KvConfig c;
  c.num_blocks = plan.num_blocks;
  c.block_size = plan.block_size;
  // A negative window is the recurrent state group (kv/sizing.h kStateWindow).
  for (int32_t w : plan.layout.windows)
    c.groups.push_back(w < 0 ? KvGroupSpec{0, plan.layout.state_blocks} : KvGroupSpec{w, 0});
  return c;
}

KvManager::KvManager(const KvConfig& config)
    : config_(config),
      blocks_(std::make_unique<SharedBlocks>(config.num_blocks, config.model_fingerprint, config.eviction_classes)) {
  PAGODA_CHECK_MSG(config.block_size >= 1 && config.block_size <= 256, "block_size %d not in 1..256",
                   config.block_size);
  PAGODA_CHECK_MSG(config.watermark >= 0.0 && config.watermark < 1.0, "watermark %f not in [0, 1)", config.watermark);
  watermark_blocks_ = static_cast<int32_t>(std::floor(config.watermark * num_usable_blocks() + 1e-9));
  PAGODA_CHECK_MSG(config.pinned_fraction >= 0.0 && config.pinned_fraction <= 1.0, "pinned fraction %f not in [0, 1]",
                   config.pinned_fraction);
  pin_cap_blocks_ = static_cast<int32_t>(std::floor(config.pinned_fraction * num_usable_blocks() + 1e-9));
  pin_count_.assign(static_cast<size_t>(config.num_blocks), 0);
  const std::vector<KvGroupSpec> specs = config.groups.empty() ? std::vector<KvGroupSpec>{KvGroupSpec{}} : config.groups;
  PAGODA_CHECK_MSG(config.state_checkpoint_interval >= 0, "state checkpoint interval %d < 0",
                   config.state_checkpoint_interval);
  for (const KvGroupSpec& g : specs) {
    PAGODA_CHECK_MSG(g.sliding_window >= 0, "sliding window %d < 0", g.sliding_window);
    groups_.push_back(make_group_manager(g, config.block_size, blocks_.get()));
    if (g.state_blocks > 0) {
      PAGODA_CHECK_MSG(state_group_ < 0, "more than one recurrent state group");
      PAGODA_CHECK_MSG(groups_.size() > 1, "the recurrent state group cannot be group 0 (the prefix chain)");
      state_group_ = static_cast<int32_t>(groups_.size()) - 1;
    }
  }
  if (state_group_ >= 0) {
    // A recurrent state is valid only at its own length: a prefix hit must end
    // at a state checkpoint (state_checkpoint.cc). Without them the cache is off.
    if (config.state_checkpoint_interval <= 0) config_.enable_prefix_caching = false;
    if (config_.enable_prefix_caching) checkpoint_tokens_ = config.state_checkpoint_interval * config.block_size;
  }
}

int32_t KvManager::first_needed_block(int32_t group, int64_t start) const {
  return groups_[static_cast<size_t>(group)]->first_needed_block(start);
}

Hash128 KvManager::group_key(const Hash128& k, int32_t group) {
  if (group == 0) return k;
  // The same chain hash of the tokens, made distinct per group: one cache holds
  // the blocks of every group.
  const uint64_t words[3] = {k.lo, k.hi, static_cast<uint64_t>(group)};
  return xxh3_128(words, sizeof(words));
}

int64_t KvManager::max_blocks_for_sequence(int64_t num_tokens, int32_t max_chunk) const {
  int64_t n = 0;
  for (const auto& g : groups_) n += g->peak_blocks(num_tokens, max_chunk);
  return n;
}

const KvManager::Seq& KvManager::seq_ref(SeqId seq) const {
  auto it = seqs_.find(seq);
  PAGODA_CHECK_MSG(it != seqs_.end(), "unknown sequence %llu", static_cast<unsigned long long>(seq));
  return it->second;
}

Status KvManager::check_current(const PrefixMatch& m, const char* what) const {
  if (m.owner_ != this) return errorf("kv: %s made by another KvManager", what);
  if (m.generation_ == generation_) return Status::Ok();
  return errorf("kv: %s made at generation %llu is stale (now %llu): the cache changed since", what,
                static_cast<unsigned long long>(m.generation_), static_cast<unsigned long long>(generation_));
}

int32_t KvManager::blocks_needed(const PrefixMatch& m, int32_t num_new_tokens) const {
  const int32_t total = num_blocks_for(static_cast<int64_t>(m.num_cached_tokens()) + num_new_tokens);
  int32_t fresh = 0;  // per group: its table's entries past the hit's (a state group: its whole fixed slot)
  for (size_t g = 0; g < groups_.size(); ++g) {
    fresh += groups_[g]->table_entries(total) - (g < m.tables_.size() ? static_cast<int32_t>(m.tables_[g].size()) : 0);
  }
  int32_t revived = 0;
  for (const auto& table : m.tables_) {
    for (BlockId b : table) revived += b != kNullBlock && pool().ref_count(b) == 0 ? 1 : 0;
  }
  // A checkpoint's blocks are held from allocate until the first step's copies ran.
  for (BlockId b : m.ckpt_blocks_) revived += pool().ref_count(b) == 0 ? 1 : 0;
  return fresh + revived;
}

int64_t KvManager::prefill_reserve(SeqId id, const Seq& s) const {
  if (s.num_computed >= s.target) return 0;  // no target, or decoding: growth is not reserved
  int64_t r = 0;
  for (const auto& g : groups_) r += std::max<int64_t>(0, g->peak_blocks(s.target, s.max_chunk) - g->held_blocks(id));
  return r;
}

int64_t KvManager::num_reserved_blocks() const {
  int64_t r = 0;
  for (const auto& [id, s] : seqs_) r += prefill_reserve(id, s);
  return r;
}

Expected<Admission> KvManager::can_allocate(PrefixMatch match, int32_t num_new_tokens, int32_t reserve_blocks,
                                            int32_t target_tokens, int32_t max_chunk) const {
  PAGODA_CHECK(num_new_tokens >= 0 && reserve_blocks >= 0 && max_chunk >= 1);
  const int32_t cached = match.num_cached_tokens();
  PAGODA_CHECK(cached + num_new_tokens >= 1);
  PAGODA_CHECK_MSG(target_tokens == 0 || target_tokens >= cached + num_new_tokens,
                   "target %d tokens < %d cached + %d new", target_tokens, cached, num_new_tokens);
  PAGODA_TRY(check_current(match, "prefix match"));
  const int32_t need = blocks_needed(match, num_new_tokens);
  // The new sequence's own reserve once allocated: per group its peak minus
  // what it will hold (the group's reservation rule).
  int64_t own = 0;
  if (target_tokens > 0 && cached + num_new_tokens < target_tokens) {
    const int32_t total = num_blocks_for(static_cast<int64_t>(cached) + num_new_tokens);
    for (size_t g = 0; g < groups_.size(); ++g) {
      const GroupManager& gm = *groups_[g];
      const int32_t live = std::min(match.num_blocks_, gm.first_needed_block(cached));
      const int64_t held = gm.held_after_allocate(match.tables_[g], live, total);
      own += std::max<int64_t>(0, gm.peak_blocks(target_tokens, max_chunk) - held);
    }
  }
  const int64_t running = num_reserved_blocks();
  const int32_t num_free = num_free_blocks();
  if (static_cast<int64_t>(need) + own + running + watermark_blocks_ + reserve_blocks > num_free) {
    const std::string prefill =
        own + running == 0 ? std::string()
                           : errorf(" + %lld reserved for the rest of its prefill + %lld for running prefills",
                                    static_cast<long long>(own), static_cast<long long>(running))
                                 .message;
    return errorf("kv: %d cached + %d new tokens need %d free blocks%s + watermark %d + reserve %d, only %d free",
                  cached, num_new_tokens, need, prefill.c_str(), watermark_blocks_, reserve_blocks, num_free);
  }
  Admission a;
  a.match_ = std::move(match);
  a.num_new_tokens_ = num_new_tokens;
  a.num_blocks_needed_ = need;
  a.num_blocks_reserved_ = static_cast<int32_t>(own);
  a.target_tokens_ = target_tokens;
  a.max_chunk_ = max_chunk;
  return a;
}

Expected<int32_t> KvManager::allocate(SeqId seq, const Admission& admission, std::vector<BlockCopy>* copies) {
  if (seqs_.count(seq)) return errorf("kv: sequence %llu already has blocks", static_cast<unsigned long long>(seq));
  const PrefixMatch& m = admission.match_;
  // Same generation: no block was taken, freed or committed since can_allocate
  // counted the free queue and confirmed the hits, so both still hold.
  PAGODA_TRY(check_current(m, "admission"));
  if (!m.ckpt_blocks_.empty() && copies == nullptr)
    return errorf("kv: sequence %llu: a hit at a state checkpoint needs the restore copies taken",
                  static_cast<unsigned long long>(seq));
  ++generation_;
  const int32_t cached = m.num_cached_tokens();
  // Every group touches its hits first so that taking fresh blocks cannot evict them.
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g]->adopt(seq, m.tables_[g], std::min(m.num_blocks_, groups_[g]->first_needed_block(cached)));
  }
  // The dashboard's per-block hit counts (a statistic: group 0 stands for the chain).
  for (BlockId b : m.tables_[0]) blocks_->cache.count_hit(b);
  touch_pins(m);  // a hit over a pinned prefix renews its TTL
  // The checkpoint's blocks are held (touched before fresh blocks are taken,
  // as the hits) until the sequence's first step has copied them.
  for (BlockId b : m.ckpt_blocks_) blocks_->pool.incref(b);
  const int32_t total_blocks = num_blocks_for(static_cast<int64_t>(cached) + admission.num_new_tokens_);
  for (const auto& g : groups_) g->grow(seq, g->table_entries(total_blocks));
  Seq s;
  if (!m.ckpt_blocks_.empty()) {
    const std::span<const BlockId> state = groups_[static_cast<size_t>(state_group_)]->table(seq);
    PAGODA_CHECK(state.size() == m.ckpt_blocks_.size());
    for (size_t i = 0; i < state.size(); ++i) copies->emplace_back(m.ckpt_blocks_[i], state[i]);
    s.restore_hold = m.ckpt_blocks_;
    ++checkpoints_hit_;
  }
  s.salt = m.salt_;
  s.keys = m.keys_;
  s.entries = m.entries_;
  s.num_computed = cached;
  s.target = admission.target_tokens_;
  s.max_chunk = admission.max_chunk_;
  seqs_.emplace(seq, std::move(s));
  prefix_query_tokens_ += m.num_query_tokens_;
  prefix_hit_tokens_ += cached;
  return cached;
}

Expected<int32_t> KvManager::allocate(SeqId seq, std::span<const TokenId> tokens, int32_t num_new_tokens,
                                      std::string_view cache_salt) {
  if (seqs_.count(seq)) return errorf("kv: sequence %llu already has blocks", static_cast<unsigned long long>(seq));
  PAGODA_ASSIGN_OR_RETURN(Admission a, can_allocate(match_prefix(tokens, cache_salt), num_new_tokens));
  return allocate(seq, a);
}

int32_t KvManager::cow_blocks_needed(SeqId seq, const Seq& s, int32_t num_new_tokens, int32_t* fresh) const {
  const int32_t target = num_blocks_for(static_cast<int64_t>(s.num_computed) + num_new_tokens);
  *fresh = 0;
  for (const auto& g : groups_) *fresh += std::max(0, g->table_entries(target) - g->num_entries(seq));
  int32_t cow = 0;
  if (num_new_tokens > 0) {
    for (const auto& g : groups_) cow += g->shared_blocks(seq, g->first_written_entry(s.num_computed), g->table_entries(target));
  }
  return cow;
}

int32_t KvManager::releasable_blocks(SeqId seq, int64_t start) const {
  int32_t freed = 0;
  for (const auto& g : groups_) freed += g->releasable_blocks(seq, start);
  return freed;
}

bool KvManager::can_append_slots(SeqId seq, int32_t num_new_tokens) const {
  const Seq& s = seq_ref(seq);
  int32_t fresh = 0;
  const int32_t cow = cow_blocks_needed(seq, s, num_new_tokens, &fresh);
  return fresh + cow <= num_free_blocks() + releasable_blocks(seq, s.num_computed);
}

bool KvManager::append_slots(SeqId seq, int32_t num_new_tokens, std::vector<BlockCopy>* copies) {
  PAGODA_CHECK(num_new_tokens >= 0);
  auto it = seqs_.find(seq);
  PAGODA_CHECK(it != seqs_.end());
  Seq& s = it->second;
  int32_t fresh = 0;
  const int32_t cow = cow_blocks_needed(seq, s, num_new_tokens, &fresh);
  // Blocks the release rules give back go first: they pay for the new ones.
  if (fresh + cow > num_free_blocks() + releasable_blocks(seq, s.num_computed)) return false;
  ++generation_;
  blocks_->pool.set_release_class(s.eviction_class);
  // Group 0 last: its head anchors the chain, evict it after the others.
  for (size_t g = 1; g <= groups_.size(); ++g) groups_[g % groups_.size()]->release_before(seq, s.num_computed);
  const int32_t target = num_blocks_for(static_cast<int64_t>(s.num_computed) + num_new_tokens);
  if (cow > 0) {
    for (const auto& g : groups_)
      g->copy_on_write(seq, g->first_written_entry(s.num_computed), g->table_entries(target), s.num_computed, copies);
  }
  for (const auto& g : groups_) g->grow(seq, g->table_entries(target));
  blocks_->pool.set_release_class(0);
  return true;
}

void KvManager::mark_computed(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed_tokens) {
  auto it = seqs_.find(seq);
  PAGODA_CHECK(it != seqs_.end());
  Seq& s = it->second;
  const int32_t bs = config_.block_size;
  const int32_t entries = groups_[0]->num_entries(seq);
  PAGODA_CHECK_MSG(num_computed_tokens >= s.num_computed && num_computed_tokens <= entries * bs &&
                       static_cast<size_t>(num_computed_tokens) <= tokens.size(),
                   "seq %llu: num_computed %d -> %d with %d slots and %zu tokens",
                   static_cast<unsigned long long>(seq), s.num_computed, num_computed_tokens, entries * bs,
                   tokens.size());
  ++generation_;
  release_restore_hold(&s);  // the step that read the restored state ran
  const int32_t before = s.num_computed;
  s.num_computed = num_computed_tokens;
  const size_t full = static_cast<size_t>(num_computed_tokens / bs);
  extend_keys(&s, tokens, full);
  PrefixCache& cache = blocks_->cache;
  for (size_t i = s.entries.size(); i < full; ++i) {
    const EntryId parent_entry = i == 0 ? kRootEntry : s.entries[i - 1];
    const auto block_tokens = tokens.subspan(i * static_cast<size_t>(bs), static_cast<size_t>(bs));
    const BlockId b0 = groups_[0]->table(seq)[i];
    PrefixCache::ChainRef ref{0, s.keys[i], i == 0 ? Hash128{} : s.keys[i - 1], i == 0};  // for KV events
    const EntryId e = config_.enable_prefix_caching && b0 != kNullBlock
                          ? cache.insert(b0, s.keys[i], parent_entry, block_tokens, s.salt, &ref)
                          : kNoEntry;
    if (commit_log_on_ && e != kNoEntry && cache.entry_of(b0) == e) {  // b0 itself holds the new entry
      commit_log_.push_back({b0, s.keys[i], {block_tokens.begin(), block_tokens.end()}, s.salt, 0, ref.parent, ref.root});
    }
    // Other groups: their own key, parented on group 0's chain (their earlier
    // blocks may be long released).
    for (size_t g = 1; g < groups_.size() && config_.enable_prefix_caching; ++g) {
      if (static_cast<int32_t>(g) == state_group_) continue;  // its state is cached as checkpoints (below)
      const BlockId b = groups_[g]->table(seq)[i];
      if (b == kNullBlock) continue;
      const auto gi = static_cast<int32_t>(g);
      ref.group = gi;
      const EntryId eg = cache.insert(b, group_key(s.keys[i], gi), parent_entry, block_tokens, s.salt, &ref);
      if (commit_log_on_ && eg != kNoEntry && cache.entry_of(b) == eg) {
        commit_log_.push_back({b, s.keys[i], {block_tokens.begin(), block_tokens.end()}, s.salt, gi, ref.parent, ref.root});
      }
    }
    s.entries.push_back(e);
  }
  if (checkpoint_tokens_ > 0 && num_computed_tokens > before && num_computed_tokens % checkpoint_tokens_ == 0) {
    make_checkpoint(seq, s, tokens);
  }
  maybe_pin(seq, &s);
}

void KvManager::extend_keys(Seq* s, std::span<const TokenId> tokens, size_t num_blocks) const {
  const size_t bs = static_cast<size_t>(config_.block_size);
  PAGODA_CHECK(num_blocks * bs <= tokens.size());
  for (size_t i = s->keys.size(); i < num_blocks; ++i) {
    const Hash128 parent = i == 0 ? Hash128{} : s->keys[i - 1];
    s->keys.push_back(cache().key(parent, tokens.subspan(i * bs, bs), s->salt));
  }
}

std::span<const Hash128> KvManager::uncommitted_block_keys(SeqId seq, std::span<const TokenId> tokens) {
  auto it = seqs_.find(seq);
  PAGODA_CHECK_MSG(it != seqs_.end(), "unknown sequence %llu", static_cast<unsigned long long>(seq));
  Seq& s = it->second;
  // Hashing ahead changes no cache state: the generation stays.
  extend_keys(&s, tokens, tokens.size() / static_cast<size_t>(config_.block_size));
  return std::span<const Hash128>(s.keys).subspan(s.entries.size());
}

Status KvManager::fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end()) return errorf("kv: fork of unknown sequence %llu", static_cast<unsigned long long>(parent));
  if (seqs_.count(child)) return errorf("kv: fork target %llu already exists", static_cast<unsigned long long>(child));
  ++generation_;
  Seq copy = it->second;
  copy.restore_hold.clear();  // the parent's until its next step
  for (const auto& g : groups_) g->fork(parent, child);
  seqs_.emplace(child, std::move(copy));
  return Status::Ok();
}

bool KvManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return false;
  ++generation_;
  blocks_->pool.set_release_class(it->second.eviction_class);
  release_restore_hold(&it->second);
  // Group 0 last, as in append_slots' release.
  for (size_t g = 1; g <= groups_.size(); ++g) groups_[g % groups_.size()]->free(seq);
  blocks_->pool.set_release_class(0);
  seqs_.erase(it);
  return true;
}

bool KvManager::truncate(SeqId seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || num_tokens < 0) return false;
  Seq& s = it->second;
  const int32_t bs = config_.block_size;
  if (num_tokens > num_slots(seq)) return false;
  const int32_t computed = std::min(s.num_computed, num_tokens);
  const int32_t keep = num_blocks_for(num_tokens);
  // A committed block is the prefix cache's: cut inside it, the sequence would
  // rewrite its tail under the old key.
  if (num_tokens % bs != 0 && static_cast<int32_t>(s.entries.size()) > num_tokens / bs) return false;
  // A released entry cannot come back, nor a recurrent state roll back: refuse before any change.
  for (const auto& g : groups_) {
    if (!g->can_roll_back() && computed < s.num_computed) return false;
    if (!g->holds(seq, g->first_needed_block(computed), g->table_entries(keep))) return false;
  }
  ++generation_;
  blocks_->pool.set_release_class(s.eviction_class);
  for (size_t g = 1; g <= groups_.size(); ++g) {  // group 0 last
    GroupManager& gm = *groups_[g % groups_.size()];
    gm.truncate(seq, gm.table_entries(keep));
  }
  blocks_->pool.set_release_class(0);
  s.num_computed = computed;
  const auto full = static_cast<size_t>(num_tokens / bs);
  if (s.entries.size() > full) s.entries.resize(full);
  if (s.keys.size() > full) s.keys.resize(full);
  return true;
}

void KvManager::set_eviction_class(SeqId seq, int32_t c) {
  auto it = seqs_.find(seq);
  PAGODA_CHECK_MSG(it != seqs_.end(), "unknown sequence %llu", static_cast<unsigned long long>(seq));
  it->second.eviction_class = std::clamp(c, 0, std::max(1, config_.eviction_classes) - 1);
}

std::span<const BlockId> KvManager::block_table(SeqId seq) const { return block_table(seq, 0); }
std::span<const BlockId> KvManager::block_table(SeqId seq, int32_t group) const {
  seq_ref(seq);
  return groups_[static_cast<size_t>(group)]->table(seq);
}
int32_t KvManager::num_computed_tokens(SeqId seq) const { return seq_ref(seq).num_computed; }
int32_t KvManager::num_committed_blocks(SeqId seq) const { return static_cast<int32_t>(seq_ref(seq).entries.size()); }
int32_t KvManager::num_slots(SeqId seq) const {
  seq_ref(seq);
  return groups_[0]->num_entries(seq) * config_.block_size;
}

}  // namespace pagoda::kv
