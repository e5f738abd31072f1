// The Jinja value type: construction, Python truthiness/equality/ordering, str()/repr(), JSON.
#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "jinja/text.h"

namespace vkllm::jinja {

const Value* CallArgs::find(size_t pos, std::string_view name) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return pos < args.size() ? &args[pos] : nullptr;
}

Value Value::undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value::Value(std::string s) : kind_(Kind::String), str_(std::make_shared<const std::string>(std::move(s))) {}

void Value::take_depth(const Value& item) {
  if (item.depth_ + 1 > k_max_depth) throw Error("a value nested deeper than " + std::to_string(k_max_depth) + " levels");
  capturing(item);
}

Value& Value::capturing(const Value& captured) {
  // Saturated, not refused: what it is put in is refused instead (a loop over a value at the limit,
  // or its method, still runs).
  depth_ = std::max(depth_, std::min(captured.depth_ + 1, k_max_depth));
  holds_namespace_ = holds_namespace_ || captured.holds_namespace_ || captured.kind_ == Kind::Namespace;
  return *this;
}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::List;
  v.depth_ = 1;
  for (const Value& e : items) v.take_depth(e);
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::Tuple;
  return v;
}

Value Value::dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::Dict;
  v.depth_ = 1;
  for (const auto& [k, e] : items) {
    v.take_depth(k);
    v.take_depth(e);
  }
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::namespace_(ValueDict items) {
  Value v = dict(std::move(items));
  v.kind_ = Kind::Namespace;
  return v;
}

Value Value::callable(Function f, std::string name) {
  Value v;
  v.kind_ = Kind::Callable;
  v.fn_ = std::make_shared<const Function>(std::move(f));
  v.name_ = std::move(name);
  return v;
}

namespace {

// As deep as tojson writes (below): one level of C++ recursion each, so a file of brackets cannot
// overflow the stack.
constexpr int k_max_json_depth = 256;

template <class Json>
Value value_from_json(const Json& j, int depth = 0) {
  if (depth > k_max_json_depth && (j.is_array() || j.is_object()))
    throw Error("JSON nested deeper than " + std::to_string(k_max_json_depth) + " levels");
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value(j.template get<bool>());
    case Json::value_t::number_integer: return Value(j.template get<int64_t>());
    case Json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case Json::value_t::number_float: return Value(j.template get<double>());
    case Json::value_t::string: return Value(j.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(value_from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      ValueDict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(Value(k), value_from_json(e, depth + 1));
      return Value::dict(std::move(items));
    }
    default: throw Error("chat template: messages hold a JSON value of unsupported type " + std::string(j.type_name()));
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return int_ != 0;
    case Kind::Float: return float_ != 0;
    case Kind::String: return !str_->empty();
    case Kind::List:
    case Kind::Tuple: return !list_->empty();
    case Kind::Dict: return !dict_->empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

const Value* Value::get(const Value& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key) return &v;
  return nullptr;
}

Value* Value::get(const Value& key) {
  return const_cast<Value*>(static_cast<const Value*>(this)->get(key));
}

void Value::set(const Value& key, Value v) {
  // A namespace's contents change after its depth was taken (on this handle only): a namespace
  // assigned into one could chain them without bound, so that is refused (one may be built holding
  // another, which its depth counts); what is assigned is at most k_max_depth deep, so a value nests
  // at most about twice that.
  if (kind_ == Kind::Namespace && (v.holds_namespace_ || v.kind_ == Kind::Namespace))
    throw Error("a namespace cannot be assigned into a namespace");
  take_depth(v);
  if (Value* slot = get(key)) *slot = std::move(v);
  else dict_->emplace_back(key, std::move(v));
}

ValueList Value::iterate() const {
  switch (kind_) {
    case Kind::List:
    case Kind::Tuple: return *list_;
    case Kind::Dict: {
      ValueList keys;
      for (const auto& e : *dict_) keys.push_back(e.first);
      return keys;
    }
    case Kind::String: {
      ValueList chars;
      for (auto& c : utf8_chars(*str_)) chars.emplace_back(std::move(c));
      return chars;
    }
    case Kind::Undefined: return {};
    default: throw Error("'" + type_name() + "' object is not iterable");
  }
}

int64_t Value::length() const {
  switch (kind_) {
    case Kind::String: return static_cast<int64_t>(utf8_length(*str_));
    case Kind::List:
    case Kind::Tuple: return static_cast<int64_t>(list_->size());
    case Kind::Dict: return static_cast<int64_t>(dict_->size());
    case Kind::Undefined: return 0;
    default: return -1;
  }
}

// The text of a list or dict (str(), repr(), tojson) is checked as it grows: a list shares its
// items, so a value of few items per level ([[1]*2^18]*2^18) can stand for hundreds of gigabytes
// of text, which the output limit would only see once built. The same 16 MiB as RenderLimits.
namespace {
void check_text_size(size_t n) {
  constexpr size_t kMaxText = size_t{16} << 20;
  if (n > kMaxText) throw Error("template value exceeds " + std::to_string(kMaxText) + " bytes as text");
}
}  // namespace

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e_pos = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  std::string mant = sci.substr(0, e_pos);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp10) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp10) + 1) + "." + digits.substr(static_cast<size_t>(exp10) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == q) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\x%02x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + q;
}

}  // namespace

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return *str_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return int_ ? "True" : "False";
    case Kind::Int: return std::to_string(int_);
    case Kind::Float: return float_repr(float_);
    case Kind::String: return repr_string(*str_);
    case Kind::List:
    case Kind::Tuple: {
      const bool tup = kind_ == Kind::Tuple;
      std::string out = tup ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        out += (i ? ", " : "") + (*list_)[i].repr();
        check_text_size(out.size());
      }
      if (tup && list_->size() == 1) out += ",";
      return out + (tup ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        out += (i ? ", " : "") + (*dict_)[i].first.repr() + ": " + (*dict_)[i].second.repr();
        check_text_size(out.size());
      }
      return out + "}";
    }
    case Kind::Namespace: return "<Namespace>";
    case Kind::Callable: return "<function " + name_ + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "";
}

