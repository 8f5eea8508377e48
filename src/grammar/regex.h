// Regular expressions compiled to a byte DFA, then to right-linear grammar rules
// (one rule per DFA state: "S ::= [class] T | ... | ''"), so a regex costs one
// parse stack and never grows it.
//
// Supported: literals (UTF-8), . (any UTF-8 character but \n), [...] and [^...]
// with ASCII ranges and single non-ASCII characters, \d \w \s \D \W \S, \n \t \r
// \f \v \0 \xHH \uHHHH and escaped punctuation, groups (...) (?:...) (?<n>...),
// | * + ? {n} {n,} {n,m} (a trailing lazy '?' is accepted and means the same:
// the constraint is the language, not the match). ^ and $ only at the ends.
// Not supported (clear error): backreferences, lookaround, \b, possessive
// quantifiers, non-ASCII ranges in classes.
//
// Limits: the regex length (max_regex_length), counted repetition (max_repeat),
// NFA states (8 x max_regex_states), DFA states (max_regex_states) and a budget of
// subset-construction work, so (a*)*b-style or exponential-DFA regexes fail fast.
#pragma once
#include <array>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace pagoda::grammar {

struct Dfa {
  std::vector<std::array<int32_t, 256>> next;  // [state][byte] -> state or -1
  std::vector<uint8_t> accept;                 // [state]
};

// search: JSON Schema "pattern" semantics (a match anywhere unless anchored with ^
// or $); otherwise the regex must match the whole string.
Expected<Dfa> compile_regex(std::string_view re, const GrammarOptions& opts, bool search);

// Adds one rule per DFA state to gb and returns the start state's rule.
// json_string: the DFA describes the DECODED content of a JSON string; the rules
// spell it as JSON would (\" \\ and \u00XX for control bytes).
Expected<uint32_t> add_dfa_rules(GrammarBuilder& gb, const Dfa& dfa, bool json_string,
                                 const std::string& name_prefix);

}  // namespace pagoda::grammar
