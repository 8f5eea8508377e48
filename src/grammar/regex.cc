#include "grammar/regex.h"

#include <algorithm>
#include <map>
#include <string>

#include "tok/unicode.h"

namespace pagoda::grammar {
namespace {

struct Node {
  enum Kind { kSet, kCat, kAlt, kRep } kind = kSet;
  ByteSet set;
  std::vector<int> kids;
  int min = 0, max = 0;  // kRep; max -1 = unbounded
};

class Parser {
 public:
  Parser(std::string_view re, const GrammarOptions& opts) : re_(re), opts_(opts) {}

  Expected<int> parse_all() {
    PAGODA_ASSIGN_OR_RETURN(int n, parse_alt(0));
    if (pos_ != re_.size()) return err("unbalanced ')'");
    return n;
  }
  std::vector<Node> nodes;

 private:
  Error err(const std::string& what) const {
    return errorf("regex: %s at offset %zu", what.c_str(), pos_);
  }
  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size() - 1);
  }
  int set_node(const ByteSet& s) {
    Node n;
    n.set = s;
    return add(std::move(n));
  }
  int cat(std::vector<int> kids) {
    Node n;
    n.kind = Node::kCat;
    n.kids = std::move(kids);
    return add(std::move(n));
  }
  int literal(std::string_view bytes) {
    std::vector<int> k;
    for (char c : bytes) {
      ByteSet s;
      s.set(static_cast<uint8_t>(c));
      k.push_back(set_node(s));
    }
    return k.size() == 1 ? k[0] : cat(std::move(k));
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.set_range(lo, hi);
    return s;
  }
  // ascii (a set of bytes < 0x80) | any multi-byte UTF-8 character when multi.
  int utf8_class(const ByteSet& ascii, bool multi, const std::vector<std::string>& extra = {}) {
    Node alt;
    alt.kind = Node::kAlt;
    if (!ascii.empty()) alt.kids.push_back(set_node(ascii));
    if (multi) {
      for (const Utf8Seq& u : kUtf8MultiByte) {
        std::vector<int> seq;
        for (int i = 0; i < u.len; ++i) seq.push_back(set_node(range(u.lo[i], u.hi[i])));
        alt.kids.push_back(cat(std::move(seq)));
      }
    }
    for (const std::string& e : extra) alt.kids.push_back(literal(e));
    if (alt.kids.size() == 1) return alt.kids[0];
    return add(std::move(alt));
  }

  bool eof() const { return pos_ >= re_.size(); }
  uint8_t peek() const { return static_cast<uint8_t>(re_[pos_]); }

  // Reads one (possibly multi-byte) literal character's bytes.
  std::string read_char_bytes() {
    const uint8_t c = peek();
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    len = std::min(len, re_.size() - pos_);
    std::string s(re_.substr(pos_, len));
    pos_ += len;
    return s;
  }

  static ByteSet class_d() { return range('0', '9'); }
  static ByteSet class_w() {
    ByteSet s = range('a', 'z');
    s.add(range('A', 'Z'));
    s.add(range('0', '9'));
    s.set('_');
    return s;
  }
  static ByteSet class_s() {
    ByteSet s;
    for (char c : std::string_view(" \t\n\r\f\v")) s.set(static_cast<uint8_t>(c));
    return s;
  }
  static ByteSet ascii_complement(const ByteSet& s) {
    ByteSet out;
    for (int b = 0; b < 0x80; ++b)
      if (!s.has(static_cast<uint8_t>(b))) out.set(static_cast<uint8_t>(b));
    return out;
  }

