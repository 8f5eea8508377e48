#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>

namespace pagoda::grammar {

// ---------------------------------------------------------------- builder

uint32_t GrammarBuilder::new_rule(std::string name) {
  g_->alts_.emplace_back();
  g_->names_.push_back(std::move(name));
  return static_cast<uint32_t>(g_->alts_.size() - 1);
}

Status GrammarBuilder::add_alt(uint32_t rule, const std::vector<uint32_t>& seq) {
  if (g_->alts_.size() > opts_.max_rules)
    return errorf("grammar too large: more than max_rules=%zu rules", opts_.max_rules);
  if (g_->elems_.size() + seq.size() + 1 > opts_.max_elements)
    return errorf("grammar too large: more than max_elements=%zu elements", opts_.max_elements);
  g_->alts_[rule].push_back(static_cast<uint32_t>(g_->elems_.size()));
  g_->elems_.insert(g_->elems_.end(), seq.begin(), seq.end());
  g_->elems_.push_back(kEnd);
  return Status::Ok();
}

uint32_t GrammarBuilder::bytes(const ByteSet& set) {
  // Most grammars use a few dozen distinct classes; a linear scan is fine and
  // keeps the ids dense.
  for (const auto& [s, id] : set_index_)
    if (s == set) return bytes_elem(id);
  const uint32_t id = static_cast<uint32_t>(g_->sets_.size());
  g_->sets_.push_back(set);
  set_index_.emplace_back(set, id);
  return bytes_elem(id);
}

uint32_t GrammarBuilder::byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return bytes(s);
}

void GrammarBuilder::append_literal(std::vector<uint32_t>& seq, std::string_view s) {
  for (char c : s) seq.push_back(byte(static_cast<uint8_t>(c)));
}

Expected<std::shared_ptr<const Grammar>> GrammarBuilder::finish(uint32_t root) {
  Grammar& g = *g_;
  const size_t n = g.alts_.size();
  if (n > opts_.max_rules) return errorf("grammar too large: %zu rules > max_rules=%zu", n, opts_.max_rules);
  if (root >= n) return errorf("grammar: root rule %u undefined", root);
  for (size_t r = 0; r < n; ++r)
    if (g.alts_[r].empty()) return errorf("grammar: rule '%s' has no alternatives", g.names_[r].c_str());
  // Nullable rules (fixpoint), then the "leftmost reference" graph: r -> q when q
  // can be expanded without consuming a byte. A cycle there is left recursion,
  // on which expand_stack would never terminate.
  std::vector<uint8_t> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (uint32_t p : g.alts_[r]) {
        bool all = true;
        for (; g.elems_[p] != kEnd; ++p) {
          const uint32_t e = g.elems_[p];
          if (elem_kind(e) != ElemKind::kRule || !nullable[elem_arg(e)]) { all = false; break; }
        }
        if (all) { nullable[r] = 1; changed = true; break; }
      }
    }
  }
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (uint32_t p : g.alts_[r])
      for (; g.elems_[p] != kEnd; ++p) {
        const uint32_t e = g.elems_[p];
        if (elem_kind(e) != ElemKind::kRule) break;
        left[r].push_back(elem_arg(e));
        if (!nullable[elem_arg(e)]) break;
      }
  // Iterative DFS (rule counts can be large; no recursion on the C++ stack).
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;
  for (size_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    path.emplace_back(static_cast<uint32_t>(s), 0);
    color[s] = 1;
    while (!path.empty()) {
      auto& [r, i] = path.back();
      if (i < left[r].size()) {
        const uint32_t q = left[r][i++];
        if (color[q] == 1)
          return errorf("grammar: left recursion through rule '%s'", g.names_[q].c_str());
        if (color[q] == 0) { color[q] = 1; path.emplace_back(q, 0); }
      } else {
        color[r] = 2;
        path.pop_back();
      }
    }
  }
  g.root_ = root;
  return std::shared_ptr<const Grammar>(std::move(g_));
}

// ---------------------------------------------------------------- matching core

namespace {
struct VectorOut {
  std::vector<Stack>& v;
  void add(const Stack& s) {
    if (v.size() < kMaxStacks) v.push_back(s);
  }
};
}  // namespace

void expand_stack(const Grammar& g, Stack& s, std::vector<Stack>& out) {
  VectorOut o{out};
  expand_stack_into(g, s, o);
}

