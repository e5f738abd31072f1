// Python methods of str, list and dict values as Jinja exposes them, and Python slicing.
#include <algorithm>

#include "base/error.h"
#include "jinja/builtins.h"
#include "jinja/text.h"

namespace vkllm::jinja {
namespace {

const Value* arg(CallArgs& a, size_t pos, std::string_view name) { return a.find(pos, name); }

std::optional<std::string> opt_str(CallArgs& a, size_t pos, std::string_view name) {
  const Value* v = arg(a, pos, name);
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw Error(std::string(name) + " must be a string, not " + v->type_name());
  return v->str();
}

std::string need_str(CallArgs& a, size_t pos, std::string_view name, std::string_view method) {
  std::optional<std::string> s = opt_str(a, pos, name);
  if (!s) throw Error(std::string(method) + "() missing argument '" + std::string(name) + "'");
  return *s;
}

long opt_int(CallArgs& a, size_t pos, std::string_view name, long def) {
  const Value* v = arg(a, pos, name);
  if (!v || v->is_none()) return def;
  if (v->kind() != Kind::Int && v->kind() != Kind::Bool) throw Error(std::string(name) + " must be an integer");
  return static_cast<long>(v->as_int());
}

Value str_list(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value::list(std::move(out));
}

// Python's str.format for "{}" / "{0}" / "{name}" fields without format specs.
std::string py_format(const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Error("str.format: single '{' encountered");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) throw Error("str.format: format specs are not supported");
    const Value* v = nullptr;
    if (field.empty()) v = auto_index < a.args.size() ? &a.args[auto_index++] : nullptr;
    else if (field.size() < 6 && std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; }))
      v = std::stoul(field) < a.args.size() ? &a.args[std::stoul(field)] : nullptr;
    else
      for (const auto& [k, kv] : a.kwargs)
        if (k == field) v = &kv;
    if (!v) throw Error("str.format: no argument for field '{" + field + "}'");
    out += v->to_str();
    i = close;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value(py_strip(s, opt_str(a, 0, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "split" || name == "rsplit")
    return str_list(py_split(s, opt_str(a, 0, "sep"), opt_int(a, 1, "maxsplit", -1), name == "rsplit"));
  if (name == "startswith" || name == "endswith") {
    const Value* p = arg(a, 0, "prefix");
    if (!p) throw Error(name + "() takes at least 1 argument");
    ValueList options = p->kind() == Kind::Tuple ? p->items() : ValueList{*p};
    for (const Value& o : options) {
      if (!o.is_string()) throw Error(name + "() argument must be str or a tuple of str");
      const std::string& x = o.str();
      if (x.size() > s.size()) continue;
      if (name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value(true);
    }
    return Value(false);
  }
  if (name == "replace")
    return Value(py_replace(s, need_str(a, 0, "old", name), need_str(a, 1, "new", name), opt_int(a, 2, "count", -1)));
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string x = need_str(a, 0, "sub", name);
    const size_t p = name[0] == 'r' ? s.rfind(x) : s.find(x);
    if (p == std::string::npos) {
      if (name.find("index") != std::string::npos) throw Error("substring not found");
      return Value(-1);
    }
    return Value(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
  }
  if (name == "count") {
    const std::string x = need_str(a, 0, "sub", name);
    if (x.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
    return Value(n);
  }
  if (name == "format") return Value(py_format(s, a));
  if (name == "join") {
    const Value* items = arg(a, 0, "iterable");
    if (!items) throw Error("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : items->iterate()) {
      if (!v.is_string()) throw Error("sequence item: expected str instance, " + v.type_name() + " found");
      if (!first) out += s;
      out += v.str();
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "splitlines") {
    std::vector<std::string> lines = py_split(s, std::string("\n"), -1, false);
    if (!lines.empty() && lines.back().empty()) lines.pop_back();
    return str_list(lines);
  }
  if (name == "isdigit") return Value(py_isdigit(s));
  if (name == "isalpha") return Value(py_isalpha(s));
  if (name == "isalnum") return Value(py_isalnum(s));
  if (name == "isspace") return Value(py_isspace(s));
  if (name == "isupper") return Value(py_isupper(s));
  if (name == "islower") return Value(py_islower(s));
  throw Error("'str' object has no attribute '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name, CallArgs& a) {
  if (name == "get") {
    const Value* k = arg(a, 0, "key");
    if (!k) throw Error("get() takes at least 1 argument");
    const Value* v = d.get(*k);
    if (v) return *v;
    const Value* def = arg(a, 1, "default");
    return def ? *def : Value::none();
  }
  if (name == "items") {
    ValueList out;
    for (const auto& [k, v] : d.entries()) out.push_back(Value::tuple({k, v}));
    return Value::list(std::move(out));
  }
  if (name == "keys" || name == "values") {
    ValueList out;
    for (const auto& [k, v] : d.entries()) out.push_back(name == "keys" ? k : v);
    return Value::list(std::move(out));
  }
  if (name == "copy") return Value::dict(d.entries());
  throw Error("'dict' object has no attribute '" + name + "'");
}

Value list_method(const Value& l, const std::string& name, CallArgs& a) {
  ValueList& items = l.items();
  if (name == "index" || name == "count") {
    if (a.args.empty()) throw Error(name + "() takes exactly one argument");
    int64_t n = 0;
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i] == a.args[0]) {
        if (name == "index") return Value(i);
        ++n;
      }
    if (name == "index") throw Error(a.args[0].repr() + " is not in list");
    return Value(n);
  }
  throw Error("'" + l.type_name() + "' object has no attribute '" + name + "'");
}

bool is_method(Kind k, const std::string& name) {
  static const char* k_str[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                "replace", "upper", "lower", "title", "capitalize", "find", "rfind", "index",
                                "rindex", "count", "format", "join", "splitlines", "isdigit", "isalpha",
                                "isalnum", "isspace", "isupper", "islower"};
  static const char* k_dict[] = {"get", "items", "keys", "values", "copy"};
  static const char* k_list[] = {"index", "count"};
  auto in = [&](const auto& table) {
    return std::any_of(std::begin(table), std::end(table), [&](const char* m) { return name == m; });
  };
  if (k == Kind::String) return in(k_str);
  if (k == Kind::Dict) return in(k_dict);
  if (k == Kind::List || k == Kind::Tuple) return in(k_list);
  return false;
}

// Methods that mutate: Hugging Face renders in Jinja2's ImmutableSandboxedEnvironment, which
// refuses them (this also keeps values free of reference cycles).
bool is_mutating_method(Kind k, const std::string& name) {
  if (k == Kind::List) return name == "append" || name == "pop" || name == "extend" || name == "insert" ||
                              name == "remove" || name == "clear" || name == "sort" || name == "reverse";
  if (k == Kind::Dict) return name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
                              name == "popitem";
  return false;
}

}  // namespace

std::optional<Value> bound_method(const Value& obj, const std::string& name) {
  if (is_mutating_method(obj.kind(), name)) {
    const std::string type = obj.type_name();
    return Value::callable(
        [type, name](CallArgs&) -> Value {
          throw Error("access to attribute '" + name + "' of '" + type + "' object is unsafe (templates render in an immutable sandbox)");
        },
        name);
  }
  if (!is_method(obj.kind(), name)) return std::nullopt;
  Value method = Value::callable(
      [obj, name](CallArgs& a) -> Value {
        if (obj.is_string()) return string_method(obj.str(), name, a);
        if (obj.kind() == Kind::Dict) return dict_method(obj, name, a);
        return list_method(obj, name, a);
      },
      name);
  return method.capturing(obj);
}

Value slice_value(const Value& v, const Value* start, const Value* stop, const Value* step) {
  auto as_index = [](const Value* b) -> std::optional<int64_t> {
    if (!b) return std::nullopt;
    if (b->kind() != Kind::Int && b->kind() != Kind::Bool) throw Error("slice indices must be integers or None");
    return b->as_int();
  };
  const int64_t st = as_index(step).value_or(1);
  if (st == 0) throw Error("slice step cannot be zero");
  std::vector<std::string> chars;
  if (v.is_string()) chars = utf8_chars(v.str());
  else if (!v.is_sequence()) throw Error("'" + v.type_name() + "' object is not subscriptable");
  const int64_t n = v.is_string() ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(v.items().size());
  auto clamp = [&](std::optional<int64_t> i, int64_t def) -> int64_t {
    if (!i) return def;
    int64_t x = *i < 0 ? *i + n : *i;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(as_index(start), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_index(stop), st > 0 ? n : -1);
  std::string s;
  ValueList items;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (v.is_string()) s += chars[static_cast<size_t>(i)];
    else items.push_back(v.items()[static_cast<size_t>(i)]);
  }
  if (v.is_string()) return Value(std::move(s));
  return v.kind() == Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

}  // namespace vkllm::jinja
