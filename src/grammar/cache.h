// Constraint specs and the cache of their compiled grammars (issue 18).
//
// A server sees the same response_format schema on request after request; the
// grammar (and, more expensive, the per-context token masks CompiledGrammar
// learns while decoding) is built once per distinct constraint and shared by
// every request and sequence using it. The key is the constraint's canonical
// text: a schema is re-serialized compactly with its key order kept (property
// order is part of the output language), so whitespace differences hit.
//
// Bounded in entries and in bytes (issue 35): a grammar of a large schema is
// megabytes (its rules, up to GrammarOptions' limits) and its context masks grow
// while requests decode (up to CompiledGrammar::kMaxContexts masks of
// vocabulary/8 bytes each), so 64 distinct large schemas could hold gigabytes.
// Past max_bytes (CompiledGrammar::memory_bytes summed, as the masks now stand,
// checked at every get) the least recently used entries go; the most recent one
// always stays, so the cache holds at most max_bytes plus one grammar. A grammar
// dropped while requests still use it lives until they end.
//
// Thread-safe: get() may run on any number of threads. Two threads missing on
// the same key at once both compile; the first insert wins, both results work.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"

namespace pagoda::grammar {

enum class ConstraintKind : uint8_t { kNone, kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf };

struct ConstraintSpec {
  ConstraintKind kind = ConstraintKind::kNone;
  std::string text;                  // schema JSON (kJsonSchema), regex (kRegex) or GBNF (kGbnf)
  std::vector<std::string> choices;  // kChoice
  // kJsonSchema: literal text around the value (a tool call's markup).
  std::string prefix, suffix;
  bool empty() const { return kind == ConstraintKind::kNone; }
};

// Compiles a spec without a vocabulary (errors name the schema path or the limit).
Expected<std::shared_ptr<const Grammar>> compile_constraint(const ConstraintSpec& spec, const GrammarOptions& opts);

class GrammarCache {
 public:
  // capacity: distinct constraints kept; max_bytes: their memory (least recently
  // used dropped first, see above).
  static constexpr size_t kDefaultMaxBytes = 32u << 20;
  GrammarCache(std::shared_ptr<const TokenIndex> index, GrammarOptions opts, size_t capacity = 64,
               size_t max_bytes = kDefaultMaxBytes);

  Expected<std::shared_ptr<const CompiledGrammar>> get(const ConstraintSpec& spec);
  const TokenIndex& index() const { return *index_; }
  size_t size() const;
  // Heap bytes of the cached grammars and their masks now.
  size_t bytes() const;
  uint64_t hits() const;
  uint64_t misses() const;

  // The cache key (exposed for tests): kind, canonical text, frame.
  static std::string key_of(const ConstraintSpec& spec);

 private:
  std::shared_ptr<const TokenIndex> index_;
  GrammarOptions opts_;
  // Drops least recently used entries while over capacity_ or max_bytes_, keeping
  // the most recent one; what goes is moved to *dropped (freed by the caller after
  // unlocking). Called with mu_ held.
  void evict_locked(std::vector<std::shared_ptr<const CompiledGrammar>>* dropped);
  size_t bytes_locked() const;

  size_t capacity_;
  size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Slot {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Slot> map_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace pagoda::grammar
