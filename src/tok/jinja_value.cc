#include "tok/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <unordered_set>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "tok/unicode.h"

namespace pagoda::tok::jinja {

namespace {
thread_local Heap* g_heap = nullptr;

constexpr int kMaxDepth = 128;  // printing/serialising nested containers (cycles via namespaces)

void charge_or_fail(Object& o, size_t n, bool* ok) {
  Heap* h = g_heap;
  *ok = true;
  if (h == nullptr) return;
  if (!h->charge(n)) {
    *ok = false;
    return;
  }
  o.heap = h;
  o.charged = n;
}

void release(Object& o) {
  if (o.heap != nullptr) o.heap->release(o.charged);
}

Error heap_error() {
  return errorf("template exceeded its memory limit (%zu bytes of strings and lists)",
                g_heap != nullptr ? g_heap->limit() : size_t{0});
}
}  // namespace

Heap* current_heap() { return g_heap; }
HeapScope::HeapScope(Heap* h) : prev_(g_heap) { g_heap = h; }
HeapScope::~HeapScope() { g_heap = prev_; }

// Destroying a deeply nested value must not recurse once per level (a template
// can nest lists 100000 deep through a namespace): containers hand their children
// to a per-thread worklist that the outermost destructor drains.
thread_local std::vector<Value>* g_graveyard = nullptr;

void bury(std::vector<Value>& items) {
  if (g_graveyard != nullptr) {
    for (Value& v : items) {
      if (v.obj) g_graveyard->push_back(std::move(v));
    }
    items.clear();
    return;
  }
  std::vector<Value> pending;
  g_graveyard = &pending;
  for (Value& v : items) {
    if (v.obj) pending.push_back(std::move(v));
  }
  items.clear();
  while (!pending.empty()) {
    Value v = std::move(pending.back());
    pending.pop_back();
    // v's object, if this was its last reference, dies here and appends its children.
  }
  g_graveyard = nullptr;
}

Str::~Str() { release(*this); }
List::~List() {
  bury(items);
  release(*this);
}
Dict::~Dict() {
  std::vector<Value> children;
  children.reserve(items.size() * 2);
  for (auto& [k, v] : items) {
    children.push_back(std::move(k));
    children.push_back(std::move(v));
  }
  items.clear();
  bury(children);
  release(*this);
}

void StrBuilder::add_span(size_t b, size_t e) {
  if (b >= e) return;
  if (!taint_.empty() && taint_.back().end >= b) {
    taint_.back().end = std::max(taint_.back().end, e);
  } else {
    taint_.push_back({b, e});
  }
}

StrBuilder::StrBuilder() : cap_(g_heap != nullptr ? g_heap->limit() - g_heap->used() : SIZE_MAX) {}

void StrBuilder::append(std::string_view s, bool tainted) {
  if (!fits(s.size())) return;
  add_work(s.size());
  const size_t at = s_.size();
  s_.append(s);
  if (tainted) add_span(at, s_.size());
}

void StrBuilder::append(const Str& src, size_t pos, size_t n) {
  if (pos > src.s.size()) pos = src.s.size();
  const size_t end = n == std::string::npos || n > src.s.size() - pos ? src.s.size() : pos + n;
  if (!fits(end - pos)) return;
  add_work(end - pos);
  const size_t at = s_.size();
  s_.append(src.s, pos, end - pos);
  for (const Span& sp : src.taint) {
    const size_t b = std::max(sp.begin, pos), e = std::min(sp.end, end);
    if (b < e) add_span(at + (b - pos), at + (e - pos));
  }
}

Expected<Value> make_str(std::string s, bool tainted) {
  StrBuilder b;
  b.append(s, tainted);
  return make_str(std::move(b));
}

Expected<Value> make_str(StrBuilder&& b) {
  if (b.overflow()) return heap_error();
  auto o = std::make_shared<Str>();
  bool ok;
  charge_or_fail(*o, b.text().size() + sizeof(Str), &ok);
  if (!ok) return heap_error();
  o->s = std::move(b.text());
  o->taint = std::move(b.taint());
  Value v;
  v.type = Value::Type::kStr;
  v.obj = std::move(o);
  return v;
}

Value literal_str(std::string s, bool tainted) {
  auto o = std::make_shared<Str>();
  if (tainted && !s.empty()) o->taint.push_back({0, s.size()});
  o->s = std::move(s);
  Value v;
  v.type = Value::Type::kStr;
  v.obj = std::move(o);
  return v;
}

Expected<Value> make_list(std::vector<Value> items, bool tuple) {
  auto o = std::make_shared<List>();
  bool ok;
  charge_or_fail(*o, items.size() * sizeof(Value) + sizeof(List), &ok);
  if (!ok) return heap_error();
  add_work(items.size());
  for (const Value& x : items) o->holds_mutable = o->holds_mutable || (x.obj && x.obj->holds_mutable);
  o->items = std::move(items);
  o->tuple = tuple;
  Value v;
  v.type = Value::Type::kList;
  v.obj = std::move(o);
  return v;
}

Expected<Value> make_generator(std::vector<Value> items) {
  PAGODA_ASSIGN_OR_RETURN(Value v, make_list(std::move(items)));
  v.list().generator = true;
  return v;
}

bool is_generator(const Value& v) { return v.is_list() && v.list().generator; }

Expected<Value> make_dict() {
  auto o = std::make_shared<Dict>();
  bool ok;
  charge_or_fail(*o, sizeof(Dict), &ok);
  if (!ok) return heap_error();
  Value v;
  v.type = Value::Type::kDict;
  v.obj = std::move(o);
  return v;
}

Value make_func(std::string name, std::function<Expected<Value>(Interp&, CallArgs&)> fn) {
  auto o = std::make_shared<Func>();
  o->holds_mutable = true;  // a bound method may keep a namespace alive
  o->name = std::move(name);
  o->fn = std::move(fn);
  Value v;
  v.type = Value::Type::kFunc;
  v.obj = std::move(o);
  return v;
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool hash_key(const Value& v, std::string* key) {
  switch (v.type) {
    case Value::Type::kStr: *key = "s:" + v.str().s; return true;
    case Value::Type::kInt: *key = "n:" + std::to_string(v.i); return true;
    case Value::Type::kBool: *key = v.b ? "n:1" : "n:0"; return true;
    case Value::Type::kFloat:
      if (v.f == std::floor(v.f) && std::fabs(v.f) < 9e18) {
        *key = "n:" + std::to_string(static_cast<int64_t>(v.f));
      } else {
        *key = "f:" + python_float(v.f);
      }
      return true;
    case Value::Type::kNone: *key = "none"; return true;
    default: return false;
  }
}

const Value* Dict::find(const Value& key) const {
  std::string k;
  if (!hash_key(key, &k)) return nullptr;
  auto it = index_.find(k);
  return it == index_.end() ? nullptr : &items[it->second].second;
}

const Value* Dict::find(std::string_view key) const {
  auto it = index_.find("s:" + std::string(key));
  return it == index_.end() ? nullptr : &items[it->second].second;
}

Status Dict::set(Value key, Value v) {
  std::string k;
  if (!hash_key(key, &k)) return errorf("unhashable dict key of type %s", type_name(key));
  auto it = index_.find(k);
  if (it != index_.end()) {
    holds_mutable = holds_mutable || (v.obj && v.obj->holds_mutable);
    items[it->second].second = std::move(v);
    return Status::Ok();
  }
  if (heap != nullptr || current_heap() != nullptr) {
    Heap* h = heap != nullptr ? heap : current_heap();
    const size_t n = 2 * sizeof(Value) + k.size() + 32;
    if (!h->charge(n)) return heap_error();
    if (heap == nullptr) heap = h;
    charged += n;
  }
  holds_mutable = holds_mutable || (v.obj && v.obj->holds_mutable);
  index_.emplace(std::move(k), items.size());
  items.emplace_back(std::move(key), std::move(v));
  return Status::Ok();
}

Status check_no_cycle(const Value& v, const Object* target) {
  std::vector<const Object*> stack;
  std::unordered_set<const Object*> seen;
  if (v.obj) stack.push_back(v.obj.get());
  while (!stack.empty()) {
    const Object* o = stack.back();
    stack.pop_back();
    if (o == target) return make_error("assignment would make a reference cycle (a namespace inside itself)");
    if (!o->holds_mutable || !seen.insert(o).second) continue;  // nothing mutable below
    add_work(1);
    auto push = [&](const Value& x) {
      if (x.obj) stack.push_back(x.obj.get());
    };
    if (auto* l = dynamic_cast<const List*>(o)) {
      for (const Value& x : l->items) push(x);
    } else if (auto* d = dynamic_cast<const Dict*>(o)) {
      for (const auto& [k, x] : d->items) push(x);
    } else if (auto* f = dynamic_cast<const Func*>(o)) {
      push(f->self);
    }
  }
  return Status::Ok();
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return false;
    case Value::Type::kBool: return v.b;
    case Value::Type::kInt: return v.i != 0;
    case Value::Type::kFloat: return v.f != 0.0;
    case Value::Type::kStr: return !v.str().s.empty();
    case Value::Type::kList: return v.list().generator || !v.list().items.empty();
    case Value::Type::kDict: return v.dict().is_namespace || !v.dict().items.empty();
    case Value::Type::kFunc: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b, int depth) {
  if (depth > kMaxDepth) return false;
  add_work(1);
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::Type::kFloat || b.type == Value::Type::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return true;
    case Value::Type::kStr: return a.str().s == b.str().s;
    case Value::Type::kList: {
      if (a.list().generator || b.list().generator) return a.obj == b.obj;
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Type::kDict: {
      if (a.obj == b.obj) return true;
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (w == nullptr || !equals(v, *w, depth + 1)) return false;
      }
      return true;
    }
    default: return a.obj == b.obj;
  }
}

Expected<bool> less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::Type::kFloat || b.type == Value::Type::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_str() && b.is_str()) return a.str().s < b.str().s;  // UTF-8 byte order == code point order
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return errorf("'<' not supported between %s and %s", type_name(a), type_name(b));
}

