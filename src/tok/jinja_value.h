// Values of the in-project Jinja interpreter (chat templates, see jinja.h).
//
// A Value is a small tagged union: undefined, none, bool, int, float, or a
// reference to a heap object (string, list, dict, namespace, callable). Lists and
// dicts have Python's reference semantics (shared_ptr); strings are immutable and
// shared.
//
// Taint: a string carries the byte ranges that came from message content. Every
// operation that copies bytes (concatenation, slicing, strip, split, replace,
// indent...) carries the ranges along; an operation that rewrites bytes it cannot
// follow (tojson escaping, upper, HTML escaping) marks its whole result tainted
// when any input byte was. The rendered output's tainted ranges are the spans a
// tokenizer must treat as plain text.
//
// Memory: objects created while rendering are charged to the render's Heap (live
// bytes, released by their destructors), so a hostile template that builds huge
// strings or lists fails with an error instead of exhausting memory.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace pagoda::tok::jinja {

// [begin, end) byte range.
struct Span {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const Span&) const = default;
};

// Live-memory accounting of one render. Not thread-safe: one per render call.
class Heap {
 public:
  explicit Heap(size_t limit_bytes) : limit_(limit_bytes) {}
  // False (and nothing charged) when the charge would pass the limit.
  bool charge(size_t n) {
    if (n > limit_ - used_) return false;
    used_ += n;
    return true;
  }
  void release(size_t n) { used_ -= n < used_ ? n : used_; }
  // Work done inside builtins (bytes scanned or copied, items visited): the
  // interpreter turns it into steps, so one call over a large value counts.
  void add_work(size_t n) { work_ += n; }
  size_t take_work() {
    const size_t w = work_;
    work_ = 0;
    return w;
  }
  size_t used() const { return used_; }
  size_t limit() const { return limit_; }

 private:
  size_t limit_;
  size_t used_ = 0;
  size_t work_ = 0;
};

// The heap that objects created on this thread are charged to (null outside a
// render: template literals and caller inputs are not charged).
Heap* current_heap();
inline void add_work(size_t n) {
  if (Heap* h = current_heap()) h->add_work(n);
}
class HeapScope {
 public:
  explicit HeapScope(Heap* h);
  ~HeapScope();
  HeapScope(const HeapScope&) = delete;
  HeapScope& operator=(const HeapScope&) = delete;

 private:
  Heap* prev_;
};

struct Object {
  virtual ~Object() = default;
  Heap* heap = nullptr;  // charged heap, released in the destructor
  size_t charged = 0;
  // A container that is, or (transitively) holds, a namespace or a bound method:
  // the only paths to a reference cycle. Containers other than namespaces are
  // immutable, so the flag set at construction stays true.
  bool holds_mutable = false;
};

// A string with its tainted byte ranges (sorted, disjoint, non-adjacent).
struct Str : Object {
  std::string s;
  std::vector<Span> taint;
  // markupsafe.Markup (the safe/escape filters): `+` HTML-escapes a plain operand.
  bool markup = false;
  ~Str() override;
};

// Builds a string with taint; appends keep ranges merged.
class StrBuilder {
 public:
  // Capacity: what the current heap has left (a string cannot outgrow memory).
  StrBuilder();
  explicit StrBuilder(size_t cap) : cap_(cap) {}
  // True once an append would have passed the capacity (that append was dropped).
  bool overflow() const { return overflow_; }
  void append(std::string_view s, bool tainted = false);
  // Appends src[pos, pos+n) with the taint that falls inside it.
  void append(const Str& src, size_t pos = 0, size_t n = std::string::npos);
  size_t size() const { return s_.size(); }
  std::string& text() { return s_; }
  std::vector<Span>& taint() { return taint_; }
  void clear() { s_.clear(); taint_.clear(); }

 private:
  void add_span(size_t b, size_t e);
  bool fits(size_t n) {
    if (n > cap_ - s_.size()) overflow_ = true;
    return !overflow_;
  }
  size_t cap_;
  bool overflow_ = false;
  std::string s_;
  std::vector<Span> taint_;
};

struct Value;
struct List;
struct Dict;
struct Func;

