// JSON Schema -> grammar.
//
// Supported: type (string or list), const, enum, anyOf, oneOf (as anyOf: the
// exclusivity is not enforced), allOf with one member, $ref to "#..." JSON
// pointers ($defs, definitions, any path; recursion allowed), boolean schemas,
// objects (properties in declared order, required/optional, additionalProperties
// true/false/schema), arrays (items, minItems, maxItems), strings (minLength,
// maxLength, pattern, format: date, time, date-time, uuid, email, ipv4; other
// formats are annotations and accept any string), integers (minimum, maximum,
// exclusiveMinimum, exclusiveMaximum: exact), numbers (the same bounds applied
// exactly to integral bounds through the integer part; fractional bounds are
// rejected with an error naming them).
// Output layout: the separators may carry the whitespace of compact or pretty-
// printed JSON ("", " ", or a newline and up to 20 spaces/tabs), bounded so a
// model cannot loop on whitespace.
// Unsupported keywords that would change the language (prefixItems, not, if,
// patternProperties, minProperties, maxProperties, uniqueItems, dependentRequired...)
// are errors naming their JSON pointer, never silently ignored.
#include <cmath>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_numbers.h"
#include "grammar/json_text.h"
#include "grammar/regex.h"

namespace pagoda::grammar {
namespace {

using json = nlohmann::ordered_json;  // keeps "properties" in declared order

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out.push_back(c);
  }
  return out;
}

class Converter {
 public:
  Converter(const json& root, const GrammarOptions& opts) : root_(root), opts_(opts), gb_(opts), numbers_(gb_) {}

  // prefix/suffix: literal text around the value (a tool call's markup,
  // "<tool_call>\n" ... "\n</tool_call>"); empty: the value alone.
  Expected<std::shared_ptr<const Grammar>> run(std::string_view prefix = {}, std::string_view suffix = {}) {
    PAGODA_ASSIGN_OR_RETURN(uint32_t value, visit(root_, "#", 0));
    // root ::= ws value ws? A leading newline is harmless but lets the model pad;
    // we allow none before and the bounded ws after none: the value alone.
    if (prefix.empty() && suffix.empty()) return gb_.finish(value);
    const uint32_t framed = gb_.new_rule("framed");
    std::vector<uint32_t> seq;
    gb_.append_literal(seq, prefix);
    seq.push_back(rule_elem(value));
    gb_.append_literal(seq, suffix);
    PAGODA_TRY(gb_.add_alt(framed, seq));
    return gb_.finish(framed);
  }

  // Any JSON object (json_object mode).
  Expected<std::shared_ptr<const Grammar>> run_object() {
    PAGODA_ASSIGN_OR_RETURN(uint32_t obj, any_object());
    return gb_.finish(obj);
  }

 private:
  Error err(const std::string& path, const std::string& what) const {
    return make_error(path + ": " + what);
  }

  // ---------------------------------------------------------- shared rules
  uint32_t R(uint32_t rule) const { return rule_elem(rule); }

  Expected<uint32_t> ws() {
    if (ws_ != UINT32_MAX) return ws_;
    // ws ::= "" | " " | "\n" ind20 ; ind_k ::= "" | [ \t] ind_{k-1}
    ByteSet st;
    st.set(' ');
    st.set('\t');
    uint32_t prev = gb_.new_rule("ind0");
    PAGODA_TRY(gb_.add_alt(prev, {}));
    for (int k = 1; k <= 20; ++k) {
      const uint32_t r = gb_.new_rule("ind" + std::to_string(k));
      PAGODA_TRY(gb_.add_alt(r, {}));
      PAGODA_TRY(gb_.add_alt(r, {gb_.bytes(st), R(prev)}));
      prev = r;
    }
    ws_ = gb_.new_rule("ws");
    PAGODA_TRY(gb_.add_alt(ws_, {}));
    PAGODA_TRY(gb_.add_alt(ws_, {gb_.byte(' ')}));
    PAGODA_TRY(gb_.add_alt(ws_, {gb_.byte('\n'), R(prev)}));
    return ws_;
  }

