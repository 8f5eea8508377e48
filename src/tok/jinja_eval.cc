// Statement execution and expression evaluation of the Jinja interpreter.
#include <cmath>

#include <nlohmann/json.hpp>

#include "tok/jinja_interp.h"

namespace pagoda::tok::jinja {

namespace {
Error at(int line, const std::string& msg) { return errorf("template error (line %d): %s", line + 1, msg.c_str()); }
}  // namespace

Context::Context() {
  auto d = std::make_shared<Dict>();
  vars_.type = Value::Type::kDict;
  vars_.obj = std::move(d);
  now = std::time(nullptr);
}

void Context::set(const std::string& name, Value v) {
  (void)vars_.dict().set(literal_str(name), std::move(v));
}

namespace {
Expected<Value> from_json_at(const nlohmann::ordered_json& j, bool tainted, const std::vector<std::string>& untainted_keys,
                             int depth) {
  if (depth > 128) return make_error("JSON input nested deeper than 128 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::real(static_cast<double>(u)) : Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return literal_str(j.get<std::string>(), tainted);
    case nlohmann::ordered_json::value_t::array: {
      auto l = std::make_shared<List>();
      for (const auto& e : j) {
        PAGODA_ASSIGN_OR_RETURN(Value v, from_json_at(e, tainted, untainted_keys, depth + 1));
        l->items.push_back(std::move(v));
      }
      Value v;
      v.type = Value::Type::kList;
      v.obj = std::move(l);
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) {
        bool t = tainted;
        for (const auto& k : untainted_keys) t = t && k != it.key();
        PAGODA_ASSIGN_OR_RETURN(Value v, from_json_at(it.value(), t, untainted_keys, depth + 1));
        PAGODA_TRY(d->set(literal_str(it.key()), std::move(v)));
      }
      Value v;
      v.type = Value::Type::kDict;
      v.obj = std::move(d);
      return v;
    }
    default: return make_error("unsupported JSON value (binary)");
  }
}
}  // namespace

Expected<Value> from_json(const nlohmann::ordered_json& j, bool tainted, const std::vector<std::string>& untainted_keys) {
  return from_json_at(j, tainted, untainted_keys, 0);
}

Expected<Template> Template::parse(std::string_view source, const Limits& limits) {
  PAGODA_ASSIGN_OR_RETURN(NodePtr root, parse_template(source, limits.max_parse_depth));
  Template t;
  t.root_ = std::shared_ptr<const Node>(std::move(root));
  t.limits_ = limits;
  return t;
}

Expected<Rendered> Template::render(const Context& ctx) const {
  Heap heap(limits_.max_memory_bytes);
  Rendered r;
  {
    HeapScope hs(&heap);
    Interp in(limits_, &heap, ctx.now);
    StrBuilder out(limits_.max_output_bytes);
    PAGODA_TRY(in.run(*root_, ctx.vars(), out));
    r.text = std::move(out.text());
    r.tainted = std::move(out.taint());
  }
  return r;
}

Interp::Interp(const Limits& limits, Heap* heap, std::time_t now)
    : limits_(limits), heap_(heap), now_(now) {
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::microseconds(static_cast<int64_t>(limits.max_seconds * 1e6));
}

Status Interp::step() {
  steps_ += 1 + static_cast<int64_t>(heap_->take_work() / 256);
  if (steps_ > limits_.max_steps) {
    return errorf("template exceeded its step limit (%lld evaluation steps)", static_cast<long long>(limits_.max_steps));
  }
  // A step can cost up to ~1 ms (a builtin over a large string or list), so the
  // clock is read often enough to stop close to the deadline.
  if (steps_ >= next_clock_check_) {
    next_clock_check_ = steps_ + 64;
    if (std::chrono::steady_clock::now() > deadline_) {
      return errorf("template exceeded its time limit (%.2f s)", limits_.max_seconds);
    }
  }
  return Status::Ok();
}

Status Interp::run(const Node& root, const Value& globals, StrBuilder& out) {
  Scope builtins;
  add_globals(builtins);
  Scope top;
  top.parent = &builtins;
  for (const auto& [k, v] : globals.dict().items) top.vars[k.str().s] = v;
  root_ = &top;
  Status st = exec_body(root, top, out);
  root_ = nullptr;
  if (st.ok() && out.overflow()) return output_error();
  return st;
}

