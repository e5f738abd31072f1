// Jinja evaluator: renders a parsed Program against global variables, with Jinja2's scoping
// (for-loop and macro scopes, namespaces), loop variables and loop controls.
#include "jinja/eval.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <unordered_map>

#include "base/error.h"
#include "jinja/builtins.h"

namespace vkllm::jinja {
namespace {

// An Error that already names its template position; outer handlers pass it through.
class LocatedError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void rethrow_located(int line, int col) {
  try {
    throw;
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    throw LocatedError("line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + e.what());
  }
}

using Scope = std::unordered_map<std::string, Value>;
using ScopeChain = std::vector<std::shared_ptr<Scope>>;

enum class Flow { Normal, Break, Continue };

int64_t checked_int(const Value& v, const char* what) {
  if (v.kind() != Kind::Int && v.kind() != Kind::Bool)
    throw Error(std::string(what) + " needs an integer, got " + v.type_name());
  return v.as_int();
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::String:
      if (!item.is_string()) throw Error("'in <string>' requires string as left operand, not " + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      for (const Value& v : container.items())
        if (v == item) return true;
      return false;
    case Kind::Dict:
    case Kind::Namespace: return container.get(item) != nullptr;
    case Kind::Undefined: return false;
    default: throw Error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

// Python's `%` string formatting for the %s, %d, %i, %r and %% conversions.
std::string percent_format(const std::string& fmt, const Value& arg) {
  ValueList args = arg.kind() == Kind::Tuple ? arg.items() : ValueList{arg};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw Error("incomplete format");
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) throw Error("not enough arguments for format string");
    const Value& a = args[next++];
    if (c == 's') out += a.to_str();
    else if (c == 'r') out += a.repr();
    else if (c == 'd' || c == 'i') out += std::to_string(a.kind() == Kind::Float ? static_cast<int64_t>(a.as_double()) : checked_int(a, "%d"));
    else throw Error(std::string("unsupported format character '") + c + "'");
  }
  if (next < args.size()) throw Error("not all arguments converted during string formatting");
  return out;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, const RenderLimits& lim) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
    if (a.is_sequence() && b.kind() == a.kind()) {
      if (a.items().size() + b.items().size() > lim.max_items)
        throw Error("template list exceeds " + std::to_string(lim.max_items) + " items");
      ValueList items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return a.kind() == Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
  }
  if (op == "*" && (a.is_string() || a.is_sequence() || b.is_string() || b.is_sequence())) {
    const Value& seq = a.is_number() ? b : a;
    const Value& n = a.is_number() ? a : b;
    const int64_t count = std::max<int64_t>(0, checked_int(n, "sequence repetition"));
    const int64_t len = std::max<int64_t>(1, seq.length());
    const size_t max_len = seq.is_string() ? lim.max_output_bytes : lim.max_items;
    if (count > static_cast<int64_t>(max_len) / len) throw Error("repetition result is too large");
    if (seq.is_string()) {
      std::string out;
      for (int64_t i = 0; i < count; ++i) out += seq.str();
      return Value(std::move(out));
    }
    ValueList items;
    for (int64_t i = 0; i < count; ++i) items.insert(items.end(), seq.items().begin(), seq.items().end());
    return seq.kind() == Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
  if (!a.is_number() || !b.is_number())
    throw Error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  const bool ints = a.kind() != Kind::Float && b.kind() != Kind::Float;
  const double x = a.as_double(), y = b.as_double();
  if (op == "/") {
    if (y == 0) throw Error("division by zero");
    return Value(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) throw Error(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints && !(a.as_int() == INT64_MIN && b.as_int() == -1)) {
      const int64_t i = a.as_int(), j = b.as_int();
      int64_t q = i / j, r = i % j;
      if (r != 0 && ((r < 0) != (j < 0))) {
        --q;
        r += j;
      }
      return op == "//" ? Value(q) : Value(r);
    }
    const double q = std::floor(x / y);
    return op == "//" ? Value(q) : Value(x - q * y);
  }
  // Integer results that overflow int64 (Python would grow a big integer) become floats.
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1, base = a.as_int(), e = b.as_int();
      bool overflow = false;
      while (e > 0 && !overflow) {  // square and multiply
        if (e & 1) overflow = __builtin_mul_overflow(r, base, &r);
        e >>= 1;
        if (e > 0 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
      if (!overflow) return Value(r);
    }
    return Value(std::pow(x, y));
  }
  if (ints) {
    const int64_t i = a.as_int(), j = b.as_int();
    int64_t r = 0;
    if (op == "+" && !__builtin_add_overflow(i, j, &r)) return Value(r);
    if (op == "-" && !__builtin_sub_overflow(i, j, &r)) return Value(r);
    if (op == "*" && !__builtin_mul_overflow(i, j, &r)) return Value(r);
  }
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  throw Error("unknown operator '" + op + "'");
}

class Evaluator {
 public:
  Evaluator(const RenderLimits& lim, ScopeChain scopes) : lim_(lim), scopes_(std::move(scopes)) {}