  // The alternatives of one JSON string character, each followed by `then`
  // (so loops stay tail calls and the char is inlined in the loop's rule).
  // exclude: single-byte characters left out (the caller handles them).
  Status add_char_alts(uint32_t rule, uint32_t then, const ByteSet& exclude = {}) {
    ByteSet plain = plain_chars();
    for (int i = 0; i < 4; ++i) plain.w[static_cast<size_t>(i)] &= ~exclude.w[static_cast<size_t>(i)];
    ByteSet esc, hex;
    for (char c : std::string_view("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
    hex.set_range('0', '9');
    hex.set_range('a', 'f');
    hex.set_range('A', 'F');
    const uint32_t h = gb_.bytes(hex);
    auto with = [&](std::vector<uint32_t> seq) {
      if (then != UINT32_MAX) seq.push_back(R(then));
      return seq;
    };
    if (!plain.empty()) PAGODA_TRY(gb_.add_alt(rule, with({gb_.bytes(plain)})));
    for (const Utf8Seq& u : kUtf8MultiByte) {
      std::vector<uint32_t> seq;
      for (int i = 0; i < u.len; ++i) {
        ByteSet b;
        b.set_range(u.lo[i], u.hi[i]);
        seq.push_back(gb_.bytes(b));
      }
      PAGODA_TRY(gb_.add_alt(rule, with(std::move(seq))));
    }
    PAGODA_TRY(gb_.add_alt(rule, with({gb_.byte('\\'), gb_.bytes(esc)})));
    PAGODA_TRY(gb_.add_alt(rule, with({gb_.byte('\\'), gb_.byte('u'), h, h, h, h})));
    return Status::Ok();
  }

  // Printable ASCII but '"' and '\\': the one-byte JSON string characters.
  static ByteSet plain_chars() {
    ByteSet plain;
    plain.set_range(0x20, 0x7F);
    plain.w[0] &= ~(uint64_t{1} << '"');
    plain.w[1] &= ~(uint64_t{1} << ('\\' - 64));
    return plain;
  }

  Expected<uint32_t> any_string() {
    if (string_ != UINT32_MAX) return string_;
    chars_ = gb_.new_rule("chars");
    PAGODA_TRY(gb_.add_alt(chars_, {}));
    PAGODA_TRY(add_char_alts(chars_, chars_));
    string_ = gb_.new_rule("string");
    PAGODA_TRY(gb_.add_alt(string_, {gb_.byte('"'), R(chars_), gb_.byte('"')}));
    return string_;
  }

  // A JSON string other than the given names (additionalProperties keys must not
  // repeat a declared property). A byte trie of the names: at node n the key may
  // close unless n spells a name, continue along the trie, or leave it with any
  // other character and then be free. Names with escapes or non-ASCII bytes fall
  // back to any string (returns any_string()).
  Expected<uint32_t> string_except(const std::vector<std::string>& names) {
    const ByteSet plain = plain_chars();
    for (const std::string& n : names)
      for (char c : n)
        if (!plain.has(static_cast<uint8_t>(c))) return any_string();
    PAGODA_ASSIGN_OR_RETURN(uint32_t str, any_string());
    (void)str;
    const uint32_t free_close = gb_.new_rule("key_free");
    PAGODA_TRY(gb_.add_alt(free_close, {R(chars_), gb_.byte('"')}));
    ByteTrie bt;
    for (const std::string& n : names) bt.insert(n);
    const std::vector<ByteTrie::Node>& trie = bt.nodes;
    std::vector<uint32_t> rule(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) rule[i] = gb_.new_rule("key_ex" + std::to_string(i));
    for (size_t i = 0; i < trie.size(); ++i) {
      if (!trie[i].end) PAGODA_TRY(gb_.add_alt(rule[i], {gb_.byte('"')}));
      ByteSet kids;
      for (auto& [b, k] : trie[i].kids) {
        kids.set(b);
        PAGODA_TRY(gb_.add_alt(rule[i], {gb_.byte(b), R(rule[k])}));
      }
      PAGODA_TRY(add_char_alts(rule[i], free_close, kids));
    }
    const uint32_t key = gb_.new_rule("key_except");
    PAGODA_TRY(gb_.add_alt(key, {gb_.byte('"'), R(rule[0])}));
    return key;
  }

  // Unsigned integer without leading zeros.
  Expected<uint32_t> uint_rule() {
    if (uint_ != UINT32_MAX) return uint_;
    PAGODA_ASSIGN_OR_RETURN(uint32_t ds, numbers_.digits());
    ByteSet nz;
    nz.set_range('1', '9');
    uint_ = gb_.new_rule("uint");
    PAGODA_TRY(gb_.add_alt(uint_, {gb_.byte('0')}));
    PAGODA_TRY(gb_.add_alt(uint_, {gb_.bytes(nz), R(ds)}));
    return uint_;
  }

  Expected<uint32_t> any_integer() {
    if (integer_ != UINT32_MAX) return integer_;
    PAGODA_ASSIGN_OR_RETURN(uint32_t u, uint_rule());
    integer_ = gb_.new_rule("integer");
    PAGODA_TRY(gb_.add_alt(integer_, {R(u)}));
    PAGODA_TRY(gb_.add_alt(integer_, {gb_.byte('-'), R(u)}));
    return integer_;
  }

  // frac_exp ::= ("" | "." [0-9] digits) ("" | [eE] ("" | [+-]) [0-9] digits)
  Expected<uint32_t> frac_exp() {
    if (frac_exp_ != UINT32_MAX) return frac_exp_;
    PAGODA_ASSIGN_OR_RETURN(uint32_t ds, numbers_.digits());
    ByteSet d, e, pm;
    d.set_range('0', '9');
    e.set('e');
    e.set('E');
    pm.set('+');
    pm.set('-');
    const uint32_t exp = gb_.new_rule("exp");
    PAGODA_TRY(gb_.add_alt(exp, {}));
    PAGODA_TRY(gb_.add_alt(exp, {gb_.bytes(e), gb_.bytes(d), R(ds)}));
    PAGODA_TRY(gb_.add_alt(exp, {gb_.bytes(e), gb_.bytes(pm), gb_.bytes(d), R(ds)}));
    frac_exp_ = gb_.new_rule("frac_exp");
    PAGODA_TRY(gb_.add_alt(frac_exp_, {R(exp)}));
    PAGODA_TRY(gb_.add_alt(frac_exp_, {gb_.byte('.'), gb_.bytes(d), R(ds), R(exp)}));
    return frac_exp_;
  }

  Expected<uint32_t> any_number() {
    if (number_ != UINT32_MAX) return number_;
    PAGODA_ASSIGN_OR_RETURN(uint32_t i, any_integer());
    PAGODA_ASSIGN_OR_RETURN(uint32_t fe, frac_exp());
    number_ = gb_.new_rule("number");
    PAGODA_TRY(gb_.add_alt(number_, {R(i), R(fe)}));
    return number_;
  }

  Expected<uint32_t> literal_rule(const std::string& text, const std::string& name) {
    const uint32_t r = gb_.new_rule(name);
    std::vector<uint32_t> seq;
    gb_.append_literal(seq, text);
    PAGODA_TRY(gb_.add_alt(r, seq));
    return r;
  }

  // "{" ws ( "}" | member ( ws "," ws member )* ws "}" ), member = string ws ":" ws value
  Expected<uint32_t> any_object() {
    if (object_ != UINT32_MAX) return object_;
    object_ = gb_.new_rule("object");
    PAGODA_ASSIGN_OR_RETURN(uint32_t v, any_value());
    PAGODA_ASSIGN_OR_RETURN(uint32_t body, kv_list(v, "object"));
    PAGODA_ASSIGN_OR_RETURN(uint32_t w, ws());
    PAGODA_TRY(gb_.add_alt(object_, {gb_.byte('{'), R(w), R(body)}));
    return object_;
  }

  // After "{" ws: "}" | member (ws "," ws member)* ws "}" with members whose key
  // is any string and value is `value`.
  Expected<uint32_t> kv_list(uint32_t value, const std::string& name) {
    PAGODA_ASSIGN_OR_RETURN(uint32_t w, ws());
    PAGODA_ASSIGN_OR_RETURN(uint32_t s, any_string());
    const uint32_t more = gb_.new_rule(name + "_more");
    // more ::= ws "}" | ws "," ws string ws ":" ws value more
    PAGODA_TRY(gb_.add_alt(more, {R(w), gb_.byte('}')}));
    PAGODA_TRY(gb_.add_alt(more, {R(w), gb_.byte(','), R(w), R(s), R(w), gb_.byte(':'), R(w), R(value), R(more)}));
    const uint32_t body = gb_.new_rule(name + "_body");
    PAGODA_TRY(gb_.add_alt(body, {gb_.byte('}')}));
    PAGODA_TRY(gb_.add_alt(body, {R(s), R(w), gb_.byte(':'), R(w), R(value), R(more)}));
    return body;
  }

  Expected<uint32_t> any_array() {
    if (array_ != UINT32_MAX) return array_;
    array_ = gb_.new_rule("array");
    PAGODA_ASSIGN_OR_RETURN(uint32_t v, any_value());
    PAGODA_ASSIGN_OR_RETURN(uint32_t body, list_rule(v, 0, -1, "array", "#"));
    PAGODA_TRY(gb_.add_alt(array_, {R(body)}));
    return array_;
  }

  Expected<uint32_t> any_value() {
    if (value_ != UINT32_MAX) return value_;
    value_ = gb_.new_rule("value");
    PAGODA_ASSIGN_OR_RETURN(uint32_t o, any_object());
    PAGODA_ASSIGN_OR_RETURN(uint32_t a, any_array());
    PAGODA_ASSIGN_OR_RETURN(uint32_t s, any_string());
    PAGODA_ASSIGN_OR_RETURN(uint32_t n, any_number());
    for (uint32_t r : {o, a, s, n}) PAGODA_TRY(gb_.add_alt(value_, {R(r)}));
    for (const char* lit : {"true", "false", "null"}) {
      std::vector<uint32_t> seq;
      gb_.append_literal(seq, lit);
      PAGODA_TRY(gb_.add_alt(value_, seq));
    }
    return value_;
  }

  // "[" ws ( item (ws "," ws item){min-1,max-1} )? ws "]" as a chain of rules.
  Expected<uint32_t> list_rule(uint32_t item, long min, long max, const std::string& name,
                               const std::string& path) {
    if (min < 0 || (max >= 0 && max < min)) return err(path, "minItems/maxItems out of order");
    if (static_cast<size_t>(min) > opts_.max_repeat || (max >= 0 && static_cast<size_t>(max) > opts_.max_repeat))
      return err(path, "minItems/maxItems above max_repeat=" + std::to_string(opts_.max_repeat));
    PAGODA_ASSIGN_OR_RETURN(uint32_t w, ws());
    // tail(k): k items emitted; tail ::= ws "]" (if k >= min) | ws "," ws item tail(k+1) (if k < max)
    const long chain = max >= 0 ? max : min;  // tail(chain) loops when unbounded
    std::vector<uint32_t> tail(static_cast<size_t>(chain) + 1);
    for (long k = 0; k <= chain; ++k) tail[static_cast<size_t>(k)] = gb_.new_rule(name + "_t" + std::to_string(k));
    for (long k = 1; k <= chain; ++k) {
      const uint32_t t = tail[static_cast<size_t>(k)];
      if (k >= min) PAGODA_TRY(gb_.add_alt(t, {R(w), gb_.byte(']')}));
      if (k < chain)
        PAGODA_TRY(gb_.add_alt(t, {R(w), gb_.byte(','), R(w), R(item), R(tail[static_cast<size_t>(k + 1)])}));
      else if (max < 0)
        PAGODA_TRY(gb_.add_alt(t, {R(w), gb_.byte(','), R(w), R(item), R(t)}));
    }
    // tail0 right after "[" ws
    const uint32_t t0 = tail[0];
    if (min == 0) PAGODA_TRY(gb_.add_alt(t0, {gb_.byte(']')}));
    if (chain >= 1) PAGODA_TRY(gb_.add_alt(t0, {R(item), R(tail[1])}));
    else if (max < 0) {
      // min == 0, unbounded: one item then the loop
      const uint32_t loop = gb_.new_rule(name + "_loop");
      PAGODA_TRY(gb_.add_alt(loop, {R(w), gb_.byte(']')}));
      PAGODA_TRY(gb_.add_alt(loop, {R(w), gb_.byte(','), R(w), R(item), R(loop)}));
      PAGODA_TRY(gb_.add_alt(t0, {R(item), R(loop)}));
    }
    const uint32_t r = gb_.new_rule(name);
    PAGODA_TRY(gb_.add_alt(r, {gb_.byte('['), R(w), R(t0)}));
    return r;
  }

  // '"' char{min,max} '"' with each char inlined in its chain rule.
  Expected<uint32_t> sized_string(long min, long max, const std::string& path) {
    if (min < 0 || (max >= 0 && max < min)) return err(path, "minLength/maxLength out of order");
    if (static_cast<size_t>(min) > opts_.max_repeat || (max >= 0 && static_cast<size_t>(max) > opts_.max_repeat))
      return err(path, "minLength/maxLength above max_repeat=" + std::to_string(opts_.max_repeat));
    const long chain = max >= 0 ? max : min;
    std::vector<uint32_t> c(static_cast<size_t>(chain) + 1);
    for (long k = 0; k <= chain; ++k) c[static_cast<size_t>(k)] = gb_.new_rule("str_c" + std::to_string(k));
    // c[k]: k chars written so far
    for (long k = 0; k <= chain; ++k) {
      const uint32_t r = c[static_cast<size_t>(k)];
      if (k >= min) PAGODA_TRY(gb_.add_alt(r, {gb_.byte('"')}));
      if (k < chain) PAGODA_TRY(add_char_alts(r, c[static_cast<size_t>(k + 1)]));
      else if (max < 0) PAGODA_TRY(add_char_alts(r, r));
    }
    const uint32_t s = gb_.new_rule("sized_string");
    PAGODA_TRY(gb_.add_alt(s, {gb_.byte('"'), R(c[0])}));
    return s;
  }

  Expected<uint32_t> regex_string(const std::string& re, bool search, const std::string& path) {
    auto dfa = compile_regex(re, opts_, search);
    if (!dfa.ok()) return err(path, dfa.message());
    auto start = add_dfa_rules(gb_, *dfa, true, "pat" + std::to_string(n_patterns_++) + "_");
    if (!start.ok()) return err(path, start.message());
    const uint32_t s = gb_.new_rule("pattern_string");
    PAGODA_TRY(gb_.add_alt(s, {gb_.byte('"'), R(*start), gb_.byte('"')}));
    return s;
  }

  // Calls take(key, low, exclusive, value) for each numeric bound of s:
  // minimum, exclusiveMinimum, maximum, exclusiveMaximum (a draft-4 boolean
  // exclusive* flag makes its plain bound exclusive). Shared checks: a number,
  // |x| <= 9e15 (exact in a double and a long long).
  template <class Take>
  Status for_each_bound(const json& s, const std::string& path, Take&& take) {
    static constexpr struct { const char* key; bool low, exclusive; } kBounds[] = {
        {"minimum", true, false}, {"exclusiveMinimum", true, true},
        {"maximum", false, false}, {"exclusiveMaximum", false, true}};
    for (const auto& bd : kBounds) {
      if (!s.contains(bd.key) || s[bd.key].is_boolean()) continue;  // the boolean flag form: below
      const json& v = s[bd.key];
      if (!v.is_number()) return err(path + "/" + bd.key, "must be a number");
      const double d = v.get<double>();
      if (std::fabs(d) > 9e15) return err(path + "/" + bd.key, "bound too large (|x| > 9e15)");
      bool excl = bd.exclusive;
      const char* flag = bd.low ? "exclusiveMinimum" : "exclusiveMaximum";
      if (!excl && s.contains(flag) && s[flag].is_boolean() && s[flag].get<bool>()) excl = true;
      PAGODA_TRY(take(bd.key, bd.low, excl, d));
    }
    return Status::Ok();
  }

  // Reads minimum/maximum/exclusive* as integer bounds. Fractional bounds on
  // integers round inward; on numbers they are an error (not exact).
  Status int_bounds(const json& s, const std::string& path, bool is_integer, bool& has_lo, long long& lo,
                    bool& has_hi, long long& hi) {
    has_lo = has_hi = false;
    return for_each_bound(s, path, [&](const char*, bool low, bool excl, double d) -> Status {
      long long b;
      if (low) b = excl ? static_cast<long long>(std::floor(d)) + 1 : static_cast<long long>(std::ceil(d));
      else b = excl ? static_cast<long long>(std::ceil(d)) - 1 : static_cast<long long>(std::floor(d));
      if (low) {
        if (!has_lo || b > lo) lo = b;
        has_lo = true;
      } else {
        if (!has_hi || b < hi) hi = b;
        has_hi = true;
      }
      return Status::Ok();
    });
  }

  // ---------------------------------------------------------- schema walk

  Expected<uint32_t> visit_ref(const std::string& ref, const std::string& path, int depth) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return it->second;
    if (ref.empty() || ref[0] != '#') return err(path, "only local $ref (\"#...\") is supported: " + ref);
    json::json_pointer ptr;
    try {
      ptr = json::json_pointer(ref.substr(1));
    } catch (const std::exception& e) {
      return err(path, "bad $ref pointer " + ref);
    }
    if (!root_.contains(ptr)) return err(path, "$ref target not found: " + ref);
    // Rule first, then its body: a recursive reference finds the rule.
    const uint32_t r = gb_.new_rule("ref" + std::to_string(refs_.size()));
    refs_[ref] = r;
    PAGODA_ASSIGN_OR_RETURN(uint32_t body, visit(root_.at(ptr), ref, depth + 1));
    PAGODA_TRY(gb_.add_alt(r, {R(body)}));
    return r;
  }

  Expected<uint32_t> visit(const json& s, const std::string& path, int depth) {
    if (depth > opts_.max_schema_depth)
      return err(path, "schema nested deeper than max_schema_depth=" + std::to_string(opts_.max_schema_depth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      return err(path, "schema false accepts nothing");
    }
    if (!s.is_object()) return err(path, "a schema must be an object or a boolean");
    for (const char* k : {"not", "if", "then", "else", "prefixItems", "patternProperties", "minProperties",
                          "maxProperties", "uniqueItems", "dependentRequired", "dependentSchemas",
                          "propertyNames", "contains", "unevaluatedProperties", "unevaluatedItems",
                          "multipleOf", "$dynamicRef"})
      if (s.contains(k)) return err(path + "/" + k, "unsupported keyword");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return err(path + "/$ref", "must be a string");
      return visit_ref(s["$ref"].get<std::string>(), path + "/$ref", depth);
    }
    if (s.contains("const")) {
      return literal_rule(s["const"].dump(), "const");
    }
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) return err(path + "/enum", "must be a non-empty array");
      if (e.size() > opts_.max_enum_size)
        return err(path + "/enum", std::to_string(e.size()) + " values > max_enum_size=" +
                                       std::to_string(opts_.max_enum_size));
      std::vector<std::string> vals;
      for (const json& v : e) vals.push_back(v.dump());
      auto g = choice_rule(vals);
      if (!g.ok()) return err(path + "/enum", g.message());
      return g;
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      const json& a = s[k];
      if (!a.is_array() || a.empty()) return err(path + "/" + k, "must be a non-empty array");
      const uint32_t r = gb_.new_rule(k);
      for (size_t i = 0; i < a.size(); ++i) {
        // Sibling keywords (e.g. a shared "type") are merged into each branch.
        json branch = a[i];
        if (branch.is_object())
          for (auto it = s.begin(); it != s.end(); ++it)
            if (it.key() != k && !branch.contains(it.key())) branch[it.key()] = it.value();
        PAGODA_ASSIGN_OR_RETURN(uint32_t b, visit(branch, path + "/" + k + "/" + std::to_string(i), depth + 1));
        PAGODA_TRY(gb_.add_alt(r, {R(b)}));
      }
      return r;
    }
    if (s.contains("allOf")) {
      const json& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) return err(path + "/allOf", "only allOf with one schema is supported");
      return visit(a[0], path + "/allOf/0", depth + 1);
    }
    if (s.contains("type") && s["type"].is_array()) {
      const json& types = s["type"];
      if (types.empty()) return err(path + "/type", "empty type list");
      const uint32_t r = gb_.new_rule("types");
      for (size_t i = 0; i < types.size(); ++i) {
        json one = s;
        one["type"] = types[i];
        PAGODA_ASSIGN_OR_RETURN(uint32_t b, visit(one, path, depth + 1));
        PAGODA_TRY(gb_.add_alt(r, {R(b)}));
      }
      return r;
    }
    std::string type;
    if (s.contains("type")) {
      if (!s["type"].is_string()) return err(path + "/type", "must be a string or an array of strings");
      type = s["type"].get<std::string>();
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      type = "object";
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      type = "array";
    } else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
      type = "string";
    } else {
      return any_value();
    }
    if (type == "string") return visit_string(s, path);
    if (type == "integer" || type == "number") {
      bool has_lo, has_hi;
      long long lo = 0, hi = 0;
      PAGODA_TRY(int_bounds(s, path, type == "integer", has_lo, lo, has_hi, hi));
      if (type == "integer") {
        if (!has_lo && !has_hi) return any_integer();
        auto r = numbers_.int_range({has_lo, false, lo, has_hi, false, hi});
        if (!r.ok()) return err(path, r.message());
        return r;
      }
      if (!has_lo && !has_hi) return any_number();
      return number_range(s, path);
    }
    if (type == "boolean") {
      const uint32_t r = gb_.new_rule("boolean");
      for (const char* lit : {"true", "false"}) {
        std::vector<uint32_t> seq;
        gb_.append_literal(seq, lit);
        PAGODA_TRY(gb_.add_alt(r, seq));
      }
      return r;
    }
    if (type == "null") return literal_rule("null", "null");
    if (type == "array") return visit_array(s, path, depth);
    if (type == "object") return visit_object(s, path, depth);
    return err(path + "/type", "unknown type \"" + type + "\"");
  }

  // Numbers x with lo <= x <= hi (or < when exclusive), integral bounds, exact.
  Expected<uint32_t> number_range(const json& s, const std::string& path) {
    bool has_lo = false, has_hi = false, lo_excl = false, hi_excl = false;
    long long lo = 0, hi = 0;
    PAGODA_TRY(for_each_bound(s, path, [&](const char* key, bool low, bool excl, double d) -> Status {
      if (d != std::floor(d)) return err(path + "/" + key, "fractional bounds on \"number\" are not supported");
      const long long b = static_cast<long long>(d);
      if (low) {
        if (!has_lo || b > lo || (b == lo && excl)) { lo = b; lo_excl = excl; }
        has_lo = true;
      } else {
        if (!has_hi || b < hi || (b == hi && excl)) { hi = b; hi_excl = excl; }
        has_hi = true;
      }
      return Status::Ok();
    }));
    auto r = numbers_.number_range({has_lo, lo_excl, lo, has_hi, hi_excl, hi});
    if (!r.ok()) return err(path, r.message());
    return r;
  }

  Expected<uint32_t> choice_rule(const std::vector<std::string>& vals) {
    return add_trie_rules(gb_, vals, "enum" + std::to_string(n_enums_++) + "_");
  }

  // RFC 3339 full-date with the real calendar: 30-day months, February 29 only
  // in leap years (Gregorian rule), years 0001-9999.
  static constexpr const char* kDate =
      "(([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-"
      "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
      "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([13579][26]|[2468][048]|0[48])00)-02-29)";
  // RFC 3339 full-time (offset required).
  static constexpr const char* kTime =
      "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";

  // A repetition bound s[k] (minLength, maxItems, ...): absent leaves `out` as
  // it is; else a non-negative integer up to max_repeat.
  Status get_count(const json& s, const std::string& path, const char* k, long& out) const {
    if (!s.contains(k)) return Status::Ok();
    if (!s[k].is_number_integer() || s[k].get<long long>() < 0)
      return err(path + "/" + k, "must be a non-negative integer");
    const long long v = s[k].get<long long>();
    if (static_cast<unsigned long long>(v) > opts_.max_repeat)
      return err(path + "/" + k, std::to_string(v) + " > max_repeat=" + std::to_string(opts_.max_repeat));
    out = static_cast<long>(v);
    return Status::Ok();
  }

  Expected<uint32_t> visit_string(const json& s, const std::string& path) {
    long min = 0, max = -1;
    PAGODA_TRY(get_count(s, path, "minLength", min));
    PAGODA_TRY(get_count(s, path, "maxLength", max));
    const bool sized = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return err(path + "/pattern", "must be a string");
      if (sized) return err(path, "pattern together with minLength/maxLength is not supported");
      return regex_string(s["pattern"].get<std::string>(), true, path + "/pattern");
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return err(path + "/format", "must be a string");
      static const std::map<std::string, std::string> formats = {
          {"date", kDate},
          {"time", kTime},
          {"date-time",
           std::string(kDate) + "T" + kTime},
          {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
          {"email", R"([a-zA-Z0-9._%+\-]+@[a-zA-Z0-9\-]+(\.[a-zA-Z0-9\-]+)*\.[a-zA-Z]{2,})"},
          {"ipv4", R"(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))"},
      };
      auto it = formats.find(s["format"].get<std::string>());
      if (it != formats.end()) {
        if (sized) return err(path, "format together with minLength/maxLength is not supported");
        return regex_string(it->second, false, path + "/format");
      }
      // Unknown formats are annotations in JSON Schema: any string.
    }
    if (sized) return sized_string(min, max, path);
    return any_string();
  }

  Expected<uint32_t> visit_array(const json& s, const std::string& path, int depth) {
    long min = 0, max = -1;
    PAGODA_TRY(get_count(s, path, "minItems", min));
    PAGODA_TRY(get_count(s, path, "maxItems", max));
    if (max >= 0 && max < min) return err(path + "/maxItems", "below minItems");
    uint32_t item;
    if (s.contains("items")) {
      if (s["items"].is_boolean() && !s["items"].get<bool>()) {
        if (min > 0) return err(path + "/items", "false with minItems > 0 accepts nothing");
        max = 0;
        PAGODA_ASSIGN_OR_RETURN(item, any_value());
      } else {
        PAGODA_ASSIGN_OR_RETURN(item, visit(s["items"], path + "/items", depth + 1));
      }
    } else {
      PAGODA_ASSIGN_OR_RETURN(item, any_value());
    }
    return list_rule(item, min, max, "arr", path);
  }

  Expected<uint32_t> visit_object(const json& s, const std::string& path, int depth) {
    PAGODA_ASSIGN_OR_RETURN(uint32_t w, ws());
    std::vector<std::string> names;
    std::vector<uint32_t> values;
    std::vector<bool> required;
    std::map<std::string, bool> req;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return err(path + "/required", "must be an array of strings");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return err(path + "/required", "must be an array of strings");
        req[r.get<std::string>()] = true;
      }
    }
    if (s.contains("properties")) {
      const json& props = s["properties"];
      if (!props.is_object()) return err(path + "/properties", "must be an object");
      for (auto it = props.begin(); it != props.end(); ++it) {
        names.push_back(it.key());
        PAGODA_ASSIGN_OR_RETURN(uint32_t v, visit(it.value(), path + "/properties/" + escape_pointer(it.key()), depth + 1));
        values.push_back(v);
        required.push_back(req.count(it.key()) > 0);
      }
    }
    // Required names without a property schema take any value.
    for (auto& [name, _] : req) {
      if (std::find(names.begin(), names.end(), name) != names.end()) continue;
      names.push_back(name);
      PAGODA_ASSIGN_OR_RETURN(uint32_t v, any_value());
      values.push_back(v);
      required.push_back(true);
    }
    // additionalProperties: schema of extra values, or none.
    uint32_t extra = UINT32_MAX;
    if (s.contains("additionalProperties")) {
      const json& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        PAGODA_ASSIGN_OR_RETURN(extra, visit(ap, path + "/additionalProperties", depth + 1));
      }
    } else if (names.empty() || !opts_.strict_additional_properties) {
      PAGODA_ASSIGN_OR_RETURN(extra, any_value());
    }
    // Properties in declared order. rest[k][f]: properties k.. remain; f = 1 when
    // none was written yet (no comma before the next). The end: extra members
    // (keys other than the declared names) then "}".
    const size_t n = names.size();
    uint32_t str = UINT32_MAX;
    if (extra != UINT32_MAX) {
      PAGODA_ASSIGN_OR_RETURN(str, string_except(names));
    }
    std::vector<std::array<uint32_t, 2>> rest(n + 1);
    for (size_t k = 0; k <= n; ++k)
      for (int f = 0; f < 2; ++f) rest[k][static_cast<size_t>(f)] = gb_.new_rule("obj_r" + std::to_string(k) + (f ? "f" : "n"));
    for (int f = 0; f < 2; ++f) {
      const uint32_t end = rest[n][static_cast<size_t>(f)];
      PAGODA_TRY(gb_.add_alt(end, {R(w), gb_.byte('}')}));
      if (extra != UINT32_MAX) {
        // end ::= ws "}" | (ws "," )? ws string ws ":" ws extra end(not first)
        std::vector<uint32_t> seq{R(w)};
        if (!f) { seq.push_back(gb_.byte(',')); seq.push_back(R(w)); }
        for (uint32_t e : {R(str), R(w), gb_.byte(':'), R(w), R(extra), R(rest[n][0])}) seq.push_back(e);
        PAGODA_TRY(gb_.add_alt(end, seq));
      }
    }
    for (size_t k = n; k-- > 0;) {
      std::vector<uint32_t> key;
      gb_.append_literal(key, json(names[k]).dump());
      for (int f = 0; f < 2; ++f) {
        const uint32_t r = rest[k][static_cast<size_t>(f)];
        std::vector<uint32_t> seq{R(w)};
        if (!f) { seq.push_back(gb_.byte(',')); seq.push_back(R(w)); }
        seq.insert(seq.end(), key.begin(), key.end());
        for (uint32_t e : {R(w), gb_.byte(':'), R(w), R(values[k]), R(rest[k + 1][0])}) seq.push_back(e);
        PAGODA_TRY(gb_.add_alt(r, seq));
        if (!required[k]) PAGODA_TRY(gb_.add_alt(r, {R(rest[k + 1][static_cast<size_t>(f)])}));
      }
    }
    const uint32_t obj = gb_.new_rule("obj");
    PAGODA_TRY(gb_.add_alt(obj, {gb_.byte('{'), R(rest[0][1])}));
    return obj;
  }

  const json& root_;
  GrammarOptions opts_;
  GrammarBuilder gb_;
  NumberRules numbers_;
  std::map<std::string, uint32_t> refs_;
  uint32_t ws_ = UINT32_MAX, string_ = UINT32_MAX, uint_ = UINT32_MAX,
           integer_ = UINT32_MAX, frac_exp_ = UINT32_MAX, number_ = UINT32_MAX, object_ = UINT32_MAX,
           array_ = UINT32_MAX, value_ = UINT32_MAX, chars_ = UINT32_MAX;
  int n_patterns_ = 0;
  int n_enums_ = 0;
};

}  // namespace

