// Jinja filters and tests (the builtins real chat templates use).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_set>

#include "tok/jinja_interp.h"
#include "tok/unicode.h"

namespace pagoda::tok::jinja {

namespace {

using FilterFn = Expected<Value> (*)(Interp&, const Value&, CallArgs&);
using TestFn = Expected<bool> (*)(Interp&, const Value&, CallArgs&);

Expected<Value> as_str(const Value& v) { return to_string_value(v); }

const Value* arg(CallArgs& a, size_t i, const char* name) { return a.get(i, name); }

// attribute="a.b" lookups (jinja's make_attrgetter; integer parts index lists).
Expected<Value> attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  for (;;) {
    const size_t e = path.find('.', b);
    const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (cur.is_undefined()) return Value();
    Value key = literal_str(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      key = Value::integer(std::atoll(part.c_str()));
    }
    PAGODA_ASSIGN_OR_RETURN(cur, get_item(cur, key));
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

Expected<Value> f_trim(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v));
  const Value* c = arg(a, 0, "chars");
  const std::string* chars = c != nullptr && c->is_str() ? &c->str().s : nullptr;
  return py_strip_value(s, chars, true, true);
}

Expected<Value> f_tojson(Interp&, const Value& v, CallArgs& a) {
  const Value* ind = arg(a, 0, "indent");
  const Value* sk = a.get(99, "sort_keys");
  int indent = -1;
  if (ind != nullptr && !ind->is_none()) {
    if (ind->type != Value::Type::kInt) return make_error("tojson: indent must be an integer");
    indent = static_cast<int>(std::clamp<int64_t>(ind->i, 0, 64));
  }
  bool ensure_ascii = false;
  for (const auto& [k, x] : a.kw) {
    if (k != "indent" && k != "sort_keys" && k != "ensure_ascii") return errorf("tojson: unsupported argument '%s'", k.c_str());
    if (k == "ensure_ascii") ensure_ascii = truthy(x);
  }
  StrBuilder out;
  PAGODA_TRY(to_json(v, out, indent, sk != nullptr && truthy(*sk), ensure_ascii));
  return make_str(std::move(out));
}

Expected<Value> f_length(Interp&, const Value& v, CallArgs&) {
  switch (v.type) {
    case Value::Type::kStr: return Value::integer(static_cast<int64_t>(utf8_length(v.str().s)));
    case Value::Type::kList:
      if (v.list().generator) return make_error("object of type 'generator' has no len() (add |list)");
      return Value::integer(static_cast<int64_t>(v.list().items.size()));
    case Value::Type::kDict: return Value::integer(static_cast<int64_t>(v.dict().items.size()));
    case Value::Type::kUndefined: return Value::integer(0);
    default: return errorf("object of type %s has no length", type_name(v));
  }
}

Expected<Value> f_items(Interp&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return make_list({});
  if (!v.is_dict()) return errorf("items: expected a mapping, got %s", type_name(v));
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().items) {
    PAGODA_ASSIGN_OR_RETURN(Value t, make_list({k, x}, true));
    out.push_back(std::move(t));
  }
  return make_generator(std::move(out));
}

