// Python str semantics for the Jinja interpreter: methods (strip, split, replace,
// startswith, format...), on UTF-8 code points, carrying taint spans.
#include <cctype>
#include <cstdlib>

#include "tok/jinja_interp.h"
#include "tok/unicode.h"

namespace pagoda::tok::jinja {

// Substring search in linear time: std::string::find is O(n*m) in the worst case,
// which a hostile template could use to hang ("aaa...ab" in "aaa...a").
size_t sfind(std::string_view h, std::string_view n, size_t pos) {
  add_work(h.size() > pos ? h.size() - pos : 0);
  if (n.size() <= 16 || pos >= h.size()) return h.find(n, pos);
  std::vector<size_t> fail(n.size(), 0);  // KMP failure function
  for (size_t i = 1, k = 0; i < n.size(); ++i) {
    while (k > 0 && n[i] != n[k]) k = fail[k - 1];
    if (n[i] == n[k]) ++k;
    fail[i] = k;
  }
  for (size_t i = pos, k = 0; i < h.size(); ++i) {
    while (k > 0 && h[i] != n[k]) k = fail[k - 1];
    if (h[i] == n[k]) ++k;
    if (k == n.size()) return i + 1 - n.size();
  }
  return std::string_view::npos;
}

size_t srfind(std::string_view h, std::string_view n) {
  if (n.size() <= 16) return h.rfind(n);
  size_t last = std::string_view::npos;
  for (size_t p = sfind(h, n, 0); p != std::string_view::npos; p = sfind(h, n, p + 1)) last = p;
  return last;
}

namespace {

// Python str methods.
bool in_chars(uint32_t cp, const std::string* chars) {
  if (chars == nullptr) return py_isspace_cp(cp);
  for (size_t i = 0; i < chars->size();) {
    size_t l = utf8_valid_len(*chars, i);
    if (l == 0) l = 1;
    if (utf8_decode(*chars, i, l) == cp) return true;
    i += l;
  }
  return false;
}

}  // namespace

size_t cp_len_at(std::string_view s, size_t i) {
  const size_t l = utf8_valid_len(s, i);
  return l == 0 ? 1 : l;
}

size_t prev_start(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
  if (cp_len_at(s, start) != end - start) start = end - 1;
  return start;
}

uint32_t cp_at(std::string_view s, size_t i) {
  const size_t l = utf8_valid_len(s, i);
  return l == 0 ? static_cast<unsigned char>(s[i]) : utf8_decode(s, i, l);
}


Expected<Value> py_strip_value(const Value& v, const std::string* chars, bool left, bool right) {
  const Str& s = v.str();
  size_t b = 0, e = s.s.size();
  if (left) {
    while (b < e && in_chars(cp_at(s.s, b), chars)) b += cp_len_at(s.s, b);
  }
  if (right) {
    while (e > b) {
      const size_t st = prev_start(s.s, e);
      if (!in_chars(cp_at(s.s, st), chars)) break;
      e = st;
    }
  }
  StrBuilder out;
  out.append(s, b, e - b);
  return make_str(std::move(out));
}


Expected<Value> substr_value(const Str& s, size_t b, size_t e) {
  StrBuilder out;
  out.append(s, b, e - b);
  return make_str(std::move(out));
}

// Python str.split(sep=None, maxsplit=-1).
namespace {

Expected<Value> py_split(const Value& v, const Value* sep, int64_t maxsplit) {
  const Str& s = v.str();
  std::vector<Value> parts;
  if (sep == nullptr || sep->is_none()) {
    size_t i = 0;
    const size_t n = s.s.size();
    for (;;) {
      while (i < n && py_isspace_cp(cp_at(s.s, i))) i += cp_len_at(s.s, i);
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        size_t e = n;
        while (e > i) {
          const size_t st = prev_start(s.s, e);
          if (!py_isspace_cp(cp_at(s.s, st))) break;
          e = st;
        }
        PAGODA_ASSIGN_OR_RETURN(Value p, substr_value(s, i, e));
        parts.push_back(std::move(p));
        break;
      }
      size_t j = i;
      while (j < n && !py_isspace_cp(cp_at(s.s, j))) j += cp_len_at(s.s, j);
      PAGODA_ASSIGN_OR_RETURN(Value p, substr_value(s, i, j));
      parts.push_back(std::move(p));
      i = j;
    }
    return make_list(std::move(parts));
  }
  if (!sep->is_str()) return make_error("split: separator must be a string");
  const std::string& d = sep->str().s;
  if (d.empty()) return make_error("split: empty separator");
  size_t i = 0;
  for (;;) {
    const size_t j = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) ? std::string::npos : sfind(s.s, d, i);
    if (j == std::string::npos) {
      PAGODA_ASSIGN_OR_RETURN(Value p, substr_value(s, i, s.s.size()));
      parts.push_back(std::move(p));
      break;
    }
    PAGODA_ASSIGN_OR_RETURN(Value p, substr_value(s, i, j));
    parts.push_back(std::move(p));
    i = j + d.size();
  }
  return make_list(std::move(parts));
}

}  // namespace

