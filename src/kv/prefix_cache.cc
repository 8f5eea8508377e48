#include "kv/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/status.h"

namespace pagoda::kv {

Hash128 PrefixCache::default_hash(const Hash128& parent, std::span<const TokenId> tokens, uint64_t model_fingerprint,
                                  std::string_view cache_salt) {
  // One contiguous buffer hashed in one shot (same digest as streaming the
  // pieces through Hasher128, without its heap-allocated state).
  // Layout: parent.lo, parent.hi, fingerprint, salt length, salt bytes, tokens.
  const size_t n = 4 * sizeof(uint64_t) + cache_salt.size() + tokens.size_bytes();
  uint8_t stack[4 * sizeof(uint64_t) + 256 * sizeof(TokenId) + 64];
  std::vector<uint8_t> heap;
  uint8_t* buf = stack;
  if (n > sizeof(stack)) {
    heap.resize(n);
    buf = heap.data();
  }
  const uint64_t head[4] = {parent.lo, parent.hi, model_fingerprint, cache_salt.size()};
  std::memcpy(buf, head, sizeof(head));
  size_t off = sizeof(head);
  if (!cache_salt.empty()) std::memcpy(buf + off, cache_salt.data(), cache_salt.size());
  off += cache_salt.size();
  if (!tokens.empty()) std::memcpy(buf + off, tokens.data(), tokens.size_bytes());
  return xxh3_128(buf, n);
}

PrefixCache::PrefixCache(int32_t num_blocks, uint64_t model_fingerprint)
    : model_fingerprint_(model_fingerprint), hash_fn_(&PrefixCache::default_hash),
      slots_(static_cast<size_t>(num_blocks)), miss_index_(num_blocks) {}

void PrefixCache::set_hash_fn_for_testing(HashFn fn) {
  PAGODA_CHECK(map_.empty());
  hash_fn_ = std::move(fn);
}

Hash128 PrefixCache::key(const Hash128& parent, std::span<const TokenId> tokens, std::string_view cache_salt) const {
  return hash_fn_(parent, tokens, model_fingerprint_, cache_salt);
}

static bool same_tokens(std::span<const TokenId> a, std::span<const TokenId> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

BlockId PrefixCache::find(const Hash128& key, EntryId parent, std::span<const TokenId> tokens,
                          std::string_view cache_salt) const {
  if (parent == kNoEntry) return kNullBlock;
  auto it = map_.find(key);
  if (it == map_.end()) return kNullBlock;
  const Slot& s = slots_[static_cast<size_t>(it->second)];
  const bool tokens_equal = same_tokens(s.tokens, tokens);
  const bool salt_equal = salt_view(s) == cache_salt;
  if (s.parent != parent || !tokens_equal || !salt_equal) {
    // Same tokens and salt under an evicted parent is not a collision, just unconfirmable.
    if (!tokens_equal || !salt_equal || live(s.parent)) ++collisions_refused_;
    return kNullBlock;
  }
  return it->second;
}

EntryId PrefixCache::insert(BlockId b, const Hash128& key, EntryId parent, std::span<const TokenId> tokens,
                            std::string_view cache_salt, const ChainRef* ref) {
  if (parent == kNoEntry) return kNoEntry;
  Slot& s = slots_[static_cast<size_t>(b)];
  if (s.entry != kNoEntry) {
    // Already committed (a block shared by fork is committed by each owner).
    PAGODA_CHECK(s.key == key);
    return (s.parent == parent && same_tokens(s.tokens, tokens) && salt_view(s) == cache_salt) ? s.entry : kNoEntry;
  }
  auto it = map_.find(key);
  if (it != map_.end()) {
    const Slot& other = slots_[static_cast<size_t>(it->second)];
    const bool tokens_equal = same_tokens(other.tokens, tokens);
    const bool salt_equal = salt_view(other) == cache_salt;
    if (other.parent == parent && tokens_equal && salt_equal) return other.entry;
    if (!tokens_equal || !salt_equal || live(other.parent)) {
      ++collisions_refused_;
      return kNoEntry;
    }
    // Same tokens and salt under an evicted parent: unreachable, take its key over.
    erase(it->second);
  }
  map_.emplace(key, b);
  s.entry = next_entry_++;
  live_.emplace(s.entry, b);
  s.parent = parent;
  s.key = key;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.salt = intern_salt(cache_salt);
  s.hits = 0;
  s.chain = ref ? ref->chain : key;
  s.group = ref ? ref->group : 0;
  s.announce = ref == nullptr || ref->announce;
  if (sink_ && s.announce) {
    const Hash128* parent_chain = nullptr;
    if (ref) {
      if (!ref->root) parent_chain = &ref->parent;
    } else if (parent != kRootEntry) {
      const BlockId pb = block_of_entry(parent);
      if (pb != kNullBlock) parent_chain = &slots_[static_cast<size_t>(pb)].chain;
    }
    sink_->block_stored(s.chain, parent_chain, s.tokens, s.group);
  }
  // The salt-free chain key: the key these tokens after this token prefix have
  // under the empty salt (one more hash, salted blocks only).
  const BlockId pb = parent == kRootEntry ? kNullBlock : block_of_entry(parent);
  miss_index_.add(b, parent,
                  cache_salt.empty() ? key : this->key(pb == kNullBlock ? Hash128{} : miss_index_.unsalted_of(pb), tokens, {}),
                  !cache_salt.empty());
  return s.entry;
}

const std::string* PrefixCache::intern_salt(std::string_view salt) {
  if (salt.empty()) return nullptr;
  auto it = salts_.find(salt);
  if (it == salts_.end()) it = salts_.emplace(std::string(salt), 0).first;
  ++it->second;
  return &it->first;
}

void PrefixCache::release_salt(const std::string* salt) {
  if (salt == nullptr) return;
  auto it = salts_.find(*salt);
  PAGODA_CHECK(it != salts_.end() && &it->first == salt && it->second > 0);
  if (--it->second == 0) salts_.erase(it);
}

void PrefixCache::erase(BlockId b) {
  Slot& s = slots_[static_cast<size_t>(b)];
  if (s.entry == kNoEntry) return;
  auto it = map_.find(s.key);
  PAGODA_CHECK(it != map_.end() && it->second == b);
  if (sink_ && s.announce) sink_->block_removed(s.chain, s.group);
  map_.erase(it);
  live_.erase(s.entry);
  miss_index_.remove(b);
  s.entry = kNoEntry;
  s.parent = kNoEntry;
  s.tokens.clear();
  release_salt(s.salt);
  s.salt = nullptr;
  s.hits = 0;
}

std::string PrefixCache::check() const {
  int32_t cached = 0;
  std::unordered_map<const std::string*, int64_t> salt_refs;  // interned salt -> cached blocks holding it
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.entry == kNoEntry) {
      if (s.salt != nullptr) return errorf("uncached block %zu holds a salt", i).message;
      continue;
    }
    ++cached;
    if (s.salt != nullptr) ++salt_refs[s.salt];
    auto it = map_.find(s.key);
    if (it == map_.end() || it->second != static_cast<BlockId>(i)) {
      return errorf("cached block %zu is not the map's block for its key", i).message;
    }
  }
  if (cached != static_cast<int32_t>(map_.size()) || live_.size() != map_.size()) {
    return errorf("%d cached blocks but %zu keys in the map", cached, map_.size()).message;
  }
  if (salt_refs.size() != salts_.size()) {
    return errorf("%zu salts held by cached blocks but %zu interned", salt_refs.size(), salts_.size()).message;
  }
  for (const auto& [salt, refs] : salts_) {
    auto it = salt_refs.find(&salt);
    if (salt.empty() || it == salt_refs.end() || it->second != refs) {
      return errorf("interned salt of %zu bytes counts %lld references, %lld cached blocks hold it", salt.size(),
                    static_cast<long long>(refs),
                    static_cast<long long>(it == salt_refs.end() ? 0 : it->second))
          .message;
    }
  }
  return "";
}

}  // namespace pagoda::kv
