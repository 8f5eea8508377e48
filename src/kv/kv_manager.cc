#include "kv/kv_manager.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "kv/sizing.h"

namespace pagoda::kv {

KvManager::KvManager(const KvConfig& config)
    : config_(config),
      pool_(config.num_blocks),
      cache_(config.num_blocks, config.model_fingerprint) {
  PAGODA_CHECK_MSG(config.block_size >= 1 && config.block_size <= 256, "block_size %d not in 1..256",
                   config.block_size);
  PAGODA_CHECK_MSG(config.watermark >= 0.0 && config.watermark < 1.0, "watermark %f not in [0, 1)", config.watermark);
  watermark_blocks_ = static_cast<int32_t>(std::floor(config.watermark * pool_.num_usable_blocks() + 1e-9));
  groups_ = config.groups.empty() ? std::vector<KvGroupSpec>{KvGroupSpec{}} : config.groups;
  for (const KvGroupSpec& g : groups_) PAGODA_CHECK_MSG(g.sliding_window >= 0, "sliding window %d < 0", g.sliding_window);
}

int32_t KvManager::first_needed_block(int32_t group, int64_t start) const {
  const int32_t w = groups_[static_cast<size_t>(group)].sliding_window;
  if (w == 0) return 0;
  return static_cast<int32_t>(std::max<int64_t>(0, start - w + 1) / config_.block_size);
}

int32_t KvManager::longest_hit(int32_t k, const std::function<bool(int32_t, int32_t)>& missing) const {
  // A block missing at i rules out every j that needs it (j > i, and
  // first_needed(j) <= i since it only grows with j), so the search continues
  // at j = i.
  int32_t j = k;
  while (j > 0) {
    int32_t miss = -1;
    for (int32_t g = 1; g < num_groups() && miss < 0; ++g) {
      const int32_t lo = first_needed_block(g, static_cast<int64_t>(j) * config_.block_size);
      for (int32_t i = j - 1; i >= lo; --i) {
        if (missing(g, i)) {
          miss = i;
          break;
        }
      }
    }
    if (miss < 0) break;
    j = miss;
  }
  return j;
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
  for (const KvGroupSpec& g : groups_) {
    n += kv_group_blocks_for_sequence(num_tokens, config_.block_size, g.sliding_window, max_chunk);
  }
  return n;
}

const KvManager::Seq& KvManager::seq_ref(SeqId seq) const {
  auto it = seqs_.find(seq);
  PAGODA_CHECK_MSG(it != seqs_.end(), "unknown sequence %llu", static_cast<unsigned long long>(seq));
  return it->second;
}

PrefixMatch KvManager::match_prefix(std::span<const TokenId> tokens, std::string_view cache_salt) const {
  ++prefix_lookups_;
  PrefixMatch m;
  m.salt_.assign(cache_salt);
  m.num_query_tokens_ = static_cast<int64_t>(tokens.size());
  m.block_size_ = config_.block_size;
  m.owner_ = this;
  m.generation_ = generation_;
  m.tables_.assign(groups_.size(), {});
  m.table_entries_.assign(groups_.size(), {});
  if (!config_.enable_prefix_caching || tokens.empty()) return m;
  const size_t bs = static_cast<size_t>(config_.block_size);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // never the last token
  Hash128 parent{};
  EntryId parent_entry = kRootEntry;
  std::vector<BlockId> walked;  // group 0's blocks of the confirmed chain
  for (size_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    const Hash128 key = cache_.key(parent, block_tokens, cache_salt);
    const BlockId b = cache_.find(key, parent_entry, block_tokens, cache_salt);
    if (b == kNullBlock) {
      m.next_key_ = key;
      m.has_next_key_ = true;
      break;
    }
    walked.push_back(b);
    m.keys_.push_back(key);
    parent_entry = cache_.entry_of(b);
    m.entries_.push_back(parent_entry);
    parent = key;
  }
  // Group 0's chain is confirmed through k blocks; the other groups look up
  // their own block under each chain key, with group 0's entry as parent.
  const auto k = static_cast<int32_t>(m.keys_.size());
  const auto ng = groups_.size();
  m.tables_.assign(ng, std::vector<BlockId>(static_cast<size_t>(k), kNullBlock));
  m.table_entries_.assign(ng, std::vector<EntryId>(static_cast<size_t>(k), kNoEntry));
  m.tables_[0] = std::move(walked);
  m.table_entries_[0] = m.entries_;
  // Each (group, block) is looked up at most once.
  std::vector<std::vector<int8_t>> looked(ng, std::vector<int8_t>(static_cast<size_t>(k), 0));
  const int32_t j = longest_hit(k, [&](int32_t g, int32_t i) {
    const auto ui = static_cast<size_t>(i);
    const auto ug = static_cast<size_t>(g);
    if (!looked[ug][ui]) {
      looked[ug][ui] = 1;
      const EntryId parent_e = i == 0 ? kRootEntry : m.entries_[ui - 1];
      const BlockId b = cache_.find(group_key(m.keys_[ui], g), parent_e, tokens.subspan(ui * bs, bs), cache_salt);
      m.tables_[ug][ui] = b;
      m.table_entries_[ug][ui] = b == kNullBlock ? kNoEntry : cache_.entry_of(b);
    }
    return m.tables_[ug][ui] == kNullBlock;
  });
  if (j < k) {
    m.next_key_ = m.keys_[static_cast<size_t>(j)];
    m.has_next_key_ = true;
  }
  truncate_match(&m, j);
  return m;
}

void KvManager::truncate_match(PrefixMatch* m, int32_t j) const {
  m->num_blocks_ = j;
  m->keys_.resize(static_cast<size_t>(j));
  m->entries_.resize(static_cast<size_t>(j));
  for (size_t g = 0; g < m->tables_.size(); ++g) {
    m->tables_[g].resize(static_cast<size_t>(j));
    m->table_entries_[g].resize(static_cast<size_t>(j));
    const int32_t lo = std::min(j, first_needed_block(static_cast<int32_t>(g), static_cast<int64_t>(j) * config_.block_size));
    for (int32_t i = 0; i < lo; ++i) {
      m->tables_[g][static_cast<size_t>(i)] = kNullBlock;
      m->table_entries_[g][static_cast<size_t>(i)] = kNoEntry;
    }
  }
}

bool KvManager::hit_valid(const PrefixMatch& m, int32_t j) const {
  for (size_t g = 0; g < m.tables_.size(); ++g) {
    const int32_t lo = first_needed_block(static_cast<int32_t>(g), static_cast<int64_t>(j) * config_.block_size);
    for (int32_t i = lo; i < j; ++i) {
      const BlockId b = m.tables_[g][static_cast<size_t>(i)];
      if (b == kNullBlock || cache_.entry_of(b) != m.table_entries_[g][static_cast<size_t>(i)]) return false;
    }
  }
  return true;
}

void KvManager::revalidate(PrefixMatch* match) const {
  PAGODA_CHECK_MSG(match->owner_ == this, "revalidate of a prefix match made by another KvManager");
  if (match->generation_ == generation_) return;
  // A block gone at i ends the hit at i or before; a window group may then
  // need blocks the match never looked up, which ends it earlier still.
  int32_t j = match->num_blocks_;
  for (size_t g = 0; g < match->tables_.size(); ++g) {
    for (int32_t i = 0; i < j; ++i) {
      const BlockId b = match->tables_[g][static_cast<size_t>(i)];
      if (b != kNullBlock && cache_.entry_of(b) != match->table_entries_[g][static_cast<size_t>(i)]) j = i;
    }
  }
  while (j > 0 && !hit_valid(*match, j)) --j;
  if (j < match->num_blocks_) {
    // The hit ends before block j: its key is the next one to compute.
    match->next_key_ = match->keys_[static_cast<size_t>(j)];
    match->has_next_key_ = true;
    truncate_match(match, j);
  }
  match->generation_ = generation_;
}

Status KvManager::check_current(const PrefixMatch& m, const char* what) const {
  if (m.owner_ != this) return errorf("kv: %s made by another KvManager", what);
  if (m.generation_ == generation_) return Status::Ok();
  return errorf("kv: %s made at generation %llu is stale (now %llu): the cache changed since", what,
                static_cast<unsigned long long>(m.generation_), static_cast<unsigned long long>(generation_));
}

int32_t KvManager::blocks_needed(const PrefixMatch& m, int32_t num_new_tokens) const {
  const int32_t hits = m.num_blocks();
  const int32_t fresh = num_blocks_for(static_cast<int64_t>(m.num_cached_tokens()) + num_new_tokens) - hits;
  int32_t revived = 0;
  for (const auto& table : m.tables_) {
    for (BlockId b : table) revived += b != kNullBlock && pool_.ref_count(b) == 0 ? 1 : 0;
  }
  return fresh * num_groups() + revived;
}

int64_t KvManager::prefill_peak_blocks(int32_t group, int32_t target, int32_t max_chunk) const {
  return kv_group_blocks_for_sequence(target, config_.block_size, groups_[static_cast<size_t>(group)].sliding_window,
                                      max_chunk);
}

int64_t KvManager::prefill_reserve(const Seq& s) const {
  if (s.num_computed >= s.target) return 0;  // no target, or decoding: growth is not reserved
  int64_t r = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& table = s.tables[g];
    // A full group never releases: its table length is what it took. A window
    // group counts the blocks it holds alone: releasing a shared one frees nothing.
    int64_t held = static_cast<int64_t>(table.size());
    if (groups_[g].sliding_window > 0) {
      held = 0;
      for (size_t i = static_cast<size_t>(s.first_live[g]); i < table.size(); ++i) {
        held += table[i] != kNullBlock && pool_.ref_count(table[i]) == 1 ? 1 : 0;
      }
    }
    r += std::max<int64_t>(0, prefill_peak_blocks(static_cast<int32_t>(g), s.target, s.max_chunk) - held);
  }
  return r;
}