// select/reject (by test on the item) and selectattr/rejectattr (test on an attribute).
Expected<Value> select_impl(Interp& in, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  // jinja2: `if value: for item in value` (None selects nothing).
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, truthy(v) ? iterate(v) : std::vector<Value>{});
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_str()) return make_error("selectattr/rejectattr need an attribute name");
    attr = a.pos[0].str().s;
    next = 1;
  }
  int test = -1;
  CallArgs targs;
  if (a.pos.size() > next) {
    if (!a.pos[next].is_str()) return make_error("select: test name must be a string");
    test = find_test(a.pos[next].str().s);
    if (test < 0) return errorf("unsupported test '%s'", a.pos[next].str().s.c_str());
    targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(next + 1), a.pos.end());
  }
  std::vector<Value> out;
  for (const Value& it : items) {
    PAGODA_TRY(in.step());
    Value x = it;
    if (by_attr) { PAGODA_ASSIGN_OR_RETURN(x, attr_path(it, attr)); }
    bool ok;
    if (test < 0) {
      ok = truthy(x);
    } else {
      PAGODA_ASSIGN_OR_RETURN(ok, apply_test(in, test, x, targs));
    }
    if (ok == keep) out.push_back(it);
  }
  return make_generator(std::move(out));
}
Expected<Value> f_select(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Expected<Value> f_reject(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Expected<Value> f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Expected<Value> f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

Expected<Value> f_map(Interp& in, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, truthy(v) ? iterate(v) : std::vector<Value>{});
  std::vector<Value> out;
  const Value* attr = nullptr;
  const Value* def = nullptr;
  for (const auto& [k, x] : a.kw) {
    if (k == "attribute") attr = &x;
    else if (k == "default") def = &x;
    else return errorf("map: unsupported argument '%s'", k.c_str());
  }
  if (attr != nullptr) {
    if (!attr->is_str()) return make_error("map: attribute must be a string");
    for (const Value& it : items) {
      PAGODA_TRY(in.step());
      PAGODA_ASSIGN_OR_RETURN(Value x, attr_path(it, attr->str().s));
      if (x.is_undefined() && def != nullptr) x = *def;
      out.push_back(std::move(x));
    }
    return make_generator(std::move(out));
  }
  if (a.pos.empty() || !a.pos[0].is_str()) return make_error("map: expected a filter name or attribute=");
  const int f = find_filter(a.pos[0].str().s);
  if (f < 0) return errorf("unsupported filter '%s'", a.pos[0].str().s.c_str());
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  for (const Value& it : items) {
    PAGODA_TRY(in.step());
    PAGODA_ASSIGN_OR_RETURN(Value x, apply_filter(in, f, it, fargs));
    out.push_back(std::move(x));
  }
  return make_generator(std::move(out));
}

Expected<Value> f_join(Interp& in, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  const Value* sep = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  StrBuilder out;
  for (size_t i = 0; i < items.size(); ++i) {
    PAGODA_TRY(in.step());
    if (i > 0 && sep != nullptr) PAGODA_TRY(print_value(*sep, out));
    Value x = items[i];
    if (attr != nullptr && attr->is_str()) { PAGODA_ASSIGN_OR_RETURN(x, attr_path(x, attr->str().s)); }
    PAGODA_TRY(print_value(x, out));
  }
  return make_str(std::move(out));
}

Expected<Value> f_default(Interp&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default_value");
  const Value* boolean = arg(a, 1, "boolean");
  const bool use_default = v.is_undefined() || (boolean != nullptr && truthy(*boolean) && !truthy(v));
  if (!use_default) return v;
  return d != nullptr ? *d : literal_str("");
}

Expected<Value> f_first(Interp&, const Value& v, CallArgs&) {
  if (v.is_str()) return get_item(v, Value::integer(0));
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  return items.empty() ? Value() : items.front();
}

Expected<Value> f_last(Interp&, const Value& v, CallArgs&) {
  if (v.is_str()) return get_item(v, Value::integer(-1));
  if (v.is_dict()) return make_error("last: a mapping is not reversible");
  if (is_generator(v)) return make_error("last: a generator is not reversible (add |list)");
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  return items.empty() ? Value() : items.back();
}

Expected<Value> f_string(Interp&, const Value& v, CallArgs&) { return as_str(v); }

Expected<Value> f_int(Interp&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  const Value def = d != nullptr ? *d : Value::integer(0);
  switch (v.type) {
    case Value::Type::kInt: return v;
    case Value::Type::kBool: return Value::integer(v.b ? 1 : 0);
    case Value::Type::kFloat:
      if (!std::isfinite(v.f) || std::fabs(v.f) > 9e18) return def;
      return Value::integer(static_cast<int64_t>(v.f));
    case Value::Type::kStr: {
      const std::string s = v.str().s;
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(s.c_str(), &end, 10);
      if (end != s.c_str() && errno == 0) {
        while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
        if (*end == '\0') return Value::integer(x);
      }
      // int(float(s)): Python's float() takes no hex (strtod does).
      if (s.find_first_of("xX") != std::string::npos) return def;
      const double f = std::strtod(s.c_str(), &end);
      if (end != s.c_str() && *end == '\0' && std::isfinite(f) && std::fabs(f) < 9e18) return Value::integer(static_cast<int64_t>(f));
      return def;
    }
    default: return def;
  }
}

Expected<Value> f_float(Interp&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  if (v.is_number()) return Value::real(v.as_double());
  if (v.is_str()) {
    char* end = nullptr;
    const double f = std::strtod(v.str().s.c_str(), &end);
    if (end != v.str().s.c_str() && *end == '\0') return Value::real(f);
  }
  return d != nullptr ? *d : Value::real(0.0);
}

Expected<Value> f_indent(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value sv, as_str(v));
  const Value* w = arg(a, 0, "width");
  const Value* first = arg(a, 1, "first");
  const Value* blank = arg(a, 2, "blank");
  std::string ind = "    ";
  if (w != nullptr) {
    if (w->is_str()) ind = w->str().s;
    else if (w->type == Value::Type::kInt) ind.assign(static_cast<size_t>(std::clamp<int64_t>(w->i, 0, 1024)), ' ');
  }
  // jinja2: s += "\n"; lines = s.splitlines(); indent each non-empty line but the first.
  const Str& s = sv.str();
  std::vector<std::pair<size_t, size_t>> lines;  // byte ranges of s + "\n" split by splitlines
  size_t b = 0;
  for (size_t i = 0; i < s.s.size();) {
    const size_t l = utf8_valid_len(s.s, i) == 0 ? 1 : utf8_valid_len(s.s, i);
    const uint32_t c = l == 1 ? static_cast<unsigned char>(s.s[i]) : utf8_decode(s.s, i, l);
    const bool br = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                    c == 0x2028 || c == 0x2029;
    if (!br) {
      i += l;
      continue;
    }
    lines.emplace_back(b, i);
    i += l;
    if (c == '\r' && i < s.s.size() && s.s[i] == '\n') ++i;
    b = i;
  }
  lines.emplace_back(b, s.s.size());  // the line the appended "\n" terminates
  StrBuilder out;
  const bool all = blank != nullptr && truthy(*blank);
  if (first != nullptr && truthy(*first)) out.append(ind);
  for (size_t k = 0; k < lines.size(); ++k) {
    const auto [lb, le] = lines[k];
    if (k > 0) {
      out.append("\n");
      if (all || le > lb) out.append(ind);
    }
    out.append(s, lb, le - lb);
  }
  return make_str(std::move(out));
}

