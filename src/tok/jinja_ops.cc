// Operators, attribute/item access, slicing, iteration, Python str/dict methods
// and the global functions of the Jinja interpreter.
#include <cmath>
#include <cstdio>
#include <ctime>

#include "tok/jinja_interp.h"
#include "tok/unicode.h"

namespace pagoda::tok::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox MAX_RANGE

}  // namespace

namespace {

Error unsupported_op(const std::string& op, const Value& a, const Value& b) {
  return errorf("unsupported operand types for %s: %s and %s", op.c_str(), type_name(a), type_name(b));
}

// Checks that n bytes (or list slots) fit in what the heap has left.
Status room(size_t bytes) {
  Heap* h = current_heap();
  if (h != nullptr && bytes > h->limit() - h->used()) {
    return errorf("template exceeded its memory limit (%zu bytes of strings and lists)", h->limit());
  }
  return Status::Ok();
}

}  // namespace

namespace {

Expected<Value> repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_str()) {
    const Str& s = seq.str();
    if (!s.s.empty() && static_cast<uint64_t>(n) > (SIZE_MAX / 2) / s.s.size()) return make_error("string repetition too large");
    PAGODA_TRY(room(s.s.size() * static_cast<size_t>(n)));
    StrBuilder b;
    for (int64_t i = 0; i < n; ++i) b.append(s);
    return make_str(std::move(b));
  }
  const auto& items = seq.list().items;
  if (!items.empty() && static_cast<uint64_t>(n) > (SIZE_MAX / 2) / (items.size() * sizeof(Value))) {
    return make_error("list repetition too large");
  }
  PAGODA_TRY(room(items.size() * static_cast<size_t>(n) * sizeof(Value)));
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return make_list(std::move(out), seq.list().tuple);
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

Expected<Value> percent_format(const Value& fmt, const Value& args);

Expected<bool> contains(const Value& container, const Value& item) {
  switch (container.type) {
    case Value::Type::kStr:
      if (!item.is_str()) return make_error("'in <string>' requires a string as left operand");
      return sfind(container.str().s, item.str().s, 0) != std::string::npos;
    case Value::Type::kList:
      add_work(container.list().items.size());
      for (const Value& v : container.list().items) {
        if (equals(v, item)) return true;
      }
      return false;
    case Value::Type::kDict: return container.dict().find(item) != nullptr;
    case Value::Type::kUndefined: return false;
    default: return errorf("argument of type %s is not iterable", type_name(container));
  }
}

}  // namespace