  void render(const Body& body, std::string& out) { exec(body, out); }

 private:
  const RenderLimits& lim_;
  ScopeChain scopes_;
  int call_depth_ = 0;
  uint64_t steps_ = 0;

  void step() {
    if (++steps_ > lim_.max_steps) throw Error("template ran more than " + std::to_string(lim_.max_steps) + " steps");
  }

  // Strings and lists built by operators and filters obey the output limit too, so a template
  // cannot exhaust memory by doubling a variable.
  Value checked(Value v) const {
    if (v.is_string() && v.str().size() > lim_.max_output_bytes)
      throw Error("template value exceeds " + std::to_string(lim_.max_output_bytes) + " bytes");
    if (v.is_sequence() && v.items().size() > lim_.max_items)
      throw Error("template list exceeds " + std::to_string(lim_.max_items) + " items");
    return v;
  }

  void append(std::string& out, const std::string& s) {
    if (out.size() + s.size() > lim_.max_output_bytes)
      throw Error("template output exceeds " + std::to_string(lim_.max_output_bytes) + " bytes");
    out += s;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value::undefined(name);
  }

  void assign(const std::vector<std::string>& targets, const Value& v) {
    Scope& s = *scopes_.back();
    if (targets.size() == 1) {
      s[targets[0]] = v;
      return;
    }
    if (!v.is_sequence() && !v.is_string() && !v.is_mapping())
      throw Error("cannot unpack " + v.type_name() + " into " + std::to_string(targets.size()) + " names");
    ValueList items = v.iterate();
    if (items.size() != targets.size())
      throw Error("expected " + std::to_string(targets.size()) + " values to unpack, got " +
                  std::to_string(items.size()));
    for (size_t i = 0; i < targets.size(); ++i) s[targets[i]] = items[i];
  }

  // ---- statements ----