Expected<Value> f_upper(Interp&, const Value& v, CallArgs&) { PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v)); return case_map(s, 'u'); }
Expected<Value> f_lower(Interp&, const Value& v, CallArgs&) { PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v)); return case_map(s, 'l'); }
Expected<Value> f_title(Interp&, const Value& v, CallArgs&) { PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v)); return case_map(s, 'T'); }
Expected<Value> f_capitalize(Interp&, const Value& v, CallArgs&) { PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v)); return case_map(s, 'c'); }

Expected<Value> f_replace(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v));
  const Value* f = arg(a, 0, "old");
  const Value* t = arg(a, 1, "new");
  const Value* c = arg(a, 2, "count");
  if (f == nullptr || t == nullptr) return make_error("replace needs two arguments");
  PAGODA_ASSIGN_OR_RETURN(Value fs, as_str(*f));
  PAGODA_ASSIGN_OR_RETURN(Value ts, as_str(*t));
  return py_replace(s, fs, ts, c != nullptr && !c->is_none() ? c->as_int() : -1);
}

Expected<Value> f_list(Interp&, const Value& v, CallArgs&) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  return make_list(std::move(items));
}

Expected<Value> f_unique(Interp& in, const Value& v, CallArgs&) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  std::vector<Value> out;
  std::unordered_set<std::string> seen;  // hashable items: linear time
  for (const Value& x : items) {
    PAGODA_TRY(in.step());
    std::string key;
    if (!hash_key(x, &key)) return make_error("unique: unhashable item (list or dict)");
    if (x.is_str()) {  // case_sensitive=False
      for (size_t i = 2; i < key.size(); ++i) key[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(key[i])));
    }
    if (seen.insert(std::move(key)).second) out.push_back(x);
  }
  return make_generator(std::move(out));
}

