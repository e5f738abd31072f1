// Jinja parser: tokens → Program (statements and expressions), with line:column in every error.
// Follows the precedence of Jinja2's parser: condexpr < or < and < not < compare < +,- < ~ <
// *,/,//,% < ** < unary < primary with postfix, filters and tests.
#include "jinja/parser.h"

#include <cstdlib>

#include "base/error.h"

namespace vkllm::jinja {
namespace {

constexpr int k_max_nesting = 200;  // expression and statement nesting, against stack exhaustion

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Program run() {
    Program p;
    std::string end;
    p.body = parse_body({}, end);
    return p;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > k_max_nesting) p.fail(p.cur(), "template nests deeper than " + std::to_string(k_max_nesting));
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }

  [[noreturn]] void fail(const Token& t, const std::string& msg) const {
    throw Error("line " + std::to_string(t.line) + ", column " + std::to_string(t.col) + ": " + msg);
  }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "'}}'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::String: return "string";
      case Tok::Text: return "text";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op) const { return cur().kind == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Tok::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(cur(), std::string("expected '") + op + "', found " + describe(cur()));
  }
  void expect_block_end() {
    if (cur().kind != Tok::BlockEnd) fail(cur(), "expected '%}', found " + describe(cur()));
    next();
  }
  std::string expect_identifier() {
    if (cur().kind != Tok::Name) fail(cur(), "expected a name, found " + describe(cur()));
    return next().text;
  }

  ExprPtr make(ExprKind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose keyword is in `ends` (consumed up to the keyword; returned in
  // `end`), or to end of template when `ends` is empty.
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == Tok::Eof) {
        if (!ends.empty()) fail(t, "unexpected end of template; expected '{% " + ends.back() + " %}'");
        return body;
      }
      if (t.kind == Tok::Text) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::Text;
        n->text = t.text;
        n->line = t.line;
        n->col = t.col;
        body.push_back(std::move(n));
        next();
      } else if (t.kind == Tok::VarBegin) {
        next();
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::Output;
        n->line = cur().line;
        n->col = cur().col;
        n->expr = parse_tuple(false);
        if (cur().kind != Tok::VarEnd) fail(cur(), "expected '}}', found " + describe(cur()));
        next();
        body.push_back(std::move(n));
      } else if (t.kind == Tok::BlockBegin) {
        next();
        const Token& kw = cur();
        if (kw.kind != Tok::Name) fail(kw, "expected a tag name, found " + describe(kw));
        for (const std::string& e : ends)
          if (kw.text == e) {
            end = kw.text;
            next();
            return body;
          }
        body.push_back(parse_statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Node> new_node(NodeKind k, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  std::unique_ptr<Node> parse_statement() {
    const Token kw = next();
    const std::string& k = kw.text;
    std::string end;
    if (k == "if") {
      auto n = new_node(NodeKind::If, kw);
      ExprPtr cond = parse_expression();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, end);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_expression();
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"}, end);
        }
        break;
      }
      expect_block_end();
      return n;
    }
    if (k == "for") {
      auto n = new_node(NodeKind::For, kw);
      n->targets = parse_targets();
      if (!accept_name("in")) fail(cur(), "expected 'in' in for loop, found " + describe(cur()));
      n->expr = parse_tuple(true);
      if (accept_name("if")) n->cond = parse_expression();
      if (is_name("recursive")) fail(cur(), "recursive for loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
      return n;
    }
    if (k == "set") {
      const Token at = cur();
      std::vector<std::string> targets = parse_targets();
      if (targets.size() == 1 && accept_op(".")) {
        auto n = new_node(NodeKind::Set, kw);
        n->targets = targets;
        n->attr = expect_identifier();
        expect_op("=");
        n->expr = parse_tuple(false);
        expect_block_end();
        return n;
      }
      if (accept_op("=")) {
        auto n = new_node(NodeKind::Set, kw);
        n->targets = std::move(targets);
        n->expr = parse_tuple(false);
        expect_block_end();
        return n;
      }
      if (targets.size() != 1) fail(at, "block set takes one name");
      if (cur().kind != Tok::BlockEnd) fail(cur(), "filtered block set is not supported");
      next();
      auto n = new_node(NodeKind::SetBlock, kw);
      n->targets = std::move(targets);
      n->body = parse_body({"endset"}, end);
      expect_block_end();
      return n;
    }
    if (k == "macro") {
      auto n = new_node(NodeKind::Macro, kw);
      n->text = expect_identifier();
      n->params = parse_params();
      expect_block_end();
      n->body = parse_body({"endmacro"}, end);
      if (cur().kind == Tok::Name && cur().text == n->text) next();
      expect_block_end();
      return n;
    }
    if (k == "call") {
      auto n = new_node(NodeKind::CallBlock, kw);
      if (is_op("(")) n->params = parse_params();
      n->expr = parse_expression();
      if (n->expr->kind != ExprKind::Call) fail(kw, "'call' needs a macro call");
      expect_block_end();
      n->body = parse_body({"endcall"}, end);
      expect_block_end();
      return n;
    }
    if (k == "filter") {
      auto n = new_node(NodeKind::FilterBlock, kw);
      // The filter applies to the body; args[0] is filled with the body's text when rendering.
      auto f = make(ExprKind::Filter, cur());
      f->args.push_back(make(ExprKind::Literal, cur()));
      parse_filter_into(*f);
      n->expr = std::move(f);
      expect_block_end();
      n->body = parse_body({"endfilter"}, end);
      expect_block_end();
      return n;
    }
    if (k == "break" || k == "continue") {
      auto n = new_node(k == "break" ? NodeKind::Break : NodeKind::Continue, kw);
      expect_block_end();
      return n;
    }
    if (k == "with") {
      auto n = new_node(NodeKind::With, kw);
      while (cur().kind != Tok::BlockEnd) {
        if (!n->targets.empty()) expect_op(",");
        n->targets.push_back(expect_identifier());
        expect_op("=");
        n->values.push_back(parse_expression());
      }
      next();
      n->body = parse_body({"endwith"}, end);
      expect_block_end();
      return n;
    }
    if (k == "generation") {
      auto n = new_node(NodeKind::Generation, kw);
      expect_block_end();
      n->body = parse_body({"endgeneration"}, end);
      expect_block_end();
      return n;
    }
    fail(kw, "unsupported tag '" + k + "'");
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = accept_op("(");
    do {
      names.push_back(expect_identifier());
    } while (accept_op(",") && cur().kind == Tok::Name);
    if (paren) expect_op(")");
    return names;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!accept_op(")")) {
      if (!params.empty()) expect_op(",");
      if (accept_op(")")) break;
      MacroParam p;
      p.name = expect_identifier();
      if (accept_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
    }
    return params;
  }

  // ---- expressions ----

  // An expression, or a tuple of them without parentheses (`{{ a, b }}`, for-loop iterables).
  ExprPtr parse_tuple(bool no_condexpr) {
    const Token at = cur();
    ExprPtr first = no_condexpr ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    auto t = make(ExprKind::Tuple, at);
    t->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (cur().kind == Tok::BlockEnd || cur().kind == Tok::VarEnd || is_name("if")) break;
      t->args.push_back(no_condexpr ? parse_or() : parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() {
    DepthGuard g(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token at = next();
      auto c = make(ExprKind::Cond, at);
      c->args.push_back(std::move(e));
      c->args.push_back(parse_or());
      c->args.push_back(accept_name("else") ? parse_expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto b = make(ExprKind::Binary, at);
    b->name = std::move(op);
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token at = next();
      e = binary(at, "or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token at = next();
      e = binary(at, "and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      const Token at = next();
      auto u = make(ExprKind::Unary, at);
      u->name = "not";
      u->args.push_back(parse_not());
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr e;
    while (true) {
      const Token at = cur();
      std::string op;
      if (at.kind == Tok::Op && (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" ||
                                 at.text == "<=" || at.text == ">=")) {
        op = at.text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        return e ? std::move(e) : std::move(first);
      }
      if (!e) {
        e = make(ExprKind::Compare, at);
        e->args.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->args.push_back(parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token at = next();
      e = binary(at, at.text, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token at = next();
      e = binary(at, "~", std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token at = next();
      e = binary(at, at.text, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token at = next();
      e = binary(at, "**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token at = next();
      e = make(ExprKind::Unary, at);
      e->name = at.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token at = cur();
    switch (at.kind) {
      case Tok::Name: {
        next();
        auto e = make(ExprKind::Literal, at);
        if (at.text == "true" || at.text == "True") e->literal = Value(true);
        else if (at.text == "false" || at.text == "False") e->literal = Value(false);
        else if (at.text == "none" || at.text == "None") e->literal = Value::none();
        else {
          e->kind = ExprKind::Name;
          e->name = at.text;
        }
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().kind == Tok::String) s += next().text;
        auto e = make(ExprKind::Literal, at);
        e->literal = Value(std::move(s));
        return e;
      }
      case Tok::Int: {
        next();
        auto e = make(ExprKind::Literal, at);
        errno = 0;
        const long long v = std::strtoll(at.text.c_str(), nullptr, 10);
        // Past int64 (Python has big integers), keep the value as a float.
        e->literal = errno == ERANGE ? Value(std::strtod(at.text.c_str(), nullptr)) : Value(static_cast<int64_t>(v));
        return e;
      }
      case Tok::Float: {
        next();
        auto e = make(ExprKind::Literal, at);
        e->literal = Value(std::strtod(at.text.c_str(), nullptr));
        return e;
      }
      case Tok::Op:
        if (at.text == "(") {
          next();
          if (accept_op(")")) return make(ExprKind::Tuple, at);
          ExprPtr first = parse_expression();
          if (accept_op(")")) return first;
          auto t = make(ExprKind::Tuple, at);
          t->args.push_back(std::move(first));
          while (accept_op(",")) {
            if (is_op(")")) break;
            t->args.push_back(parse_expression());
          }
          expect_op(")");
          return t;
        }
        if (at.text == "[") {
          next();
          auto l = make(ExprKind::List, at);
          while (!accept_op("]")) {
            if (!l->args.empty()) expect_op(",");
            if (accept_op("]")) break;
            l->args.push_back(parse_expression());
          }
          return l;
        }
        if (at.text == "{") {
          next();
          auto d = make(ExprKind::Dict, at);
          while (!accept_op("}")) {
            if (!d->args.empty()) expect_op(",");
            if (accept_op("}")) break;
            d->args.push_back(parse_expression());
            expect_op(":");
            d->args.push_back(parse_expression());
          }
          return d;
        }
        break;
      default: break;
    }
    fail(at, "unexpected " + describe(at));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token at = cur();
      if (accept_op(".")) {
        if (cur().kind == Tok::Int) {
          auto ix = make(ExprKind::Index, at);
          ix->args.push_back(std::move(e));
          auto lit = make(ExprKind::Literal, cur());
          lit->literal = Value(static_cast<int64_t>(std::strtoll(next().text.c_str(), nullptr, 10)));
          ix->args.push_back(std::move(lit));
          e = std::move(ix);
          continue;
        }
        auto a = make(ExprKind::Attr, at);
        a->name = expect_identifier();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (accept_op("[")) {
        e = parse_subscript(at, std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(const Token& at, ExprPtr target) {
    ExprPtr bounds[3];
    bool slice = false;
    if (!is_op(":")) bounds[0] = parse_expression();
    if (accept_op(":")) {
      slice = true;
      if (!is_op(":") && !is_op("]")) bounds[1] = parse_expression();
      if (accept_op(":") && !is_op("]")) bounds[2] = parse_expression();
    }
    expect_op("]");
    auto e = make(slice ? ExprKind::Slice : ExprKind::Index, at);
    e->args.push_back(std::move(target));
    e->args.push_back(std::move(bounds[0]));
    if (slice) {
      e->args.push_back(std::move(bounds[1]));
      e->args.push_back(std::move(bounds[2]));
    }
    return e;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (accept_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur(), "'*args' and '**kwargs' in calls are not supported");
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
        std::string k = next().text;
        next();
        call.kwargs.emplace_back(std::move(k), parse_expression());
      } else {
        if (!call.kwargs.empty()) fail(cur(), "positional argument follows keyword argument");
        call.args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(ExprKind::Call, cur());
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  void parse_filter_into(Expr& f) {
    f.line = cur().line;
    f.col = cur().col;
    f.name = expect_identifier();
    while (accept_op(".")) f.name += "." + expect_identifier();
    if (is_op("(")) parse_call_args(f);
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (accept_op("|")) {
        auto f = make(ExprKind::Filter, cur());
        f->args.push_back(std::move(e));
        parse_filter_into(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const Token at = next();
        auto t = make(ExprKind::Test, at);
        t->negate = accept_name("not");
        t->name = expect_identifier();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().kind == Tok::Name && cur().text != "else" && cur().text != "or" && cur().text != "and" &&
                    cur().text != "if" && cur().text != "in" && cur().text != "not" && cur().text != "is") ||
                   cur().kind == Tok::String || cur().kind == Tok::Int || cur().kind == Tok::Float ||
                   is_op("[") || is_op("{")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Program parse_template(const std::string& source, const LexOptions& o) {
  return Parser(lex_template(source, o)).run();
}

}  // namespace vkllm::jinja