Expected<Value> binary_op(const std::string& op, const Value& a, const Value& b) {
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && a.type != Value::Type::kFloat && b.type != Value::Type::kFloat;
  if (op == "~") {
    StrBuilder s;
    PAGODA_TRY(print_value(a, s));
    PAGODA_TRY(print_value(b, s));
    return make_str(std::move(s));
  }
  if (op == "==") return Value::boolean(equals(a, b));
  if (op == "!=") return Value::boolean(!equals(a, b));
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    if (a.is_undefined() || b.is_undefined()) return make_error("cannot compare an undefined value");
    PAGODA_ASSIGN_OR_RETURN(bool lt, less(a, b));
    if (op == "<") return Value::boolean(lt);
    PAGODA_ASSIGN_OR_RETURN(bool gt, less(b, a));
    if (op == ">") return Value::boolean(gt);
    if (op == "<=") return Value::boolean(!gt);
    return Value::boolean(!lt);
  }
  if (op == "in" || op == "not in") {
    PAGODA_ASSIGN_OR_RETURN(bool in, contains(b, a));
    return Value::boolean(in != (op == "not in"));
  }
  if (a.is_undefined() || b.is_undefined()) {
    return errorf("undefined value used with operator '%s'", op.c_str());
  }
  // + - * of two numbers: ints stay ints (an overflow is an error: Python's ints
  // do not wrap), else doubles. Other operands: each operator below.
  if (nums && (op == "+" || op == "-" || op == "*")) {
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
      if (overflow) return make_error("integer overflow");
      return Value::integer(r);
    }
    const double x = a.as_double(), y = b.as_double();
    return Value::real(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }
  if (op == "+") {
    if (a.is_str() && b.is_str()) {
      PAGODA_TRY(room(a.str().s.size() + b.str().s.size()));
      if (a.str().markup != b.str().markup) {
        // Markup + str escapes the plain side (markupsafe), and the result is Markup.
        PAGODA_ASSIGN_OR_RETURN(Value ea, html_escape(a));
        PAGODA_ASSIGN_OR_RETURN(Value eb, html_escape(b));
        return binary_op(op, ea, eb);
      }
      StrBuilder s;
      s.append(a.str());
      s.append(b.str());
      PAGODA_ASSIGN_OR_RETURN(Value r, make_str(std::move(s)));
      static_cast<Str&>(*r.obj).markup = a.str().markup;
      return r;
    }
    if (is_generator(a) || is_generator(b)) return unsupported_op(op, a, b);
    if (a.is_list() && b.is_list()) {
      PAGODA_TRY(room((a.list().items.size() + b.list().items.size()) * sizeof(Value)));
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      return make_list(std::move(items), a.list().tuple);
    }
    return unsupported_op(op, a, b);
  }
  if (op == "-") return unsupported_op(op, a, b);
  if (op == "*") {
    const bool a_int = a.type == Value::Type::kInt || a.type == Value::Type::kBool;
    const bool b_int = b.type == Value::Type::kInt || b.type == Value::Type::kBool;
    if ((a.is_str() || a.is_list()) && b_int) return repeat(a, b.as_int());
    if ((b.is_str() || b.is_list()) && a_int) return repeat(b, a.as_int());
    return unsupported_op(op, a, b);
  }
  if (op == "/") {
    if (!nums) return unsupported_op(op, a, b);
    if (b.as_double() == 0) return make_error("division by zero");
    return Value::real(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!nums) return unsupported_op(op, a, b);
    if (b.as_double() == 0) return make_error("integer division or modulo by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) return make_error("integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::integer(q);
    }
    return Value::real(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (a.is_str()) return percent_format(a, b);
    if (!nums) return unsupported_op(op, a, b);
    if (b.as_double() == 0) return make_error("integer division or modulo by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == -1) return Value::integer(0);
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::integer(m);
    }
    return Value::real(py_fmod(a.as_double(), b.as_double()));
  }
  if (op == "**") {
    if (!nums) return unsupported_op(op, a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), r = 1;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(r, base, &r)) return make_error("integer overflow in '**'");
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) return make_error("integer overflow in '**'");
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(a.as_double(), b.as_double()));
  }
  return errorf("unsupported operator '%s'", op.c_str());
}

namespace {

// printf-style "%s" % x (Python's str % args) for the conversions templates use.
Expected<Value> percent_format(const Value& fmt, const Value& args) {
  std::vector<Value> argv;
  if (args.is_list() && args.list().tuple) {
    argv = args.list().items;
  } else {
    argv.push_back(args);
  }
  const Str& f = fmt.str();
  StrBuilder out;
  size_t ai = 0;
  for (size_t i = 0; i < f.s.size(); ++i) {
    if (f.s[i] != '%') {
      size_t j = f.s.find('%', i);
      if (j == std::string::npos) j = f.s.size();
      out.append(f, i, j - i);
      i = j - 1;
      continue;
    }
    if (i + 1 >= f.s.size()) return make_error("incomplete format");
    const char c = f.s[++i];
    if (c == '%') {
      out.append("%");
      continue;
    }
    if (ai >= argv.size()) return make_error("not enough arguments for format string");
    const Value& v = argv[ai++];
    if (c == 's') {
      PAGODA_TRY(print_value(v, out));
    } else if (c == 'd' || c == 'i') {
      if (!v.is_number()) return make_error("%d format: a number is required");
      out.append(std::to_string(v.type == Value::Type::kFloat ? static_cast<int64_t>(v.f) : v.as_int()));
    } else if (c == 'r') {
      if (v.is_str()) out.append(python_repr_str(v.str().s), !v.str().taint.empty());
      else { PAGODA_TRY(print_value(v, out)); }
    } else {
      return errorf("unsupported format conversion '%%%c'", c);
    }
  }
  if (ai < argv.size()) return make_error("not all arguments converted during string formatting");
  return make_str(std::move(out));
}

}  // namespace