Expected<Value> f_reverse(Interp&, const Value& v, CallArgs&) {
  if (v.is_str()) return slice(v, Value::none(), Value::none(), Value::integer(-1));
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  std::reverse(items.begin(), items.end());
  return make_generator(std::move(items));
}

Expected<Value> f_sort(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  const Value* rev = arg(a, 0, "reverse");
  const Value* attr = a.get(99, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : items) {
    Value k = x;
    if (attr != nullptr && attr->is_str()) { PAGODA_ASSIGN_OR_RETURN(k, attr_path(x, attr->str().s)); }
    if (k.is_str()) { PAGODA_ASSIGN_OR_RETURN(k, case_map(k, 'l')); }  // case_sensitive=False
    keyed.emplace_back(std::move(k), x);
  }
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
    auto r = less(p.first, q.first);
    if (!r.ok()) {
      err = r.error();
      return false;
    }
    return *r;
  });
  PAGODA_TRY(err);
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  if (rev != nullptr && truthy(*rev)) std::reverse(out.begin(), out.end());
  return make_list(std::move(out));
}

Expected<Value> f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value items, f_items(in, v, a));
  CallArgs none;
  return f_sort(in, items, none);
}

Expected<Value> f_safe(Interp&, const Value& v, CallArgs&) {
  PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v));
  if (s.str().markup) return s;
  StrBuilder b;
  b.append(s.str());
  PAGODA_ASSIGN_OR_RETURN(Value m, make_str(std::move(b)));
  static_cast<Str&>(*m.obj).markup = true;
  return m;
}

}  // namespace

// markupsafe.escape.
Expected<Value> html_escape(const Value& v) {
  PAGODA_ASSIGN_OR_RETURN(Value sv, to_string_value(v));
  const Str& s = sv.str();
  if (s.markup) return sv;
  std::string o;
  for (char c : s.s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&#34;"; break;
      case '\'': o += "&#39;"; break;
      default: o.push_back(c);
    }
  }
  PAGODA_ASSIGN_OR_RETURN(Value m, make_str(std::move(o), !s.taint.empty()));
  static_cast<Str&>(*m.obj).markup = true;
  return m;
}

namespace {

Expected<Value> f_escape(Interp&, const Value& v, CallArgs&) { return html_escape(v); }

Expected<Value> f_abs(Interp&, const Value& v, CallArgs&) {
  if (v.type == Value::Type::kFloat) return Value::real(std::fabs(v.f));
  if (v.is_number()) {
    if (v.as_int() == INT64_MIN) return make_error("integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  return errorf("bad operand type for abs(): %s", type_name(v));
}

Expected<Value> f_round(Interp&, const Value& v, CallArgs& a) {
  if (!v.is_number()) return errorf("round: expected a number, got %s", type_name(v));
  const Value* p = arg(a, 0, "precision");
  const Value* m = arg(a, 1, "method");
  const int prec = p != nullptr ? static_cast<int>(std::clamp<int64_t>(p->as_int(), -20, 20)) : 0;
  const std::string method = m != nullptr && m->is_str() ? m->str().s : "common";
  const double scale = std::pow(10.0, prec);
  double x = v.as_double() * scale;
  if (method == "common") x = std::nearbyint(x);  // Python's round: half to even
  else if (method == "floor") x = std::floor(x);
  else if (method == "ceil") x = std::ceil(x);
  else return make_error("round: method must be common, floor or ceil");
  return Value::real(x / scale);
}

Expected<Value> f_sum(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  const Value* attr = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value acc = start != nullptr ? *start : Value::integer(0);
  for (const Value& x : items) {
    Value y = x;
    if (attr != nullptr && attr->is_str()) { PAGODA_ASSIGN_OR_RETURN(y, attr_path(x, attr->str().s)); }
    PAGODA_ASSIGN_OR_RETURN(acc, binary_op("+", acc, y));
  }
  return acc;
}

Expected<Value> minmax(const Value& v, bool want_max) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  if (items.empty()) return Value();
  Value best = items[0];
  for (size_t i = 1; i < items.size(); ++i) {
    PAGODA_ASSIGN_OR_RETURN(bool lt, want_max ? less(best, items[i]) : less(items[i], best));
    if (lt) best = items[i];
  }
  return best;
}
Expected<Value> f_min(Interp&, const Value& v, CallArgs&) { return minmax(v, false); }
Expected<Value> f_max(Interp&, const Value& v, CallArgs&) { return minmax(v, true); }

Expected<Value> f_format(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v));
  if (!a.kw.empty()) return make_error("format: keyword arguments are not supported");
  PAGODA_ASSIGN_OR_RETURN(Value args, make_list(a.pos, true));
  return binary_op("%", s, args);
}

