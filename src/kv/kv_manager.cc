#include "kv/kv_manager.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace pagoda::kv {

KvManager::KvManager(const KvConfig& config)
    : config_(config),
      pool_(config.num_blocks),
      cache_(config.num_blocks, config.model_fingerprint) {
  PAGODA_CHECK_MSG(config.block_size >= 1 && config.block_size <= 256, "block_size %d not in 1..256",
                   config.block_size);
  PAGODA_CHECK_MSG(config.watermark >= 0.0 && config.watermark < 1.0, "watermark %f not in [0, 1)", config.watermark);
  watermark_blocks_ = static_cast<int32_t>(std::floor(config.watermark * pool_.num_usable_blocks() + 1e-9));
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
  if (!config_.enable_prefix_caching || tokens.empty()) return m;
  const size_t bs = static_cast<size_t>(config_.block_size);
  const size_t max_blocks = (tokens.size() - 1) / bs;  // never the last token
  Hash128 parent{};
  EntryId parent_entry = kRootEntry;
  for (size_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * bs, bs);
    const Hash128 key = cache_.key(parent, block_tokens, cache_salt);
    const BlockId b = cache_.find(key, parent_entry, block_tokens, cache_salt);
    if (b == kNullBlock) {
      m.next_key_ = key;
      m.has_next_key_ = true;
      break;
    }
    m.blocks_.push_back(b);
    m.keys_.push_back(key);
    parent_entry = cache_.entry_of(b);
    m.entries_.push_back(parent_entry);
    parent = key;
  }
  return m;
}