  Flow exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
      Flow f = Flow::Normal;
      try {
        f = exec_node(*n, out);
      } catch (const Error&) {
        rethrow_located(n->line, n->col);
      }
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& n, std::string& out) {
    step();
    switch (n.kind) {
      case NodeKind::Text: append(out, n.text); return Flow::Normal;
      case NodeKind::Output: append(out, eval(*n.expr).to_str()); return Flow::Normal;
      case NodeKind::If:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) return exec(body, out);
        return exec(n.else_body, out);
      case NodeKind::For: return exec_for(n, out);
      case NodeKind::Set: {
        Value v = eval(*n.expr);
        if (n.attr.empty()) {
          assign(n.targets, v);
          return Flow::Normal;
        }
        Value ns = lookup(n.targets[0]);
        if (ns.kind() != Kind::Namespace) throw Error("cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
        ns.set(Value(n.attr), std::move(v));
        return Flow::Normal;
      }
      case NodeKind::SetBlock: {
        std::string captured;
        exec(n.body, captured);
        assign(n.targets, Value(std::move(captured)));
        return Flow::Normal;
      }
      case NodeKind::Macro:
        (*scopes_.back())[n.text] = make_macro(n.text, n.params, n.body);
        return Flow::Normal;
      case NodeKind::CallBlock: {
        const Expr& call = *n.expr;
        Value callee = eval(*call.args[0]);
        CallArgs args = eval_args(call);
        args.kwargs.emplace_back("caller", make_macro("caller", n.params, n.body));
        append(out, invoke(callee, args).to_str());
        return Flow::Normal;
      }
      case NodeKind::FilterBlock: {
        std::string captured;
        exec(n.body, captured);
        CallArgs args = eval_args(*n.expr);
        append(out, apply_filter(n.expr->name, Value(std::move(captured)), args).to_str());
        return Flow::Normal;
      }
      case NodeKind::Break: return Flow::Break;
      case NodeKind::Continue: return Flow::Continue;
      case NodeKind::Generation: return exec(n.body, out);
      case NodeKind::With: {
        auto scope = std::make_shared<Scope>();
        for (size_t i = 0; i < n.targets.size(); ++i) (*scope)[n.targets[i]] = eval(*n.values[i]);
        scopes_.push_back(scope);
        struct Pop {
          ScopeChain& s;
          ~Pop() { s.pop_back(); }
        } pop{scopes_};
        return exec(n.body, out);
      }
    }
    return Flow::Normal;
  }

  Flow exec_for(const Node& n, std::string& out) {
    Value seq = eval(*n.expr);
    if (seq.is_none() || seq.kind() == Kind::Callable || seq.is_number())
      throw Error("'" + seq.type_name() + "' object is not iterable");
    ValueList items = seq.iterate();
    scopes_.push_back(std::make_shared<Scope>());
    struct Pop {
      ScopeChain& s;
      ~Pop() { s.pop_back(); }
    } pop{scopes_};
    if (n.cond) {
      ValueList kept;
      for (const Value& item : items) {
        assign(n.targets, item);
        if (eval(*n.cond).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, out);
    const size_t len = items.size();
    // One `loop` object per loop, updated in place each iteration.
    auto index = std::make_shared<size_t>(0);
    Value loop = Value::dict();
    for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                            "previtem", "nextitem"})
      loop.set(Value(key), Value());
    loop.set(Value("cycle"), Value::callable(
                                 [index](CallArgs& a) -> Value {
                                   if (a.args.empty()) throw Error("no items for cycling given");
                                   return a.args[*index % a.args.size()];
                                 },
                                 "cycle"));
    for (const Value& item : items) loop.capturing(item);  // its previtem and nextitem, set in place below
    ValueDict& f = loop.entries();  // in the order set above
    for (size_t i = 0; i < len; ++i) {
      step();
      scopes_.back() = std::make_shared<Scope>();  // each iteration starts with fresh locals
      assign(n.targets, items[i]);
      *index = i;
      f[0].second = Value(i + 1);
      f[1].second = Value(i);
      f[2].second = Value(len - i);
      f[3].second = Value(len - i - 1);
      f[4].second = Value(i == 0);
      f[5].second = Value(i + 1 == len);
      f[6].second = Value(len);
      f[7].second = Value(1);
      f[8].second = Value(0);
      f[9].second = i > 0 ? items[i - 1] : Value::undefined("previtem");
      f[10].second = i + 1 < len ? items[i + 1] : Value::undefined("nextitem");
      (*scopes_.back())["loop"] = loop;
      if (exec(n.body, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const std::string& name, const std::vector<MacroParam>& params, const Body& body) {
    // Weak references: the macro usually lives in one of these scopes, and a strong one would
    // make a cycle. A scope that has ended (a loop's) is skipped.
    std::vector<std::weak_ptr<Scope>> closure(scopes_.begin(), scopes_.end());
    return Value::callable(
        [this, closure, &params, &body, name](CallArgs& a) -> Value {
          if (++call_depth_ > lim_.max_call_depth) {
            --call_depth_;
            throw Error("macro calls nest deeper than " + std::to_string(lim_.max_call_depth));
          }
          auto locals = std::make_shared<Scope>();
          ScopeChain frame;
          for (const auto& w : closure)
            if (auto s = w.lock()) frame.push_back(std::move(s));
          frame.push_back(locals);
          std::swap(scopes_, frame);
          struct Restore {
            Evaluator& ev;
            ScopeChain& saved;
            ~Restore() {
              std::swap(ev.scopes_, saved);
              --ev.call_depth_;
            }
          } restore{*this, frame};
          ValueList varargs;
          for (size_t i = 0; i < a.args.size(); ++i) {
            if (i < params.size()) (*locals)[params[i].name] = a.args[i];
            else varargs.push_back(a.args[i]);
          }
          ValueDict kwargs;
          for (auto& [k, v] : a.kwargs) {
            bool is_param = k == "caller";
            for (const MacroParam& p : params) is_param = is_param || p.name == k;
            if (is_param) (*locals)[k] = v;
            else kwargs.emplace_back(Value(k), v);
          }
          for (const MacroParam& p : params)
            if (!locals->count(p.name))
              (*locals)[p.name] = p.default_value ? eval(*p.default_value) : Value::undefined(p.name);
          (*locals)["varargs"] = Value::tuple(std::move(varargs));
          (*locals)["kwargs"] = Value::dict(std::move(kwargs));
          std::string out;
          exec(body, out);
          return Value(std::move(out));
        },
        name);
  }

  // ---- expressions ----

  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    for (size_t i = 1; i < e.args.size(); ++i) a.args.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v));
    return a;
  }