namespace {

Expected<Value> dict_method(const Value& self, const std::string& name, CallArgs& a) {
  const Dict& d = self.dict();
  if (name == "items" || name == "keys" || name == "values") {
    std::vector<Value> out;
    for (const auto& [k, v] : d.items) {
      if (name == "keys") {
        out.push_back(k);
      } else if (name == "values") {
        out.push_back(v);
      } else {
        PAGODA_ASSIGN_OR_RETURN(Value t, make_list({k, v}, true));
        out.push_back(std::move(t));
      }
    }
    return make_list(std::move(out));
  }
  if (name == "get") {
    const Value* k = a.get(0, "key");
    if (k == nullptr) return make_error("get() takes a key");
    const Value* v = d.find(*k);
    if (v != nullptr) return *v;
    const Value* def = a.get(1, "default");
    return def != nullptr ? *def : Value::none();
  }
  return errorf("unsupported dict method '%s' (dicts are read-only in templates)", name.c_str());
}

bool is_dict_method(const std::string& n) {
  return n == "items" || n == "keys" || n == "values" || n == "get" || n == "update" || n == "pop" ||
         n == "setdefault" || n == "clear" || n == "copy" || n == "popitem";
}

Expected<Value> list_method(const Value& self, const std::string& name, CallArgs& a) {
  const auto& items = self.list().items;
  if (name == "index" || name == "count") {
    const Value* x = a.get(0, "value");
    if (x == nullptr) return errorf("%s() takes one argument", name.c_str());
    int64_t n = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!equals(items[i], *x)) continue;
      if (name == "index") return Value::integer(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") return make_error("value is not in list");
    return Value::integer(n);
  }
  return errorf("unsupported list method '%s' (lists are read-only in templates)", name.c_str());
}

bool is_list_method(const std::string& n) {
  return n == "index" || n == "count" || n == "append" || n == "extend" || n == "pop" || n == "insert" ||
         n == "remove" || n == "sort" || n == "reverse" || n == "clear" || n == "copy";
}

Value bound(const Value& self, const std::string& name,
            Expected<Value> (*m)(const Value&, const std::string&, CallArgs&)) {
  Value f = make_func(name, [self, name, m](Interp&, CallArgs& a) { return m(self, name, a); });
  f.func().self = self;
  return f;
}

}  // namespace

Expected<Value> get_attr(const Value& obj, const std::string& name) {
  // Python objects' own "_" attributes are dunders (__class__, __globals__...) or
  // privates of functions: refused. A dict key spelled "_x" is still data.
  if (!name.empty() && name[0] == '_' &&
      (name.compare(0, 2, "__") == 0 || obj.type == Value::Type::kFunc)) {
    return errorf("access to attribute '%s' is not allowed (unsafe attribute)", name.c_str());
  }
  switch (obj.type) {
    case Value::Type::kDict: {
      const Dict& d = obj.dict();
      if (!d.is_namespace && is_dict_method(name)) return bound(obj, name, dict_method);
      const Value* v = d.find(name);
      return v != nullptr ? *v : Value();
    }
    case Value::Type::kStr:
      if (is_str_method(name)) return bound(obj, name, str_method);
      return Value();
    case Value::Type::kList:
      if (is_list_method(name)) return bound(obj, name, list_method);
      return Value();
    case Value::Type::kUndefined: return errorf("undefined value has no attribute '%s'", name.c_str());
    default: return Value();
  }
}