const char* type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined: return "undefined";
    case Value::Type::kNone: return "none";
    case Value::Type::kBool: return "bool";
    case Value::Type::kInt: return "int";
    case Value::Type::kFloat: return "float";
    case Value::Type::kStr: return "string";
    case Value::Type::kList: return v.list().tuple ? "tuple" : "list";
    case Value::Type::kDict: return v.dict().is_namespace ? "namespace" : "dict";
    case Value::Type::kFunc: return "function";
  }
  return "?";
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout: scientific when the
  // exponent is < -4 or >= 16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::atoi(sci.c_str() + e + 1);
  bool neg = false;
  if (mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t ip = static_cast<size_t>(exp) + 1;
    if (digits.size() <= ip) {
      out = digits + std::string(ip - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, ip) + "." + digits.substr(ip);
    }
  }
  return neg ? "-" + out : out;
}

std::string python_repr_str(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back(q);
  return out;
}

namespace {
Status repr_value(const Value& v, StrBuilder& out, int depth) {
  if (depth > kMaxDepth) return make_error("template value nested too deeply to print");
  switch (v.type) {
    case Value::Type::kStr: {
      const Str& s = v.str();
      out.append(python_repr_str(s.s), !s.taint.empty());
      return Status::Ok();
    }
    case Value::Type::kList: {
      if (v.list().generator) return make_error("cannot print a generator (the result of map/select/...); add |list");
      const bool t = v.list().tuple;
      out.append(t ? "(" : "[");
      const auto& items = v.list().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(", ");
        PAGODA_TRY(repr_value(items[i], out, depth + 1));
      }
      if (t && items.size() == 1) out.append(",");
      out.append(t ? ")" : "]");
      return Status::Ok();
    }
    case Value::Type::kDict: {
      const Dict& d = v.dict();
      if (d.is_namespace) {
        out.append("<Namespace>");
        return Status::Ok();
      }
      out.append("{");
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i > 0) out.append(", ");
        PAGODA_TRY(repr_value(d.items[i].first, out, depth + 1));
        out.append(": ");
        PAGODA_TRY(repr_value(d.items[i].second, out, depth + 1));
      }
      out.append("}");
      return Status::Ok();
    }
    case Value::Type::kUndefined:
      out.append("Undefined");
      return Status::Ok();
    default:
      return print_value(v, out, depth);
  }
}
}  // namespace

