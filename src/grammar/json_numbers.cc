// Exact decimal ranges as grammar rules (see json_numbers.h).
#include "grammar/json_numbers.h"

#include <algorithm>
#include <string>

namespace pagoda::grammar {

// digits ::= "" | [0-9] digits
Expected<uint32_t> NumberRules::digits() {
  if (digits_ != UINT32_MAX) return digits_;
  ByteSet d;
  d.set_range('0', '9');
  digits_ = gb_.new_rule("digits");
  PAGODA_TRY(gb_.add_alt(digits_, {}));
  PAGODA_TRY(gb_.add_alt(digits_, {gb_.bytes(d), rule_elem(digits_)}));
  return digits_;
}

// Fixed-length decimal strings from lo to hi (same length, digits only).
Status NumberRules::add_fixed_range(uint32_t rule, const std::string& lo, const std::string& hi,
                                    std::vector<uint32_t> prefix) {
  ByteSet d;
  if (lo.size() == 1) {
    d.set_range(static_cast<uint8_t>(lo[0]), static_cast<uint8_t>(hi[0]));
    prefix.push_back(gb_.bytes(d));
    return gb_.add_alt(rule, prefix);
  }
  if (lo[0] == hi[0]) {
    prefix.push_back(gb_.byte(static_cast<uint8_t>(lo[0])));
    return add_fixed_range(rule, lo.substr(1), hi.substr(1), prefix);
  }
  const std::string nines(lo.size() - 1, '9'), zeros(lo.size() - 1, '0');
  {
    auto p = prefix;
    p.push_back(gb_.byte(static_cast<uint8_t>(lo[0])));
    PAGODA_TRY(add_fixed_range(rule, lo.substr(1), nines, p));
  }
  if (hi[0] - lo[0] >= 2) {
    auto p = prefix;
    d.set_range(static_cast<uint8_t>(lo[0] + 1), static_cast<uint8_t>(hi[0] - 1));
    p.push_back(gb_.bytes(d));
    ByteSet any;
    any.set_range('0', '9');
    for (size_t i = 1; i < lo.size(); ++i) p.push_back(gb_.bytes(any));
    PAGODA_TRY(gb_.add_alt(rule, p));
  }
  auto p = prefix;
  p.push_back(gb_.byte(static_cast<uint8_t>(hi[0])));
  return add_fixed_range(rule, zeros, hi.substr(1), p);
}

// Non-negative integers in [lo, hi] (hi < 0: unbounded), canonical decimal.
Status NumberRules::add_uint_range(uint32_t rule, long long lo, long long hi) {
  if (hi >= 0 && lo > hi) return Status::Ok();
  const std::string los = std::to_string(lo);
  if (hi >= 0) {
    const std::string his = std::to_string(hi);
    for (size_t len = los.size(); len <= his.size(); ++len) {
      std::string a = los;  // smallest len-digit number >= lo
      if (len != los.size()) {
        a.assign(len, '0');
        a[0] = '1';
      }
      const std::string b = len == his.size() ? his : std::string(len, '9');
      PAGODA_TRY(add_fixed_range(rule, a, b, {}));
    }
    return Status::Ok();
  }
  PAGODA_TRY(add_fixed_range(rule, los, std::string(los.size(), '9'), {}));
  // Any longer number: [1-9] [0-9]{len} digits
  PAGODA_ASSIGN_OR_RETURN(uint32_t ds, digits());
  ByteSet nz, any;
  nz.set_range('1', '9');
  any.set_range('0', '9');
  std::vector<uint32_t> seq{gb_.bytes(nz)};
  for (size_t i = 0; i < los.size(); ++i) seq.push_back(gb_.bytes(any));
  seq.push_back(rule_elem(ds));
  return gb_.add_alt(rule, seq);
}

// Integers in [lo, hi]; has_lo/has_hi false = unbounded on that side.
Expected<uint32_t> NumberRules::int_range(const Bounds& b) {
  const bool has_lo = b.has_lo, has_hi = b.has_hi;
  const long long lo = b.lo, hi = b.hi;
  if (has_lo && has_hi && lo > hi) return make_error("minimum above maximum: no integer fits");
  const uint32_t r = gb_.new_rule("int_range");
  // non-negative part [max(lo,0), hi]
  if (!has_hi || hi >= 0) PAGODA_TRY(add_uint_range(r, has_lo ? std::max(lo, 0LL) : 0, has_hi ? hi : -1));
  // negative part: "-" then magnitude in [max(1,-hi), -lo]
  if (!has_lo || lo < 0) {
    const long long mlo = has_hi ? std::max(1LL, -hi) : 1;
    const long long mhi = has_lo ? -lo : -1;
    const uint32_t mag = gb_.new_rule("neg_mag");
    PAGODA_TRY(add_uint_range(mag, mlo, mhi));
    PAGODA_TRY(gb_.add_alt(r, {gb_.byte('-'), rule_elem(mag)}));
  }
  return r;
}

// Magnitudes m (a decimal without sign or exponent) with A <= m <= B (B < 0:
// unbounded), each bound integral and inclusive or exclusive, added as
// alternatives of rule `r` after `prefix` ("" or "-"):
//   integer part in [A+1, B-1] with any fraction,
//   integer part A with any fraction (A exclusive: a nonzero fraction),
//   exactly B (inclusive only): B with a zero fraction.
Status NumberRules::add_magnitudes(uint32_t r, const std::string& prefix, long long A, bool a_excl, long long B, bool b_excl) {
  PAGODA_ASSIGN_OR_RETURN(uint32_t ds, digits());
  ByteSet d, nz;
  d.set_range('0', '9');
  nz.set_range('1', '9');
  if (frac_ == UINT32_MAX) {
    frac_ = gb_.new_rule("frac_opt");  // "" | "." [0-9] digits
    PAGODA_TRY(gb_.add_alt(frac_, {}));
    PAGODA_TRY(gb_.add_alt(frac_, {gb_.byte('.'), gb_.bytes(d), rule_elem(ds)}));
    const uint32_t zeros = gb_.new_rule("zeros");
    PAGODA_TRY(gb_.add_alt(zeros, {}));
    PAGODA_TRY(gb_.add_alt(zeros, {gb_.byte('0'), rule_elem(zeros)}));
    zfrac_ = gb_.new_rule("zero_frac_opt");  // "" | "." "0"+
    PAGODA_TRY(gb_.add_alt(zfrac_, {}));
    PAGODA_TRY(gb_.add_alt(zfrac_, {gb_.byte('.'), gb_.byte('0'), rule_elem(zeros)}));
    const uint32_t nzt = gb_.new_rule("nonzero_tail");  // "0"* [1-9] digits
    PAGODA_TRY(gb_.add_alt(nzt, {gb_.byte('0'), rule_elem(nzt)}));
    PAGODA_TRY(gb_.add_alt(nzt, {gb_.bytes(nz), rule_elem(ds)}));
    nzfrac_ = gb_.new_rule("nonzero_frac");
    PAGODA_TRY(gb_.add_alt(nzfrac_, {gb_.byte('.'), rule_elem(nzt)}));
  }
  auto lit = [&](long long v, uint32_t tail) -> Status {
    std::vector<uint32_t> seq;
    gb_.append_literal(seq, prefix + std::to_string(v));
    seq.push_back(rule_elem(tail));
    return gb_.add_alt(r, seq);
  };
  if (B >= 0 && A == B) {
    if (!a_excl && !b_excl) PAGODA_TRY(lit(A, zfrac_));
    return Status::Ok();
  }
  if (B < 0 || A + 1 <= B - 1) {
    const uint32_t ip = gb_.new_rule("num_ip");
    PAGODA_TRY(add_uint_range(ip, A + 1, B < 0 ? -1 : B - 1));
    std::vector<uint32_t> seq;
    gb_.append_literal(seq, prefix);
    seq.push_back(rule_elem(ip));
    seq.push_back(rule_elem(frac_));
    PAGODA_TRY(gb_.add_alt(r, seq));
  }
  PAGODA_TRY(lit(A, a_excl ? nzfrac_ : frac_));
  if (B >= 0 && !b_excl) PAGODA_TRY(lit(B, zfrac_));
  return Status::Ok();
}

Expected<uint32_t> NumberRules::number_range(const Bounds& b) {
  const bool has_lo = b.has_lo, has_hi = b.has_hi, lo_excl = b.lo_excl, hi_excl = b.hi_excl;
  const long long lo = b.lo, hi = b.hi;
  if (has_lo && has_hi && (lo > hi || (lo == hi && (lo_excl || hi_excl))))
    return make_error("minimum above maximum: no number fits");
  const uint32_t r = gb_.new_rule("number_range");
  // x >= 0 part.
  if (!has_hi || hi > 0 || (hi == 0 && !hi_excl)) {
    const long long A = has_lo && lo >= 0 ? lo : 0;
    const bool a_excl = has_lo && lo >= 0 && lo_excl;
    PAGODA_TRY(add_magnitudes(r, "", A, a_excl, has_hi ? hi : -1, has_hi && hi_excl));
  }
  // x < 0 part: magnitude -x in [max(0, -hi), -lo].
  if (!has_lo || lo < 0) {
    const long long A = has_hi && hi <= 0 ? -hi : 0;
    const bool a_excl = has_hi && hi <= 0 && hi_excl;
    PAGODA_TRY(add_magnitudes(r, "-", A, a_excl, has_lo ? -lo : -1, has_lo && lo_excl));
  }
  return r;
}

}  // namespace pagoda::grammar