  Value invoke(const Value& callee, CallArgs& args) {
    if (callee.is_undefined()) throw Error("'" + callee.name() + "' is undefined");
    if (!callee.is_callable()) throw Error("'" + callee.type_name() + "' object is not callable");
    return callee.function()(args);
  }

  static Value get_attr(const Value& obj, const std::string& name) {
    if (obj.is_undefined())
      throw Error("'" + (obj.name().empty() ? std::string("value") : obj.name()) + "' is undefined (reading ." + name + ")");
    if (obj.kind() == Kind::Namespace) {
      const Value* v = obj.get(Value(name));
      return v ? *v : Value::undefined(name);
    }
    if (std::optional<Value> m = bound_method(obj, name)) return *m;
    if (obj.kind() == Kind::Dict) {
      const Value* v = obj.get(Value(name));
      return v ? *v : Value::undefined(name);
    }
    return Value::undefined(name);
  }

  static Value get_item(const Value& obj, const Value& key) {
    if (obj.is_undefined())
      throw Error("'" + (obj.name().empty() ? std::string("value") : obj.name()) + "' is undefined (reading [" +
                  key.repr() + "])");
    if (obj.is_mapping()) {
      const Value* v = obj.get(key);
      return v ? *v : Value::undefined(key.to_str());
    }
    if ((obj.is_sequence() || obj.is_string()) && (key.kind() == Kind::Int || key.kind() == Kind::Bool)) {
      int64_t i = key.as_int();
      const int64_t n = obj.length();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();  // Python's IndexError
      if (obj.is_string()) {
        const Value start(i), stop(i + 1);
        return slice_value(obj, &start, &stop, nullptr);
      }
      return obj.items()[static_cast<size_t>(i)];
    }
    if (key.is_string()) return get_attr(obj, key.str());
    return Value::undefined();
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const Error&) {
      rethrow_located(e.line, e.col);
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Literal: return e.literal;
      case ExprKind::Name: return lookup(e.name);
      case ExprKind::List:
      case ExprKind::Tuple: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return e.kind == ExprKind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case ExprKind::Dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) d.set(eval(*e.args[i]), eval(*e.args[i + 1]));
        return d;
      }
      case ExprKind::Attr: return get_attr(eval(*e.args[0]), e.name);
      case ExprKind::Index: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case ExprKind::Slice: {
        Value target = eval(*e.args[0]);
        if (target.is_undefined()) throw Error("'" + target.name() + "' is undefined (slicing)");
        Value b[3];
        for (int i = 0; i < 3; ++i)
          if (e.args[static_cast<size_t>(i) + 1]) b[i] = eval(*e.args[static_cast<size_t>(i) + 1]);
        auto ptr = [](const Value& v) { return v.is_undefined() || v.is_none() ? nullptr : &v; };
        // Like a failed subscript in Jinja2, slicing what cannot be sliced is undefined.
        if (!target.is_string() && !target.is_sequence()) return Value::undefined();
        return slice_value(target, ptr(b[0]), ptr(b[1]), ptr(b[2]));
      }
      case ExprKind::Call: {
        Value callee = eval(*e.args[0]);
        CallArgs args = eval_args(e);
        return checked(invoke(callee, args));
      }
      case ExprKind::Filter: {
        Value target = eval(*e.args[0]);
        CallArgs args = eval_args(e);
        return checked(apply_filter(e.name, target, args));
      }
      case ExprKind::Test: {
        Value target = eval(*e.args[0]);
        CallArgs args = eval_args(e);
        return Value(apply_test(e.name, target, args) != e.negate);
      }
      case ExprKind::Unary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number()) throw Error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.kind() == Kind::Float ? v : Value(v.as_int());
        if (v.kind() == Kind::Float || v.as_int() == INT64_MIN) return Value(-v.as_double());
        return Value(-v.as_int());
      }
      case ExprKind::Binary: return eval_binary(e);
      case ExprKind::Compare: return eval_compare(e);
      case ExprKind::Cond:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined();
    }
    return Value::undefined();
  }

  static bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "<") return value_less(a, b);
    if (op == ">") return value_less(b, a);
    if (op == "<=") return !value_less(b, a);
    if (op == ">=") return !value_less(a, b);
    if (op == "in") return contains(b, a);
    return !contains(b, a);  // "not in"
  }

  // Python's chained comparison: a < b < c means a < b and b < c.
  Value eval_compare(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1]);
      if (!compare(e.ops[i], left, right)) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    Value a = eval(*e.args[0]);
    if (op == "and") return a.truthy() ? eval(*e.args[1]) : a;
    if (op == "or") return a.truthy() ? a : eval(*e.args[1]);
    Value b = eval(*e.args[1]);
    if (op == "~") return checked(Value(a.to_str() + b.to_str()));
    return checked(arithmetic(op, a, b, lim_));
  }
};