Status print_value(const Value& v, StrBuilder& out, int depth) {
  switch (v.type) {
    case Value::Type::kUndefined: return Status::Ok();
    case Value::Type::kNone: out.append("None"); return Status::Ok();
    case Value::Type::kBool: out.append(v.b ? "True" : "False"); return Status::Ok();
    case Value::Type::kInt: out.append(std::to_string(v.i)); return Status::Ok();
    case Value::Type::kFloat: out.append(python_float(v.f)); return Status::Ok();
    case Value::Type::kStr: out.append(v.str()); return Status::Ok();
    case Value::Type::kFunc: out.append("<function " + v.func().name + ">"); return Status::Ok();
    case Value::Type::kList:
    case Value::Type::kDict: return repr_value(v, out, depth);
  }
  return Status::Ok();
}

Expected<Value> to_string_value(const Value& v) {
  if (v.is_str()) return v;
  StrBuilder b;
  PAGODA_TRY(print_value(v, b));
  return make_str(std::move(b));
}

namespace {
void json_string(const Str& s, StrBuilder& out, bool ensure_ascii) {
  std::string o = "\"";
  for (size_t i = 0; i < s.s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s.s[i]);
    if (ensure_ascii && c >= 0x80) {
      // \uXXXX, surrogate pairs past the BMP (invalid bytes: U+FFFD).
      const size_t l = utf8_valid_len(s.s, i);
      uint32_t cp = l == 0 ? 0xFFFD : utf8_decode(s.s, i, l);
      i += (l == 0 ? 1 : l) - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      o += b;
      continue;
    }
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          o += b;
        } else {
          o.push_back(static_cast<char>(c));
        }
    }
  }
  o += "\"";
  out.append(o, !s.taint.empty());
}
}  // namespace

