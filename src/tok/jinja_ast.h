// Syntax tree of a parsed Jinja template (internal to jinja_*.cc).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tok/jinja_value.h"

namespace pagoda::tok::jinja {

struct Node;
using NodePtr = std::unique_ptr<Node>;

enum class NodeKind {
  // Expressions.
  kLiteral,    // lit
  kName,       // name
  kListLit,    // kids
  kTupleLit,   // kids
  kDictLit,    // kids: key, value, key, value...
  kAttr,       // kids[0].name
  kIndex,      // kids[0][kids[1]]
  kSlice,      // kids[0][kids[1]:kids[2]:kids[3]] (null kids for omitted parts)
  kCall,       // kids[0](kids[1..]); names: keyword names of the last names.size() args
  kFilter,     // kids[0] | name(kids[1..]); names as for kCall
  kTest,       // kids[0] is [not] name(kids[1..]); negated
  kUnary,      // op kids[0]: "-", "+", "not"
  kBinary,     // kids[0] op kids[1]: + - * / // % ** ~ == != < > <= >= in "not in" and or
  kCond,       // kids[1] if kids[0] else kids[2] (kids[2] may be null)
  // Statements.
  kText,       // name is the text
  kOutput,     // {{ kids[0] }}
  kIf,         // kids: cond, body, cond, body, ..., [else body] (odd count: last is else)
  kFor,        // names: targets; kids: iter, body, else body (or null), filter cond (or null)
  kSet,        // names: targets (a name or "ns.attr"); kids[0]: value
  kSetBlock,   // names[0]: target; kids[0]: body
  kMacro,      // name; names: params; kids: body, then defaults for the last params
  kBreak,
  kContinue,
  kBody,       // kids: statements
  kFilterBlock,  // kids[0]: body, kids[1]: a kFilter chain whose innermost operand is null
};

struct Node {
  NodeKind kind;
  int line = 0;
  std::string name;
  std::string op;
  Value lit;
  bool negated = false;
  std::vector<NodePtr> kids;
  std::vector<std::string> names;
  // kFilter: index into the builtin filter table; kTest: index into the tests.
  int builtin = -1;
  int depth = 1;  // height of the subtree (bounded by the parser)
};

// Parses a template source; errors name the line and the construct.
Expected<NodePtr> parse_template(std::string_view source, int max_depth);

// Builtin lookup (jinja_builtins.cc): -1 when unknown.
int find_filter(std::string_view name);
int find_test(std::string_view name);

}  // namespace pagoda::tok::jinja