Expected<Value> get_item(const Value& obj, const Value& key) {
  switch (obj.type) {
    case Value::Type::kDict: {
      const Value* v = obj.dict().find(key);
      if (v != nullptr) return *v;
      if (key.is_str()) return get_attr(obj, key.str().s);
      return Value();
    }
    case Value::Type::kList: {
      if (key.is_str()) return get_attr(obj, key.str().s);
      if (obj.list().generator) return Value();
      if (key.type != Value::Type::kInt && key.type != Value::Type::kBool) return Value();
      const auto& items = obj.list().items;
      int64_t i = key.as_int();
      const int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return items[static_cast<size_t>(i)];
    }
    case Value::Type::kStr: {
      if (key.is_str()) return get_attr(obj, key.str().s);
      if (key.type != Value::Type::kInt && key.type != Value::Type::kBool) return Value();
      const Str& s = obj.str();
      int64_t i = key.as_int();
      const int64_t n = static_cast<int64_t>(utf8_length(s.s));
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      const size_t b = utf8_offset(s.s, i);
      return substr_value(s, b, b + cp_len_at(s.s, b));
    }
    case Value::Type::kUndefined: return make_error("undefined value is not subscriptable");
    default:
      if (key.is_str()) return get_attr(obj, key.str().s);
      return Value();
  }
}