Status to_json(const Value& v, StrBuilder& out, int indent, bool sort_keys, bool ensure_ascii, int depth) {
  if (depth > kMaxDepth) return make_error("tojson: value nested too deeply (circular reference?)");
  if (out.size() > (current_heap() != nullptr ? current_heap()->limit() : size_t{1} << 30)) {
    return make_error("tojson: output exceeds the template memory limit");
  }
  auto newline = [&](int d) {
    if (indent < 0) return;
    out.append("\n");
    out.append(std::string(static_cast<size_t>(indent) * static_cast<size_t>(d), ' '));
  };
  switch (v.type) {
    case Value::Type::kUndefined: return make_error("tojson: value is undefined");
    case Value::Type::kNone: out.append("null"); return Status::Ok();
    case Value::Type::kBool: out.append(v.b ? "true" : "false"); return Status::Ok();
    case Value::Type::kInt: out.append(std::to_string(v.i)); return Status::Ok();
    case Value::Type::kFloat: {
      const double d = v.f;
      out.append(std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d));
      return Status::Ok();
    }
    case Value::Type::kStr: json_string(v.str(), out, ensure_ascii); return Status::Ok();
    case Value::Type::kList: {
      if (v.list().generator) return make_error("tojson: Object of type generator is not JSON serializable");
      const auto& items = v.list().items;
      if (items.empty()) {
        out.append("[]");
        return Status::Ok();
      }
      out.append("[");
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(indent >= 0 ? "," : ", ");
        newline(depth + 1);
        PAGODA_TRY(to_json(items[i], out, indent, sort_keys, ensure_ascii, depth + 1));
      }
      newline(depth);
      out.append("]");
      return Status::Ok();
    }
    case Value::Type::kDict: {
      const Dict& d = v.dict();
      if (d.is_namespace) return make_error("tojson: a namespace is not JSON serializable");
      if (d.items.empty()) {
        out.append("{}");
        return Status::Ok();
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : d.items) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) {
          auto r = less(a->first, b->first);
          return r.ok() && *r;
        });
      }
      out.append("{");
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(indent >= 0 ? "," : ", ");
        newline(depth + 1);
        const Value& k = items[i]->first;
        if (k.is_str()) {
          json_string(k.str(), out, ensure_ascii);
        } else if (k.type == Value::Type::kNone) {
          out.append("\"null\"");
        } else if (k.type == Value::Type::kBool) {
          out.append(k.b ? "\"true\"" : "\"false\"");
        } else {
          StrBuilder kb;
          PAGODA_TRY(print_value(k, kb));
          out.append("\"" + kb.text() + "\"");
        }
        out.append(": ");
        PAGODA_TRY(to_json(items[i]->second, out, indent, sort_keys, ensure_ascii, depth + 1));
      }
      newline(depth);
      out.append("}");
      return Status::Ok();
    }
    case Value::Type::kFunc: return make_error("tojson: a function is not JSON serializable");
  }
  return Status::Ok();
}

bool py_isspace_cp(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A)) return true;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t utf8_length(std::string_view s) {
  add_work(s.size());
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_valid_len(s, i);
    i += len == 0 ? 1 : len;
    ++n;
  }
  return n;
}

size_t utf8_offset(std::string_view s, int64_t cp) {
  size_t i = 0;
  add_work(cp > 0 ? static_cast<size_t>(cp) : 0);
  for (int64_t k = 0; k < cp && i < s.size(); ++k) {
    const size_t len = utf8_valid_len(s, i);
    i += len == 0 ? 1 : len;
  }
  return i;
}

}  // namespace pagoda::tok::jinja