Error Interp::output_error() const {
  return errorf("template output exceeds its limit of %zu bytes (or its memory limit inside a macro or set block)",
                limits_.max_output_bytes);
}

Status Interp::exec_body(const Node& body, Scope& sc, StrBuilder& out) {
  for (const NodePtr& k : body.kids) {
    PAGODA_TRY(exec(*k, sc, out));
    if (flow_ != Flow::kNormal) break;
  }
  return Status::Ok();
}

namespace {
// Bounds the C++ recursion of exec/eval (tree height x macro depth): under 1 KiB
// of stack per level (measured: 1000 levels fit in a 1 MiB stack).
constexpr int kMaxEvalDepth = 1000;
struct EvalDepth {
  int* d;
  explicit EvalDepth(int* x) : d(x) { ++*d; }
  ~EvalDepth() { --*d; }
};
}  // namespace

Status Interp::exec(const Node& n, Scope& sc, StrBuilder& out) {
  EvalDepth guard(&eval_depth_);
  if (eval_depth_ > kMaxEvalDepth) return at(n.line, "template evaluation nested too deeply");
  PAGODA_TRY(step());
  switch (n.kind) {
    case NodeKind::kText:
      out.append(n.name);
      if (out.overflow()) return output_error();
      break;
    case NodeKind::kOutput: {
      PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[0], sc));
      PAGODA_TRY(print_value(v, out));
      if (out.overflow()) return output_error();
      break;
    }
    case NodeKind::kBody: return exec_body(n, sc, out);
    case NodeKind::kIf: {
      size_t i = 0;
      for (; i + 1 < n.kids.size(); i += 2) {
        PAGODA_ASSIGN_OR_RETURN(Value c, eval(*n.kids[i], sc));
        if (truthy(c)) return exec_body(*n.kids[i + 1], sc, out);
      }
      if (i < n.kids.size()) return exec_body(*n.kids[i], sc, out);
      break;
    }
    case NodeKind::kFor: return exec_for(n, sc, out);
    case NodeKind::kSet: {
      PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[0], sc));
      return exec_set(n, sc, v);
    }
    case NodeKind::kSetBlock: {
      StrBuilder b;
      PAGODA_TRY(exec_body(*n.kids[0], sc, b));
      PAGODA_ASSIGN_OR_RETURN(Value v, make_str(std::move(b)));
      return assign(sc, n.names, v, n.line);
    }
    case NodeKind::kMacro: sc.vars[n.name] = define_macro(n, sc); break;
    case NodeKind::kBreak: flow_ = Flow::kBreak; break;
    case NodeKind::kContinue: flow_ = Flow::kContinue; break;
    case NodeKind::kFilterBlock: {
      StrBuilder b;
      PAGODA_TRY(exec_body(*n.kids[0], sc, b));
      PAGODA_ASSIGN_OR_RETURN(Value v, make_str(std::move(b)));
      // Apply the chain innermost first.
      std::vector<const Node*> chain;
      for (const Node* f = n.kids[1].get(); f != nullptr; f = f->kids[0].get()) chain.push_back(f);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        if ((*it)->builtin < 0) return at(n.line, "unsupported filter '" + (*it)->name + "'");
        CallArgs a;
        PAGODA_TRY(eval_args(**it, 1, sc, &a));
        PAGODA_ASSIGN_OR_RETURN(v, apply_filter(*this, (*it)->builtin, v, a));
      }
      return print_value(v, out);
    }
    default: {
      return at(n.line, "expression used as a statement");
    }
  }
  return Status::Ok();
}

Status Interp::exec_set(const Node& n, Scope& sc, const Value& v) { return assign(sc, n.names, v, n.line); }

