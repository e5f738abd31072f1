// Jinja's built-in filters and tests, with Jinja2 3.1's argument names and defaults, plus the
// Hugging Face tojson (ensure_ascii=False, indent honoured) and from_json.
#include "jinja/builtins.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "base/error.h"
#include "jinja/text.h"

namespace vkllm::jinja {
namespace {

const Value* arg(CallArgs& a, size_t pos, std::string_view name) { return a.find(pos, name); }

bool flag(CallArgs& a, size_t pos, std::string_view name, bool def) {
  const Value* v = arg(a, pos, name);
  return v ? v->truthy() : def;
}

// Resolves a dotted attribute path ("function.name" or "0") the way Jinja's make_attrgetter does.
Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    Value key(part);
    if (!part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      key = Value(static_cast<int64_t>(std::stoll(part)));
    if (cur.is_mapping()) {
      const Value* f = cur.get(key);
      cur = f ? *f : Value::undefined(part);
    } else if (cur.is_sequence() && key.kind() == Kind::Int && key.as_int() < static_cast<int64_t>(cur.items().size())) {
      cur = cur.items()[static_cast<size_t>(key.as_int())];
    } else {
      cur = Value::undefined(part);
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

std::string attr_name(CallArgs& a, size_t pos, const char* filter) {
  const Value* v = arg(a, pos, "attribute");
  if (!v) throw Error(std::string(filter) + " needs an attribute name");
  return v->to_str();
}

Value as_list(const Value& v) { return Value::list(v.iterate()); }

// Jinja's sort key: strings compare case-insensitively unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value(py_lower(v.str())) : v;
}

// The widest indent tojson and indent take: every line of a result carries it (a width of 10^9
// was gigabytes before the output limit could see it).
constexpr int64_t kMaxIndent = 1024;
constexpr size_t kMaxIndentedBytes = size_t{16} << 20;  // the padding indent adds in all (RenderLimits' output size)

Value do_tojson(const Value& v, CallArgs& a) {
  const Value* indent_v = arg(a, 1, "indent");
  int indent = -1;
  std::string indent_str;
  if (indent_v && !indent_v->is_none()) {
    if (indent_v->kind() != Kind::Int) throw Error("tojson: indent must be an integer");
    if (indent_v->as_int() > kMaxIndent) throw Error("tojson: indent " + std::to_string(indent_v->as_int()) + " is over " + std::to_string(kMaxIndent));
    indent = static_cast<int>(std::max<int64_t>(0, indent_v->as_int()));
  }
  std::string item_sep = indent < 0 ? ", " : ",", key_sep = ": ";
  if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_sequence() || sep->items().size() != 2) throw Error("tojson: separators must be a pair of strings");
    item_sep = sep->items()[0].to_str();
    key_sep = sep->items()[1].to_str();
  }
  return Value(to_json_text(v, indent, flag(a, 3, "sort_keys", false), item_sep, key_sep));
}

Value do_indent(const Value& v, CallArgs& a) {
  std::string pad = "    ";
  if (const Value* w = arg(a, 0, "width")) {
    if (!w->is_string() && w->as_int() > kMaxIndent) throw Error("indent: width " + std::to_string(w->as_int()) + " is over " + std::to_string(kMaxIndent));
    pad = w->is_string() ? w->str() : std::string(static_cast<size_t>(std::max<int64_t>(0, w->as_int())), ' ');
  }
  const bool first = flag(a, 1, "first", false), blank = flag(a, 2, "blank", false);
  std::vector<std::string> lines = py_split(v.to_str() + "\n", std::string("\n"), -1, false);
  lines.pop_back();  // the piece after the added newline
  if (pad.size() * lines.size() > kMaxIndentedBytes) throw Error("indent: the result would exceed " + std::to_string(kMaxIndentedBytes) + " bytes");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + ((blank || !lines[i].empty()) ? pad : std::string());
    out += lines[i];
  }
  return Value(first ? pad + out : out);
}