Expected<Value> f_attr(Interp&, const Value& v, CallArgs& a) {
  const Value* n = arg(a, 0, "name");
  if (n == nullptr || !n->is_str()) return make_error("attr needs a name");
  // Python getattr only: a dict's keys are not attributes.
  PAGODA_ASSIGN_OR_RETURN(Value r, get_attr(v, n->str().s));
  if (v.is_dict() && !v.dict().is_namespace && r.type != Value::Type::kFunc) return Value();
  return r;
}

Expected<Value> f_wordcount(Interp&, const Value& v, CallArgs&) {
  PAGODA_ASSIGN_OR_RETURN(Value s, as_str(v));
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : s.str().s) {
    const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

// A filter or test under its Jinja name; the parser stores the table index.
template <class Fn>
struct Named {
  const char* name;
  Fn fn;
};
template <class Fn, size_t N>
int index_of(const Named<Fn> (&table)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (name == table[i].name) return static_cast<int>(i);
  }
  return -1;
}

const Named<FilterFn> kFilters[] = {
    {"trim", f_trim},         {"tojson", f_tojson},       {"length", f_length},       {"count", f_length},
    {"items", f_items},       {"select", f_select},       {"reject", f_reject},       {"selectattr", f_selectattr},
    {"rejectattr", f_rejectattr}, {"map", f_map},         {"join", f_join},           {"default", f_default},
    {"d", f_default},         {"first", f_first},         {"last", f_last},           {"string", f_string},
    {"int", f_int},           {"float", f_float},         {"indent", f_indent},       {"upper", f_upper},
    {"lower", f_lower},       {"title", f_title},         {"capitalize", f_capitalize}, {"replace", f_replace},
    {"list", f_list},         {"unique", f_unique},       {"reverse", f_reverse},     {"sort", f_sort},
    {"dictsort", f_dictsort}, {"safe", f_safe},           {"escape", f_escape},       {"e", f_escape},
    {"forceescape", f_escape}, {"abs", f_abs},            {"round", f_round},         {"sum", f_sum},
    {"min", f_min},           {"max", f_max},             {"format", f_format},       {"attr", f_attr},
    {"wordcount", f_wordcount},
};

