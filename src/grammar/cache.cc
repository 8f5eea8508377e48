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

GrammarCache::GrammarCache(std::shared_ptr<const TokenIndex> index, GrammarOptions opts, size_t capacity)
    : index_(std::move(index)), opts_(opts), capacity_(std::max<size_t>(1, capacity)) {}

Expected<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(const ConstraintSpec& spec) {
  const std::string key = key_of(spec);
  {
    std::lock_guard l(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.pos);
      return it->second.grammar;
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
  while (map_.size() > capacity_) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledGrammar>(cg);
}

size_t GrammarCache::size() const {
  std::lock_guard l(mu_);
  return map_.size();
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
