// Lexer of the Jinja interpreter (internal): splits a template into text and
// tag tokens, applying HF's whitespace rules (trim_blocks, lstrip_blocks, "-"/"+"
// markers, newline normalisation, no trailing newline).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace pagoda::tok::jinja {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // text, name, unescaped string, operator
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

Expected<std::vector<Token>> lex_template(std::string_view source);

}  // namespace pagoda::tok::jinja