static void sort_unique(std::vector<Stack>& v) {
  if (v.size() < 2) return;
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

std::vector<Stack> initial_stacks(const Grammar& g) {
  std::vector<Stack> out;
  for (uint32_t a : g.alternatives(g.root())) {
    Stack s;
    if (g.elements()[a] != kEnd) s.push_back(a);
    expand_stack(g, s, out);
  }
  sort_unique(out);
  return out;
}

bool advance_stacks(const Grammar& g, const std::vector<Stack>& in, uint8_t b, std::vector<Stack>& out) {
  out.clear();
  Stack tmp;
  for (const Stack& s : in) {
    if (s.empty()) continue;
    const uint32_t p = s.back();
    if (!g.byte_set(elem_arg(g.elements()[p])).has(b)) continue;
    tmp.assign(s.begin(), s.end() - 1);
    if (g.elements()[p + 1] != kEnd) tmp.push_back(p + 1);
    expand_stack(g, tmp, out);
  }
  sort_unique(out);
  return !out.empty();
}

static bool run(const Grammar& g, std::string_view s, bool prefix) {
  std::vector<Stack> cur = initial_stacks(g), next;
  for (char c : s) {
    if (!advance_stacks(g, cur, static_cast<uint8_t>(c), next)) return false;
    cur.swap(next);
  }
  if (prefix) return !cur.empty();
  for (const Stack& st : cur)
    if (st.empty()) return true;
  return false;
}

bool Grammar::matches(std::string_view s) const { return run(*this, s, false); }
bool Grammar::matches_prefix(std::string_view s) const { return run(*this, s, true); }

// ---------------------------------------------------------------- debugging

static std::string set_to_string(const ByteSet& s) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!s.has(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    auto put = [&](int c) {
      char buf[8];
      if (c >= 0x21 && c < 0x7f && c != '\\' && c != ']' && c != '-') {
        out.push_back(static_cast<char>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\x%02X", c);
        out += buf;
      }
    };
    put(b);
    if (e > b) { out.push_back('-'); put(e); }
    b = e;
  }
  return out + "]";
}

size_t Grammar::memory_bytes() const {
  size_t n = sizeof(Grammar) + elems_.capacity() * sizeof(uint32_t) + sets_.capacity() * sizeof(ByteSet) +
             alts_.capacity() * sizeof(alts_[0]) + names_.capacity() * sizeof(std::string);
  for (const auto& a : alts_) n += a.capacity() * sizeof(uint32_t);
  for (const auto& name : names_)
    if (name.capacity() > std::string().capacity()) n += name.capacity() + 1;  // beyond the inline buffer
  return n;
}

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < alts_.size(); ++r) {
    out += names_[r] + " ::=";
    for (size_t i = 0; i < alts_[r].size(); ++i) {
      if (i) out += " |";
      uint32_t p = alts_[r][i];
      if (elems_[p] == kEnd) out += " \"\"";
      for (; elems_[p] != kEnd; ++p) {
        const uint32_t e = elems_[p];
        out += " ";
        out += elem_kind(e) == ElemKind::kRule ? names_[elem_arg(e)] : set_to_string(sets_[elem_arg(e)]);
      }
    }
    out += "\n";
  }
  return out;
}

// ---------------------------------------------------------------- choices

void ByteTrie::insert(std::string_view s) {
  uint32_t at = 0;
  for (char ch : s) {
    const uint8_t b = static_cast<uint8_t>(ch);
    uint32_t next = UINT32_MAX;
    for (auto& [kb, kn] : nodes[at].kids)
      if (kb == b) next = kn;
    if (next == UINT32_MAX) {
      next = static_cast<uint32_t>(nodes.size());
      nodes[at].kids.emplace_back(b, next);
      nodes.emplace_back();
    }
    at = next;
  }
  nodes[at].end = true;
}

Expected<uint32_t> add_trie_rules(GrammarBuilder& gb, const std::vector<std::string>& strings,
                                  const std::string& name_prefix) {
  // A byte trie of the strings as right-linear rules keeps the grammar
  // deterministic (one stack) however many strings share prefixes.
  ByteTrie bt;
  const std::vector<ByteTrie::Node>& trie = bt.nodes;
  size_t bytes = 0;
  for (const std::string& c : strings) {
    bytes += c.size();
    if (bytes > gb.options().max_elements)
      return errorf("grammar too large: more than max_elements=%zu elements", gb.options().max_elements);
    bt.insert(c);
  }
  if (gb.num_rules() + trie.size() > gb.options().max_rules)
    return errorf("grammar too large: more than max_rules=%zu rules", gb.options().max_rules);
  std::vector<uint32_t> rule(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rule[i] = gb.new_rule(name_prefix + std::to_string(i));
  for (size_t i = 0; i < trie.size(); ++i) {
    if (trie[i].end) PAGODA_TRY(gb.add_alt(rule[i], {}));
    for (auto& [b, k] : trie[i].kids) PAGODA_TRY(gb.add_alt(rule[i], {gb.byte(b), rule_elem(rule[k])}));
  }
  return rule[0];
}

Expected<std::shared_ptr<const Grammar>> Grammar::from_choices(const std::vector<std::string>& choices,
                                                               const GrammarOptions& opts) {
  if (choices.empty()) return make_error("guided_choice: empty list of choices");
  if (choices.size() > opts.max_enum_size)
    return errorf("guided_choice: %zu choices > max_enum_size=%zu", choices.size(), opts.max_enum_size);
  GrammarBuilder gb(opts);
  PAGODA_ASSIGN_OR_RETURN(uint32_t root, add_trie_rules(gb, choices, "choice"));
  return gb.finish(root);
}

}  // namespace pagoda::grammar