Status Interp::assign(Scope& sc, const std::vector<std::string>& targets, const Value& v, int line) {
  auto one = [&](const std::string& t, const Value& x) -> Status {
    const size_t dot = t.find('.');
    if (dot == std::string::npos) {
      sc.vars[t] = x;
      return Status::Ok();
    }
    const Value* ns = sc.find(t.substr(0, dot));
    if (ns == nullptr || !ns->is_dict() || !ns->dict().is_namespace) {
      return at(line, "cannot assign attribute '" + t + "': not a namespace");
    }
    if (Status st = check_no_cycle(x, ns->obj.get()); !st.ok()) return at(line, st.message());
    return ns->dict().set(literal_str(t.substr(dot + 1)), x);
  };
  if (targets.size() == 1) return one(targets[0], v);
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  if (items.size() != targets.size()) {
    return at(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) + " names");
  }
  for (size_t i = 0; i < targets.size(); ++i) PAGODA_TRY(one(targets[i], items[i]));
  return Status::Ok();
}

Status Interp::exec_for(const Node& n, Scope& sc, StrBuilder& out) {
  PAGODA_ASSIGN_OR_RETURN(Value seq, eval(*n.kids[0], sc));
  PAGODA_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(seq));
  const Node* cond = n.kids[3].get();
  if (cond != nullptr) {
    // `for x in xs if cond`: filtered before loop.index and loop.length are computed.
    std::vector<Value> kept;
    for (const Value& it : items) {
      PAGODA_TRY(step());
      Scope cond_scope;
      cond_scope.parent = &sc;
      PAGODA_TRY(assign(cond_scope, n.names, it, n.line));
      PAGODA_ASSIGN_OR_RETURN(Value c, eval(*cond, cond_scope));
      if (truthy(c)) kept.push_back(it);
    }
    items = std::move(kept);
  }
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    PAGODA_TRY(step());
    const Value& item = items[static_cast<size_t>(i)];
    // jinja2 gives every iteration fresh locals: a `set` in the body is not seen
    // by the next iteration (nor after the loop).
    Scope loop_scope;
    loop_scope.parent = &sc;
    PAGODA_TRY(assign(loop_scope, n.names, item, n.line));
    // A fresh `loop` per iteration: a template may keep one (set ns.l = loop), and
    // an object that changes after it was stored could form a reference cycle.
    PAGODA_ASSIGN_OR_RETURN(Value loop, make_dict());
    Dict& ld = loop.dict();
    PAGODA_TRY(ld.set(literal_str("index"), Value::integer(i + 1)));
    PAGODA_TRY(ld.set(literal_str("index0"), Value::integer(i)));
    PAGODA_TRY(ld.set(literal_str("revindex"), Value::integer(len - i)));
    PAGODA_TRY(ld.set(literal_str("revindex0"), Value::integer(len - i - 1)));
    PAGODA_TRY(ld.set(literal_str("first"), Value::boolean(i == 0)));
    PAGODA_TRY(ld.set(literal_str("last"), Value::boolean(i == len - 1)));
    PAGODA_TRY(ld.set(literal_str("length"), Value::integer(len)));
    PAGODA_TRY(ld.set(literal_str("depth"), Value::integer(1)));
    PAGODA_TRY(ld.set(literal_str("depth0"), Value::integer(0)));
    PAGODA_TRY(ld.set(literal_str("previtem"), i > 0 ? items[static_cast<size_t>(i - 1)] : Value()));
    PAGODA_TRY(ld.set(literal_str("nextitem"), i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value()));
    const int64_t idx = i;
    PAGODA_TRY(ld.set(literal_str("cycle"), make_func("loop.cycle", [idx](Interp&, CallArgs& a) -> Expected<Value> {
      if (a.pos.empty()) return make_error("loop.cycle() needs at least one argument");
      return a.pos[static_cast<size_t>(idx) % a.pos.size()];
    })));
    loop_scope.vars["loop"] = std::move(loop);
    PAGODA_TRY(exec_body(*n.kids[1], loop_scope, out));
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  if (len == 0 && n.kids[2]) PAGODA_TRY(exec_body(*n.kids[2], sc, out));
  return Status::Ok();
}