struct Value {
  enum class Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kFunc };
  Type type = Type::kUndefined;
  union {
    bool b;
    int64_t i;
    double f;
  };
  std::shared_ptr<Object> obj;  // Str, List, Dict (also namespaces) or Func

  Value() : i(0) {}
  static Value none() { Value v; v.type = Type::kNone; return v; }
  static Value boolean(bool x) { Value v; v.type = Type::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.type = Type::kInt; v.i = x; return v; }
  static Value real(double x) { Value v; v.type = Type::kFloat; v.f = x; return v; }

  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_none() const { return type == Type::kNone; }
  bool is_str() const { return type == Type::kStr; }
  bool is_list() const { return type == Type::kList; }
  bool is_dict() const { return type == Type::kDict; }
  bool is_number() const { return type == Type::kInt || type == Type::kFloat || type == Type::kBool; }
  const Str& str() const { return static_cast<const Str&>(*obj); }
  List& list() const;
  Dict& dict() const;
  Func& func() const;
  double as_double() const { return type == Type::kFloat ? f : type == Type::kBool ? (b ? 1.0 : 0.0) : static_cast<double>(i); }
  int64_t as_int() const { return type == Type::kInt ? i : type == Type::kBool ? (b ? 1 : 0) : static_cast<int64_t>(f); }
};

struct List : Object {
  std::vector<Value> items;
  bool tuple = false;  // printed as (a, b)
  // The result of map/select/reject/items/unique/reverse: a Python generator in
  // jinja2. Always true, no len(), no indexing, not JSON serializable, not printable.
  bool generator = false;
  ~List() override;
};

struct Dict : Object {
  std::vector<std::pair<Value, Value>> items;  // insertion order
  bool is_namespace = false;                   // `namespace(...)`: attributes assignable
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts or replaces. Fails on an unhashable key (list, dict).
  Status set(Value key, Value v);
  ~Dict() override;

 private:
  std::unordered_map<std::string, size_t> index_;  // hash key -> position in items
};

class Interp;
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, std::string_view name) const;  // positional i or keyword name
};
struct Func : Object {
  std::string name;
  Value self;  // a bound method's receiver (what the closure keeps alive)
  std::function<Expected<Value>(Interp&, CallArgs&)> fn;
};

inline List& Value::list() const { return static_cast<List&>(*obj); }
inline Dict& Value::dict() const { return static_cast<Dict&>(*obj); }
inline Func& Value::func() const { return static_cast<Func&>(*obj); }

// Constructors charge the current heap; they fail past its limit.
Expected<Value> make_str(std::string s, bool tainted = false);
Expected<Value> make_str(StrBuilder&& b);
Expected<Value> make_list(std::vector<Value> items, bool tuple = false);
Expected<Value> make_generator(std::vector<Value> items);
bool is_generator(const Value& v);
Expected<Value> make_dict();
Value make_func(std::string name, std::function<Expected<Value>(Interp&, CallArgs&)> fn);
// Uncharged string for literals and inputs.
Value literal_str(std::string s, bool tainted = false);

// Errors when storing v inside target would make a reference cycle (namespaces are
// the only mutable objects; a cycle would leak, as there is no garbage collector).
Status check_no_cycle(const Value& v, const Object* target);

// Python truthiness; undefined is false.
bool truthy(const Value& v);
// Python ==, deep for lists and dicts; int/float/bool compare numerically.
bool equals(const Value& a, const Value& b, int depth = 0);
// Python <; error for unorderable types.
Expected<bool> less(const Value& a, const Value& b);
const char* type_name(const Value& v);

// str(v) as Jinja prints it ({{ v }}): undefined -> "", None, True, 1.5, and
// Python repr inside lists and dicts. Appends with taint to out.
Status print_value(const Value& v, StrBuilder& out, int depth = 0);
Expected<Value> to_string_value(const Value& v);  // the `string` filter
std::string python_repr_str(std::string_view s);
std::string python_float(double d);
// HF's tojson: json.dumps(v, ensure_ascii=..., indent=indent (-1: None), sort_keys=...).
Status to_json(const Value& v, StrBuilder& out, int indent, bool sort_keys, bool ensure_ascii, int depth = 0);
// Key used to index dicts by value ("s:" + text, "i:" + number...). False for unhashable.
bool hash_key(const Value& v, std::string* key);

// Python str helpers (UTF-8 aware).
bool py_isspace_cp(uint32_t cp);
size_t utf8_length(std::string_view s);  // code points (invalid bytes count as one)
// Byte offset of code point index cp (clamped to s.size()).
size_t utf8_offset(std::string_view s, int64_t cp);

}  // namespace pagoda::tok::jinja
