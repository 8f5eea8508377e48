#include "grammar/matcher.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace pagoda::grammar {

namespace {

Stack context_key(const Stack& s) {
  const size_t k = std::min(s.size(), kContextFrames);
  return Stack(s.end() - static_cast<std::ptrdiff_t>(k), s.end());
}

bool run_bytes(const Grammar& g, std::vector<Stack>& cur, std::string_view bytes, std::vector<Stack>& tmp) {
  for (char c : bytes) {
    if (!advance_stacks(g, cur, static_cast<uint8_t>(c), tmp)) return false;
    cur.swap(tmp);
  }
  return true;
}

}  // namespace

size_t CompiledGrammar::KeyHash::operator()(const Stack& k) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ k.size();
  for (uint32_t v : k) h = (h ^ v) * 0x100000001B3ull + (h >> 29);
  return static_cast<size_t>(h);
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenIndex> ti)
    : g_(std::move(g)), ti_(std::move(ti)), grammar_bytes_(sizeof(CompiledGrammar) + g_->memory_bytes()) {}
CompiledGrammar::~CompiledGrammar() = default;

std::shared_ptr<const CompiledGrammar::Entry> CompiledGrammar::entry(const Stack& s) const {
  Stack key = context_key(s);
  auto lookup = [&]() -> std::shared_ptr<const Entry> {
    std::shared_lock lock(mu_);
    auto it = cache_.find(key);
    return it == cache_.end() ? nullptr : it->second;
  };
  if (auto e = lookup()) return e;
  {
    std::unique_lock lk(progress_mu_);
    progress_cv_.wait(lk, [&] {
      return std::find(in_progress_.begin(), in_progress_.end(), key) == in_progress_.end();
    });
    // A finisher stores its entry before leaving in_progress_, so this sees it.
    if (auto e = lookup()) return e;
    in_progress_.push_back(key);
  }
  std::shared_ptr<const Entry> e = compute(key);
  {
    std::unique_lock lock(mu_);
    if (cache_.size() < kMaxContexts && cache_.emplace(key, e).second) {
      // The entry, its shared_ptr control block, the key and the hash node (approximate overheads).
      const size_t bytes = sizeof(Entry) + 32 + e->accepted.capacity() * sizeof(uint32_t) +
                           e->dependent.capacity() * sizeof(int32_t) + key.capacity() * sizeof(uint32_t) + 64;
      contexts_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  {
    std::lock_guard lk(progress_mu_);
    in_progress_.erase(std::find(in_progress_.begin(), in_progress_.end(), key));
  }
  progress_cv_.notify_all();
  return e;
}

CompiledGrammar::Stats CompiledGrammar::stats() const {
  std::shared_lock lock(mu_);
  Stats st;
  st.contexts = cache_.size();
  for (auto& [k, e] : cache_) st.dependent_total += e->dependent.size();
  return st;
}

// One preorder walk of the vocabulary trie from the context alone. A walk state
// is a set of stacks plus at_base (some stack popped below the context: the
// bytes so far are fine if the frames below accept the rest). Distinct sets are
// few (inside a string every prefix leads to the same set), so sets are interned
// and their byte transitions memoized: most trie nodes cost one table lookup.
// Per depth we keep the set id and `dependent` (at_base happened earlier on the
// path: more bytes need the frames below).
std::unique_ptr<CompiledGrammar::Entry> CompiledGrammar::compute(const Stack& key) const {
  const Grammar& g = *g_;
  const TokenIndex& ti = *ti_;
  auto e = std::make_unique<Entry>();
  e->accepted.assign(ti.mask_words(), 0);

  struct Collect {  // expand_stack_into sink
    std::vector<Stack> stacks;
    bool at_base = false;
    void add(const Stack& s) {
      if (s.empty()) at_base = true;
      else if (stacks.size() < kMaxStacks) stacks.push_back(s);
    }
  };
  struct SetNode {
    std::vector<Stack> stacks;  // sorted, unique, non-empty stacks
    bool at_base = false;
    std::array<int32_t, 256> next;  // -2 unknown, -1 dead
  };
  struct SetKeyHash {
    size_t operator()(const std::pair<std::vector<Stack>, bool>& k) const {
      uint64_t h = k.second ? 0x51ED27ull : 0x1234567ull;
      for (const Stack& s : k.first) h = h * 0x100000001B3ull ^ CompiledGrammar::KeyHash{}(s);
      return static_cast<size_t>(h);
    }
  };
  std::vector<SetNode> sets;
  std::unordered_map<std::pair<std::vector<Stack>, bool>, int32_t, SetKeyHash> ids;
  auto intern = [&](Collect&& c) -> int32_t {
    if (c.stacks.empty() && !c.at_base) return -1;
    std::sort(c.stacks.begin(), c.stacks.end());
    c.stacks.erase(std::unique(c.stacks.begin(), c.stacks.end()), c.stacks.end());
    auto k = std::make_pair(std::move(c.stacks), c.at_base);
    auto it = ids.find(k);
    if (it != ids.end()) return it->second;
    SetNode sn;
    sn.stacks = k.first;
    sn.at_base = k.second;
    sn.next.fill(-2);
    sets.push_back(std::move(sn));
    const int32_t id = static_cast<int32_t>(sets.size() - 1);
    ids.emplace(std::move(k), id);
    return id;
  };
  Stack tmp;
  auto step = [&](int32_t sid, uint8_t b) -> int32_t {
    if (sets[static_cast<size_t>(sid)].next[b] != -2) return sets[static_cast<size_t>(sid)].next[b];
    Collect c;
    for (const Stack& s : sets[static_cast<size_t>(sid)].stacks) {
      const uint32_t p = s.back();
      if (!g.byte_set(elem_arg(g.elements()[p])).has(b)) continue;
      tmp.assign(s.begin(), s.end() - 1);
      if (g.elements()[p + 1] != kEnd) tmp.push_back(p + 1);
      expand_stack_into(g, tmp, c);
    }
    const int32_t r = intern(std::move(c));
    sets[static_cast<size_t>(sid)].next[b] = r;
    return r;
  };

  struct Level {
    int32_t sid = -1;
    bool dependent = false;
  };
  std::vector<Level> level(ti.max_token_bytes() + 2);
  {
    Collect c;
    c.add(key);
    level[0].sid = intern(std::move(c));
  }
  const auto& nodes = ti.nodes();
  const auto& toks = ti.tokens();
  auto mark_accepted = [&](const TokenIndex::Node& nd) {
    for (uint32_t i = 0; i < nd.tok_count; ++i) {
      const int32_t t = toks[nd.tok_begin + i];
      e->accepted[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
    }
  };
  auto mark_dependent = [&](uint32_t from, uint32_t to) {
    for (uint32_t n = from; n < to; ++n)
      for (uint32_t i = 0; i < nodes[n].tok_count; ++i) e->dependent.push_back(toks[nodes[n].tok_begin + i]);
  };
  for (uint32_t i = 1; i < nodes.size();) {
    const TokenIndex::Node& nd = nodes[i];
    const Level& parent = level[nd.depth - 1u];
    Level& cur = level[nd.depth];
    const SetNode& ps = sets[static_cast<size_t>(parent.sid)];
    cur.dependent = parent.dependent || ps.at_base;
    cur.sid = ps.stacks.empty() ? -1 : step(parent.sid, nd.byte);
    const bool live = cur.sid >= 0 && !sets[static_cast<size_t>(cur.sid)].stacks.empty();
    if (cur.sid >= 0) {
      mark_accepted(nd);  // some stack alive, or the context completed exactly here
    } else if (cur.dependent) {
      mark_dependent(i, i + 1);
    } else {
      i = nd.end;  // nothing under here can be valid
      continue;
    }
    if (!live) {
      // Only the frames below can take more bytes: the whole subtree depends on them.
      mark_dependent(i + 1, nd.end);
      i = nd.end;
      continue;
    }
    ++i;
  }
  std::sort(e->dependent.begin(), e->dependent.end());
  return e;
}

// ---------------------------------------------------------------- Matcher

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> cg) : cg_(std::move(cg)) { reset(); }

void Matcher::reset() {
  stacks_ = initial_stacks(cg_->grammar());
  ended_ = false;
}

bool Matcher::can_end() const {
  if (ended_) return false;
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool Matcher::is_finished() const {
  if (ended_) return true;
  for (const Stack& s : stacks_)
    if (!s.empty()) return false;
  return true;
}

void Matcher::fill_mask(std::span<uint32_t> mask) const {
  const TokenIndex& ti = cg_->index();
  const size_t words = std::min(mask.size(), ti.mask_words());
  std::memset(mask.data(), 0, mask.size() * sizeof(uint32_t));
  if (ended_) return;
  const Grammar& g = cg_->grammar();
  std::vector<Stack> cur, tmp;
  bool end = false;
  for (const Stack& s : stacks_) {
    if (s.empty()) {
      end = true;
      continue;
    }
    const std::shared_ptr<const CompiledGrammar::Entry> ep = cg_->entry(s);
    const CompiledGrammar::Entry& e = *ep;
    const uint32_t* a = e.accepted.data();
    for (size_t w = 0; w < words; ++w) mask[w] |= a[w];
    if (e.dependent.empty()) continue;
    const bool whole = s.size() <= kContextFrames;  // the context was the whole stack
    for (int32_t t : e.dependent) {
      uint32_t& word = mask[static_cast<size_t>(t) >> 5];
      const uint32_t bit = 1u << (t & 31);
      if (whole || (word & bit)) continue;  // nothing below: popping past it is the end
      cur.assign(1, s);
      if (run_bytes(g, cur, ti.token_bytes(t), tmp)) word |= bit;
    }
  }
  if (end)
    for (int32_t t : ti.eog_ids())
      if (static_cast<size_t>(t >> 5) < words) mask[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
}

bool Matcher::accept(int32_t token) {
  const TokenIndex& ti = cg_->index();
  if (ended_ || token < 0 || token >= ti.vocab_size()) return false;
  if (ti.is_eog(token)) {
    if (!can_end()) return false;
    ended_ = true;
    return true;
  }
  const std::string& b = ti.token_bytes(token);
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (ended_) return false;
  std::vector<Stack> cur = stacks_, tmp;
  if (!run_bytes(cg_->grammar(), cur, bytes, tmp)) return false;
  stacks_.swap(cur);
  return true;
}

bool Matcher::accepts_bytes(std::string_view bytes) const {
  if (ended_) return false;
  std::vector<Stack> cur = stacks_, tmp;
  return run_bytes(cg_->grammar(), cur, bytes, tmp);
}

bool Matcher::replay(std::span<const int32_t> tokens) {
  reset();
  for (int32_t t : tokens)
    if (!accept(t)) {
      reset();
      return false;
    }
  return true;
}

}  // namespace pagoda::grammar