void check_expr(const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::Filter && !has_filter(e->name))
    throw Error("line " + std::to_string(e->line) + ", column " + std::to_string(e->col) + ": no filter named '" +
                e->name + "'");
  if (e->kind == ExprKind::Test && !has_test(e->name))
    throw Error("line " + std::to_string(e->line) + ", column " + std::to_string(e->col) + ": no test named '" +
                e->name + "'");
  for (const auto& a : e->args) check_expr(a.get());
  for (const auto& [k, v] : e->kwargs) check_expr(v.get());
}

void check_body(const Body& body) {
  for (const auto& n : body) {
    check_expr(n->expr.get());
    check_expr(n->cond.get());
    for (const auto& [c, b] : n->branches) {
      check_expr(c.get());
      check_body(b);
    }
    for (const MacroParam& p : n->params) check_expr(p.default_value.get());
    check_body(n->body);
    check_body(n->else_body);
    for (const auto& v : n->values) check_expr(v.get());
  }
}

}  // namespace

void check_program(const Program& p) { check_body(p.body); }

std::string render_program(const Program& p, const std::vector<std::pair<std::string, Value>>& globals,
                           const RenderLimits& limits) {
  auto g = std::make_shared<Scope>();
  for (const auto& [k, v] : globals) (*g)[k] = v;
  Evaluator ev(limits, {g, std::make_shared<Scope>()});
  std::string out;
  ev.render(p.body, out);
  return out;
}

}  // namespace vkllm::jinja