// Python str.replace(old, new, count=-1) keeping the taint of both sides.
Expected<Value> py_replace(const Value& v, const Value& from, const Value& to, int64_t count) {
  if (!from.is_str() || !to.is_str()) return make_error("replace: arguments must be strings");
  const Str& s = v.str();
  const std::string& f = from.str().s;
  StrBuilder out;
  size_t i = 0;
  int64_t done = 0;
  if (f.empty()) {
    // Python inserts `to` between every character (and at both ends).
    while (i <= s.s.size() && (count < 0 || done < count)) {
      out.append(to.str());
      ++done;
      if (i == s.s.size()) { i = s.s.size() + 1; break; }
      const size_t l = cp_len_at(s.s, i);
      out.append(s, i, l);
      i += l;
    }
    if (i <= s.s.size()) out.append(s, i);
    return make_str(std::move(out));
  }
  for (;;) {
    const size_t j = (count >= 0 && done >= count) ? std::string::npos : sfind(s.s, f, i);
    if (j == std::string::npos) {
      out.append(s, i);
      break;
    }
    out.append(s, i, j - i);
    out.append(to.str());
    i = j + f.size();
    ++done;
  }
  return make_str(std::move(out));
}

// ASCII case mapping keeps byte offsets, so the taint spans stay valid.
Expected<Value> case_map(const Value& v, char how) {
  const Str& s = v.str();
  StrBuilder out;
  out.append(s);
  std::string& t = out.text();
  bool word_start = true;
  for (size_t i = 0; i < t.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    const bool alpha = std::isalpha(c) != 0;
    switch (how) {
      case 'u': t[i] = static_cast<char>(std::toupper(c)); break;
      case 'l': t[i] = static_cast<char>(std::tolower(c)); break;
      case 'c': t[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c)); break;
      case 't':  // str.title(): a cased character after an uncased one starts a word
        t[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));
        word_start = !alpha && c < 0x80;
        break;
      case 'T': {  // jinja2's title filter: words start after runs of -, space, (, {, [, <
        const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' ||
                         (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
        t[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));
        word_start = sep;
        break;
      }
    }
  }
  return make_str(std::move(out));
}

