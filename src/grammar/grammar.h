// Compiled constraint grammars for constrained decoding (issue 18).
//
// Every constraint (JSON schema, json_object, regex, choice list, GBNF) compiles to one
// context-free grammar over BYTES: rules, each a list of alternatives, each a
// sequence of elements that are either a byte class or a reference to a rule.
// Loops are written right-recursively and a rule reference at the end of an
// alternative is a tail call (the matcher replaces the frame instead of growing
// the stack), so regular parts run in constant stack depth and only real nesting
// (objects in objects) grows it. Left recursion is rejected at build time, which
// guarantees the matcher's expansion terminates.
//
// A Grammar is immutable after build and shared (shared_ptr<const Grammar>) by any
// number of requests and threads.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace pagoda::grammar {

// Limits that keep hostile input (deep nesting, huge enums, pathological regexes,
// huge repetition counts) from costing unbounded time or memory. Each violation
// is an error naming the option and its value.
struct GrammarOptions {
  int max_schema_depth = 128;          // nesting of subschemas (properties/items/anyOf...)
  size_t max_enum_size = 4096;         // values in one enum / choices in from_choices
  size_t max_rules = 100000;           // rules in the compiled grammar
  size_t max_elements = 2000000;       // elements (byte classes + rule refs) in all rules
  size_t max_regex_length = 4096;      // bytes of one regex / pattern
  size_t max_regex_states = 4096;      // DFA states of one regex (and 8x that NFA states)
  size_t max_repeat = 1024;            // minItems/maxItems/minLength/maxLength/{n,m} expanded
  // true: additionalProperties absent means "no other keys" when properties are
  // given (what structured-output APIs expect); false: JSON Schema's default (any).
  bool strict_additional_properties = true;
};

// 256-bit byte set.
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  void add(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) w[i] |= o.w[i];
  }
  bool empty() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