int64_t KvManager::num_reserved_blocks() const {
  int64_t r = 0;
  for (const auto& [id, s] : seqs_) r += prefill_reserve(s);
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
  // The new sequence's own reserve once allocated: its peak per group minus
  // what it will hold (a full group: its table; a window group: the blocks
  // it holds alone, i.e. all but hits still used by another sequence).
  int64_t own = 0;
  if (target_tokens > 0 && cached + num_new_tokens < target_tokens) {
    const int32_t total = num_blocks_for(static_cast<int64_t>(cached) + num_new_tokens);
    for (size_t g = 0; g < groups_.size(); ++g) {
      int64_t held = total;
      if (groups_[g].sliding_window > 0) {
        const int32_t live = std::min(match.num_blocks_, first_needed_block(static_cast<int32_t>(g), cached));
        held = total - live;
        for (BlockId b : match.tables_[g]) held -= b != kNullBlock && pool_.ref_count(b) > 0 ? 1 : 0;
      }
      own += std::max<int64_t>(0, prefill_peak_blocks(static_cast<int32_t>(g), target_tokens, max_chunk) - held);
    }
  }
  const int64_t running = num_reserved_blocks();
  if (static_cast<int64_t>(need) + own + running + watermark_blocks_ + reserve_blocks > pool_.num_free()) {
    const std::string prefill =
        own + running == 0 ? std::string()
                           : errorf(" + %lld reserved for the rest of its prefill + %lld for running prefills",
                                    static_cast<long long>(own), static_cast<long long>(running))
                                 .message;
    return errorf("kv: %d cached + %d new tokens need %d free blocks%s + watermark %d + reserve %d, only %d free",
                  cached, num_new_tokens, need, prefill.c_str(), watermark_blocks_, reserve_blocks, pool_.num_free());
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

BlockId KvManager::take_block() {
  const BlockId b = pool_.pop_free();
  if (cache_.contains(b)) {
    cache_.erase(b);
    ++num_evictions_;
  }
  return b;
}

Expected<int32_t> KvManager::allocate(SeqId seq, const Admission& admission) {
  if (seqs_.count(seq)) return errorf("kv: sequence %llu already has blocks", static_cast<unsigned long long>(seq));
  const PrefixMatch& m = admission.match_;
  // Same generation: no block was taken, freed or committed since can_allocate
  // counted the free queue and confirmed the hits, so both still hold.
  PAGODA_TRY(check_current(m, "admission"));
  ++generation_;
  // Touch hits first so that popping fresh blocks cannot evict them.
  for (const auto& table : m.tables_) {
    for (BlockId b : table) {
      if (b != kNullBlock) pool_.incref(b);
    }
  }
  // The dashboard's per-block hit counts (a statistic: group 0 stands for the chain).
  if (!m.tables_.empty())
    for (BlockId b : m.tables_[0]) cache_.count_hit(b);
  const int32_t cached = m.num_cached_tokens();
  Seq s;
  s.salt = m.salt_;
  s.tables = m.tables_;
  s.keys = m.keys_;
  s.entries = m.entries_;
  s.num_computed = cached;
  s.target = admission.target_tokens_;
  s.max_chunk = admission.max_chunk_;
  s.first_live.resize(groups_.size());
  const int32_t total_blocks = num_blocks_for(static_cast<int64_t>(cached) + admission.num_new_tokens_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    s.first_live[g] = std::min(m.num_blocks_, first_needed_block(static_cast<int32_t>(g), cached));
    while (static_cast<int32_t>(s.tables[g].size()) < total_blocks) s.tables[g].push_back(take_block());
  }
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

// Over all groups: *fresh = new table entries, the result = shared blocks to copy.
int32_t KvManager::cow_blocks_needed(const Seq& s, int32_t num_new_tokens, int32_t* fresh) const {
  const int32_t target = num_blocks_for(static_cast<int64_t>(s.num_computed) + num_new_tokens);
  const int32_t have = static_cast<int32_t>(s.tables[0].size());
  *fresh = std::max(0, target - have) * num_groups();
  int32_t cow = 0;
  if (num_new_tokens > 0) {
    for (const auto& table : s.tables) {
      for (int32_t j = s.num_computed / config_.block_size; j < std::min(have, target); ++j) {
        cow += pool_.ref_count(table[static_cast<size_t>(j)]) > 1 ? 1 : 0;
      }
    }
  }
  return cow;
}

int32_t KvManager::releasable_blocks(const Seq& s, int64_t start) const {
  int32_t freed = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& table = s.tables[g];
    const int32_t lo = std::min(static_cast<int32_t>(table.size()), first_needed_block(static_cast<int32_t>(g), start));
    for (int32_t i = s.first_live[g]; i < lo; ++i) {
      const BlockId b = table[static_cast<size_t>(i)];
      freed += b != kNullBlock && pool_.ref_count(b) == 1 ? 1 : 0;  // shared ones stay with the other holder
    }
  }
  return freed;
}

void KvManager::release_out_of_window(Seq* s, int64_t start) {
  for (size_t g = 1; g <= groups_.size(); ++g) {
    const size_t gi = g % groups_.size();  // group 0 last: its head anchors the chain, evict it after the others
    auto& table = s->tables[gi];
    const int32_t lo = std::min(static_cast<int32_t>(table.size()), first_needed_block(static_cast<int32_t>(gi), start));
    for (int32_t i = s->first_live[gi]; i < lo; ++i) {
      BlockId& b = table[static_cast<size_t>(i)];
      if (b == kNullBlock) continue;
      pool_.decref(b);  // committed: cached-evictable, a prefix hit may revive it; else free
      b = kNullBlock;
    }
    s->first_live[gi] = std::max(s->first_live[gi], lo);
  }
}

bool KvManager::can_append_slots(SeqId seq, int32_t num_new_tokens) const {
  const Seq& s = seq_ref(seq);
  int32_t fresh = 0;
  const int32_t cow = cow_blocks_needed(s, num_new_tokens, &fresh);
  return fresh + cow <= pool_.num_free() + releasable_blocks(s, s.num_computed);
}

bool KvManager::append_slots(SeqId seq, int32_t num_new_tokens, std::vector<BlockCopy>* copies) {
  PAGODA_CHECK(num_new_tokens >= 0);
  auto it = seqs_.find(seq);
  PAGODA_CHECK(it != seqs_.end());
  Seq& s = it->second;
  int32_t fresh = 0;
  const int32_t cow = cow_blocks_needed(s, num_new_tokens, &fresh);
  // Blocks before the windows go back first: they pay for the new ones.
  if (fresh + cow > pool_.num_free() + releasable_blocks(s, s.num_computed)) return false;
  ++generation_;
  release_out_of_window(&s, s.num_computed);
  const int32_t bs = config_.block_size;
  const int32_t target = num_blocks_for(static_cast<int64_t>(s.num_computed) + num_new_tokens);
  for (auto& table : s.tables) {
    if (cow == 0) break;
    const int32_t end = std::min(static_cast<int32_t>(table.size()), target);
    for (int32_t j = s.num_computed / bs; j < end; ++j) {
      BlockId& slot = table[static_cast<size_t>(j)];
      if (pool_.ref_count(slot) <= 1) continue;
      const BlockId dst = take_block();
      // Only computed tokens need copying; a block past them is just unshared.
      if (j * bs < s.num_computed) {
        PAGODA_CHECK(copies != nullptr);
        copies->emplace_back(slot, dst);
        ++num_cow_copies_;
      }
      pool_.decref(slot);  // still > 0: another sequence holds it
      slot = dst;
    }
  }
  for (auto& table : s.tables) {
    while (static_cast<int32_t>(table.size()) < target) table.push_back(take_block());
  }
  return true;
}

void KvManager::mark_computed(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed_tokens) {
  auto it = seqs_.find(seq);
  PAGODA_CHECK(it != seqs_.end());
  Seq& s = it->second;
  const int32_t bs = config_.block_size;
  PAGODA_CHECK_MSG(num_computed_tokens >= s.num_computed &&
                       num_computed_tokens <= static_cast<int32_t>(s.tables[0].size()) * bs &&
                       static_cast<size_t>(num_computed_tokens) <= tokens.size(),
                   "seq %llu: num_computed %d -> %d with %zu slots and %zu tokens",
                   static_cast<unsigned long long>(seq), s.num_computed, num_computed_tokens,
                   s.tables[0].size() * static_cast<size_t>(bs), tokens.size());
  ++generation_;
  s.num_computed = num_computed_tokens;
  const size_t full = static_cast<size_t>(num_computed_tokens / bs);
  extend_keys(&s, tokens, full);
  for (size_t i = s.entries.size(); i < full; ++i) {
    const EntryId parent_entry = i == 0 ? kRootEntry : s.entries[i - 1];
    const auto block_tokens = tokens.subspan(i * static_cast<size_t>(bs), static_cast<size_t>(bs));
    const BlockId b0 = s.tables[0][i];
    const EntryId e = config_.enable_prefix_caching && b0 != kNullBlock
                          ? cache_.insert(b0, s.keys[i], parent_entry, block_tokens, s.salt)
                          : kNoEntry;
    if (commit_log_on_ && e != kNoEntry && cache_.entry_of(b0) == e) {  // b0 itself holds the new entry
      commit_log_.push_back({b0, s.keys[i], {block_tokens.begin(), block_tokens.end()}, s.salt});
    }
    // Other groups: their own key, parented on group 0's chain (their earlier
    // blocks may be long released).
    for (size_t g = 1; g < s.tables.size() && config_.enable_prefix_caching; ++g) {
      const BlockId b = s.tables[g][i];
      if (b == kNullBlock) continue;
      const auto gi = static_cast<int32_t>(g);
      const EntryId eg = cache_.insert(b, group_key(s.keys[i], gi), parent_entry, block_tokens, s.salt);
      if (commit_log_on_ && eg != kNoEntry && cache_.entry_of(b) == eg) {
        commit_log_.push_back({b, s.keys[i], {block_tokens.begin(), block_tokens.end()}, s.salt, gi});
      }
    }
    s.entries.push_back(e);
  }
}

void KvManager::extend_keys(Seq* s, std::span<const TokenId> tokens, size_t num_blocks) const {
  const size_t bs = static_cast<size_t>(config_.block_size);
  PAGODA_CHECK(num_blocks * bs <= tokens.size());
  for (size_t i = s->keys.size(); i < num_blocks; ++i) {
    const Hash128 parent = i == 0 ? Hash128{} : s->keys[i - 1];
    s->keys.push_back(cache_.key(parent, tokens.subspan(i * bs, bs), s->salt));
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
  for (const auto& table : copy.tables) {
    for (BlockId b : table) {
      if (b != kNullBlock) pool_.incref(b);
    }
  }
  seqs_.emplace(child, std::move(copy));
  return Status::Ok();
}

bool KvManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return false;
  ++generation_;
  // Group 0 last, as in release_out_of_window.
  const auto& tables = it->second.tables;
  for (size_t g = 1; g <= tables.size(); ++g) {
    const auto& blocks = tables[g % tables.size()];
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
      if (*b != kNullBlock) pool_.decref(*b);
    }
  }
  seqs_.erase(it);
  return true;
}

bool KvManager::truncate(SeqId seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || num_tokens < 0) return false;
  Seq& s = it->second;
  const int32_t bs = config_.block_size;
  const auto have = static_cast<int32_t>(s.tables[0].size());
  if (num_tokens > have * bs) return false;
  const int32_t computed = std::min(s.num_computed, num_tokens);
  const int32_t keep = num_blocks_for(num_tokens);
  // A committed block is the prefix cache's: cut inside it, the sequence would
  // rewrite its tail under the old key.
  if (num_tokens % bs != 0 && static_cast<int32_t>(s.entries.size()) > num_tokens / bs) return false;
  // A window group's released entries cannot come back: refuse before any change.
  for (size_t g = 0; g < s.tables.size(); ++g) {
    for (int32_t i = first_needed_block(static_cast<int32_t>(g), computed); i < keep; ++i) {
      if (s.tables[g][static_cast<size_t>(i)] == kNullBlock) return false;
    }
  }
  ++generation_;
  for (size_t g = 1; g <= s.tables.size(); ++g) {  // group 0 last, as in free()
    auto& table = s.tables[g % s.tables.size()];
    while (static_cast<int32_t>(table.size()) > keep) {
      if (table.back() != kNullBlock) pool_.decref(table.back());
      table.pop_back();
    }
  }
  s.num_computed = computed;
  const auto full = static_cast<size_t>(num_tokens / bs);
  if (s.entries.size() > full) s.entries.resize(full);
  if (s.keys.size() > full) s.keys.resize(full);
  return true;
}

