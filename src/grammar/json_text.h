// Scans of raw JSON text that run before (or instead of) a parser: nesting depth
// checks on untrusted bodies and schemas, and the extent of the JSON value at
// the start of model output. One walk over the text, strings skipped, no
// allocation. Shared by grammar/ (schema depth) and server/ (bodies, tool calls).
#pragma once
#include <cstddef>
#include <string_view>

namespace pagoda::grammar {

// Calls f(i, +1) at each '{' or '[' and f(i, -1) at each '}' or ']' of s that is
// outside a JSON string, in order; stops early when f returns false.
template <class F>
void walk_json_brackets(std::string_view s, F&& f) {
  bool in_str = false, esc = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (!f(i, +1)) return;
    } else if (c == '}' || c == ']') {
      if (!f(i, -1)) return;
    }
  }
}

// The deepest nesting of objects/arrays in s, or stop_above + 1 as soon as it
// goes past stop_above (so a hostile document costs only what was read).
inline int json_nesting_depth(std::string_view s, int stop_above) {
  int depth = 0, max_depth = 0;
  walk_json_brackets(s, [&](size_t, int d) {
    depth += d;
    if (depth > max_depth) max_depth = depth;
    return max_depth <= stop_above;
  });
  return max_depth;
}

// Length of the object/array that starts s (brackets balanced), 0 when s does
// not start with '{' or '[' or the value is not closed.
inline size_t json_value_extent(std::string_view s) {
  if (s.empty() || (s[0] != '{' && s[0] != '[')) return 0;
  int depth = 0;
  size_t end = 0;
  walk_json_brackets(s, [&](size_t i, int d) {
    depth += d;
    if (depth == 0) end = i + 1;
    return depth != 0;
  });
  return end;
}

}  // namespace pagoda::grammar