bool Value::operator==(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::Float || o.kind_ == Kind::Float) return as_double() == o.as_double();
    return int_ == o.int_;
  }
  if (is_sequence() && o.is_sequence()) {
    if (kind_ != o.kind_) return false;
    return *list_ == *o.list_;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return *str_ == *o.str_;
    case Kind::Dict: {
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* ov = o.get(k);
        if (!ov || !(*ov == v)) return false;
      }
      return true;
    }
    case Kind::Namespace: return dict_ == o.dict_;
    case Kind::Callable: return fn_ == o.fn_;
    default: return false;
  }
}

bool value_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_sequence() && b.is_sequence()) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (value_less(x[i], y[i])) return true;
      if (value_less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw Error("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  bool sort_keys;
  const std::string& item_sep;
  const std::string& key_sep;
  std::string out;

  void newline(int depth) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * depth), ' ');
  }

  void write(const Value& v, int depth) {
    if (depth > k_max_json_depth) throw Error("tojson: value nested deeper than " + std::to_string(k_max_json_depth) + " levels");
    switch (v.kind()) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Kind::Int: out += std::to_string(v.as_int()); return;
      case Kind::Float: {
        const double d = v.as_double();
        out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : float_repr(d);
        return;
      }
      case Kind::String: json_string(out, v.str()); return;
      case Kind::List:
      case Kind::Tuple: {
        const ValueList& items = v.items();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          newline(depth + 1);
          write(items[i], depth + 1);
          check_text_size(out.size());
        }
        newline(depth);
        out += ']';
        return;
      }
      case Kind::Dict:
      case Kind::Namespace: {
        ValueDict entries = v.entries();
        if (entries.empty()) {
          out += "{}";
          return;
        }
        if (sort_keys)
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& a, const auto& b) { return value_less(a.first, b.first); });
        out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_sep;
          newline(depth + 1);
          const Value& k = entries[i].first;
          if (k.is_string()) json_string(out, k.str());
          else if (k.kind() == Kind::Bool) out += k.as_bool() ? "\"true\"" : "\"false\"";
          else if (k.is_none()) out += "\"null\"";
          else if (k.is_number()) out += "\"" + k.to_str() + "\"";
          else throw Error("tojson: keys must be str, int, float, bool or None, not " + k.type_name());
          out += key_sep;
          write(entries[i].second, depth + 1);
          check_text_size(out.size());
        }
        newline(depth);
        out += '}';
        return;
      }
      default: throw Error("tojson: Object of type " + v.type_name() + " is not JSON serializable");
    }
  }
};

}  // namespace

std::string to_json_text(const Value& v, int indent, bool sort_keys, const std::string& item_sep,
                         const std::string& key_sep) {
  JsonWriter w{indent, sort_keys, item_sep, key_sep, {}};
  w.write(v, 0);
  return std::move(w.out);
}

}  // namespace vkllm::jinja