Expected<std::shared_ptr<const Grammar>> Grammar::from_json_schema(std::string_view schema_json,
                                                                   const GrammarOptions& opts) {
  return from_json_schema_framed(schema_json, "", "", opts);
}

Expected<std::shared_ptr<const Grammar>> Grammar::from_json_schema_framed(std::string_view schema_json,
                                                                          std::string_view prefix,
                                                                          std::string_view suffix,
                                                                          const GrammarOptions& opts) {
  // nlohmann's parser is iterative, but its depth is still bounded here first so
  // a 10k-deep document costs a linear scan, not a parse. Each schema level is
  // at most two JSON levels ({"properties": {...}}) plus keyword containers: 4x
  // is generous.
  const int max_json_depth = 4 * opts.max_schema_depth + 8;
  const int depth = json_nesting_depth(schema_json, max_json_depth);
  if (depth > max_json_depth)
    return errorf("#: schema nested deeper than max_schema_depth=%d (JSON depth above %d)", opts.max_schema_depth,
                  max_json_depth);
  json root = json::parse(schema_json, nullptr, false);
  if (root.is_discarded()) return make_error("#: schema is not valid JSON");
  Converter c(root, opts);
  return c.run(prefix, suffix);
}

Expected<std::shared_ptr<const Grammar>> Grammar::json_object(const GrammarOptions& opts) {
  json dummy;
  Converter c(dummy, opts);
  return c.run_object();
}

}  // namespace pagoda::grammar