Value Interp::define_macro(const Node& n, Scope&) {
  const Node* node = &n;
  return make_func(n.name, [node](Interp& in, CallArgs& a) -> Expected<Value> {
    if (in.depth_ >= in.limits_.max_call_depth) {
      return errorf("template macro recursion deeper than %d (in '%s')", in.limits_.max_call_depth, node->name.c_str());
    }
    const size_t np = node->names.size();
    if (a.pos.size() > np) return errorf("macro '%s' takes %zu arguments, got %zu", node->name.c_str(), np, a.pos.size());
    // Macros see the template's top-level names (jinja2 closes over the template scope).
    Scope sc;
    sc.parent = in.root_;
    const size_t n_defaults = node->kids.size() - 1;
    for (size_t i = 0; i < np; ++i) {
      const Value* v = a.get(i, node->names[i]);
      if (v != nullptr) {
        sc.vars[node->names[i]] = *v;
      } else if (i + n_defaults >= np) {
        PAGODA_ASSIGN_OR_RETURN(Value d, in.eval(*node->kids[1 + i - (np - n_defaults)], sc));
        sc.vars[node->names[i]] = d;
      } else {
        sc.vars[node->names[i]] = Value();
      }
    }
    for (const auto& [k, v] : a.kw) {
      bool known = false;
      for (const auto& p : node->names) known = known || p == k;
      if (!known) return errorf("macro '%s' has no parameter '%s'", node->name.c_str(), k.c_str());
    }
    StrBuilder body;
    ++in.depth_;
    Status st = in.exec_body(*node->kids[0], sc, body);
    --in.depth_;
    in.flow_ = Flow::kNormal;
    PAGODA_TRY(st);
    return make_str(std::move(body));
  });
}

Expected<Value> Interp::call(const Value& f, CallArgs& args, int line) {
  if (f.type != Value::Type::kFunc) {
    return at(line, std::string("cannot call a value of type ") + type_name(f));
  }
  return f.func().fn(*this, args);
}

Status Interp::eval_args(const Node& n, size_t first, Scope& sc, CallArgs* args) {
  const size_t n_kw = n.names.size();
  const size_t n_args = n.kids.size() - first;
  for (size_t i = 0; i < n_args; ++i) {
    PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[first + i], sc));
    if (i + n_kw >= n_args) {
      args->kw.emplace_back(n.names[i + n_kw - n_args], std::move(v));
    } else {
      args->pos.push_back(std::move(v));
    }
  }
  return Status::Ok();
}

Expected<Value> Interp::eval_call(const Node& n, Scope& sc) {
  PAGODA_ASSIGN_OR_RETURN(Value f, eval(*n.kids[0], sc));
  CallArgs args;
  PAGODA_TRY(eval_args(n, 1, sc, &args));
  if (f.is_undefined()) {
    std::string what = n.kids[0]->kind == NodeKind::kName ? n.kids[0]->name
                       : n.kids[0]->kind == NodeKind::kAttr ? n.kids[0]->name : "value";
    return at(n.line, "'" + what + "' is undefined or not a supported function");
  }
  return call(f, args, n.line);
}

Expected<Value> Interp::eval_binary(const Node& n, Scope& sc) {
  const std::string& op = n.op;
  PAGODA_ASSIGN_OR_RETURN(Value a, eval(*n.kids[0], sc));
  if (op == "and") {
    if (!truthy(a)) return a;
    return eval(*n.kids[1], sc);
  }
  if (op == "or") {
    if (truthy(a)) return a;
    return eval(*n.kids[1], sc);
  }
  PAGODA_ASSIGN_OR_RETURN(Value b, eval(*n.kids[1], sc));
  auto r = binary_op(op, a, b);
  if (!r.ok()) return at(n.line, r.message());
  return r;
}

