// Integer and number ranges as exact grammar rules, for JSON Schema's minimum /
// maximum / exclusiveMinimum / exclusiveMaximum. Integers: canonical decimals
// (no leading zeros, no "-0") whose value lies in the range, built digit by digit
// (the classic range-to-regex split). Numbers: the same on the integer part, with
// the fraction constrained only at the bounds themselves; exponents are not
// generated (they would hide the magnitude). Bounds are integral (the caller
// rejects fractional number bounds).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace pagoda::grammar {

class NumberRules {
 public:
  struct Bounds {
    bool has_lo = false, lo_excl = false;
    long long lo = 0;
    bool has_hi = false, hi_excl = false;
    long long hi = 0;
  };
  explicit NumberRules(GrammarBuilder& gb) : gb_(gb) {}

  // digits ::= "" | [0-9] digits (shared)
  Expected<uint32_t> digits();
  // Integers in [lo, hi] (exclusive flags ignored: pass integral inclusive bounds).
  Expected<uint32_t> int_range(const Bounds& b);
  // Numbers in the range, exclusive flags honoured.
  Expected<uint32_t> number_range(const Bounds& b);

 private:
  Status add_fixed_range(uint32_t rule, const std::string& lo, const std::string& hi, std::vector<uint32_t> prefix);
  Status add_uint_range(uint32_t rule, long long lo, long long hi);
  Status add_magnitudes(uint32_t r, const std::string& prefix, long long A, bool a_excl, long long B, bool b_excl);

  GrammarBuilder& gb_;
  uint32_t digits_ = UINT32_MAX, frac_ = UINT32_MAX, zfrac_ = UINT32_MAX, nzfrac_ = UINT32_MAX;
};

}  // namespace pagoda::grammar
