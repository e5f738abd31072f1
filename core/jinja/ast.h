// The Jinja syntax tree: expressions and statements as produced by the parser.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace vkllm::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,  // literal
  Name,     // name
  List,     // args: items
  Tuple,    // args: items
  Dict,     // args: key, value, key, value, …
  Attr,     // args[0].name
  Index,    // args[0][args[1]]
  Slice,    // args[0][args[1]:args[2]:args[3]], each bound may be null
  Call,     // args[0](args[1..], kwargs)
  Filter,   // args[0] | name(args[1..], kwargs)
  Test,     // args[0] is [not] name(args[1..]); `negate`
  Unary,    // name args[0], name in {"-", "+", "not"}
  Binary,   // args[0] name args[1]; "and"/"or" short-circuit
  Compare,  // args[0] ops[0] args[1] ops[1] args[2] …, chained as in Python
  Cond,     // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind = ExprKind::Literal;
  int line = 0, col = 0;
  Value literal;
  std::string name;
  bool negate = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

enum class NodeKind {
  Text,         // text
  Output,       // {{ expr }}
  If,           // branches: (cond, body)…; else_body
  For,          // for targets in expr [if cond] body [else else_body]
  Set,          // set targets = expr, or set targets[0].attr = expr (namespace)
  SetBlock,     // set targets[0] %} body {% endset
  Macro,        // macro text(params) body
  CallBlock,    // call [(params)] expr %} body — body is the `caller` macro
  FilterBlock,  // filter expr %} body: expr is a Filter whose args[0] (the input) stands for body
  Break,
  Continue,
  Generation,  // Hugging Face's {% generation %} marker: renders body as is
  With,        // with targets[i] = values[i], … body
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  NodeKind kind = NodeKind::Text;
  int line = 0, col = 0;
  std::string text;  // Text: the data; Macro: the macro's name
  ExprPtr expr;      // Output/Set/For iterable/CallBlock call/FilterBlock filter
  ExprPtr cond;  // For filter
  std::vector<std::string> targets;
  std::string attr;  // Set: `ns.attr = …` sets attribute `attr` of targets[0]
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<MacroParam> params;
  std::vector<ExprPtr> values;  // With
};

// A parsed template.
struct Program {
  Body body;
};

}  // namespace vkllm::jinja
