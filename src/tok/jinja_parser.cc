// Parser of the Jinja subset chat templates use: statements (if/for/set/macro/
// filter/generation/break/continue) and jinja2's expression grammar and precedence.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>

#include "tok/jinja_ast.h"
#include "tok/jinja_lexer.h"

namespace pagoda::tok::jinja {

namespace {

NodePtr make(NodeKind k, int line) {
  auto n = std::make_unique<Node>();
  n->kind = k;
  n->line = line;
  return n;
}

class Parser {
 public:
  Parser(std::vector<Token> toks, int max_depth) : t_(std::move(toks)), max_depth_(max_depth) {}

  Expected<NodePtr> parse() {
    std::string end;
    PAGODA_ASSIGN_OR_RETURN(NodePtr body, parse_body({}, &end));
    if (!end.empty()) return err("unexpected '" + end + "'");
    return body;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { const Token& t = t_[p_]; if (p_ + 1 < t_.size()) ++p_; return t; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).type == Tok::kOp && peek(k).text == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).type == Tok::kName && peek(k).text == n; }
  Error err(const std::string& what) const {
    return errorf("template syntax error (line %d): %s", peek().line + 1, what.c_str());
  }
  Status expect_op(const char* op) {
    if (!is_op(op)) return err(std::string("expected '") + op + "', got '" + peek().text + "'");
    next();
    return Status::Ok();
  }
  Status expect(Tok type, const char* what) {
    if (peek().type != type) return err(std::string("expected ") + what + (peek().text.empty() ? "" : ", got '" + peek().text + "'"));
    next();
    return Status::Ok();
  }
  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* pp) : p(pp) { ++p->depth_; }
    ~DepthGuard() { --p->depth_; }
  };
  // Appends a child, keeping the tree shallow: loops in the grammar (a + b + c...,
  // x|f|g..., a.b.c...) build chains without recursion, and evaluating or freeing
  // a chain recurses once per level.
  Status adopt(Node* parent, NodePtr kid) {
    if (kid) {
      parent->depth = std::max(parent->depth, kid->depth + 1);
      if (parent->depth > 4 * max_depth_) {
        return err("expression nested too deeply (limit " + std::to_string(4 * max_depth_) + " levels)");
      }
    }
    parent->kids.push_back(std::move(kid));
    return Status::Ok();
  }
  Status check_depth() {
    if (depth_ > max_depth_) return err("template nested too deeply (limit " + std::to_string(max_depth_) + ")");
    return Status::Ok();
  }

  // Statements until one of end_tags ({% endfor %}, {% else %}...); *end gets the tag name.
  Expected<NodePtr> parse_body(std::vector<std::string> end_tags, std::string* end) {
    DepthGuard g(this);
    PAGODA_TRY(check_depth());
    NodePtr body = make(NodeKind::kBody, peek().line);
    for (;;) {
      const Token& tk = peek();
      if (tk.type == Tok::kEof) {
        if (!end_tags.empty()) return err("unexpected end of template, expected '" + end_tags.back() + "'");
        end->clear();
        return body;
      }
      if (tk.type == Tok::kText) {
        NodePtr n = make(NodeKind::kText, tk.line);
        n->name = tk.text;
        next();
        PAGODA_TRY(adopt(body.get(), std::move(n)));
        continue;
      }
      if (tk.type == Tok::kVarBegin) {
        next();
        NodePtr n = make(NodeKind::kOutput, tk.line);
        PAGODA_ASSIGN_OR_RETURN(NodePtr e, parse_expr());
        PAGODA_TRY(adopt(n.get(), std::move(e)));
        PAGODA_TRY(expect(Tok::kVarEnd, "'}}'"));
        PAGODA_TRY(adopt(body.get(), std::move(n)));
        continue;
      }
      if (tk.type != Tok::kBlockBegin) return err("unexpected token '" + tk.text + "'");
      const Token& kw = peek(1);
      if (kw.type != Tok::kName) return err("expected a statement name after '{%'");
      for (const std::string& e : end_tags) {
        if (kw.text == e) {
          next();
          next();
          *end = e;
          return body;
        }
      }
      next();
      PAGODA_ASSIGN_OR_RETURN(NodePtr st, parse_statement());
      if (st) PAGODA_TRY(adopt(body.get(), std::move(st)));
    }
  }

  Expected<NodePtr> parse_statement() {
    const Token kw = next();
    const std::string& k = kw.text;
    if (k == "if") return parse_if(kw.line);
    if (k == "for") return parse_for(kw.line);
    if (k == "set") return parse_set(kw.line);
    if (k == "macro") return parse_macro(kw.line);
    if (k == "break" || k == "continue") {
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      return make(k == "break" ? NodeKind::kBreak : NodeKind::kContinue, kw.line);
    }
    if (k == "generation") {  // HF's AssistantTracker extension: renders its body
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      std::string end;
      PAGODA_ASSIGN_OR_RETURN(NodePtr b, parse_body({"endgeneration"}, &end));
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      return b;
    }
    if (k == "filter") {
      NodePtr n = make(NodeKind::kFilterBlock, kw.line);
      PAGODA_ASSIGN_OR_RETURN(NodePtr chain, parse_filters(nullptr));
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      std::string end;
      PAGODA_ASSIGN_OR_RETURN(NodePtr body, parse_body({"endfilter"}, &end));
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      PAGODA_TRY(adopt(n.get(), std::move(body)));
      PAGODA_TRY(adopt(n.get(), std::move(chain)));
      return n;
    }
    if (k == "include" || k == "import" || k == "from" || k == "extends") {
      return err("unsupported statement '" + k + "' (templates have no file access)");
    }
    return err("unsupported statement '" + k + "'");
  }

  Expected<NodePtr> parse_if(int line) {
    NodePtr n = make(NodeKind::kIf, line);
    for (;;) {
      PAGODA_ASSIGN_OR_RETURN(NodePtr cond, parse_expr());
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      std::string end;
      PAGODA_ASSIGN_OR_RETURN(NodePtr body, parse_body({"elif", "else", "endif"}, &end));
      PAGODA_TRY(adopt(n.get(), std::move(cond)));
      PAGODA_TRY(adopt(n.get(), std::move(body)));
      if (end == "elif") continue;
      if (end == "else") {
        PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
        PAGODA_ASSIGN_OR_RETURN(NodePtr els, parse_body({"endif"}, &end));
        PAGODA_TRY(adopt(n.get(), std::move(els)));
      }
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      return n;
    }
  }

  Status parse_targets(std::vector<std::string>* names, bool allow_attr) {
    bool paren = false;
    if (is_op("(")) {
      next();
      paren = true;
    }
    for (;;) {
      if (peek().type != Tok::kName) return err("expected a variable name");
      std::string name = next().text;
      if (allow_attr && is_op(".")) {
        next();
        if (peek().type != Tok::kName) return err("expected an attribute name");
        name += "." + next().text;
      }
      names->push_back(std::move(name));
      if (!is_op(",")) break;
      next();
    }
    if (paren) PAGODA_TRY(expect_op(")"));
    return Status::Ok();
  }

  Expected<NodePtr> parse_for(int line) {
    NodePtr n = make(NodeKind::kFor, line);
    PAGODA_TRY(parse_targets(&n->names, false));
    if (!is_name("in")) return err("expected 'in' in for loop");
    next();
    PAGODA_ASSIGN_OR_RETURN(NodePtr iter, parse_tuple_or_expr(/*no_cond=*/true));
    NodePtr cond;
    if (is_name("if")) {
      next();
      PAGODA_ASSIGN_OR_RETURN(cond, parse_expr());
    }
    if (is_name("recursive")) return err("unsupported construct 'recursive' loops");
    PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
    std::string end;
    PAGODA_ASSIGN_OR_RETURN(NodePtr body, parse_body({"else", "endfor"}, &end));
    NodePtr els;
    if (end == "else") {
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      PAGODA_ASSIGN_OR_RETURN(els, parse_body({"endfor"}, &end));
    }
    PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
    PAGODA_TRY(adopt(n.get(), std::move(iter)));
    PAGODA_TRY(adopt(n.get(), std::move(body)));
    PAGODA_TRY(adopt(n.get(), std::move(els)));
    PAGODA_TRY(adopt(n.get(), std::move(cond)));
    return n;
  }

  Expected<NodePtr> parse_set(int line) {
    std::vector<std::string> targets;
    PAGODA_TRY(parse_targets(&targets, true));
    if (is_op("=")) {
      next();
      NodePtr n = make(NodeKind::kSet, line);
      n->names = std::move(targets);
      PAGODA_ASSIGN_OR_RETURN(NodePtr v, parse_tuple_or_expr(false));
      PAGODA_TRY(adopt(n.get(), std::move(v)));
      PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
      return n;
    }
    if (targets.size() != 1) return err("block set takes one target");
    if (is_op("|")) return err("unsupported construct: filtered block set");
    PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
    NodePtr n = make(NodeKind::kSetBlock, line);
    n->names = std::move(targets);
    std::string end;
    PAGODA_ASSIGN_OR_RETURN(NodePtr body, parse_body({"endset"}, &end));
    PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
    PAGODA_TRY(adopt(n.get(), std::move(body)));
    return n;
  }

  Expected<NodePtr> parse_macro(int line) {
    NodePtr n = make(NodeKind::kMacro, line);
    if (peek().type != Tok::kName) return err("expected a macro name");
    n->name = next().text;
    PAGODA_TRY(expect_op("("));
    std::vector<NodePtr> defaults;
    while (!is_op(")")) {
      if (peek().type != Tok::kName) return err("expected a macro parameter name");
      n->names.push_back(next().text);
      if (is_op("=")) {
        next();
        PAGODA_ASSIGN_OR_RETURN(NodePtr d, parse_expr());
        defaults.push_back(std::move(d));
      } else if (!defaults.empty()) {
        return err("non-default macro parameter after a default one");
      }
      if (!is_op(",")) break;
      next();
    }
    PAGODA_TRY(expect_op(")"));
    PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
    std::string end;
    PAGODA_ASSIGN_OR_RETURN(NodePtr body, parse_body({"endmacro"}, &end));
    if (peek().type == Tok::kName) next();  // {% endmacro name %}
    PAGODA_TRY(expect(Tok::kBlockEnd, "'%}'"));
    PAGODA_TRY(adopt(n.get(), std::move(body)));
    for (auto& d : defaults) PAGODA_TRY(adopt(n.get(), std::move(d)));
    return n;
  }

  // a, b, c (a tuple) or a single expression.
  Expected<NodePtr> parse_tuple_or_expr(bool no_cond) {
    const int line = peek().line;
    PAGODA_ASSIGN_OR_RETURN(NodePtr first, no_cond ? parse_or() : parse_expr());
    if (!is_op(",")) return first;
    NodePtr t = make(NodeKind::kTupleLit, line);
    PAGODA_TRY(adopt(t.get(), std::move(first)));
    while (is_op(",")) {
      next();
      if (peek().type == Tok::kBlockEnd || peek().type == Tok::kVarEnd || is_name("if")) break;
      PAGODA_ASSIGN_OR_RETURN(NodePtr e, no_cond ? parse_or() : parse_expr());
      PAGODA_TRY(adopt(t.get(), std::move(e)));
    }
    return t;
  }

  Expected<NodePtr> parse_expr() {
    DepthGuard g(this);
    PAGODA_TRY(check_depth());
    const int line = peek().line;
    PAGODA_ASSIGN_OR_RETURN(NodePtr a, parse_or());
    while (is_name("if")) {
      next();
      NodePtr n = make(NodeKind::kCond, line);
      PAGODA_ASSIGN_OR_RETURN(NodePtr cond, parse_or());
      NodePtr els;
      if (is_name("else")) {
        next();
        PAGODA_ASSIGN_OR_RETURN(els, parse_expr());
      }
      PAGODA_TRY(adopt(n.get(), std::move(cond)));
      PAGODA_TRY(adopt(n.get(), std::move(a)));
      PAGODA_TRY(adopt(n.get(), std::move(els)));
      a = std::move(n);
    }
    return a;
  }

  Expected<NodePtr> binary(const std::string& op, NodePtr l, NodePtr r) {
    NodePtr n = make(NodeKind::kBinary, l->line);
    n->op = op;
    PAGODA_TRY(adopt(n.get(), std::move(l)));
    PAGODA_TRY(adopt(n.get(), std::move(r)));
    return n;
  }

  // One left-associative level of binary operators: operand (op operand)*, op
  // one of `ops`, operator tokens or (is_names) keywords such as "and".
  template <class Operand>
  Expected<NodePtr> left_assoc(Operand operand, std::initializer_list<const char*> ops, bool is_names) {
    PAGODA_ASSIGN_OR_RETURN(NodePtr l, operand());
    for (;;) {
      const char* op = nullptr;
      for (const char* o : ops) {
        if (is_names ? is_name(o) : is_op(o)) {
          op = o;
          break;
        }
      }
      if (!op) return l;
      next();
      PAGODA_ASSIGN_OR_RETURN(NodePtr r, operand());
      PAGODA_ASSIGN_OR_RETURN(l, binary(op, std::move(l), std::move(r)));
    }
  }

  Expected<NodePtr> parse_or() { return left_assoc([this] { return parse_and(); }, {"or"}, true); }
  Expected<NodePtr> parse_and() { return left_assoc([this] { return parse_not(); }, {"and"}, true); }
  Expected<NodePtr> parse_not() {
    if (is_name("not")) {
      DepthGuard g(this);
      PAGODA_TRY(check_depth());
      const int line = next().line;
      PAGODA_ASSIGN_OR_RETURN(NodePtr e, parse_not());
      NodePtr n = make(NodeKind::kUnary, line);
      n->op = "not";
      PAGODA_TRY(adopt(n.get(), std::move(e)));
      return n;
    }
    return parse_compare();
  }
  Expected<NodePtr> parse_compare() {
    PAGODA_ASSIGN_OR_RETURN(NodePtr l, parse_math1());
    for (;;) {
      std::string op;
      if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return l;
      }
      PAGODA_ASSIGN_OR_RETURN(NodePtr r, parse_math1());
      // Python chains a < b < c as (a < b) and (b < c); templates do not chain.
      PAGODA_ASSIGN_OR_RETURN(l, binary(op, std::move(l), std::move(r)));
    }
  }
  Expected<NodePtr> parse_math1() { return left_assoc([this] { return parse_concat(); }, {"+", "-"}, false); }
  Expected<NodePtr> parse_concat() { return left_assoc([this] { return parse_math2(); }, {"~"}, false); }
  Expected<NodePtr> parse_math2() {
    return left_assoc([this] { return parse_pow(); }, {"*", "/", "//", "%"}, false);
  }
  Expected<NodePtr> parse_pow() { return left_assoc([this] { return parse_unary(true); }, {"**"}, false); }
  Expected<NodePtr> parse_unary(bool with_filter) {
    DepthGuard g(this);
    PAGODA_TRY(check_depth());
    NodePtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      NodePtr n = make(NodeKind::kUnary, t.line);
      n->op = t.text;
      PAGODA_ASSIGN_OR_RETURN(NodePtr e, parse_unary(false));
      PAGODA_TRY(adopt(n.get(), std::move(e)));
      node = std::move(n);
    } else {
      PAGODA_ASSIGN_OR_RETURN(node, parse_primary());
    }
    PAGODA_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      for (;;) {
        if (is_op("|")) {
          PAGODA_ASSIGN_OR_RETURN(node, parse_filters(std::move(node)));
        } else if (is_name("is")) {
          PAGODA_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
        } else {
          break;
        }
        PAGODA_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
      }
    }
    return node;
  }

  Expected<NodePtr> parse_primary() {
    const Token t = next();
    switch (t.type) {
      case Tok::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
        NodePtr n = make(NodeKind::kName, t.line);
        n->name = t.text;
        return n;
      }
      case Tok::kString: {
        std::string s = t.text;
        while (peek().type == Tok::kString) s += next().text;  // adjacent literals join
        return literal(literal_str(std::move(s)), t.line);
      }
      case Tok::kInt: return literal(Value::integer(t.i), t.line);
      case Tok::kFloat: return literal(Value::real(t.f), t.line);
      case Tok::kOp:
        if (t.text == "(") {
          if (is_op(")")) {
            next();
            return make(NodeKind::kTupleLit, t.line);
          }
          PAGODA_ASSIGN_OR_RETURN(NodePtr e, parse_expr());
          if (is_op(",")) {
            NodePtr tup = make(NodeKind::kTupleLit, t.line);
            PAGODA_TRY(adopt(tup.get(), std::move(e)));
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              PAGODA_ASSIGN_OR_RETURN(NodePtr x, parse_expr());
              PAGODA_TRY(adopt(tup.get(), std::move(x)));
            }
            e = std::move(tup);
          }
          PAGODA_TRY(expect_op(")"));
          return e;
        }
        if (t.text == "[") {
          NodePtr n = make(NodeKind::kListLit, t.line);
          PAGODA_TRY(parse_items("]", [&]() -> Status {
            PAGODA_ASSIGN_OR_RETURN(NodePtr x, parse_expr());
            return adopt(n.get(), std::move(x));
          }));
          return n;
        }
        if (t.text == "{") {
          NodePtr n = make(NodeKind::kDictLit, t.line);
          PAGODA_TRY(parse_items("}", [&]() -> Status {
            PAGODA_ASSIGN_OR_RETURN(NodePtr k, parse_expr());
            PAGODA_TRY(expect_op(":"));
            PAGODA_ASSIGN_OR_RETURN(NodePtr v, parse_expr());
            PAGODA_TRY(adopt(n.get(), std::move(k)));
            return adopt(n.get(), std::move(v));
          }));
          return n;
        }
        break;
      default: break;
    }
    return errorf("template syntax error (line %d): unexpected '%s'", t.line + 1,
                  t.type == Tok::kBlockEnd ? "%}" : t.type == Tok::kVarEnd ? "}}" : t.type == Tok::kEof ? "end of template" : t.text.c_str());
  }

  NodePtr literal(Value v, int line) {
    NodePtr n = make(NodeKind::kLiteral, line);
    n->lit = std::move(v);
    return n;
  }

  // (args, name=value...) after '(' has been consumed.
  // item (',' item)* up to the operator `close`, a trailing comma allowed, then
  // `close` itself: list and dict literals, call arguments.
  template <class Item>
  Status parse_items(const char* close, Item item) {
    while (!is_op(close)) {
      PAGODA_TRY(item());
      if (!is_op(",")) break;
      next();
    }
    return expect_op(close);
  }

  Status parse_call_args(Node* n) {
    return parse_items(")", [&]() -> Status {
      if (is_op("*") || is_op("**")) return err("unsupported construct: *args/**kwargs in a call");
      if (peek().type == Tok::kName && is_op("=", 1)) {
        n->names.push_back(next().text);
        next();
      } else if (!n->names.empty()) {
        return err("positional argument after keyword argument");
      }
      PAGODA_ASSIGN_OR_RETURN(NodePtr v, parse_expr());
      return adopt(n, std::move(v));
    });
  }

  Expected<NodePtr> parse_postfix(NodePtr node) {
    for (;;) {
      if (is_op(".")) {
        next();
        const Token& t = next();
        if (t.type == Tok::kInt) {
          NodePtr n = make(NodeKind::kIndex, t.line);
          PAGODA_TRY(adopt(n.get(), std::move(node)));
          PAGODA_TRY(adopt(n.get(), literal(Value::integer(t.i), t.line)));
          node = std::move(n);
          continue;
        }
        if (t.type != Tok::kName) return err("expected an attribute name after '.'");
        NodePtr n = make(NodeKind::kAttr, t.line);
        n->name = t.text;
        PAGODA_TRY(adopt(n.get(), std::move(node)));
        node = std::move(n);
      } else if (is_op("[")) {
        const int line = next().line;
        NodePtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) {
            PAGODA_ASSIGN_OR_RETURN(parts[k], parse_expr());
          }
          if (is_op(":") && k < 2) {
            next();
            slice = true;
            continue;
          }
          break;
        }
        PAGODA_TRY(expect_op("]"));
        if (!slice) {
          if (!parts[0]) return err("empty subscript");
          NodePtr n = make(NodeKind::kIndex, line);
          PAGODA_TRY(adopt(n.get(), std::move(node)));
          PAGODA_TRY(adopt(n.get(), std::move(parts[0])));
          node = std::move(n);
        } else {
          NodePtr n = make(NodeKind::kSlice, line);
          PAGODA_TRY(adopt(n.get(), std::move(node)));
          for (auto& p : parts) PAGODA_TRY(adopt(n.get(), std::move(p)));
          node = std::move(n);
        }
      } else if (is_op("(")) {
        const int line = next().line;
        NodePtr n = make(NodeKind::kCall, line);
        PAGODA_TRY(adopt(n.get(), std::move(node)));
        PAGODA_TRY(parse_call_args(n.get()));
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  // | name(args) | name ... ; operand may be null (filter blocks).
  Expected<NodePtr> parse_filters(NodePtr operand) {
    bool first = operand == nullptr;
    while (first || is_op("|")) {
      if (!first) next();
      first = false;
      if (peek().type != Tok::kName) return err("expected a filter name after '|'");
      const Token& t = next();
      NodePtr n = make(NodeKind::kFilter, t.line);
      n->name = t.text;
      // Unknown filters fail when evaluated (jinja2 defers them the same way in
      // conditional code), so a template using one only on a path not taken renders.
      n->builtin = find_filter(t.text);
      PAGODA_TRY(adopt(n.get(), std::move(operand)));
      if (is_op("(")) {
        next();
        PAGODA_TRY(parse_call_args(n.get()));
      }
      operand = std::move(n);
    }
    return operand;
  }

  Expected<NodePtr> parse_test(NodePtr operand) {
    const int line = next().line;  // 'is'
    NodePtr n = make(NodeKind::kTest, line);
    if (is_name("not")) {
      next();
      n->negated = true;
    }
    if (peek().type != Tok::kName) return err("expected a test name after 'is'");
    n->name = next().text;
    // jinja2 spells some tests as operators' names, and "none"/"true"/"false" as keywords.
    n->builtin = find_test(n->name);
    PAGODA_TRY(adopt(n.get(), std::move(operand)));
    if (is_op("(")) {
      next();
      PAGODA_TRY(parse_call_args(n.get()));
    } else {
      const Token& a = peek();
      const bool arg_start = a.type == Tok::kString || a.type == Tok::kInt || a.type == Tok::kFloat ||
                             (a.type == Tok::kName && a.text != "else" && a.text != "or" && a.text != "and" &&
                              a.text != "if" && a.text != "is" && a.text != "in" && a.text != "not") ||
                             (a.type == Tok::kOp && (a.text == "[" || a.text == "{"));
      if (arg_start) {
        PAGODA_ASSIGN_OR_RETURN(NodePtr arg, parse_primary());
        PAGODA_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
        PAGODA_TRY(adopt(n.get(), std::move(arg)));
      }
    }
    return n;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int max_depth_;
};

}  // namespace

Expected<NodePtr> parse_template(std::string_view source, int max_depth) {
  PAGODA_ASSIGN_OR_RETURN(std::vector<Token> toks, lex_template(source));
  Parser p(std::move(toks), max_depth);
  return p.parse();
}

}  // namespace pagoda::tok::jinja