void KvManager::revalidate(PrefixMatch* match) const {
  PAGODA_CHECK_MSG(match->owner_ == this, "revalidate of a prefix match made by another KvManager");
  if (match->generation_ == generation_) return;
  for (size_t i = 0; i < match->blocks_.size(); ++i) {
    if (cache_.entry_of(match->blocks_[i]) == match->entries_[i]) continue;
    // Block i is gone: the hit ends before it, and its key is the next one to compute.
    match->next_key_ = match->keys_[i];
    match->has_next_key_ = true;
    match->blocks_.resize(i);
    match->keys_.resize(i);
    match->entries_.resize(i);
    break;
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
  for (BlockId b : m.blocks_) revived += pool_.ref_count(b) == 0 ? 1 : 0;
  return fresh + revived;
}

Expected<Admission> KvManager::can_allocate(PrefixMatch match, int32_t num_new_tokens, int32_t reserve_blocks) const {
  PAGODA_CHECK(num_new_tokens >= 0 && reserve_blocks >= 0);
  PAGODA_CHECK(match.num_cached_tokens() + num_new_tokens >= 1);
  PAGODA_TRY(check_current(match, "prefix match"));
  const int32_t need = blocks_needed(match, num_new_tokens);
  if (static_cast<int64_t>(need) + watermark_blocks_ + reserve_blocks > pool_.num_free()) {
    return errorf("kv: %d cached + %d new tokens need %d free blocks + watermark %d + reserve %d, only %d free",
                  match.num_cached_tokens(), num_new_tokens, need, watermark_blocks_, reserve_blocks,
                  pool_.num_free());
  }
  Admission a;
  a.match_ = std::move(match);
  a.num_new_tokens_ = num_new_tokens;
  a.num_blocks_needed_ = need;
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
  for (BlockId b : m.blocks_) pool_.incref(b);
  const int32_t cached = m.num_cached_tokens();
  Seq s;
  s.salt = m.salt_;
  s.blocks = m.blocks_;
  s.keys = m.keys_;
  s.entries = m.entries_;
  s.num_computed = cached;
  const int32_t total_blocks = num_blocks_for(static_cast<int64_t>(cached) + admission.num_new_tokens_);
  while (static_cast<int32_t>(s.blocks.size()) < total_blocks) s.blocks.push_back(take_block());
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

int32_t KvManager::cow_blocks_needed(const Seq& s, int32_t num_new_tokens, int32_t* fresh) const {
  const int32_t target = num_blocks_for(static_cast<int64_t>(s.num_computed) + num_new_tokens);
  const int32_t have = static_cast<int32_t>(s.blocks.size());
  *fresh = std::max(0, target - have);
  int32_t cow = 0;
  if (num_new_tokens > 0) {
    for (int32_t j = s.num_computed / config_.block_size; j < std::min(have, target); ++j) {
      cow += pool_.ref_count(s.blocks[static_cast<size_t>(j)]) > 1 ? 1 : 0;
    }
  }
  return cow;
}

bool KvManager::can_append_slots(SeqId seq, int32_t num_new_tokens) const {
  int32_t fresh = 0;
  const int32_t cow = cow_blocks_needed(seq_ref(seq), num_new_tokens, &fresh);
  return fresh + cow <= pool_.num_free();
}

bool KvManager::append_slots(SeqId seq, int32_t num_new_tokens, std::vector<BlockCopy>* copies) {
  PAGODA_CHECK(num_new_tokens >= 0);
  auto it = seqs_.find(seq);
  PAGODA_CHECK(it != seqs_.end());
  Seq& s = it->second;
  int32_t fresh = 0;
  const int32_t cow = cow_blocks_needed(s, num_new_tokens, &fresh);
  if (fresh + cow > pool_.num_free()) return false;
  ++generation_;
  if (cow > 0) {
    const int32_t bs = config_.block_size;
    const int32_t target = num_blocks_for(static_cast<int64_t>(s.num_computed) + num_new_tokens);
    const int32_t end = std::min(static_cast<int32_t>(s.blocks.size()), target);
    for (int32_t j = s.num_computed / bs; j < end; ++j) {
      BlockId& slot = s.blocks[static_cast<size_t>(j)];
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
  for (int32_t i = 0; i < fresh; ++i) s.blocks.push_back(take_block());
  return true;
}

void KvManager::mark_computed(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed_tokens) {
  auto it = seqs_.find(seq);
  PAGODA_CHECK(it != seqs_.end());
  Seq& s = it->second;
  const int32_t bs = config_.block_size;
  PAGODA_CHECK_MSG(num_computed_tokens >= s.num_computed &&
                       num_computed_tokens <= static_cast<int32_t>(s.blocks.size()) * bs &&
                       static_cast<size_t>(num_computed_tokens) <= tokens.size(),
                   "seq %llu: num_computed %d -> %d with %zu slots and %zu tokens",
                   static_cast<unsigned long long>(seq), s.num_computed, num_computed_tokens,
                   s.blocks.size() * static_cast<size_t>(bs), tokens.size());
  ++generation_;
  s.num_computed = num_computed_tokens;
  const size_t full = static_cast<size_t>(num_computed_tokens / bs);
  extend_keys(&s, tokens, full);
  for (size_t i = s.entries.size(); i < full; ++i) {
    const EntryId parent_entry = i == 0 ? kRootEntry : s.entries[i - 1];
    const auto block_tokens = tokens.subspan(i * static_cast<size_t>(bs), static_cast<size_t>(bs));
    const EntryId e = config_.enable_prefix_caching
                          ? cache_.insert(s.blocks[i], s.keys[i], parent_entry, block_tokens, s.salt)
                          : kNoEntry;
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
  for (BlockId b : copy.blocks) pool_.incref(b);
  seqs_.emplace(child, std::move(copy));
  return Status::Ok();
}

bool KvManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return false;
  ++generation_;
  const auto& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.decref(*b);
  seqs_.erase(it);
  return true;
}

std::span<const BlockId> KvManager::block_table(SeqId seq) const { return seq_ref(seq).blocks; }
int32_t KvManager::num_computed_tokens(SeqId seq) const { return seq_ref(seq).num_computed; }
int32_t KvManager::num_committed_blocks(SeqId seq) const { return static_cast<int32_t>(seq_ref(seq).entries.size()); }
int32_t KvManager::num_slots(SeqId seq) const {
  return static_cast<int32_t>(seq_ref(seq).blocks.size()) * config_.block_size;
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
  return st;
}

std::string KvManager::check_invariants() const {
  if (std::string e = pool_.check(); !e.empty()) return "pool: " + e;
  if (std::string e = cache_.check(); !e.empty()) return "prefix cache: " + e;
  const int32_t n = pool_.num_blocks();
  const int32_t bs = config_.block_size;
  std::vector<int32_t> refs(static_cast<size_t>(n), 0);
  for (const auto& [id, s] : seqs_) {
    const auto uid = static_cast<unsigned long long>(id);
    for (BlockId b : s.blocks) {
      if (b <= kNullBlock || b >= n) return errorf("seq %llu holds invalid block %d", uid, b).message;
      ++refs[static_cast<size_t>(b)];
    }
    if (s.num_computed < 0 || s.num_computed > static_cast<int32_t>(s.blocks.size()) * bs) {
      return errorf("seq %llu: %d computed tokens in %zu blocks", uid, s.num_computed, s.blocks.size()).message;
    }
    if (static_cast<int32_t>(s.entries.size()) > s.num_computed / bs) {
      return errorf("seq %llu: %zu committed blocks with %d computed tokens", uid, s.entries.size(), s.num_computed)
          .message;
    }
    if (s.keys.size() < s.entries.size()) {
      return errorf("seq %llu: %zu block keys for %zu committed blocks", uid, s.keys.size(), s.entries.size())
          .message;
    }
    for (size_t i = 0; i < s.entries.size(); ++i) {
      const BlockId b = s.blocks[i];
      if (cache_.contains(b) && !(cache_.key_of(b) == s.keys[i])) {
        return errorf("seq %llu: block %d cached under another key", uid, b).message;
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