std::span<const BlockId> KvManager::block_table(SeqId seq) const { return seq_ref(seq).tables[0]; }
std::span<const BlockId> KvManager::block_table(SeqId seq, int32_t group) const {
  return seq_ref(seq).tables[static_cast<size_t>(group)];
}
int32_t KvManager::num_computed_tokens(SeqId seq) const { return seq_ref(seq).num_computed; }
int32_t KvManager::num_committed_blocks(SeqId seq) const { return static_cast<int32_t>(seq_ref(seq).entries.size()); }
int32_t KvManager::num_slots(SeqId seq) const {
  return static_cast<int32_t>(seq_ref(seq).tables[0].size()) * config_.block_size;
}

std::vector<Hash128> KvManager::chain_keys(std::span<const TokenId> tokens, std::string_view cache_salt) const {
  std::vector<Hash128> keys;
  if (tokens.empty()) return keys;
  const size_t bs = static_cast<size_t>(config_.block_size);
  Hash128 parent{};
  for (size_t i = 0; i < (tokens.size() - 1) / bs; ++i) {
    parent = cache_.key(parent, tokens.subspan(i * bs, bs), cache_salt);
    keys.push_back(parent);
  }
  return keys;
}

std::vector<std::vector<int8_t>> KvManager::cached_blocks(std::span<const TokenId> tokens,
                                                          std::string_view cache_salt) const {
  const size_t bs = static_cast<size_t>(config_.block_size);
  const size_t n = tokens.empty() ? 0 : (tokens.size() - 1) / bs;
  std::vector<std::vector<int8_t>> held(groups_.size(), std::vector<int8_t>(n, 0));
  if (!config_.enable_prefix_caching) return held;
  Hash128 key{};
  EntryId parent = kRootEntry;
  for (size_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    key = cache_.key(key, block_tokens, cache_salt);
    const BlockId b = cache_.find(key, parent, block_tokens, cache_salt);
    if (b == kNullBlock) break;
    held[0][i] = 1;
    for (size_t g = 1; g < groups_.size(); ++g)
      held[g][i] = cache_.find(group_key(key, static_cast<int32_t>(g)), parent, block_tokens, cache_salt) != kNullBlock;
    parent = cache_.entry_of(b);
  }
  return held;
}

