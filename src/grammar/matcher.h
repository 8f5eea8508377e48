// Per-step token masks for a grammar over a vocabulary.
//
// CompiledGrammar (one per grammar x TokenIndex, shared, thread-safe) caches, for
// a parse-stack "context" (its top kContextFrames frames), which tokens are
// accepted no matter what lies below (a bitset) and which depend on the frames
// below (a short list checked per step against the full stack). A context is
// computed the first time a matcher meets it, by one walk over the vocabulary
// trie (shared prefixes advanced once, dead subtrees skipped); later steps cost
// a bitset OR plus the few context-dependent tokens.
//
// Matcher (one per sequence) is a small copyable value: the set of parse stacks.
// Copy it for n>1 forks; rebuild it after preemption or a prefix-cache hit by
// replaying the accepted tokens (replay()).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_index.h"

namespace pagoda::grammar {

// Frames of the stack top that key the cache. More frames: fewer tokens left to
// the per-step check, more distinct contexts to precompute.
inline constexpr size_t kContextFrames = 3;

class CompiledGrammar {
 public:
  struct Entry {
    std::vector<uint32_t> accepted;  // [mask_words] tokens valid from this context alone
    std::vector<int32_t> dependent;  // tokens that pop below the context: check per step
  };
  struct Stats {
    size_t contexts = 0;         // cached contexts
    size_t dependent_total = 0;  // sum of dependent list sizes
  };

  CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenIndex> ti);
  ~CompiledGrammar();

  const Grammar& grammar() const { return *g_; }
  const TokenIndex& index() const { return *ti_; }
  // The entry for the context at the top of stack s (non-empty). Thread-safe: a
  // context being computed by another thread is waited for, not computed twice
  // (32 streams in lockstep meet a new context together).
  std::shared_ptr<const Entry> entry(const Stack& s) const;
  // Contexts kept per grammar (~6 KiB each for a 49k vocabulary); past this,
  // new contexts are computed on each use and not kept.
  static constexpr size_t kMaxContexts = 8192;
  Stats stats() const;
  // Heap bytes held: the grammar and the contexts cached so far (it grows as
  // matchers meet new contexts, up to kMaxContexts). Lock-free.
  size_t memory_bytes() const { return grammar_bytes_ + contexts_bytes_.load(std::memory_order_relaxed); }

 private:
  struct KeyHash {
    size_t operator()(const Stack& k) const;
  };
  std::unique_ptr<Entry> compute(const Stack& key) const;

  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const TokenIndex> ti_;
  mutable std::shared_mutex mu_;  // guards cache_
  mutable std::unordered_map<Stack, std::shared_ptr<const Entry>, KeyHash> cache_;
  size_t grammar_bytes_ = 0;
  mutable std::atomic<size_t> contexts_bytes_{0};  // the entries and keys in cache_
  mutable std::mutex progress_mu_;  // guards in_progress_
  mutable std::condition_variable progress_cv_;
  mutable std::vector<Stack> in_progress_;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> cg);

  // mask: mask_words() uint32 words; bit t set = token t keeps the output valid.
  // End-of-generation tokens are set exactly when can_end().
  void fill_mask(std::span<uint32_t> mask) const;
  size_t mask_words() const { return cg_->index().mask_words(); }
  // Advances by one token. False (and no change) when the token is not allowed.
  bool accept(int32_t token);
  // Advances by raw bytes (tests, forced prefixes). False (and no change) if invalid.
  bool accept_bytes(std::string_view bytes);
  // Replays accepted tokens from the start; false if one is rejected (the matcher
  // is then left at the start state).
  bool replay(std::span<const int32_t> tokens);
  void reset();

  // The output so far is a complete string of the grammar.
  bool can_end() const;
  // An end-of-generation token was accepted, or nothing but the end is possible.
  bool is_finished() const;
  // Would these bytes keep the output valid (without advancing)?
  bool accepts_bytes(std::string_view bytes) const;
  const std::vector<Stack>& stacks() const { return stacks_; }

 private:
  std::shared_ptr<const CompiledGrammar> cg_;
  std::vector<Stack> stacks_;
  bool ended_ = false;  // accepted an end-of-generation token
};

}  // namespace pagoda::grammar