Expected<Value> Interp::eval(const Node& n, Scope& sc) {
  EvalDepth guard(&eval_depth_);
  if (eval_depth_ > kMaxEvalDepth) return at(n.line, "template evaluation nested too deeply");
  PAGODA_TRY(step());
  switch (n.kind) {
    case NodeKind::kLiteral: return n.lit;
    case NodeKind::kName: {
      const Value* v = sc.find(n.name);
      return v != nullptr ? *v : Value();
    }
    case NodeKind::kListLit:
    case NodeKind::kTupleLit: {
      std::vector<Value> items;
      for (const NodePtr& k : n.kids) {
        PAGODA_ASSIGN_OR_RETURN(Value v, eval(*k, sc));
        items.push_back(std::move(v));
      }
      return make_list(std::move(items), n.kind == NodeKind::kTupleLit);
    }
    case NodeKind::kDictLit: {
      PAGODA_ASSIGN_OR_RETURN(Value d, make_dict());
      for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
        PAGODA_ASSIGN_OR_RETURN(Value k, eval(*n.kids[i], sc));
        PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[i + 1], sc));
        Status st = d.dict().set(std::move(k), std::move(v));
        if (!st.ok()) return at(n.line, st.message());
      }
      return d;
    }
    case NodeKind::kAttr: {
      PAGODA_ASSIGN_OR_RETURN(Value o, eval(*n.kids[0], sc));
      if (o.is_undefined()) {
        const std::string what = n.kids[0]->kind == NodeKind::kName ? "'" + n.kids[0]->name + "'" : "value";
        return at(n.line, what + " is undefined (reading attribute '" + n.name + "')");
      }
      auto r = get_attr(o, n.name);
      if (!r.ok()) return at(n.line, r.message());
      return r;
    }
    case NodeKind::kIndex: {
      PAGODA_ASSIGN_OR_RETURN(Value o, eval(*n.kids[0], sc));
      PAGODA_ASSIGN_OR_RETURN(Value k, eval(*n.kids[1], sc));
      if (o.is_undefined()) {
        const std::string what = n.kids[0]->kind == NodeKind::kName ? "'" + n.kids[0]->name + "'" : "value";
        return at(n.line, what + " is undefined (subscripted)");
      }
      auto r = get_item(o, k);
      if (!r.ok()) return at(n.line, r.message());
      return r;
    }
    case NodeKind::kSlice: {
      PAGODA_ASSIGN_OR_RETURN(Value o, eval(*n.kids[0], sc));
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        if (n.kids[1 + static_cast<size_t>(k)]) {
          PAGODA_ASSIGN_OR_RETURN(parts[k], eval(*n.kids[1 + static_cast<size_t>(k)], sc));
        } else {
          parts[k] = Value::none();
        }
      }
      auto r = slice(o, parts[0], parts[1], parts[2]);
      if (!r.ok()) return at(n.line, r.message());
      return r;
    }
    case NodeKind::kCall: {
      auto r = eval_call(n, sc);
      return r;
    }
    case NodeKind::kFilter: {
      PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[0], sc));
      CallArgs a;
      PAGODA_TRY(eval_args(n, 1, sc, &a));
      if (n.builtin < 0) return at(n.line, "unsupported filter '" + n.name + "'");
      auto r = apply_filter(*this, n.builtin, v, a);
      if (!r.ok() && r.message().rfind("template", 0) != 0) return at(n.line, "filter '" + n.name + "': " + r.message());
      return r;
    }
    case NodeKind::kTest: {
      if (n.builtin < 0) return at(n.line, "unsupported test '" + n.name + "'");
      PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[0], sc));
      CallArgs a;
      PAGODA_TRY(eval_args(n, 1, sc, &a));
      auto r = apply_test(*this, n.builtin, v, a);
      if (!r.ok()) return at(n.line, "test '" + n.name + "': " + r.message());
      return Value::boolean(*r != n.negated);
    }
    case NodeKind::kUnary: {
      PAGODA_ASSIGN_OR_RETURN(Value v, eval(*n.kids[0], sc));
      if (n.op == "not") return Value::boolean(!truthy(v));
      if (v.type == Value::Type::kFloat) return Value::real(n.op == "-" ? -v.f : v.f);
      if (v.type == Value::Type::kInt || v.type == Value::Type::kBool) {
        const int64_t x = v.as_int();
        if (n.op == "-" && x == INT64_MIN) return at(n.line, "integer overflow");
        return Value::integer(n.op == "-" ? -x : x);
      }
      return at(n.line, std::string("bad operand type for unary ") + n.op + ": " + type_name(v));
    }
    case NodeKind::kBinary: return eval_binary(n, sc);
    case NodeKind::kCond: {
      PAGODA_ASSIGN_OR_RETURN(Value c, eval(*n.kids[0], sc));
      if (truthy(c)) return eval(*n.kids[1], sc);
      if (n.kids[2]) return eval(*n.kids[2], sc);
      return Value();
    }
    default: return at(n.line, "statement used as an expression");
  }
}

}  // namespace pagoda::tok::jinja
