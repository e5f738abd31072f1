// The Jinja value type: Python-like data (undefined, none, bool, int, float, str, list, tuple,
// dict, namespace, callable) with Python's printing, truthiness, equality and ordering.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vkllm::jinja {

class Value;
using ValueList = std::vector<Value>;
// Insertion-ordered like a Python dict; small dicts make linear lookup the cheap choice.
using ValueDict = std::vector<std::pair<Value, Value>>;

// Positional and keyword arguments of a call, already evaluated.
struct CallArgs {
  ValueList args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // Argument `pos`, or keyword `name`, or nullptr when neither was given.
  const Value* find(size_t pos, std::string_view name) const;
};

using Function = std::function<Value(CallArgs&)>;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Callable };

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  Value(bool b) : kind_(Kind::Bool), int_(b) {}
  Value(int64_t i) : kind_(Kind::Int), int_(i) {}
  Value(int i) : kind_(Kind::Int), int_(i) {}
  Value(size_t i) : kind_(Kind::Int), int_(static_cast<int64_t>(i)) {}
  Value(double d) : kind_(Kind::Float), float_(d) {}
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(ValueList items = {});
  static Value tuple(ValueList items);
  static Value dict(ValueDict items = {});
  static Value namespace_(ValueDict items);
  static Value callable(Function f, std::string name);
  // JSON data; an ordered_json keeps the objects' key order, as Python dicts do.
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_sequence() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_mapping() const { return kind_ == Kind::Dict || kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // Int and Bool
  double as_double() const { return kind_ == Kind::Float ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return *str_; }
  ValueList& items() const { return *list_; }   // List, Tuple
  ValueDict& entries() const { return *dict_; }  // Dict, Namespace
  const Function& function() const { return *fn_; }
  // The variable name an undefined value stands for ("" when unknown), or a callable's name.
  const std::string& name() const { return name_; }

  // Python truthiness.
  bool truthy() const;
  // Dict lookup by key; nullptr when absent.
  const Value* get(const Value& key) const;
  Value* get(const Value& key);
  void set(const Value& key, Value v);  // Dict, Namespace
  // Elements when iterating: list items, dict keys, string characters (UTF-8 code points).
  ValueList iterate() const;
  // Python `len()`, or -1 when the value has none.
  int64_t length() const;

  // Python str() and repr().
  std::string to_str() const;
  std::string repr() const;
  // Python's type name, for error messages ("str", "int", "dict", "undefined").
  std::string type_name() const;

  bool operator==(const Value& o) const;

  // Nesting: values are printed, compared and freed by recursion, so no list or dict may be built
  // deeper than k_max_depth (a template building [x] in a loop, a file of brackets). 0 for a scalar,
  // 1 + the deepest element for a container; a namespace, the one value that changes, takes no
  // namespace by assignment, so no value nests deeper than about twice k_max_depth.
  static constexpr uint32_t k_max_depth = 1000;
  uint32_t depth() const { return depth_; }
  // A callable that keeps `captured` (a bound method), or a loop object its items, nests one deeper
  // (saturated at k_max_depth).
  Value& capturing(const Value& captured);

 private:
  // depth_ and holds_namespace_ of a container of `items`; throws Error past k_max_depth.
  void take_depth(const Value& item);

  Kind kind_ = Kind::Undefined;
  uint32_t depth_ = 0;
  bool holds_namespace_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Function> fn_;
  std::string name_;
};

// Python ordering (`<`) between numbers, strings or sequences; throws Error on other types.
bool value_less(const Value& a, const Value& b);
// Python repr() of a float: "1.0", "0.1", "1e+20", "inf".
std::string float_repr(double d);
// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=sort_keys).
// indent < 0: on one line. Throws Error on values JSON cannot hold (undefined, callables).
std::string to_json_text(const Value& v, int indent, bool sort_keys, const std::string& item_sep,
                         const std::string& key_sep);

}  // namespace vkllm::jinja