BlockId KvManager::import_one(const Hash128& key, EntryId parent, std::span<const TokenId> tokens,
                              std::string_view salt, const std::function<void(BlockId)>& fill) {
  if (pool_.num_free() <= watermark_blocks_) return kNullBlock;
  const BlockId b = take_block();
  fill(b);
  const EntryId e = cache_.insert(b, key, parent, tokens, salt);
  if (e == kNoEntry || cache_.entry_of(b) != e) {  // refused (a collision): back to the pool, keyless
    pool_.decref(b);
    return kNullBlock;
  }
  return b;
}

int32_t KvManager::import_blocks(std::span<const TokenId> tokens, std::string_view cache_salt, int32_t num_blocks,
                                 const std::function<bool(int32_t, int32_t)>& loaded,
                                 const std::function<void(int32_t, int32_t, BlockId)>& fill) {
  if (!config_.enable_prefix_caching || num_blocks <= 0 || tokens.empty()) return 0;
  ++generation_;
  const size_t bs = static_cast<size_t>(config_.block_size);
  const auto end = std::min(static_cast<size_t>(num_blocks), (tokens.size() - 1) / bs);
  const auto ng = groups_.size();
  std::vector<std::vector<BlockId>> pinned(ng);  // [group] held so that taking a block cannot evict them
  std::vector<Hash128> keys;
  std::vector<EntryId> entries;  // group 0's entry standing for the prefix through each block
  int32_t imported = 0;
  // Group 0: the chain, from the cache or imported.
  for (size_t i = 0; i < end; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    const Hash128 key = cache_.key(keys.empty() ? Hash128{} : keys.back(), block_tokens, cache_salt);
    const EntryId parent = entries.empty() ? kRootEntry : entries.back();
    const auto ii = static_cast<int32_t>(i);
    BlockId b = cache_.find(key, parent, block_tokens, cache_salt);
    if (b != kNullBlock) {
      pool_.incref(b);
    } else if (loaded(0, ii)) {
      b = import_one(key, parent, block_tokens, cache_salt, [&](BlockId blk) { fill(0, ii, blk); });
      if (b == kNullBlock) break;
      ++imported;
    } else {
      break;
    }
    pinned[0].push_back(b);
    keys.push_back(key);
    entries.push_back(cache_.entry_of(b));
  }
  // Window groups: the hit every group serves, then their blocks of it.
  auto find_g = [&](int32_t g, int32_t i) {
    const auto ui = static_cast<size_t>(i);
    return cache_.find(group_key(keys[ui], g), i == 0 ? kRootEntry : entries[ui - 1], tokens.subspan(ui * bs, bs),
                       cache_salt);
  };
  const int32_t h = longest_hit(static_cast<int32_t>(keys.size()),
                                [&](int32_t g, int32_t i) { return find_g(g, i) == kNullBlock && !loaded(g, i); });
  for (int32_t g = 1; g < num_groups(); ++g) {  // pin what the cache has first: imports cannot evict it then
    auto& table = pinned[static_cast<size_t>(g)];
    table.assign(static_cast<size_t>(h), kNullBlock);
    for (int32_t i = first_needed_block(g, static_cast<int64_t>(h) * config_.block_size); i < h; ++i) {
      const BlockId b = find_g(g, i);
      if (b != kNullBlock) pool_.incref(b);
      table[static_cast<size_t>(i)] = b;
    }
  }
  for (int32_t g = 1; g < num_groups(); ++g) {
    auto& table = pinned[static_cast<size_t>(g)];
    for (int32_t i = first_needed_block(g, static_cast<int64_t>(h) * config_.block_size); i < h; ++i) {
      const auto ui = static_cast<size_t>(i);
      if (table[ui] != kNullBlock) continue;
      const BlockId b = import_one(group_key(keys[ui], g), i == 0 ? kRootEntry : entries[ui - 1],
                                   tokens.subspan(ui * bs, bs), cache_salt, [&](BlockId blk) { fill(g, i, blk); });
      if (b == kNullBlock) break;
      table[ui] = b;
      ++imported;
    }
  }
  // Released as free() does: group 0 last, each group's last block first.
  for (size_t g = 1; g <= ng; ++g) {
    const auto& blocks = pinned[g % ng];
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (*it != kNullBlock) pool_.decref(*it);
    }
  }
  return imported;
}

