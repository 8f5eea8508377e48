// The tree-walking evaluator (internal to jinja_*.cc).
#pragma once
#include <chrono>
#include <ctime>
#include <string>
#include <unordered_map>

#include "tok/jinja.h"
#include "tok/jinja_ast.h"

namespace pagoda::tok::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Interp {
 public:
  Interp(const Limits& limits, Heap* heap, std::time_t now);

  Status run(const Node& root, const Value& globals, StrBuilder& out);
  Status exec(const Node& n, Scope& sc, StrBuilder& out);
  Expected<Value> eval(const Node& n, Scope& sc);
  // Counts one step; errors past the step or time limit.
  Status step();
  Expected<Value> call(const Value& f, CallArgs& args, int line);
  std::time_t now() const { return now_; }
  const Limits& limits() const { return limits_; }
  Heap* heap() const { return heap_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Status exec_body(const Node& body, Scope& sc, StrBuilder& out);
  Status exec_for(const Node& n, Scope& sc, StrBuilder& out);
  Status exec_set(const Node& n, Scope& sc, const Value& v);
  Status assign(Scope& sc, const std::vector<std::string>& targets, const Value& v, int line);
  Expected<Value> eval_binary(const Node& n, Scope& sc);
  Expected<Value> eval_call(const Node& n, Scope& sc);
  Status eval_args(const Node& n, size_t first, Scope& sc, CallArgs* args);
  Value define_macro(const Node& n, Scope& sc);
  Error output_error() const;

  Limits limits_;
  Heap* heap_;
  std::time_t now_;
  int64_t steps_ = 0;
  int64_t next_clock_check_ = 64;
  int depth_ = 0;       // macro calls
  int eval_depth_ = 0;  // nested exec/eval calls (C++ stack)
  Flow flow_ = Flow::kNormal;
  std::chrono::steady_clock::time_point deadline_;
  Scope* root_ = nullptr;
};

// Builtins (jinja_builtins.cc).
Expected<Value> apply_filter(Interp& in, int filter, const Value& v, CallArgs& args);
Expected<bool> apply_test(Interp& in, int test, const Value& v, CallArgs& args);
// obj.name: a bound method, a dict entry, or undefined. Errors on unsafe names.
Expected<Value> get_attr(const Value& obj, const std::string& name);
// obj[key] (Python subscript; undefined when absent).
Expected<Value> get_item(const Value& obj, const Value& key);
Expected<Value> slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Fills the global functions (range, namespace, dict, raise_exception, strftime_now...).
void add_globals(Scope& sc);
// Python binary operators on values: + - * / // % ** ~ and comparisons.
Expected<Value> binary_op(const std::string& op, const Value& a, const Value& b);
// Python str semantics (jinja_strings.cc): UTF-8 code points, taint carried along.
size_t sfind(std::string_view h, std::string_view n, size_t pos);  // linear time
size_t srfind(std::string_view h, std::string_view n);
size_t cp_len_at(std::string_view s, size_t i);    // bytes of the code point at i (1 if invalid)
uint32_t cp_at(std::string_view s, size_t i);
size_t prev_start(std::string_view s, size_t end);  // start of the code point ending at end
Expected<Value> substr_value(const Str& s, size_t b, size_t e);
Expected<Value> py_strip_value(const Value& v, const std::string* chars, bool left, bool right);
Expected<Value> py_replace(const Value& v, const Value& from, const Value& to, int64_t count);
Expected<Value> case_map(const Value& v, char how);  // 'u'pper 'l'ower 't'itle 'c'apitalize (ASCII)
bool is_str_method(const std::string& name);
Expected<Value> str_method(const Value& self, const std::string& name, CallArgs& a);
// markupsafe.escape (jinja_filters.cc).
Expected<Value> html_escape(const Value& v);
// Iterates v as a for loop does (dict -> keys, string -> characters, undefined -> nothing).
Expected<std::vector<Value>> iterate(const Value& v);

}  // namespace pagoda::tok::jinja