Value do_int(const Value& v, CallArgs& a) {
  const Value* def = arg(a, 0, "default");
  const Value fallback = def ? *def : Value(0);
  if (v.kind() == Kind::Int || v.kind() == Kind::Bool) return Value(v.as_int());
  if (v.kind() == Kind::Float) return Value(static_cast<int64_t>(v.as_double()));
  if (v.is_string()) {
    const std::string s = py_strip(v.str(), std::nullopt, true, true);
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value(static_cast<int64_t>(i));
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(static_cast<int64_t>(d));
  }
  return fallback;
}

Value do_float(const Value& v, CallArgs& a) {
  const Value* def = arg(a, 0, "default");
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    const std::string s = py_strip(v.str(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(d);
  }
  return def ? *def : Value(0.0);
}

Value do_round(const Value& v, CallArgs& a) {
  if (!v.is_number()) throw Error("type " + v.type_name() + " doesn't define __round__ method");
  const Value* p = arg(a, 0, "precision");
  const int64_t precision = p ? p->as_int() : 0;
  const Value* m = arg(a, 1, "method");
  const std::string method = m ? m->to_str() : "common";
  if (method == "common" && (v.kind() == Kind::Int || v.kind() == Kind::Bool) && precision >= 0)
    return Value(v.as_int());  // Python's round() keeps an int an int
  const double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  if (method == "common") x = std::nearbyint(x);  // Python's round(): ties to even
  else if (method == "ceil") x = std::ceil(x);
  else if (method == "floor") x = std::floor(x);
  else throw Error("round: method must be common, ceil or floor");
  return Value(x / scale);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// select/reject and selectattr/rejectattr: args are (test name, test args…) after `skip`.
Value select_items(const Value& v, CallArgs& a, bool by_attr, bool keep) {
  std::string attr;
  size_t next = 0;
  if (by_attr) attr = attr_name(a, next++, "selectattr");
  std::string test;
  CallArgs test_args;
  if (next < a.args.size()) {
    test = a.args[next].to_str();
    test_args.args.assign(a.args.begin() + static_cast<long>(next) + 1, a.args.end());
  }
  ValueList out;
  if (!v.truthy()) return Value::list();  // Jinja2 skips falsy inputs such as None
  for (const Value& item : v.iterate()) {
    const Value x = by_attr ? attribute_of(item, attr) : item;
    const bool ok = test.empty() ? x.truthy() : apply_test(test, x, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value do_map(const Value& v, CallArgs& a) {
  ValueList out;
  if (!v.truthy()) return Value::list();  // Jinja2 skips falsy inputs such as None
  if (const Value* attr = arg(a, 99, "attribute")) {
    const Value* def = arg(a, 99, "default");
    for (const Value& item : v.iterate()) {
      Value x = attribute_of(item, attr->to_str());
      out.push_back(x.is_undefined() && def ? *def : x);
    }
    return Value::list(std::move(out));
  }
  if (a.args.empty()) throw Error("map needs a filter name or attribute=");
  const std::string filter = a.args[0].to_str();
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const Value& item : v.iterate()) {
    CallArgs copy = rest;
    out.push_back(apply_filter(filter, item, copy));
  }
  return Value::list(std::move(out));
}

Value do_sort(const Value& v, CallArgs& a) {
  const bool reverse = flag(a, 0, "reverse", false), case_sensitive = flag(a, 1, "case_sensitive", false);
  const Value* attr = arg(a, 2, "attribute");
  ValueList items = v.iterate();
  auto key = [&](const Value& x) { return sort_key(attr ? attribute_of(x, attr->to_str()) : x, case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? value_less(key(y), key(x)) : value_less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value do_dictsort(const Value& v, CallArgs& a) {
  if (!v.is_mapping()) throw Error("dictsort needs a mapping, got " + v.type_name());
  const bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  const bool by_value = by && by->to_str() == "value";
  const bool reverse = flag(a, 2, "reverse", false);
  ValueList items;
  for (const auto& [k, x] : v.entries()) items.push_back(Value::tuple({k, x}));
  auto key = [&](const Value& t) { return sort_key(t.items()[by_value ? 1 : 0], case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? value_less(key(y), key(x)) : value_less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value do_unique(const Value& v, CallArgs& a) {
  const bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const Value* attr = arg(a, 1, "attribute");
  ValueList out, seen;
  for (const Value& item : v.iterate()) {
    Value k = sort_key(attr ? attribute_of(item, attr->to_str()) : item, case_sensitive);
    if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  const bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const Value* attr = arg(a, 1, "attribute");
  ValueList items = v.iterate();
  if (items.empty()) return Value::undefined();
  auto key = [&](const Value& x) { return sort_key(attr ? attribute_of(x, attr->to_str()) : x, case_sensitive); };
  const Value* best = &items[0];
  for (const Value& x : items)
    if (want_max ? value_less(key(*best), key(x)) : value_less(key(x), key(*best))) best = &x;
  return *best;
}

Value do_join(const Value& v, CallArgs& a) {
  const Value* sep = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : v.iterate()) {
    if (!first && sep) out += sep->to_str();
    out += (attr ? attribute_of(item, attr->to_str()) : item).to_str();
    first = false;
  }
  return Value(std::move(out));
}

// Jinja's wordcount: matches of \w+, where \w is '_' or a code point str.isalnum accepts.
int64_t word_count(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (const std::string& c : utf8_chars(s)) {
    const bool w = c == "_" || py_isalnum(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

Value do_length(const Value& v, CallArgs&) {
  if (v.length() < 0) throw Error("object of type '" + v.type_name() + "' has no len()");
  return Value(v.length());
}

using FilterFn = Value (*)(const Value&, CallArgs&);

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry k_filters[] = {
    {"abs", [](const Value& v, CallArgs&) {
       if (!v.is_number()) throw Error("bad operand type for abs(): '" + v.type_name() + "'");
       if (v.kind() == Kind::Float || v.as_int() == INT64_MIN) return Value(std::fabs(v.as_double()));
       return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
     }},
    {"attr", [](const Value& v, CallArgs& a) { return attribute_of(v, attr_name(a, 0, "attr")); }},
    {"capitalize", [](const Value& v, CallArgs&) { return Value(py_capitalize(v.to_str())); }},
    {"count", do_length},

    {"d", [](const Value& v, CallArgs& a) {
       const Value* def = arg(a, 0, "default_value");
       const bool use = flag(a, 1, "boolean", false) ? !v.truthy() : v.is_undefined();
       return use ? (def ? *def : Value("")) : v;
     }},
    {"dictsort", do_dictsort},
    {"e", [](const Value& v, CallArgs&) { return Value(html_escape(v.to_str())); }},
    {"first", [](const Value& v, CallArgs&) {
       ValueList items = v.iterate();
       return items.empty() ? Value::undefined() : items.front();
     }},
    {"float", do_float},
    {"from_json", [](const Value& v, CallArgs&) {
       try {
         return Value::from_json(nlohmann::ordered_json::parse(v.to_str()));
       } catch (const nlohmann::json::exception& e) {
         throw Error(std::string("from_json: ") + e.what());
       }
     }},
    {"indent", do_indent},
    {"int", do_int},
    {"items", [](const Value& v, CallArgs&) {
       ValueList out;
       if (v.is_undefined()) return Value::list();
       if (!v.is_mapping()) throw Error("items filter needs a mapping, got " + v.type_name());
       for (const auto& [k, x] : v.entries()) out.push_back(Value::tuple({k, x}));
       return Value::list(std::move(out));
     }},
    {"join", do_join},
    {"last", [](const Value& v, CallArgs&) {
       ValueList items = v.iterate();
       return items.empty() ? Value::undefined() : items.back();
     }},
    {"length", do_length},
    {"list", [](const Value& v, CallArgs&) { return as_list(v); }},
    {"lower", [](const Value& v, CallArgs&) { return Value(py_lower(v.to_str())); }},
    {"map", do_map},
    {"max", [](const Value& v, CallArgs& a) { return min_max(v, a, true); }},
    {"min", [](const Value& v, CallArgs& a) { return min_max(v, a, false); }},
    {"reject", [](const Value& v, CallArgs& a) { return select_items(v, a, false, false); }},
    {"rejectattr", [](const Value& v, CallArgs& a) { return select_items(v, a, true, false); }},
    {"replace", [](const Value& v, CallArgs& a) {
       const Value* old = arg(a, 0, "old");
       const Value* with = arg(a, 1, "new");
       const Value* count = arg(a, 2, "count");
       if (!old || !with) throw Error("replace needs old and new strings");
       return Value(py_replace(v.to_str(), old->to_str(), with->to_str(), count && !count->is_none() ? static_cast<long>(count->as_int()) : -1));
     }},
    {"reverse", [](const Value& v, CallArgs&) {
       if (v.is_string()) {
         std::vector<std::string> cs = utf8_chars(v.str());
         std::string out;
         for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
         return Value(std::move(out));
       }
       ValueList items = v.iterate();
       std::reverse(items.begin(), items.end());
       return Value::list(std::move(items));
     }},
    {"round", do_round},
    {"safe", [](const Value& v, CallArgs&) { return Value(v.to_str()); }},  // Markup is a str
    {"select", [](const Value& v, CallArgs& a) { return select_items(v, a, false, true); }},
    {"selectattr", [](const Value& v, CallArgs& a) { return select_items(v, a, true, true); }},
    {"sort", do_sort},
    {"string", [](const Value& v, CallArgs&) { return Value(v.to_str()); }},
    {"sum", [](const Value& v, CallArgs& a) {
       const Value* attr = arg(a, 0, "attribute");
       const Value* start = arg(a, 1, "start");
       Value total = start ? *start : Value(0);
       for (const Value& x : v.iterate()) {
         Value y = attr ? attribute_of(x, attr->to_str()) : x;
         if (!y.is_number() || !total.is_number()) throw Error("sum: unsupported operand " + y.type_name());
         total = total.kind() == Kind::Float || y.kind() == Kind::Float ? Value(total.as_double() + y.as_double())
                                                                          : Value(total.as_int() + y.as_int());
       }
       return total;
     }},
    {"title", [](const Value& v, CallArgs&) { return Value(jinja_title_filter(v.to_str())); }},
    {"tojson", do_tojson},
    {"trim", [](const Value& v, CallArgs& a) {
       const Value* chars = arg(a, 0, "chars");
       return Value(py_strip(v.to_str(), chars && !chars->is_none() ? std::optional<std::string>(chars->to_str()) : std::nullopt, true, true));
     }},
    {"unique", do_unique},
    {"upper", [](const Value& v, CallArgs&) { return Value(py_upper(v.to_str())); }},
    {"wordcount", [](const Value& v, CallArgs&) { return Value(word_count(v.to_str())); }},
};

const FilterEntry* find_filter(const std::string& name) {
  const std::string n = name == "default" ? "d" : name == "escape" ? "e" : name;
  for (const FilterEntry& f : k_filters)
    if (n == f.name) return &f;
  return nullptr;
}

using TestFn = bool (*)(const Value&, CallArgs&);

struct TestEntry {
  const char* name;
  TestFn fn;
};

const Value& test_arg(CallArgs& a, const char* test) {
  if (a.args.empty()) throw Error(std::string("test '") + test + "' needs an argument");
  return a.args[0];
}

// Python's `value % 2` (0 or 1; floats may give a fraction); an error for non-numbers.
double parity(const Value& v) {
  if (!v.is_number()) throw Error("unsupported operand type(s) for %: '" + v.type_name() + "' and 'int'");
  if (v.kind() == Kind::Float) return v.as_double() - 2 * std::floor(v.as_double() / 2);
  return static_cast<double>(v.as_int() & 1);
}

const TestEntry k_tests[] = {
    {"boolean", [](const Value& v, CallArgs&) { return v.kind() == Kind::Bool; }},
    {"callable", [](const Value& v, CallArgs&) { return v.is_callable(); }},
    {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
    {"divisibleby", [](const Value& v, CallArgs& a) {
       const int64_t d = test_arg(a, "divisibleby").as_int();
       return d != 0 && (d == -1 || v.as_int() % d == 0);
     }},
    {"eq", [](const Value& v, CallArgs& a) { return v == test_arg(a, "eq"); }},
    {"even", [](const Value& v, CallArgs&) { return parity(v) == 0; }},
    {"false", [](const Value& v, CallArgs&) { return v.kind() == Kind::Bool && !v.as_bool(); }},
    {"float", [](const Value& v, CallArgs&) { return v.kind() == Kind::Float; }},
    {"ge", [](const Value& v, CallArgs& a) { return !value_less(v, test_arg(a, "ge")); }},
    {"gt", [](const Value& v, CallArgs& a) { return value_less(test_arg(a, "gt"), v); }},
    {"in", [](const Value& v, CallArgs& a) {
       const Value& c = test_arg(a, "in");
       if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
       if (c.is_mapping()) return c.get(v) != nullptr;
       for (const Value& x : c.iterate())
         if (x == v) return true;
       return false;
     }},
    {"integer", [](const Value& v, CallArgs&) { return v.kind() == Kind::Int; }},
    {"iterable", [](const Value& v, CallArgs&) { return v.is_string() || v.is_sequence() || v.is_mapping() || v.is_undefined(); }},
    {"le", [](const Value& v, CallArgs& a) { return !value_less(test_arg(a, "le"), v); }},
    {"lower", [](const Value& v, CallArgs&) { return py_islower(v.to_str()); }},
    {"lt", [](const Value& v, CallArgs& a) { return value_less(v, test_arg(a, "lt")); }},
    {"mapping", [](const Value& v, CallArgs&) { return v.kind() == Kind::Dict; }},
    {"ne", [](const Value& v, CallArgs& a) { return !(v == test_arg(a, "ne")); }},
    {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
    {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
    {"odd", [](const Value& v, CallArgs&) { return parity(v) == 1; }},
    {"sameas", [](const Value& v, CallArgs& a) {
       const Value& o = test_arg(a, "sameas");
       if (v.kind() != o.kind()) return false;
       // Python interns short strings and caches small ints; equal scalars count as the same.
       if (v.is_none() || v.kind() == Kind::Bool || v.is_string() || v.kind() == Kind::Int) return v == o;
       // (A dict's entries, not its items: those are a list's, absent from a dict.)
       if (v.is_mapping()) return &v.entries() == &o.entries();
       return v.is_sequence() && &v.items() == &o.items();
     }},
    {"sequence", [](const Value& v, CallArgs&) {
       return v.is_string() || v.is_sequence() || v.kind() == Kind::Dict || v.is_undefined();
     }},
    {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
    {"true", [](const Value& v, CallArgs&) { return v.kind() == Kind::Bool && v.as_bool(); }},
    {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
    {"upper", [](const Value& v, CallArgs&) { return py_isupper(v.to_str()); }},
};

const TestEntry* find_test(const std::string& name) {
  std::string n = name;
  if (n == "equalto" || n == "==") n = "eq";
  else if (n == "!=") n = "ne";
  else if (n == "greaterthan" || n == ">") n = "gt";
  else if (n == "lessthan" || n == "<") n = "lt";
  else if (n == ">=") n = "ge";
  else if (n == "<=") n = "le";
  for (const TestEntry& t : k_tests)
    if (n == t.name) return &t;
  return nullptr;
}

}  // namespace

bool has_filter(const std::string& name) { return find_filter(name) != nullptr; }
bool has_test(const std::string& name) { return find_test(name) != nullptr; }

Value apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  const FilterEntry* f = find_filter(name);
  if (!f) throw Error("no filter named '" + name + "'");
  return f->fn(value, args);
}

bool apply_test(const std::string& name, const Value& value, CallArgs& args) {
  const TestEntry* t = find_test(name);
  if (!t) throw Error("no test named '" + name + "'");
  return t->fn(value, args);
}

}  // namespace vkllm::jinja