KvStats KvManager::stats() const {
  KvStats st;
  st.num_blocks_total = pool_.num_usable_blocks();
  st.num_cached = cache_.size();
  for (BlockId b = 1; b < pool_.num_blocks(); ++b) {
    if (pool_.ref_count(b) > 0) {
      ++st.num_used;
    } else if (cache_.contains(b)) {
      ++st.num_cached_evictable;
    } else {
      ++st.num_free;
    }
  }
  st.prefix_lookups = prefix_lookups_;
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.num_evictions = num_evictions_;
  st.num_cow_copies = num_cow_copies_;
  st.collisions_refused = cache_.collisions_refused();
  st.group_blocks_used.assign(groups_.size(), 0);
  // A block sits in one group's tables only (shared by fork within that group).
  std::vector<uint8_t> seen(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& [id, s] : seqs_) {
    for (size_t g = 0; g < s.tables.size(); ++g) {
      for (BlockId b : s.tables[g]) {
        if (b == kNullBlock || seen[static_cast<size_t>(b)]) continue;
        seen[static_cast<size_t>(b)] = 1;
        ++st.group_blocks_used[g];
      }
    }
  }
  return st;
}

std::string KvManager::check_invariants() const {
  if (std::string e = pool_.check(); !e.empty()) return "pool: " + e;
  if (std::string e = cache_.check(); !e.empty()) return "prefix cache: " + e;
  const int32_t n = pool_.num_blocks();
  const int32_t bs = config_.block_size;
  std::vector<int32_t> refs(static_cast<size_t>(n), 0);
  std::vector<int32_t> group_of(static_cast<size_t>(n), -1);
  for (const auto& [id, s] : seqs_) {
    const auto uid = static_cast<unsigned long long>(id);
    if (s.tables.size() != groups_.size() || s.first_live.size() != groups_.size()) {
      return errorf("seq %llu: %zu tables for %zu groups", uid, s.tables.size(), groups_.size()).message;
    }
    for (size_t g = 0; g < s.tables.size(); ++g) {
      if (s.tables[g].size() != s.tables[0].size()) {
        return errorf("seq %llu: group %zu table of %zu blocks, group 0 of %zu", uid, g, s.tables[g].size(),
                      s.tables[0].size())
            .message;
      }
      // No block is released while inside the window: every entry from the
      // block of key num_computed - W + 1 on is a real block (full groups: all).
      const int32_t need_lo = first_needed_block(static_cast<int32_t>(g), s.num_computed);
      for (size_t i = 0; i < s.tables[g].size(); ++i) {
        const BlockId b = s.tables[g][i];
        if (b == kNullBlock) {
          if (static_cast<int32_t>(i) >= need_lo) {
            return errorf("seq %llu: group %zu block %zu is released but inside the window (%d computed)", uid, g, i,
                          s.num_computed)
                .message;
          }
          continue;
        }
        if (static_cast<int32_t>(i) < s.first_live[g]) {
          return errorf("seq %llu: group %zu holds block %d before its first live entry %d", uid, g, b,
                        s.first_live[g])
              .message;
        }
        if (b < kNullBlock || b >= n) return errorf("seq %llu holds invalid block %d", uid, b).message;
        ++refs[static_cast<size_t>(b)];
        int32_t& owner = group_of[static_cast<size_t>(b)];
        if (owner >= 0 && owner != static_cast<int32_t>(g)) {
          return errorf("block %d is in the tables of groups %d and %zu", b, owner, g).message;
        }
        owner = static_cast<int32_t>(g);
      }
    }
    if (s.num_computed < 0 || s.num_computed > static_cast<int32_t>(s.tables[0].size()) * bs) {
      return errorf("seq %llu: %d computed tokens in %zu blocks", uid, s.num_computed, s.tables[0].size()).message;
    }
    if (static_cast<int32_t>(s.entries.size()) > s.num_computed / bs) {
      return errorf("seq %llu: %zu committed blocks with %d computed tokens", uid, s.entries.size(), s.num_computed)
          .message;
    }
    if (s.keys.size() < s.entries.size()) {
      return errorf("seq %llu: %zu block keys for %zu committed blocks", uid, s.keys.size(), s.entries.size())
          .message;
    }
    for (size_t g = 0; g < s.tables.size(); ++g) {
      for (size_t i = 0; i < s.entries.size(); ++i) {
        const BlockId b = s.tables[g][i];
        if (b != kNullBlock && cache_.contains(b) && !(cache_.key_of(b) == group_key(s.keys[i], static_cast<int32_t>(g)))) {
          return errorf("seq %llu: group %zu block %d cached under another key", uid, g, b).message;
        }
      }
    }
  }
  int32_t used = 0, free_plain = 0, evictable = 0;
  for (BlockId b = 1; b < n; ++b) {
    const auto i = static_cast<size_t>(b);
    if (refs[i] != pool_.ref_count(b)) {
      return errorf("block %d: ref count %d but %d table references", b, pool_.ref_count(b), refs[i]).message;
    }
    if (refs[i] > 0 && pool_.in_free_queue(b)) return errorf("block %d both free and referenced", b).message;
    if (refs[i] > 0) {
      ++used;
    } else if (cache_.contains(b)) {
      ++evictable;
    } else {
      ++free_plain;
    }
  }
  if (cache_.contains(kNullBlock)) return "null block is cached";
  if (free_plain + used + evictable != pool_.num_usable_blocks()) {
    return errorf("free %d + used %d + cached-evictable %d != total %d", free_plain, used, evictable,
                  pool_.num_usable_blocks())
        .message;
  }
  if (free_plain + evictable != pool_.num_free()) {
    return errorf("free %d + evictable %d != free queue %d", free_plain, evictable, pool_.num_free()).message;
  }
  return "";
}

}  // namespace pagoda::kv
