// GBNF (llama.cpp's grammar format, what vLLM's guided_grammar takes) to a Grammar.
//
//   root   ::= "yes" | "no" | item+     # a comment
//   item   ::= [a-z0-9_] ( "," ws )?    # classes, groups, * + ? {m} {m,} {m,n}
//   ws     ::= [ \t\n]*
//
// Rules are `name ::= alternatives`, one per line (inside parentheses and after
// '|' or '::=' a rule may go on over newlines); `root` is the start rule. Terminals
// are string literals and character classes over code points ([^"\\], [\u0100-\uFFFF],
// '.' = any character), compiled to UTF-8 byte sequences, so every output is valid
// UTF-8. Escapes: \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH. Repetitions are
// right-recursive rules ({m,n} is expanded, bounded by max_repeat). Left-recursive
// grammars are refused by GrammarBuilder::finish (the matcher needs none), as is a
// rule that is used but never defined.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "grammar/grammar.h"
#include "tok/unicode.h"

namespace pagoda::grammar {
namespace {

using Range = std::pair<uint32_t, uint32_t>;  // code points, inclusive

// One code point range as UTF-8 byte-range sequences (RE2's split: every sequence
// has one length, and each byte position is a contiguous range).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  static const uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t m : kMax) {
    if (lo <= m && hi > m) {
      utf8_sequences(lo, m, out);
      utf8_sequences(m + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  tok::append_utf8(a, lo);
  tok::append_utf8(b, hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(seq));
}

// Sorted, merged ranges without the surrogates (not characters: never in UTF-8).
std::vector<Range> normalize(std::vector<Range> r) {
  std::vector<Range> cut;
  for (auto [lo, hi] : r) {
    if (lo <= 0xDFFF && hi >= 0xD800) {
      if (lo < 0xD800) cut.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) cut.emplace_back(0xE000, hi);
    } else {
      cut.emplace_back(lo, hi);
    }
  }
  std::sort(cut.begin(), cut.end());
  std::vector<Range> out;
  for (const Range& x : cut) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

std::vector<Range> complement(const std::vector<Range>& r) {
  std::vector<Range> out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return normalize(out);
}

class Parser {
 public:
  Parser(std::string_view src, const GrammarOptions& opts) : s_(src), gb_(opts) {}

  Expected<std::shared_ptr<const Grammar>> parse() {
    if (s_.size() > gb_.options().max_regex_length * 16)
      return errorf("guided_grammar is %zu bytes; the limit is %zu", s_.size(), gb_.options().max_regex_length * 16);
    skip_space(true);
    if (eof()) return err("empty grammar (no rules)");
    while (!eof()) {
      PAGODA_TRY(parse_rule());
      skip_space(true);
    }
    for (const auto& [name, rule] : rules_)
      if (!defined_[rule]) return errorf("gbnf: rule '%s' is used but not defined", name.c_str());
    auto root = rules_.find("root");
    if (root == rules_.end()) return errorf("gbnf: no 'root' rule");
    return gb_.finish(root->second);
  }

 private:
  Error err(const std::string& what) const {
    size_t line = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
    return errorf("gbnf: %s at line %zu (offset %zu)", what.c_str(), line, pos_);
  }
  bool eof() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  // Spaces, tabs and comments; newlines too when newline_ok (inside parentheses,
  // after '|' or '::=', between rules).
  void skip_space(bool newline_ok) {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string parse_name() {
    const size_t b = pos_;
    while (!eof() && name_char(peek())) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }
  uint32_t rule_of(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    const uint32_t r = gb_.new_rule(name);
    rules_.emplace(name, r);
    defined_.resize(std::max<size_t>(defined_.size(), r + 1), 0);
    return r;
  }
  uint32_t helper_rule(const char* kind) {
    const uint32_t r = gb_.new_rule(std::string(kind) + "-" + std::to_string(++helpers_));
    defined_.resize(std::max<size_t>(defined_.size(), r + 1), 0);
    defined_[r] = 1;
    return r;
  }

  Status parse_rule() {
    const std::string name = parse_name();
    if (name.empty()) return err("expected a rule name");
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") return err("expected '::=' after '" + name + "'");
    pos_ += 3;
    const uint32_t r = rule_of(name);
    if (defined_[r]) return err("rule '" + name + "' is defined twice");
    defined_[r] = 1;
    skip_space(true);
    PAGODA_TRY(parse_alternatives(r, false));
    if (!eof() && peek() != '\n' && peek() != '\r') return err(std::string("unexpected '") + peek() + "'");
    return Status::Ok();
  }

  Status parse_alternatives(uint32_t rule, bool nested) {
    for (;;) {
      std::vector<uint32_t> seq;
      PAGODA_TRY(parse_sequence(seq, nested));
      PAGODA_TRY(gb_.add_alt(rule, seq));
      if (eof() || peek() != '|') return Status::Ok();
      ++pos_;
      skip_space(true);
    }
  }

  Status parse_sequence(std::vector<uint32_t>& seq, bool nested) {
    for (;;) {
      skip_space(nested);
      if (eof()) return Status::Ok();
      const char c = peek();
      if (c == '|' || c == ')' || c == '\n' || c == '\r') return Status::Ok();
      std::vector<uint32_t> item;  // the elements of one primary
      PAGODA_TRY(parse_primary(item));
      skip_space(nested);
      if (!eof() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
        PAGODA_TRY(parse_repeat(item));
      }
      seq.insert(seq.end(), item.begin(), item.end());
    }
  }

  Status parse_primary(std::vector<uint32_t>& out) {
    const char c = peek();
    if (c == '"') {
      ++pos_;
      std::string lit;
      while (!eof() && peek() != '"') {
        uint32_t cp = 0;
        PAGODA_TRY(parse_char(cp));
        tok::append_utf8(lit, cp);
      }
      if (eof()) return err("unterminated string literal");
      ++pos_;
      gb_.append_literal(out, lit);
      return Status::Ok();
    }
    if (c == '[') {
      ++pos_;
      bool neg = false;
      if (!eof() && peek() == '^') {
        neg = true;
        ++pos_;
      }
      std::vector<Range> ranges;
      while (!eof() && peek() != ']') {
        uint32_t lo = 0, hi = 0;
        PAGODA_TRY(parse_char(lo));
        hi = lo;
        if (pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          PAGODA_TRY(parse_char(hi));
          if (hi < lo) return err("reversed range in character class");
        }
        ranges.emplace_back(lo, hi);
      }
      if (eof()) return err("unterminated character class");
      ++pos_;
      ranges = neg ? complement(ranges) : normalize(ranges);
      if (ranges.empty()) return err("empty character class");
      return add_class(ranges, out);
    }
    if (c == '.') {
      ++pos_;
      return add_class(normalize({{0, 0x10FFFF}}), out);
    }
    if (c == '(') {
      ++pos_;
      if (++depth_ > 256) return err("groups nested deeper than 256");
      const uint32_t r = helper_rule("group");
      skip_space(true);
      PAGODA_TRY(parse_alternatives(r, true));
      --depth_;
      if (eof() || peek() != ')') return err("missing ')'");
      ++pos_;
      out.push_back(rule_elem(r));
      return Status::Ok();
    }
    if (name_char(c)) {
      out.push_back(rule_elem(rule_of(parse_name())));
      return Status::Ok();
    }
    return err(std::string("unexpected '") + c + "'");
  }

  // The elements matching one character of `ranges`: one byte class when every
  // character is one byte, else a rule with one alternative per UTF-8 sequence.
  Status add_class(const std::vector<Range>& ranges, std::vector<uint32_t>& out) {
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : ranges) utf8_sequences(lo, hi, seqs);
    ByteSet one;
    std::vector<std::vector<uint32_t>> multi;
    for (const auto& sq : seqs) {
      if (sq.size() == 1) {
        one.set_range(sq[0].first, sq[0].second);
        continue;
      }
      std::vector<uint32_t> alt;
      for (auto [a, b] : sq) {
        ByteSet bs;
        bs.set_range(a, b);
        alt.push_back(gb_.bytes(bs));
      }
      multi.push_back(std::move(alt));
    }
    if (multi.empty()) {
      out.push_back(gb_.bytes(one));
      return Status::Ok();
    }
    const uint32_t r = helper_rule("class");
    if (!one.empty()) PAGODA_TRY(gb_.add_alt(r, {gb_.bytes(one)}));
    for (const auto& alt : multi) PAGODA_TRY(gb_.add_alt(r, alt));
    out.push_back(rule_elem(r));
    return Status::Ok();
  }

  // One character of a literal or class (an escape or a UTF-8 character) as a code point.
  Status parse_char(uint32_t& cp) {
    const uint8_t c = static_cast<uint8_t>(peek());
    if (c != '\\') {
      const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
      if (len == 0 || pos_ + len > s_.size()) return err("invalid UTF-8");
      cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
      for (size_t k = 1; k < len; ++k) {
        const uint8_t d = static_cast<uint8_t>(s_[pos_ + k]);
        if ((d & 0xC0) != 0x80) return err("invalid UTF-8");
        cp = (cp << 6) | (d & 0x3F);
      }
      pos_ += len;
      return Status::Ok();
    }
    if (pos_ + 1 >= s_.size()) return err("trailing backslash");
    const char e = s_[pos_ + 1];
    pos_ += 2;
    int digits = 0;
    switch (e) {
      case 'n': cp = '\n'; return Status::Ok();
      case 'r': cp = '\r'; return Status::Ok();
      case 't': cp = '\t'; return Status::Ok();
      case '\\': case '"': case '[': case ']': case '-': case '^': cp = static_cast<uint8_t>(e); return Status::Ok();
      case 'x': digits = 2; break;
      case 'u': digits = 4; break;
      case 'U': digits = 8; break;
      default: return err(std::string("unknown escape '\\") + e + "'");
    }
    cp = 0;
    for (int k = 0; k < digits; ++k, ++pos_) {
      if (eof()) return err("short hex escape");
      const char h = peek();
      const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (v < 0) return err("bad hex digit in escape");
      cp = cp * 16 + static_cast<uint32_t>(v);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return err("escape is not a Unicode scalar value");
    return Status::Ok();
  }

  // item (its elements) -> item*, item+, item?, item{m}, item{m,}, item{m,n}.
  Status parse_repeat(std::vector<uint32_t>& item) {
    const char op = peek();
    ++pos_;
    int64_t lo = 0, hi = -1;  // hi -1: unbounded
    if (op == '+') {
      lo = 1;
    } else if (op == '?') {
      hi = 1;
    } else if (op == '{') {
      auto number = [&](int64_t* v) {
        skip_space(false);
        const size_t b = pos_;
        *v = 0;
        while (!eof() && peek() >= '0' && peek() <= '9' && *v <= 1 << 20) *v = *v * 10 + (s_[pos_++] - '0');
        skip_space(false);
        return pos_ > b;
      };
      if (!number(&lo)) return err("expected a number after '{'");
      if (!eof() && peek() == ',') {
        ++pos_;
        if (!number(&hi)) hi = -1;
      } else {
        hi = lo;
      }
      if (eof() || peek() != '}') return err("expected '}'");
      ++pos_;
      if (hi >= 0 && hi < lo) return err("repetition {m,n} with n < m");
    }
    const int64_t bound = std::max(lo, hi);
    if (bound > static_cast<int64_t>(gb_.options().max_repeat))
      return err("repetition count " + std::to_string(bound) + " exceeds max_repeat=" +
                 std::to_string(gb_.options().max_repeat));
    // rep-star ::= item rep-star | ""     (tail call: constant stack)
    // rep-opt  ::= item | ""
    std::vector<uint32_t> out;
    for (int64_t k = 0; k < lo; ++k) out.insert(out.end(), item.begin(), item.end());
    if (hi < 0) {
      const uint32_t star = helper_rule("star");
      std::vector<uint32_t> a = item;
      a.push_back(rule_elem(star));
      PAGODA_TRY(gb_.add_alt(star, a));
      PAGODA_TRY(gb_.add_alt(star, {}));
      out.push_back(rule_elem(star));
    } else if (hi > lo) {
      // opt_k ::= item opt_{k-1} | "", nested (hi - lo) deep.
      uint32_t inner = 0;
      for (int64_t k = 0; k < hi - lo; ++k) {
        const uint32_t opt = helper_rule("opt");
        std::vector<uint32_t> a = item;
        if (k > 0) a.push_back(rule_elem(inner));
        PAGODA_TRY(gb_.add_alt(opt, a));
        PAGODA_TRY(gb_.add_alt(opt, {}));
        inner = opt;
      }
      out.push_back(rule_elem(inner));
    }
    item = std::move(out);
    return Status::Ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
  GrammarBuilder gb_;
  std::map<std::string, uint32_t> rules_;
  std::vector<uint8_t> defined_;  // [rule]
  int helpers_ = 0;
  int depth_ = 0;
};

}  // namespace

Expected<std::shared_ptr<const Grammar>> Grammar::from_gbnf(std::string_view text, const GrammarOptions& opts) {
  return Parser(text, opts).parse();
}

}  // namespace pagoda::grammar