Expected<Value> slice(const Value& obj, const Value& start, const Value& stop, const Value& stepv) {
  int64_t n;
  if (obj.is_str()) {
    n = static_cast<int64_t>(utf8_length(obj.str().s));
  } else if (obj.is_list() && !obj.list().generator) {
    n = static_cast<int64_t>(obj.list().items.size());
  } else {
    return errorf("cannot slice a value of type %s", type_name(obj));
  }
  auto as_idx = [](const Value& v, bool* given) -> Expected<int64_t> {
    *given = !v.is_none() && !v.is_undefined();
    if (!*given) return int64_t{0};
    if (v.type != Value::Type::kInt && v.type != Value::Type::kBool) return make_error("slice indices must be integers");
    return v.as_int();
  };
  bool has_b, has_e, has_s;
  PAGODA_ASSIGN_OR_RETURN(int64_t st, as_idx(stepv, &has_s));
  if (!has_s) st = 1;
  if (st == 0) return make_error("slice step cannot be zero");
  PAGODA_ASSIGN_OR_RETURN(int64_t b, as_idx(start, &has_b));
  PAGODA_ASSIGN_OR_RETURN(int64_t e, as_idx(stop, &has_e));
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](int64_t v, bool given, int64_t def) {
    if (!given) return def;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  b = adjust(b, has_b, st < 0 ? n - 1 : 0);
  e = adjust(e, has_e, st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  add_work(idx.size());
  if (obj.is_list()) {
    std::vector<Value> out;
    out.reserve(idx.size());
    for (int64_t i : idx) out.push_back(obj.list().items[static_cast<size_t>(i)]);
    return make_list(std::move(out), obj.list().tuple);
  }
  const Str& s = obj.str();
  if (st == 1) {
    const size_t bo = utf8_offset(s.s, b);
    const size_t eo = e > b ? utf8_offset(s.s, e) : bo;
    return substr_value(s, bo, eo);
  }
  // Byte offset of every code point once ([n + 1]), then pick: linear time.
  std::vector<size_t> offs;
  offs.reserve(static_cast<size_t>(n) + 1);
  for (size_t i = 0; i < s.s.size(); i += cp_len_at(s.s, i)) offs.push_back(i);
  offs.push_back(s.s.size());
  StrBuilder out;
  for (int64_t i : idx) {
    const size_t k = static_cast<size_t>(i);
    out.append(s, offs[k], offs[k + 1] - offs[k]);
  }
  return make_str(std::move(out));
}

Expected<std::vector<Value>> iterate(const Value& v) {
  switch (v.type) {
    case Value::Type::kList: add_work(v.list().items.size()); return v.list().items;
    case Value::Type::kDict: {
      add_work(v.dict().items.size());
      if (v.dict().is_namespace) return make_error("a namespace is not iterable");
      std::vector<Value> keys;
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Type::kStr: {
      const Str& s = v.str();
      std::vector<Value> out;
      PAGODA_TRY(room(s.s.size() * sizeof(Value)));
      for (size_t i = 0; i < s.s.size();) {
        const size_t l = cp_len_at(s.s, i);
        PAGODA_ASSIGN_OR_RETURN(Value c, substr_value(s, i, i + l));
        out.push_back(std::move(c));
        i += l;
      }
      return out;
    }
    case Value::Type::kUndefined: return std::vector<Value>{};
    default: return errorf("'%s' object is not iterable", type_name(v));
  }
}

void add_globals(Scope& sc) {
  sc.vars["range"] = make_func("range", [](Interp&, CallArgs& a) -> Expected<Value> {
    for (const Value& v : a.pos) {
      if (v.type != Value::Type::kInt && v.type != Value::Type::kBool) return make_error("range() arguments must be integers");
    }
    int64_t b = 0, e = 0, st = 1;
    if (a.pos.size() == 1) {
      e = a.pos[0].as_int();
    } else if (a.pos.size() == 2 || a.pos.size() == 3) {
      b = a.pos[0].as_int();
      e = a.pos[1].as_int();
      if (a.pos.size() == 3) st = a.pos[2].as_int();
    } else {
      return make_error("range() takes 1 to 3 arguments");
    }
    if (st == 0) return make_error("range() step must not be zero");
    // Count without overflow.
    const long double cnt = st > 0 ? (e > b ? (static_cast<long double>(e) - b + st - 1) / st : 0)
                                   : (b > e ? (static_cast<long double>(b) - e - st - 1) / -st : 0);
    if (cnt > kMaxRange) {
      return errorf("range() too big: the sandbox allows at most %lld items", static_cast<long long>(kMaxRange));
    }
    PAGODA_TRY(room(static_cast<size_t>(cnt) * sizeof(Value)));
    std::vector<Value> out;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(Value::integer(i));
    return make_list(std::move(out));
  });
  auto make_ns = [](bool ns) {
    return [ns](Interp&, CallArgs& a) -> Expected<Value> {
      PAGODA_ASSIGN_OR_RETURN(Value d, make_dict());
      d.dict().is_namespace = ns;
      d.dict().holds_mutable = ns;
      for (const Value& p : a.pos) {
        if (!p.is_dict()) return make_error("namespace()/dict() takes a dict or keyword arguments");
        for (const auto& [k, v] : p.dict().items) PAGODA_TRY(d.dict().set(k, v));
      }
      for (const auto& [k, v] : a.kw) {
        PAGODA_ASSIGN_OR_RETURN(Value key, make_str(k));
        PAGODA_TRY(d.dict().set(std::move(key), v));
      }
      return d;
    };
  };
  sc.vars["namespace"] = make_func("namespace", make_ns(true));
  sc.vars["dict"] = make_func("dict", make_ns(false));
  sc.vars["raise_exception"] = make_func("raise_exception", [](Interp&, CallArgs& a) -> Expected<Value> {
    std::string msg = !a.pos.empty() && a.pos[0].is_str() ? a.pos[0].str().s : "error";
    return make_error("template raised an exception: " + msg);
  });
  sc.vars["strftime_now"] = make_func("strftime_now", [](Interp& in, CallArgs& a) -> Expected<Value> {
    if (a.pos.empty() || !a.pos[0].is_str()) return make_error("strftime_now() takes a format string");
    const std::string& fmt = a.pos[0].str().s;
    if (fmt.size() > 256) return make_error("strftime_now(): format too long");
    std::tm tm{};
    const std::time_t t = in.now();
    gmtime_r(&t, &tm);
    char buf[1024];
    const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
    return make_str(std::string(buf, n));
  });
}

}  // namespace pagoda::tok::jinja