// Well-formed multi-byte UTF-8 (RFC 3629 table: no overlongs, no surrogates,
// nothing above U+10FFFF), as byte-range sequences.
struct Utf8Seq {
  int len;
  uint8_t lo[4], hi[4];
};
inline constexpr Utf8Seq kUtf8MultiByte[] = {
    {2, {0xC2, 0x80}, {0xDF, 0xBF}},
    {3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
    {3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},
    {3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
    {3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},
    {4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
    {4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
    {4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
};

// Element encoding (one uint32): kind in the top 2 bits, argument below.
inline constexpr uint32_t kEnd = 0;  // terminates an alternative
inline constexpr uint32_t kKindShift = 30;
inline constexpr uint32_t kArgMask = (1u << kKindShift) - 1;
enum class ElemKind : uint32_t { kEnd = 0, kBytes = 1, kRule = 2 };
inline ElemKind elem_kind(uint32_t e) { return static_cast<ElemKind>(e >> kKindShift); }
inline uint32_t elem_arg(uint32_t e) { return e & kArgMask; }
inline uint32_t bytes_elem(uint32_t set_id) { return (1u << kKindShift) | set_id; }
inline uint32_t rule_elem(uint32_t rule) { return (2u << kKindShift) | rule; }

class GrammarBuilder;

class Grammar {
 public:
  // --- constructors of the supported constraint kinds -------------------------
  // JSON Schema (a subset: see json_schema.cc's header). Errors name the JSON
  // pointer of the offending part ("#/properties/age/minimum: ...").
  static Expected<std::shared_ptr<const Grammar>> from_json_schema(std::string_view schema_json,
                                                                   const GrammarOptions& opts = {});
  // The same value between literal prefix and suffix text (a tool call in the
  // model's syntax: "<tool_call>\n" + {"name":..,"arguments":..} + "\n</tool_call>").
  static Expected<std::shared_ptr<const Grammar>> from_json_schema_framed(std::string_view schema_json,
                                                                          std::string_view prefix,
                                                                          std::string_view suffix,
                                                                          const GrammarOptions& opts = {});
  // Any JSON object (OpenAI response_format json_object).
  static Expected<std::shared_ptr<const Grammar>> json_object(const GrammarOptions& opts = {});
  // Whole-output regex (anchored at both ends; ^ and $ at the ends are allowed).
  static Expected<std::shared_ptr<const Grammar>> from_regex(std::string_view regex,
                                                             const GrammarOptions& opts = {});
  // A GBNF grammar (llama.cpp's format, vLLM's guided_grammar; see gbnf.cc), from its
  // `root` rule. Errors name the line.
  static Expected<std::shared_ptr<const Grammar>> from_gbnf(std::string_view text, const GrammarOptions& opts = {});
  // Exactly one of the given strings.
  static Expected<std::shared_ptr<const Grammar>> from_choices(const std::vector<std::string>& choices,
                                                               const GrammarOptions& opts = {});

  // --- structure (read by the matcher) ----------------------------------------
  // elements(): all alternatives back to back, each terminated by kEnd. A
  // "position" is an index into it.
  const std::vector<uint32_t>& elements() const { return elems_; }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return alts_[rule]; }
  const ByteSet& byte_set(uint32_t id) const { return sets_[id]; }
  uint32_t root() const { return root_; }
  size_t num_rules() const { return alts_.size(); }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  // Human-readable GBNF-like dump, for debugging and error reports.
  std::string to_string() const;
  // Heap bytes this grammar holds (its vectors' capacities and the rule names),
  // for caches that are bounded in bytes. O(rules).
  size_t memory_bytes() const;

  // Whole-string check without a tokenizer: does the grammar derive exactly s?
  bool matches(std::string_view s) const;
  // Is s a prefix of some string the grammar derives?
  bool matches_prefix(std::string_view s) const;

 private:
  friend class GrammarBuilder;
  std::vector<uint32_t> elems_;
  std::vector<std::vector<uint32_t>> alts_;  // [rule] -> start positions
  std::vector<ByteSet> sets_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

// Builds a Grammar rule by rule; finish() validates (every rule defined, no left
// recursion, limits) and freezes it.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(const GrammarOptions& opts) : opts_(opts) {}
  uint32_t new_rule(std::string name);
  // Appends one alternative (a sequence of elements, without kEnd) to rule.
  Status add_alt(uint32_t rule, const std::vector<uint32_t>& seq);
  uint32_t bytes(const ByteSet& set);  // element for a byte class (deduplicated)
  uint32_t byte(uint8_t b);            // element for one byte
  // Appends the elements that spell s literally.
  void append_literal(std::vector<uint32_t>& seq, std::string_view s);
  size_t num_rules() const { return g_->alts_.size(); }
  const GrammarOptions& options() const { return opts_; }
  Expected<std::shared_ptr<const Grammar>> finish(uint32_t root);

 private:
  GrammarOptions opts_;
  std::shared_ptr<Grammar> g_ = std::make_shared<Grammar>();
  std::vector<std::pair<ByteSet, uint32_t>> set_index_;  // small linear dedupe
};

// A byte trie of strings, node 0 the root (children as (byte, node) pairs, few
// per node). Built by add_trie_rules and by the JSON schema's key rules.
struct ByteTrie {
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> kids;
    bool end = false;  // a string ends here
  };
  std::vector<Node> nodes = std::vector<Node>(1);
  void insert(std::string_view s);
};

// Adds rules deriving exactly the given strings, as a byte trie (one rule per
// trie node, deterministic: one parse stack however many strings); returns the
// root rule. Used by from_choices and JSON Schema enums.
Expected<uint32_t> add_trie_rules(GrammarBuilder& gb, const std::vector<std::string>& strings,
                                  const std::string& name_prefix);

// ---- the byte-level matching core (shared by Matcher and Grammar::matches) -----

// A parse stack: positions to resume, bottom first; the top is always a byte-class
// position. An empty stack means the root rule is complete.
using Stack = std::vector<uint32_t>;

// Replaces a stack whose top may be a rule reference by all stacks whose top is a
// byte class (or that are empty), passing each to out.add(const Stack&); s is
// restored before return. Terminates because finish() rejects left recursion.
template <class Out>
void expand_stack_into(const Grammar& g, Stack& s, Out& out) {
  const std::vector<uint32_t>& el = g.elements();
  if (s.empty() || elem_kind(el[s.back()]) == ElemKind::kBytes) {
    out.add(s);
    return;
  }
  const uint32_t p = s.back();
  s.pop_back();
  // Tail call: a reference at the end of its alternative leaves no frame behind.
  const bool push_next = el[p + 1] != kEnd;
  if (push_next) s.push_back(p + 1);
  for (uint32_t a : g.alternatives(elem_arg(el[p]))) {
    if (el[a] == kEnd) {
      expand_stack_into(g, s, out);
    } else {
      s.push_back(a);
      expand_stack_into(g, s, out);
      s.pop_back();
    }
  }
  if (push_next) s.pop_back();
  s.push_back(p);
}
// The same into a vector (at most kMaxStacks kept).
void expand_stack(const Grammar& g, Stack& s, std::vector<Stack>& out);
// The initial stack set of the root rule.
std::vector<Stack> initial_stacks(const Grammar& g);
// Consumes byte b from every stack in `in`; survivors (expanded, sorted, unique)
// go to out (cleared first). Returns !out.empty().
bool advance_stacks(const Grammar& g, const std::vector<Stack>& in, uint8_t b, std::vector<Stack>& out);
// Stack-count cap per step: grammars we build are near-deterministic; a runaway
// ambiguous grammar is cut here (the surplus stacks are dropped, never crashes).
inline constexpr size_t kMaxStacks = 4096;

}  // namespace pagoda::grammar