Expected<Value> str_method(const Value& self, const std::string& name, CallArgs& a) {
  const Str& s = self.str();
  auto arg_str = [&](size_t i, const char* kw) -> const std::string* {
    const Value* v = a.get(i, kw);
    return v != nullptr && v->is_str() ? &v->str().s : nullptr;
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* c = a.get(0, "chars");
    const std::string* chars = c != nullptr && c->is_str() ? &c->str().s : nullptr;
    return py_strip_value(self, chars, name != "rstrip", name != "lstrip");
  }
  if (name == "split") {
    const Value* mx = a.get(1, "maxsplit");
    return py_split(self, a.get(0, "sep"), mx != nullptr ? mx->as_int() : -1);
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (p == nullptr) return errorf("%s() takes one argument", name.c_str());
    std::vector<Value> cands;
    if (p->is_list()) cands = p->list().items; else cands.push_back(*p);
    for (const Value& c : cands) {
      if (!c.is_str()) return errorf("%s: argument must be a string or a tuple of strings", name.c_str());
      const std::string& x = c.str().s;
      if (x.size() > s.s.size()) continue;
      if (name == "startswith" ? s.s.compare(0, x.size(), x) == 0 : s.s.compare(s.s.size() - x.size(), x.size(), x) == 0) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (name == "replace") {
    const Value* f = a.get(0, "old");
    const Value* t = a.get(1, "new");
    const Value* c = a.get(2, "count");
    if (f == nullptr || t == nullptr) return make_error("replace() takes two arguments");
    return py_replace(self, *f, *t, c != nullptr ? c->as_int() : -1);
  }
  if (name == "upper") return case_map(self, 'u');
  if (name == "lower") return case_map(self, 'l');
  if (name == "title") return case_map(self, 't');
  if (name == "capitalize") return case_map(self, 'c');
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const std::string* x = arg_str(0, "sub");
    if (x == nullptr) return errorf("%s() needs a string argument", name.c_str());
    if (name == "count") {
      if (x->empty()) return Value::integer(static_cast<int64_t>(utf8_length(s.s)) + 1);
      int64_t n = 0;
      for (size_t i = sfind(s.s, *x, 0); i != std::string::npos; i = sfind(s.s, *x, i + x->size())) ++n;
      return Value::integer(n);
    }
    const size_t p = name == "rfind" ? srfind(s.s, *x) : sfind(s.s, *x, 0);
    if (p == std::string::npos) {
      if (name == "index") return make_error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(s.s).substr(0, p))));
  }
  if (name == "join") {
    const Value* it = a.get(0, "iterable");
    if (it == nullptr) return make_error("join() takes one argument");
    PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(*it));
    StrBuilder out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out.append(s);
      if (!items[i].is_str()) return make_error("join: sequence item is not a string");
      out.append(items[i].str());
    }
    return make_str(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string* x = arg_str(0, "prefix");
    if (x == nullptr) return errorf("%s() needs a string argument", name.c_str());
    if (name == "removeprefix" && s.s.compare(0, x->size(), *x) == 0) return substr_value(s, x->size(), s.s.size());
    if (name == "removesuffix" && !x->empty() && x->size() <= s.s.size() &&
        s.s.compare(s.s.size() - x->size(), x->size(), *x) == 0) {
      return substr_value(s, 0, s.s.size() - x->size());
    }
    return self;
  }
  if (name == "splitlines") {
    std::vector<Value> parts;
    size_t b = 0;
    for (size_t i = 0; i < s.s.size();) {
      const uint32_t c = cp_at(s.s, i);
      const size_t l = cp_len_at(s.s, i);
      const bool br = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                      c == 0x2028 || c == 0x2029;
      if (!br) {
        i += l;
        continue;
      }
      PAGODA_ASSIGN_OR_RETURN(Value p, substr_value(s, b, i));
      parts.push_back(std::move(p));
      i += l;
      if (c == '\r' && i < s.s.size() && s.s[i] == '\n') ++i;
      b = i;
    }
    if (b < s.s.size()) {
      PAGODA_ASSIGN_OR_RETURN(Value p, substr_value(s, b, s.s.size()));
      parts.push_back(std::move(p));
    }
    return make_list(std::move(parts));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" || name == "isupper") {
    if (s.s.empty()) return Value::boolean(false);
    bool ok = true, cased = false;
    for (unsigned char c : s.s) {
      if (name == "isdigit") ok = ok && std::isdigit(c);
      else if (name == "isalpha") ok = ok && std::isalpha(c);
      else if (name == "isalnum") ok = ok && std::isalnum(c);
      else if (name == "isspace") ok = ok && py_isspace_cp(c);
      else if (name == "islower") { ok = ok && !std::isupper(c); cased = cased || std::islower(c); }
      else { ok = ok && !std::islower(c); cased = cased || std::isupper(c); }
    }
    if (name == "islower" || name == "isupper") ok = ok && cased;
    return Value::boolean(ok);
  }
  if (name == "format") {
    // "{}", "{0}", "{name}" and "{{"/"}}"; format specs and conversions are refused.
    StrBuilder out;
    size_t auto_idx = 0;
    for (size_t i = 0; i < s.s.size(); ++i) {
      const char c = s.s[i];
      if (c == '}' ) {
        if (i + 1 < s.s.size() && s.s[i + 1] == '}') ++i;
        else return make_error("format: single '}' in format string");
        out.append("}");
        continue;
      }
      if (c != '{') {
        out.append(s, i, 1);
        continue;
      }
      if (i + 1 < s.s.size() && s.s[i + 1] == '{') {
        out.append("{");
        ++i;
        continue;
      }
      const size_t e = s.s.find('}', i);
      if (e == std::string::npos) return make_error("format: unclosed '{'");
      const std::string field = s.s.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        return errorf("unsupported construct: str.format field '{%s}'", field.c_str());
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_idx < a.pos.size() ? &a.pos[auto_idx] : nullptr;
        ++auto_idx;
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        const size_t k = static_cast<size_t>(std::atoi(field.c_str()));
        v = k < a.pos.size() ? &a.pos[k] : nullptr;
      } else {
        for (const auto& [kn, kv] : a.kw) {
          if (kn == field) v = &kv;
        }
      }
      if (v == nullptr) return errorf("format: no argument for field '{%s}'", field.c_str());
      PAGODA_TRY(print_value(*v, out));
      i = e;
    }
    return make_str(std::move(out));
  }
  return errorf("unsupported string method '%s'", name.c_str());
}

bool is_str_method(const std::string& n) {
  static const char* const kNames[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "replace",
                                       "upper", "lower", "title", "capitalize", "find", "rfind", "index", "count",
                                       "join", "removeprefix", "removesuffix", "splitlines", "isdigit", "isalpha",
                                       "isspace", "isalnum", "islower", "isupper", "format", "rsplit", "zfill",
                                       "center", "ljust", "rjust", "encode", "partition", "rpartition", "casefold",
                                       "swapcase", "expandtabs", "translate"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

}  // namespace pagoda::tok::jinja
