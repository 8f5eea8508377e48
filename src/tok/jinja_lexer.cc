// Lexer of the Jinja interpreter: text, {{ }}, {% %}, {# #}, {% raw %}.
#include "tok/jinja_lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "tok/jinja_value.h"
#include "tok/unicode.h"

namespace pagoda::tok::jinja {

namespace {

bool is_space_at(std::string_view s, size_t i, size_t* len) {
  const size_t l = utf8_valid_len(s, i);
  if (l == 0) return false;
  *len = l;
  return py_isspace_cp(utf8_decode(s, i, l));
}

// Python str.rstrip() / lstrip().
size_t rstrip_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    size_t len;
    if (!is_space_at(s, start, &len) || start + len != end) break;
    end = start;
  }
  return end;
}
size_t lstrip_begin(std::string_view s) {
  size_t i = 0, len;
  while (i < s.size() && is_space_at(s, i, &len)) i += len;
  return i;
}

// Python str.splitlines() + "\n".join(): every line break becomes "\n" and one
// trailing line break goes (Jinja's keep_trailing_newline=False).
std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\r') {
      out.push_back('\n');
      i += (i + 1 < s.size() && s[i + 1] == '\n') ? 2 : 1;
    } else if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E)) {
      out.push_back('\n');
      ++i;
    } else if (s.compare(i, 2, "\xC2\x85") == 0) {
      out.push_back('\n');
      i += 2;
    } else if (s.compare(i, 3, "\xE2\x80\xA8") == 0 || s.compare(i, 3, "\xE2\x80\xA9") == 0) {
      out.push_back('\n');
      i += 3;
    } else {
      out.push_back(static_cast<char>(c));
      ++i;
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  Expected<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    bool lstrip_next = false;  // the previous tag ended with "-"
    while (pos < s_.size()) {
      // Next tag start.
      size_t t = pos;
      for (;;) {
        t = s_.find('{', t);
        if (t == std::string::npos || t + 1 >= s_.size()) {
          t = std::string::npos;
          break;
        }
        const char c = s_[t + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++t;
      }
      std::string text = s_.substr(pos, t == std::string::npos ? std::string::npos : t - pos);
      if (lstrip_next) text.erase(0, lstrip_begin(text));
      lstrip_next = false;
      if (t == std::string::npos) {
        add_text(std::move(text));
        break;
      }
      const char kind = s_[t + 1];
      char sign = 0;
      if (t + 2 < s_.size() && (s_[t + 2] == '-' || s_[t + 2] == '+')) sign = s_[t + 2];
      if (sign == '-') {
        text.resize(rstrip_end(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the spaces between the line start and a block/comment tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && lstrip_begin(std::string_view(text).substr(l_pos)) == text.size() - l_pos) {
          text.resize(l_pos);
        }
      }
      line_ += count_nl(s_, pos, t);
      add_text(std::move(text));
      pos = t + 2 + (sign != 0 ? 1 : 0);
      if (kind == '#') {
        const size_t e = s_.find("#}", pos);
        if (e == std::string::npos) return err("unclosed comment");
        line_ += count_nl(s_, pos, e);
        const bool minus = e > pos && s_[e - 1] == '-';
        pos = e + 2;
        line_starting = false;
        if (minus) {
          lstrip_next = true;
        } else if (pos < s_.size() && s_[pos] == '\n') {
          ++pos;
          ++line_;
          line_starting = true;
        }
        continue;
      }
      // raw blocks: {% raw %}...{% endraw %} copied verbatim.
      if (kind == '%') {
        size_t q = pos;
        while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t' || s_[q] == '\n')) ++q;
        if (s_.compare(q, 3, "raw") == 0 && q + 3 < s_.size() && !std::isalnum(static_cast<unsigned char>(s_[q + 3])) && s_[q + 3] != '_') {
          PAGODA_TRY(lex_raw(q + 3, &pos, &line_starting, &lstrip_next));
          continue;
        }
      }
      toks_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", 0, 0, line_});
      const std::string end = kind == '{' ? "}}" : "%}";
      PAGODA_TRY(lex_tag(end, &pos));
      // pos is at the end delimiter, possibly preceded by '-' or '+' (consumed as part of it).
      toks_.push_back({kind == '{' ? Tok::kVarEnd : Tok::kBlockEnd, "", 0, 0, line_});
      const char esign = end_sign_;
      pos += 2;
      line_starting = false;
      if (esign == '-') {
        lstrip_next = true;
      } else if (kind == '%' && esign != '+' && pos < s_.size() && s_[pos] == '\n') {
        ++pos;  // trim_blocks
        ++line_;
        line_starting = true;
      }
    }
    toks_.push_back({Tok::kEof, "", 0, 0, line_});
    return std::move(toks_);
  }

 private:
  static int count_nl(const std::string& s, size_t b, size_t e) {
    int n = 0;
    for (size_t i = b; i < e && i < s.size(); ++i) n += s[i] == '\n';
    return n;
  }
  void add_text(std::string text) {
    if (!text.empty()) toks_.push_back({Tok::kText, std::move(text), 0, 0, line_});
  }
  Error err(const std::string& what) const { return errorf("template syntax error (line %d): %s", line_ + 1, what.c_str()); }

  Status lex_raw(size_t q, size_t* pos, bool* line_starting, bool* lstrip_next) {
    // {% raw %}: find the end of this tag, then "{% endraw %}" (with optional -).
    const size_t e = s_.find("%}", q);
    if (e == std::string::npos) return err("unclosed raw tag");
    size_t body = e + 2;
    if (s_[e - 1] == '-') body += lstrip_begin(std::string_view(s_).substr(body));
    else if (body < s_.size() && s_[body] == '\n') ++body;
    size_t search = body;
    for (;;) {
      const size_t b = s_.find("{%", search);
      if (b == std::string::npos) return err("raw block without endraw");
      size_t k = b + 2;
      const bool minus = k < s_.size() && s_[k] == '-';
      if (k < s_.size() && (s_[k] == '-' || s_[k] == '+')) ++k;
      while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t' || s_[k] == '\n')) ++k;
      if (s_.compare(k, 6, "endraw") != 0) {
        search = b + 2;
        continue;
      }
      const size_t ee = s_.find("%}", k);
      if (ee == std::string::npos) return err("unclosed endraw tag");
      std::string text = s_.substr(body, b - body);
      if (minus) text.resize(rstrip_end(text));
      line_ += count_nl(s_, *pos, ee);
      add_text(std::move(text));
      *pos = ee + 2;
      *line_starting = false;
      if (s_[ee - 1] == '-') {
        *lstrip_next = true;
      } else if (*pos < s_.size() && s_[*pos] == '\n') {
        ++*pos;
        *line_starting = true;
      }
      return Status::Ok();
    }
  }

  Status lex_tag(const std::string& end, size_t* pos_io) {
    size_t p = *pos_io;
    int depth = 0;  // brackets: "}}" inside a dict literal is not the end
    for (;;) {
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\n' || s_[p] == '\r')) {
        if (s_[p] == '\n') ++line_;
        ++p;
      }
      if (p >= s_.size()) return err("unclosed tag (expected '" + end + "')");
      if (depth == 0) {
        if ((s_[p] == '-' || s_[p] == '+') && s_.compare(p + 1, 2, end) == 0) {
          end_sign_ = s_[p];
          *pos_io = p + 1;
          return Status::Ok();
        }
        if (s_.compare(p, 2, end) == 0) {
          end_sign_ = 0;
          *pos_io = p;
          return Status::Ok();
        }
      }
      const char c = s_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        toks_.push_back({Tok::kName, s_.substr(p, e - p), 0, 0, line_});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        std::string digits;
        while (e < s_.size()) {
          const char d = s_[e];
          if (std::isdigit(static_cast<unsigned char>(d))) {
            digits.push_back(d);
          } else if (d == '_' ) {
          } else if (d == '.' && !is_float && e + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
            is_float = true;
            digits.push_back(d);
          } else if ((d == 'e' || d == 'E') && e + 1 < s_.size() &&
                     (std::isdigit(static_cast<unsigned char>(s_[e + 1])) || s_[e + 1] == '-' || s_[e + 1] == '+')) {
            is_float = true;
            digits.push_back(d);
            digits.push_back(s_[++e]);
          } else {
            break;
          }
          ++e;
        }
        Token t{is_float ? Tok::kFloat : Tok::kInt, digits, 0, 0, line_};
        if (is_float) {
          t.f = std::strtod(digits.c_str(), nullptr);
        } else {
          errno = 0;
          t.i = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) return err("integer literal too large: " + digits);
        }
        toks_.push_back(std::move(t));
        p = e;
      } else if (c == '\'' || c == '"') {
        std::string out;
        size_t e = p + 1;
        bool closed = false;
        while (e < s_.size()) {
          const char d = s_[e];
          if (d == c) {
            closed = true;
            break;
          }
          if (d == '\\' && e + 1 < s_.size()) {
            PAGODA_TRY(unescape(&e, &out));
            continue;
          }
          if (d == '\n') ++line_;
          out.push_back(d);
          ++e;
        }
        if (!closed) return err("unterminated string literal");
        toks_.push_back({Tok::kString, std::move(out), 0, 0, line_});
        p = e + 1;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                           "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";"};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (s_.compare(p, n, op) == 0) {
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
            if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
            toks_.push_back({Tok::kOp, op, 0, 0, line_});
            p += n;
            found = true;
            break;
          }
        }
        if (!found) return err(std::string("unexpected character '") + c + "'");
      }
    }
  }

  // Python unicode-escape at s_[*e] == '\\'.
  Status unescape(size_t* e, std::string* out) {
    const char x = s_[*e + 1];
    *e += 2;
    auto hex = [&](int n) -> Expected<uint32_t> {
      if (*e + static_cast<size_t>(n) > s_.size()) return err("truncated \\x/\\u escape");
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        const char h = s_[*e + static_cast<size_t>(k)];
        int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0) return err("bad hex digit in escape");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      *e += static_cast<size_t>(n);
      return v;
    };
    switch (x) {
      case 'n': out->push_back('\n'); break;
      case 't': out->push_back('\t'); break;
      case 'r': out->push_back('\r'); break;
      case '\\': out->push_back('\\'); break;
      case '\'': out->push_back('\''); break;
      case '"': out->push_back('"'); break;
      case 'a': out->push_back('\a'); break;
      case 'b': out->push_back('\b'); break;
      case 'f': out->push_back('\f'); break;
      case 'v': out->push_back('\v'); break;
      case '\n': break;
      case 'x': { PAGODA_ASSIGN_OR_RETURN(uint32_t v, hex(2)); append_utf8(*out, v); break; }
      case 'u': { PAGODA_ASSIGN_OR_RETURN(uint32_t v, hex(4)); if (v >= 0xD800 && v < 0xE000) return err("surrogate escape"); append_utf8(*out, v); break; }
      case 'U': { PAGODA_ASSIGN_OR_RETURN(uint32_t v, hex(8)); if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) return err("bad \\U escape"); append_utf8(*out, v); break; }
      default:
        if (x >= '0' && x <= '7') {
          uint32_t v = static_cast<uint32_t>(x - '0');
          for (int k = 0; k < 2 && *e < s_.size() && s_[*e] >= '0' && s_[*e] <= '7'; ++k) v = v * 8 + static_cast<uint32_t>(s_[(*e)++] - '0');
          append_utf8(*out, v);
        } else {
          out->push_back('\\');
          out->push_back(x);
        }
    }
    return Status::Ok();
  }

  std::string s_;
  std::vector<Token> toks_;
  int line_ = 0;
  char end_sign_ = 0;
};

}  // namespace

Expected<std::vector<Token>> lex_template(std::string_view source) {
  Lexer lx(normalize_newlines(source));
  return lx.run();
}

}  // namespace pagoda::tok::jinja