  // After a backslash. kind: 0 = bytes in `lit`, 1 = class in `cls` (+multi).
  Status parse_escape(std::string& lit, ByteSet& cls, bool& is_class, bool& multi) {
    if (eof()) return err("trailing backslash");
    const char c = static_cast<char>(peek());
    ++pos_;
    is_class = false;
    multi = false;
    switch (c) {
      case 'd': is_class = true; cls = class_d(); return Status::Ok();
      case 'w': is_class = true; cls = class_w(); return Status::Ok();
      case 's': is_class = true; cls = class_s(); return Status::Ok();
      case 'D': is_class = true; multi = true; cls = ascii_complement(class_d()); return Status::Ok();
      case 'W': is_class = true; multi = true; cls = ascii_complement(class_w()); return Status::Ok();
      case 'S': is_class = true; multi = true; cls = ascii_complement(class_s()); return Status::Ok();
      case 'n': lit = "\n"; return Status::Ok();
      case 't': lit = "\t"; return Status::Ok();
      case 'r': lit = "\r"; return Status::Ok();
      case 'f': lit = "\f"; return Status::Ok();
      case 'v': lit = "\v"; return Status::Ok();
      case '0': lit = std::string(1, '\0'); return Status::Ok();
      case 'x':
      case 'u': {
        const size_t n = c == 'x' ? 2 : 4;
        if (pos_ + n > re_.size()) return err(std::string("truncated \\") + c + " escape");
        uint32_t cp = 0;
        for (size_t i = 0; i < n; ++i) {
          const char h = re_[pos_ + i];
          const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (v < 0) return err(std::string("bad hex digit in \\") + c + " escape");
          cp = cp * 16 + static_cast<uint32_t>(v);
        }
        pos_ += n;
        lit.clear();
        tok::append_utf8(lit, cp);
        return Status::Ok();
      }
      case 'b': case 'B': return err("word boundaries (\\b, \\B) are not supported");
      default:
        if (c >= '1' && c <= '9') return err("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return err(std::string("unknown escape \\") + c);
        lit = std::string(1, c);
        return Status::Ok();
    }
  }

  // One member of a character class: a character (its UTF-8 bytes into out) or a
  // class escape like \d (its bytes into cls, *is_class set, *multi when it has
  // non-ASCII members).
  Status parse_class_member(std::string& out, ByteSet& cls, bool& is_class, bool& multi) {
    is_class = multi = false;
    if (peek() != '\\') {
      out = read_char_bytes();
      return Status::Ok();
    }
    ++pos_;
    return parse_escape(out, cls, is_class, multi);
  }

  Expected<int> parse_class() {  // after '['
    bool neg = false;
    if (!eof() && peek() == '^') { neg = true; ++pos_; }
    ByteSet ascii;
    bool multi = false;
    std::vector<std::string> extra;
    bool first = true;
    while (true) {
      if (eof()) return err("unterminated character class");
      if (peek() == ']' && !first) { ++pos_; break; }
      first = false;
      std::string lo;
      ByteSet cls;
      bool is_class = false, m = false;
      PAGODA_TRY(parse_class_member(lo, cls, is_class, m));
      if (is_class) { ascii.add(cls); multi |= m; continue; }
      if (pos_ + 1 < re_.size() && peek() == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        std::string hi;
        PAGODA_TRY(parse_class_member(hi, cls, is_class, m));
        if (is_class) return err("class escape as a range end");
        if (lo.size() != 1 || hi.size() != 1 || static_cast<uint8_t>(lo[0]) >= 0x80 ||
            static_cast<uint8_t>(hi[0]) >= 0x80)
          return err("non-ASCII ranges in character classes are not supported");
        if (lo[0] > hi[0]) return err("reversed range in character class");
        ascii.set_range(static_cast<uint8_t>(lo[0]), static_cast<uint8_t>(hi[0]));
      } else if (lo.size() == 1 && static_cast<uint8_t>(lo[0]) < 0x80) {
        ascii.set(static_cast<uint8_t>(lo[0]));
      } else {
        extra.push_back(lo);
      }
    }
    if (neg) {
      if (!extra.empty() || multi) return err("non-ASCII members in a negated class are not supported");
      return utf8_class(ascii_complement(ascii), true);
    }
    if (ascii.empty() && !multi && extra.empty()) return err("empty character class");
    return utf8_class(ascii, multi, extra);
  }

  Expected<int> parse_atom() {
    const char c = static_cast<char>(peek());
    if (c == '(') {
      ++pos_;
      if (!eof() && peek() == '?') {
        ++pos_;
        if (!eof() && peek() == ':') {
          ++pos_;
        } else if (!eof() && (peek() == '<' || peek() == 'P')) {
          if (peek() == 'P') ++pos_;
          if (eof() || peek() != '<') return err("bad group syntax");
          if (pos_ + 1 < re_.size() && (re_[pos_ + 1] == '=' || re_[pos_ + 1] == '!'))
            return err("lookbehind is not supported");
          const size_t close = re_.find('>', pos_);
          if (close == std::string_view::npos) return err("unterminated group name");
          pos_ = close + 1;
        } else {
          return err("lookaround and inline flags are not supported");
        }
      }
      if (++depth_ > 256) return err("groups nested deeper than 256");
      PAGODA_ASSIGN_OR_RETURN(int n, parse_alt(depth_));
      --depth_;
      if (eof() || peek() != ')') return err("missing ')'");
      ++pos_;
      return n;
    }
    if (c == '[') { ++pos_; return parse_class(); }
    if (c == '.') {
      ++pos_;
      ByteSet s = range(0, 0x7F);
      s.w[0] &= ~(uint64_t{1} << '\n');
      return utf8_class(s, true);
    }
    if (c == '\\') {
      ++pos_;
      std::string lit;
      ByteSet cls;
      bool is_class = false, multi = false;
      PAGODA_TRY(parse_escape(lit, cls, is_class, multi));
      if (is_class) return utf8_class(cls, multi);
      return literal(lit);
    }
    if (c == '^' || c == '$') return err("anchors are supported only at the ends of the regex");
    if (c == '*' || c == '+' || c == '?') return err("quantifier without an operand");
    if (c == ')') return err("unbalanced ')'");
    return literal(read_char_bytes());
  }

  // Parses a decimal at pos_; -1 when absent.
  long read_int() {
    if (eof() || peek() < '0' || peek() > '9') return -1;
    long v = 0;
    while (!eof() && peek() >= '0' && peek() <= '9') {
      v = std::min<long>(v * 10 + (peek() - '0'), 1L << 30);
      ++pos_;
    }
    return v;
  }

  Expected<int> parse_repeat() {
    PAGODA_ASSIGN_OR_RETURN(int atom, parse_atom());
    while (!eof()) {
      const char c = static_cast<char>(peek());
      long lo, hi;
      if (c == '*') { lo = 0; hi = -1; ++pos_; }
      else if (c == '+') { lo = 1; hi = -1; ++pos_; }
      else if (c == '?') { lo = 0; hi = 1; ++pos_; }
      else if (c == '{') {
        const size_t save = pos_;
        ++pos_;
        lo = read_int();
        hi = lo;
        if (!eof() && peek() == ',') { ++pos_; hi = read_int(); }
        if (lo < 0 || eof() || peek() != '}') {  // not a quantifier: a literal '{'
          pos_ = save;
          break;
        }
        ++pos_;
        if (hi >= 0 && hi < lo) return err("{n,m} with m < n");
      } else {
        break;
      }
      if (static_cast<size_t>(lo) > opts_.max_repeat || (hi >= 0 && static_cast<size_t>(hi) > opts_.max_repeat))
        return errorf("regex: repetition count above max_repeat=%zu at offset %zu", opts_.max_repeat, pos_);
      if (!eof() && peek() == '?') ++pos_;                        // lazy: same language
      else if (!eof() && peek() == '+') return err("possessive quantifiers are not supported");
      Node n;
      n.kind = Node::kRep;
      n.kids = {atom};
      n.min = static_cast<int>(lo);
      n.max = static_cast<int>(hi);
      atom = add(std::move(n));
    }
    return atom;
  }

  Expected<int> parse_cat() {
    std::vector<int> kids;
    while (!eof() && peek() != '|' && peek() != ')') {
      PAGODA_ASSIGN_OR_RETURN(int k, parse_repeat());
      kids.push_back(k);
    }
    if (kids.size() == 1) return kids[0];
    return cat(std::move(kids));  // empty cat = the empty string
  }

  Expected<int> parse_alt(int) {
    Node alt;
    alt.kind = Node::kAlt;
    PAGODA_ASSIGN_OR_RETURN(int first, parse_cat());
    alt.kids.push_back(first);
    while (!eof() && peek() == '|') {
      ++pos_;
      PAGODA_ASSIGN_OR_RETURN(int k, parse_cat());
      alt.kids.push_back(k);
    }
    if (alt.kids.size() == 1) return alt.kids[0];
    return add(std::move(alt));
  }

  std::string_view re_;
  const GrammarOptions& opts_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Thompson NFA: each state has epsilon edges and at most one byte-class edge.
struct Nfa {
  struct State {
    std::vector<int> eps;
    int set = -1;  // index into sets, -1 none
    int to = -1;
  };
  std::vector<State> st;
  std::vector<ByteSet> sets;
  size_t limit = 0;
  bool overflow = false;

  int new_state() {
    if (st.size() >= limit) { overflow = true; return 0; }
    st.emplace_back();
    return static_cast<int>(st.size() - 1);
  }
  // Builds node n between fresh states; returns {start, end}.
  std::pair<int, int> build(const std::vector<Node>& nodes, int n) {
    if (overflow) return {0, 0};
    const Node& nd = nodes[static_cast<size_t>(n)];
    switch (nd.kind) {
      case Node::kSet: {
        const int s = new_state(), t = new_state();
        if (overflow) return {0, 0};
        sets.push_back(nd.set);
        st[s].set = static_cast<int>(sets.size() - 1);
        st[s].to = t;
        return {s, t};
      }
      case Node::kCat: {
        const int s = new_state();
        int cur = s;
        for (int k : nd.kids) {
          auto [a, b] = build(nodes, k);
          if (overflow) return {0, 0};
          st[cur].eps.push_back(a);
          cur = b;
        }
        return {s, cur};
      }
      case Node::kAlt: {
        const int s = new_state(), t = new_state();
        for (int k : nd.kids) {
          auto [a, b] = build(nodes, k);
          if (overflow) return {0, 0};
          st[s].eps.push_back(a);
          st[b].eps.push_back(t);
        }
        return {s, t};
      }
      case Node::kRep: {
        const int s = new_state();
        int cur = s;
        for (int i = 0; i < nd.min; ++i) {
          auto [a, b] = build(nodes, nd.kids[0]);
          if (overflow) return {0, 0};
          st[cur].eps.push_back(a);
          cur = b;
        }
        if (nd.max < 0) {
          auto [a, b] = build(nodes, nd.kids[0]);
          const int t = new_state();
          if (overflow) return {0, 0};
          st[cur].eps.push_back(a);
          st[cur].eps.push_back(t);
          st[b].eps.push_back(cur);
          return {s, t};
        }
        const int t = new_state();
        for (int i = nd.min; i < nd.max; ++i) {
          auto [a, b] = build(nodes, nd.kids[0]);
          if (overflow) return {0, 0};
          st[cur].eps.push_back(a);
          st[cur].eps.push_back(t);
          cur = b;
        }
        if (overflow) return {0, 0};
        st[cur].eps.push_back(t);
        return {s, t};
      }
    }
    return {0, 0};
  }
};

void closure(const Nfa& nfa, std::vector<int>& set, std::vector<uint8_t>& seen, size_t& work) {
  std::vector<int> todo(set.begin(), set.end());
  for (int s : set) seen[static_cast<size_t>(s)] = 1;
  while (!todo.empty()) {
    const int s = todo.back();
    todo.pop_back();
    for (int t : nfa.st[static_cast<size_t>(s)].eps) {
      ++work;
      if (!seen[static_cast<size_t>(t)]) {
        seen[static_cast<size_t>(t)] = 1;
        set.push_back(t);
        todo.push_back(t);
      }
    }
  }
  for (int s : set) seen[static_cast<size_t>(s)] = 0;
  std::sort(set.begin(), set.end());
}

}  // namespace

Expected<Dfa> compile_regex(std::string_view re, const GrammarOptions& opts, bool search) {
  if (re.size() > opts.max_regex_length)
    return errorf("regex: length %zu > max_regex_length=%zu", re.size(), opts.max_regex_length);
  bool anchored_start = false, anchored_end = false;
  if (!re.empty() && re.front() == '^') { anchored_start = true; re.remove_prefix(1); }
  if (!re.empty() && re.back() == '$') {
    size_t bs = 0;
    for (size_t i = re.size() - 1; i > 0 && re[i - 1] == '\\'; --i) ++bs;
    if (bs % 2 == 0) { anchored_end = true; re.remove_suffix(1); }
  }
  Parser p(re, opts);
  PAGODA_ASSIGN_OR_RETURN(int root, p.parse_all());
  std::vector<Node> nodes = std::move(p.nodes);
  if (search) {
    // Unanchored search = .* X .* with . matching every UTF-8 character.
    auto any_star = [&]() {
      auto set_node = [&](uint8_t lo, uint8_t hi) {
        Node n;
        n.set.set_range(lo, hi);
        nodes.push_back(n);
        return static_cast<int>(nodes.size() - 1);
      };
      Node alt;
      alt.kind = Node::kAlt;
      alt.kids.push_back(set_node(0, 0x7F));
      for (const Utf8Seq& u : kUtf8MultiByte) {
        Node seq;
        seq.kind = Node::kCat;
        for (int i = 0; i < u.len; ++i) seq.kids.push_back(set_node(u.lo[i], u.hi[i]));
        nodes.push_back(seq);
        alt.kids.push_back(static_cast<int>(nodes.size() - 1));
      }
      nodes.push_back(alt);
      Node star;
      star.kind = Node::kRep;
      star.kids = {static_cast<int>(nodes.size() - 1)};
      star.min = 0;
      star.max = -1;
      nodes.push_back(star);
      return static_cast<int>(nodes.size() - 1);
    };
    Node c;
    c.kind = Node::kCat;
    if (!anchored_start) c.kids.push_back(any_star());
    c.kids.push_back(root);
    if (!anchored_end) c.kids.push_back(any_star());
    nodes.push_back(c);
    root = static_cast<int>(nodes.size() - 1);
  }

  Nfa nfa;
  nfa.limit = opts.max_regex_states * 8;
  // Plain variables, not a structured binding: the lambdas below capture
  // final_state, which clang before 16 refuses for a binding (the fuzz build).
  const auto built = nfa.build(nodes, root);
  const auto start = built.first;
  const auto final_state = built.second;
  if (nfa.overflow)
    return errorf("regex: too large, NFA over %zu states (8 x max_regex_states=%zu)", nfa.limit,
                  opts.max_regex_states);

  // Subset construction with a work budget: hostile regexes fail here, fast.
  const size_t work_budget = 64u * 1024 * 1024;
  size_t work = 0;
  std::vector<uint8_t> seen(nfa.st.size(), 0);
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> subsets;
  Dfa dfa;
  auto intern = [&](std::vector<int> set) -> Expected<int> {
    closure(nfa, set, seen, work);
    // Only states with a byte edge (and the final state) decide the future:
    // dropping pure-epsilon states merges equivalent subsets.
    std::erase_if(set, [&](int s) { return nfa.st[static_cast<size_t>(s)].set < 0 && s != final_state; });
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (subsets.size() >= opts.max_regex_states)
      return errorf("regex: too complex, DFA over max_regex_states=%zu states", opts.max_regex_states);
    const int id = static_cast<int>(subsets.size());
    ids.emplace(set, id);
    dfa.accept.push_back(std::binary_search(set.begin(), set.end(), final_state) ? 1 : 0);
    std::array<int32_t, 256> none;
    none.fill(-1);
    dfa.next.push_back(none);
    subsets.push_back(std::move(set));
    return id;
  };
  PAGODA_TRY(intern({start}));
  std::vector<std::vector<int>> by_byte(256);
  for (size_t d = 0; d < subsets.size(); ++d) {
    for (auto& v : by_byte) v.clear();
    for (int s : subsets[d]) {
      const auto& ns = nfa.st[static_cast<size_t>(s)];
      if (ns.set < 0) continue;
      const ByteSet& bs = nfa.sets[static_cast<size_t>(ns.set)];
      for (int b = 0; b < 256; ++b)
        if (bs.has(static_cast<uint8_t>(b))) by_byte[static_cast<size_t>(b)].push_back(ns.to);
      work += 256;
    }
    std::map<std::vector<int>, int> local;  // many bytes share a target subset
    for (int b = 0; b < 256; ++b) {
      auto& v = by_byte[static_cast<size_t>(b)];
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      auto it = local.find(v);
      int target;
      if (it != local.end()) {
        target = it->second;
      } else {
        PAGODA_ASSIGN_OR_RETURN(target, intern(v));
        local.emplace(v, target);
      }
      dfa.next[d][static_cast<size_t>(b)] = target;
    }
    if (work > work_budget)
      return errorf("regex: too complex, subset construction over its work budget (max_regex_states=%zu)",
                    opts.max_regex_states);
  }

  // Drop states from which no accepting state is reachable (their transitions
  // would let the matcher walk into a dead end).
  const size_t n = dfa.next.size();
  std::vector<uint8_t> live(dfa.accept.begin(), dfa.accept.end());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < n; ++s) {
      if (live[s]) continue;
      for (int32_t t : dfa.next[s])
        if (t >= 0 && live[static_cast<size_t>(t)]) { live[s] = 1; changed = true; break; }
    }
  }
  if (!live[0]) return make_error("regex: matches no string");
  for (auto& row : dfa.next)
    for (int32_t& t : row)
      if (t >= 0 && !live[static_cast<size_t>(t)]) t = -1;
  return dfa;
}