// ---- tests ----
Expected<bool> t_defined(Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }
Expected<bool> t_undefined(Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }
Expected<bool> t_none(Interp&, const Value& v, CallArgs&) { return v.is_none(); }
Expected<bool> t_string(Interp&, const Value& v, CallArgs&) { return v.is_str(); }
Expected<bool> t_mapping(Interp&, const Value& v, CallArgs&) { return v.is_dict() && !v.dict().is_namespace; }
Expected<bool> t_iterable(Interp&, const Value& v, CallArgs&) { return v.is_str() || v.is_list() || (v.is_dict() && !v.dict().is_namespace); }
Expected<bool> t_sequence(Interp&, const Value& v, CallArgs&) { return v.is_str() || (v.is_list() && !v.list().generator) || (v.is_dict() && !v.dict().is_namespace); }
Expected<bool> t_number(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kInt || v.type == Value::Type::kFloat; }
Expected<bool> t_integer(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kInt; }
Expected<bool> t_float(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kFloat; }
Expected<bool> t_boolean(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kBool; }
Expected<bool> t_true(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kBool && v.b; }
Expected<bool> t_false(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kBool && !v.b; }
Expected<bool> t_callable(Interp&, const Value& v, CallArgs&) { return v.type == Value::Type::kFunc; }
// Python's str.isupper / str.islower (ASCII letters): a string with at least
// one letter, all of them of that case.
bool one_case(const Value& v, bool upper) {
  if (!v.is_str()) return false;
  bool cased = false;
  for (unsigned char c : v.str().s) {
    if (upper ? std::islower(c) : std::isupper(c)) return false;
    cased = cased || (upper ? std::isupper(c) : std::islower(c));
  }
  return cased;
}
Expected<bool> t_lower(Interp&, const Value& v, CallArgs&) { return one_case(v, false); }
Expected<bool> t_upper(Interp&, const Value& v, CallArgs&) { return one_case(v, true); }
Expected<Value> need(CallArgs& a, const char* test) {
  if (a.pos.empty()) return errorf("test '%s' needs an argument", test);
  return a.pos[0];
}
Expected<bool> t_eq(Interp&, const Value& v, CallArgs& a) { PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "eq")); return equals(v, o); }
Expected<bool> t_ne(Interp&, const Value& v, CallArgs& a) { PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "ne")); return !equals(v, o); }
Expected<bool> t_lt(Interp&, const Value& v, CallArgs& a) { PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "lt")); return less(v, o); }
Expected<bool> t_gt(Interp&, const Value& v, CallArgs& a) { PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "gt")); return less(o, v); }
Expected<bool> t_le(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "le"));
  PAGODA_ASSIGN_OR_RETURN(bool gt, less(o, v));
  return !gt;
}
Expected<bool> t_ge(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "ge"));
  PAGODA_ASSIGN_OR_RETURN(bool lt, less(v, o));
  return !lt;
}
Expected<bool> t_in(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "in"));
  PAGODA_ASSIGN_OR_RETURN(Value r, binary_op("in", v, o));
  return r.b;
}
Expected<bool> t_sameas(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "sameas"));
  if (v.obj || o.obj) return v.obj == o.obj;
  return v.type == o.type && equals(v, o);
}
Expected<bool> t_odd(Interp&, const Value& v, CallArgs&) {
  if (v.type != Value::Type::kInt) return make_error("odd: expected an integer");
  return (v.i % 2) != 0;
}
Expected<bool> t_even(Interp&, const Value& v, CallArgs&) {
  if (v.type != Value::Type::kInt) return make_error("even: expected an integer");
  return (v.i % 2) == 0;
}
Expected<bool> t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  PAGODA_ASSIGN_OR_RETURN(Value o, need(a, "divisibleby"));
  if (v.type != Value::Type::kInt || o.type != Value::Type::kInt || o.i == 0) return make_error("divisibleby: expected non-zero integers");
  return o.i == -1 || v.i % o.i == 0;
}

const Named<TestFn> kTests[] = {
    {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},         {"string", t_string},
    {"mapping", t_mapping},   {"iterable", t_iterable},   {"sequence", t_sequence}, {"number", t_number},
    {"integer", t_integer},   {"float", t_float},         {"boolean", t_boolean},   {"true", t_true},
    {"false", t_false},       {"callable", t_callable},   {"lower", t_lower},       {"upper", t_upper},
    {"equalto", t_eq},        {"eq", t_eq},               {"==", t_eq},             {"ne", t_ne},
    {"!=", t_ne},             {"lt", t_lt},               {"lessthan", t_lt},       {"<", t_lt},
    {"gt", t_gt},             {"greaterthan", t_gt},      {">", t_gt},              {"le", t_le},
    {"<=", t_le},             {"ge", t_ge},               {">=", t_ge},             {"in", t_in},
    {"sameas", t_sameas},     {"odd", t_odd},             {"even", t_even},         {"divisibleby", t_divisibleby},
};

}  // namespace

int find_filter(std::string_view name) { return index_of(kFilters, name); }

int find_test(std::string_view name) { return index_of(kTests, name); }

Expected<Value> apply_filter(Interp& in, int filter, const Value& v, CallArgs& args) {
  if (filter < 0 || static_cast<size_t>(filter) >= std::size(kFilters)) return make_error("unsupported filter");
  PAGODA_TRY(in.step());
  return kFilters[filter].fn(in, v, args);
}

Expected<bool> apply_test(Interp& in, int test, const Value& v, CallArgs& args) {
  if (test < 0 || static_cast<size_t>(test) >= std::size(kTests)) return make_error("unsupported test");
  PAGODA_TRY(in.step());
  return kTests[test].fn(in, v, args);
}

}  // namespace pagoda::tok::jinja
