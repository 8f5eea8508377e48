#include "grammar/cache.h"

#include <nlohmann/json.hpp>

namespace pagoda::grammar {

namespace {

// Length-prefixed field, so no choice list or frame can collide with another.
void put(std::string& key, std::string_view s) {
  key += std::to_string(s.size());
  key += ':';
  key.append(s);
}

}  // namespace

Expected<std::shared_ptr<const Grammar>> compile_constraint(const ConstraintSpec& spec, const GrammarOptions& opts) {
  switch (spec.kind) {
    case ConstraintKind::kJsonSchema:
      return Grammar::from_json_schema_framed(spec.text, spec.prefix, spec.suffix, opts);
    case ConstraintKind::kJsonObject:
      return Grammar::json_object(opts);
    case ConstraintKind::kRegex:
      return Grammar::from_regex(spec.text, opts);
    case ConstraintKind::kChoice:
      return Grammar::from_choices(spec.choices, opts);
    case ConstraintKind::kGbnf:
      return Grammar::from_gbnf(spec.text, opts);
    case ConstraintKind::kNone:
      break;
  }
  return make_error("no constraint to compile");
}

std::string GrammarCache::key_of(const ConstraintSpec& spec) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(spec.kind)));
  if (spec.kind == ConstraintKind::kJsonSchema) {
    // Compact re-serialization, key order kept (ordered_json). Invalid JSON keys
    // on its raw text: compile reports the error, nothing is cached.
    auto j = nlohmann::ordered_json::parse(spec.text, nullptr, false);
    put(key, j.is_discarded() ? spec.text : j.dump());
    put(key, spec.prefix);
    put(key, spec.suffix);
  } else if (spec.kind == ConstraintKind::kRegex || spec.kind == ConstraintKind::kGbnf) {
    put(key, spec.text);
  } else if (spec.kind == ConstraintKind::kChoice) {
    for (const auto& c : spec.choices) put(key, c);
  }
  return key;
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenIndex> index, GrammarOptions opts, size_t capacity,
                           size_t max_bytes)
    : index_(std::move(index)), opts_(opts), capacity_(std::max<size_t>(1, capacity)), max_bytes_(max_bytes) {}

size_t GrammarCache::bytes_locked() const {
  size_t n = 0;
  // The key is held twice: in the map and in the LRU list.
  for (const auto& [key, slot] : map_) n += 2 * key.capacity() + slot.grammar->memory_bytes();
  return n;
}

void GrammarCache::evict_locked(std::vector<std::shared_ptr<const CompiledGrammar>>* dropped) {
  // Masks grow while requests decode, so the sum is taken now (a few dozen atomic loads).
  size_t bytes = bytes_locked();
  while (map_.size() > 1 && (map_.size() > capacity_ || bytes > max_bytes_)) {
    auto it = map_.find(lru_.back());
    bytes -= std::min(bytes, 2 * it->first.capacity() + it->second.grammar->memory_bytes());
    dropped->push_back(std::move(it->second.grammar));
    map_.erase(it);
    lru_.pop_back();
  }
}

Expected<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(const ConstraintSpec& spec) {
  const std::string key = key_of(spec);
  // Grammars dropped here are destroyed after the lock is released (declared first).
  std::vector<std::shared_ptr<const CompiledGrammar>> dropped;
  {
    std::lock_guard l(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      std::shared_ptr<const CompiledGrammar> g = it->second.grammar;
      evict_locked(&dropped);
      return g;
    }
    ++misses_;
  }
  // Compiled outside the lock: a slow schema does not stall other requests.
  PAGODA_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, compile_constraint(spec, opts_));
  auto cg = std::make_shared<const CompiledGrammar>(std::move(g), index_);
  std::lock_guard l(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) return it->second.grammar;  // another thread was first
  lru_.push_front(key);
  map_.emplace(key, Slot{cg, lru_.begin()});
  evict_locked(&dropped);
  return std::shared_ptr<const CompiledGrammar>(cg);
}

size_t GrammarCache::size() const {
  std::lock_guard l(mu_);
  return map_.size();
}
size_t GrammarCache::bytes() const {
  std::lock_guard l(mu_);
  return bytes_locked();
}
uint64_t GrammarCache::hits() const {
  std::lock_guard l(mu_);
  return hits_;
}
uint64_t GrammarCache::misses() const {
  std::lock_guard l(mu_);
  return misses_;
}

}  // namespace pagoda::grammar