Expected<uint32_t> add_dfa_rules(GrammarBuilder& gb, const Dfa& dfa, bool json_string,
                                 const std::string& name_prefix) {
  const size_t n = dfa.next.size();
  if (gb.num_rules() + n > gb.options().max_rules)
    return errorf("grammar too large: more than max_rules=%zu rules", gb.options().max_rules);
  std::vector<uint32_t> rule(n);
  for (size_t s = 0; s < n; ++s) rule[s] = gb.new_rule(name_prefix + std::to_string(s));
  // Unreachable states (pruned transitions) still get rules; they are harmless.
  for (size_t s = 0; s < n; ++s) {
    if (dfa.accept[s]) PAGODA_TRY(gb.add_alt(rule[s], {}));
    std::map<int32_t, ByteSet> by_target;
    for (int b = 0; b < 256; ++b) {
      const int32_t t = dfa.next[s][static_cast<size_t>(b)];
      if (t < 0) continue;
      const uint32_t tr = rule_elem(rule[static_cast<size_t>(t)]);
      if (json_string && (b == '"' || b == '\\')) {
        PAGODA_TRY(gb.add_alt(rule[s], {gb.byte('\\'), gb.byte(static_cast<uint8_t>(b)), tr}));
      } else if (json_string && b < 0x20) {
        static const char* hex = "0123456789abcdef";
        std::vector<uint32_t> seq;
        gb.append_literal(seq, "\\u00");
        seq.push_back(gb.byte(static_cast<uint8_t>(hex[b >> 4])));
        seq.push_back(gb.byte(static_cast<uint8_t>(hex[b & 15])));
        seq.push_back(tr);
        PAGODA_TRY(gb.add_alt(rule[s], seq));
      } else {
        by_target[t].set(static_cast<uint8_t>(b));
      }
    }
    for (auto& [t, set] : by_target)
      PAGODA_TRY(gb.add_alt(rule[s], {gb.bytes(set), rule_elem(rule[static_cast<size_t>(t)])}));
  }
  if (n > 0 && dfa.next.empty()) return make_error("regex: empty DFA");
  return rule[0];
}

Expected<std::shared_ptr<const Grammar>> Grammar::from_regex(std::string_view regex, const GrammarOptions& opts) {
  PAGODA_ASSIGN_OR_RETURN(Dfa dfa, compile_regex(regex, opts, false));
  GrammarBuilder gb(opts);
  PAGODA_ASSIGN_OR_RETURN(uint32_t root, add_dfa_rules(gb, dfa, false, "re"));
  return gb.finish(root);
}

}  // namespace pagoda::grammar
