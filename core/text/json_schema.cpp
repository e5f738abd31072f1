// JSON as grammars: the JSON rules every JSON grammar shares, json_object's root, and the JSON
// Schema converter that writes one GBNF rule per schema that needs one.
#include "text/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "base/commas.h"
#include "base/error.h"

namespace vkllm {
namespace {

using json = nlohmann::ordered_json;

constexpr uint64_t k_max_count = Grammar::k_max_repetitions;  // counts become repetitions
constexpr size_t k_max_depth = 64;      // schemas inside schemas

// Any JSON value. Whitespace is bounded (one blank, or a newline and an indent of up to 24) so
// that a model cannot spend its tokens on blanks; numbers keep 16 digits a part. `char` (one
// character of a string) and `int` are rules of their own, which schemas use too.
constexpr std::string_view k_json_rules = R"GBNF(value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws
array  ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" char* "\"" ws
char   ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,4} )? ws
int    ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
ws     ::= ( " " | "\n" [ \t]{0,24} )?
)GBNF";

// What schemas add: integers.
constexpr std::string_view k_schema_rules = R"GBNF(integer ::= int ws
)GBNF";

// Keywords that describe a schema without constraining its values.
const std::set<std::string, std::less<>> k_annotations = {
    "$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    "$defs", "definitions"};

// A GBNF string literal spelling `text` (UTF-8 passes as it is).
std::string literal(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = uint8_t(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

class SchemaConverter {
 public:
  explicit SchemaConverter(const json& root) : root_(root) {}

  std::string convert() {
    const std::string root = expr(root_, "");
    return std::string(k_json_rules) + std::string(k_schema_rules) + rules_.str() + "root ::= " + root + "\n";
  }

 private:
  [[noreturn]] void fail(const std::string& at, const std::string& msg) const {
    throw Error("JSON schema" + std::string(at.empty() ? "" : " at " + at) + ": " + msg);
  }

  std::string rule(const std::string& body) {
    const std::string name = "s" + std::to_string(++n_rules_);
    rules_ << name << " ::= " << body << "\n";
    return name;
  }

  // A GBNF expression for the values `s` accepts, each followed by whitespace; `at` is the schema's
  // JSON pointer in the root.
  // Each schema (by its place, `at`) is converted once: a `type` list writes the schema once per
  // type, and its subschemas would otherwise be converted again each time, 2^depth times.
  std::string expr(const json& s, const std::string& at) {
    if (const auto done = done_.find(at); done != done_.end()) return done->second;
    if (++depth_ > k_max_depth) fail(at, "schemas nest deeper than " + std::to_string(k_max_depth) + " levels");
    const std::string e = named(expr_at_depth(s, at));
    --depth_;
    done_.emplace(at, e);
    return e;
  }

  std::string expr_at_depth(const json& s, const std::string& at) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(at, "the schema false accepts no value");
      return "value";
    }
    if (!s.is_object()) fail(at, "a schema must be an object or a boolean, not " + s.dump().substr(0, 40));
    static const std::set<std::string, std::less<>> k_followed = {
        "type",  "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength",
        "enum",  "const",      "anyOf",    "oneOf",                "allOf", "$ref"};
    for (const auto& [key, value] : s.items()) {
      (void)value;
      if (!k_followed.count(key) && !k_annotations.count(key)) {
        fail(at, "'" + key + "' is not supported: the reply could not be held to it (docs/sampling.md, \"JSON schemas\")");
      }
    }
    if (const auto ref = s.find("$ref"); ref != s.end()) {
      for (const auto& [key, value] : s.items()) {
        (void)value;
        if (key != "$ref" && !k_annotations.count(key)) fail(at, "'$ref' beside '" + key + "' is not supported");
      }
      return reference(*ref, at);
    }
    // enum, const, anyOf, oneOf, allOf choose among values or schemas: beside them only `type`
    // (beside enum and const, which keeps the values of those types), lest a keyword be dropped.
    const char* chooser = nullptr;
    for (const char* k : {"const", "enum", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(k)) continue;
      if (chooser) fail(at, std::string("'") + k + "' beside '" + chooser + "' is not supported");
      chooser = k;
    }
    if (chooser) {
      const bool values = std::string(chooser) == "const" || std::string(chooser) == "enum";
      for (const auto& [key, value] : s.items()) {
        (void)value;
        if (key != chooser && !k_annotations.count(key) && !(values && key == "type"))
          fail(at, "'" + key + "' beside '" + chooser + "' is not supported");
      }
    }
    if (const auto c = s.find("const"); c != s.end()) {
      if (!has_type(*c, s, at)) fail(at, "the 'const' value does not have the schema's 'type'");
      return literal(c->dump()) + " ws";
    }
    if (const auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail(at + "/enum", "'enum' must be a non-empty array");
      std::string alts;
      for (const json& v : *e)
        if (has_type(v, s, at)) alts += (alts.empty() ? "" : " | ") + literal(v.dump());
      if (alts.empty()) fail(at, "no value of 'enum' has the schema's 'type'");
      return "(" + alts + ") ws";
    }
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      const auto list = s.find(k);
      if (list == s.end()) continue;
      if (!list->is_array() || list->empty()) fail(at + "/" + k, std::string("'") + k + "' must be a non-empty array");
      if (std::string(k) == "allOf") {
        if (list->size() != 1) fail(at + "/allOf", "'allOf' of more than one schema is not supported");
        return expr((*list)[0], at + "/allOf/0");
      }
      std::string alts;
      for (size_t i = 0; i < list->size(); ++i) alts += (i ? " | " : "") + expr((*list)[i], at + "/" + k + "/" + std::to_string(i));
      return "(" + alts + ")";
    }
    const auto type = s.find("type");
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) return typed("object", s, at);
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed("array", s, at);
      if (s.contains("minLength") || s.contains("maxLength")) return typed("string", s, at);
      return "value";
    }
    if (type->is_string()) return typed(type->get<std::string>(), s, at);
    if (!type->is_array() || type->empty()) fail(at + "/type", "'type' must be a type name or a non-empty array of them");
    std::set<std::string> names;
    std::string alts;
    for (const json& t : *type) {
      if (!t.is_string()) fail(at + "/type", "'type' must be a type name or a non-empty array of them");
      if (names.insert(t.get<std::string>()).second) alts += (alts.empty() ? "" : " | ") + typed(t.get<std::string>(), s, at);
    }
    return "(" + alts + ")";
  }

  // Whether JSON value v has (one of) the schema's `type`s; true without one.
  bool has_type(const json& v, const json& s, const std::string& at) const {
    const auto type = s.find("type");
    if (type == s.end()) return true;
    const auto is = [&](const json& t) {
      if (!t.is_string()) fail(at + "/type", "'type' must be a type name or a non-empty array of them");
      const std::string& n = t.get_ref<const std::string&>();
      return (n == "null" && v.is_null()) || (n == "boolean" && v.is_boolean()) || (n == "string" && v.is_string()) ||
             (n == "number" && v.is_number()) || (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
             (n == "integer" && v.is_number() && (v.is_number_integer() || v.get<double>() == std::floor(v.get<double>())));
    };
    if (type->is_array()) return std::any_of(type->begin(), type->end(), is);
    return is(*type);
  }

  // `e` as one name: itself when it is one, else a rule of its own (an expression written twice
  // by a repetition would double with every level of nesting).
  std::string named(const std::string& e) {
    const bool name = !e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '-'; });
    return name ? e : rule(e);
  }

  std::string reference(const json& ref, const std::string& at) {
    if (!ref.is_string()) fail(at + "/$ref", "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    if (const auto done = refs_.find(r); done != refs_.end()) return done->second;
    if (r != "#" && r.rfind("#/$defs/", 0) != 0 && r.rfind("#/definitions/", 0) != 0)
      fail(at + "/$ref", "'" + r + "': only references into this schema's $defs or definitions are supported");
    json::json_pointer pointer;
    try {
      pointer = json::json_pointer(r == "#" ? "" : r.substr(1));
    } catch (const json::exception&) {
      fail(at + "/$ref", "'" + r + "' is not a JSON pointer");
    }
    const json* target = nullptr;
    try {
      target = &root_.at(pointer);
    } catch (const json::exception&) {  // no such member or index (a pointer into an array past its end)
    }
    if (!target) fail(at + "/$ref", "'" + r + "' names no schema");
    // Named before it is converted, so a schema that refers to itself (a tree) refers to its rule.
    const std::string name = "s" + std::to_string(++n_rules_);
    refs_.emplace(r, name);
    const std::string body = expr(*target, r.substr(1));
    rules_ << name << " ::= " << body << "\n";
    return name;
  }

  uint64_t count(const json& s, const char* key, const std::string& at, uint64_t fallback) {
    const auto v = s.find(key);
    if (v == s.end()) return fallback;
    if (!v->is_number() || v->get<double>() < 0 || v->get<double>() != std::floor(v->get<double>()))
      fail(at + "/" + key, std::string("'") + key + "' must be a whole number ≥ 0");
    if (v->get<double>() > double(k_max_count))
      fail(at + "/" + key, std::string("'") + key + "' above " + with_commas(k_max_count) + " is not supported (a grammar repeats an item at most " +
                               with_commas(k_max_count) + " times)");
    return uint64_t(v->get<double>());
  }

  // `item` repeated from min to max times (max UINT64_MAX: no end), separated by `sep`.
  static std::string repeated(const std::string& item, const std::string& sep, uint64_t min, uint64_t max) {
    const std::string rest = sep.empty() ? item : "(" + sep + " " + item + ")";
    const std::string upper = max == UINT64_MAX ? "" : std::to_string(max - 1);
    if (min == 0) return max == 0 ? "" : "(" + item + " " + rest + "{0," + upper + "})?";
    return item + " " + rest + "{" + std::to_string(min - 1) + "," + upper + "}";
  }

  std::string typed(const std::string& t, const json& s, const std::string& at) {
    if (t == "null") return "\"null\" ws";
    if (t == "boolean") return "(\"true\" | \"false\") ws";
    if (t == "integer") return "integer";
    if (t == "number") return "number";
    if (t == "string") {
      const uint64_t min = count(s, "minLength", at, 0), max = count(s, "maxLength", at, UINT64_MAX);
      if (max < min) fail(at, "'maxLength' is below 'minLength'");
      if (min == 0 && max == UINT64_MAX) return "string";
      const std::string upper = max == UINT64_MAX ? "" : std::to_string(max);
      return "\"\\\"\" char{" + std::to_string(min) + "," + upper + "} \"\\\"\" ws";
    }
    if (t == "array") {
      const auto items = s.find("items");
      if (items != s.end() && items->is_array()) fail(at + "/items", "'items' as an array (tuples) is not supported");
      const std::string item = items == s.end() ? "value" : named(expr(*items, at + "/items"));
      const uint64_t min = count(s, "minItems", at, 0), max = count(s, "maxItems", at, UINT64_MAX);
      if (max < min) fail(at, "'maxItems' is below 'minItems'");
      const std::string body = repeated(item, "\",\" ws", min, max);
      return "\"[\" ws " + (body.empty() ? "" : body + " ") + "\"]\" ws";
    }
    if (t == "object") return object(s, at);
    fail(at + "/type", "unknown type '" + t + "'");
  }

  // The listed properties in their order, the required ones always and the others optional, with
  // commas only between those present: B(i) is the properties from i on when none came before,
  // A(i) when one did (so each present property after the first takes a comma). Properties past
  // the listed ones are never written (a schema accepts an object without them whatever its
  // additionalProperties says); without `properties`, any keys, their values per
  // additionalProperties.
  std::string object(const json& s, const std::string& at) {
    const auto props = s.find("properties");
    const auto extra = s.find("additionalProperties");
    std::set<std::string> required;
    if (const auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) fail(at + "/required", "'required' must be an array of names");
      for (const json& n : *r) {
        if (!n.is_string()) fail(at + "/required", "'required' must be an array of names");
        if (props == s.end() || !props->is_object() || !props->contains(n.get<std::string>()))
          fail(at + "/required", "'" + n.get<std::string>() + "' is required but not among the properties");
        required.insert(n.get<std::string>());
      }
    }
    if (props == s.end() || (props->is_object() && props->empty() && required.empty())) {
      if (extra == s.end() || (extra->is_boolean() && extra->get<bool>())) return props == s.end() ? "object" : "\"{\" ws \"}\" ws";
      if (extra->is_boolean()) return "\"{\" ws \"}\" ws";
      const std::string v = expr(*extra, at + "/additionalProperties");
      const std::string pair = rule("string \":\" ws " + v);
      return "\"{\" ws " + repeated(pair, "\",\" ws", 0, UINT64_MAX) + " \"}\" ws";
    }
    if (!props->is_object()) fail(at + "/properties", "'properties' must be an object");
    if (extra != s.end() && !extra->is_boolean() && !extra->is_object())
      fail(at + "/additionalProperties", "'additionalProperties' must be a boolean or a schema");
    std::vector<std::pair<std::string, bool>> kvs;  // each property's "key": value rule, and whether it is required
    for (const auto& [name, schema] : props->items()) {
      const std::string v = expr(schema, at + "/properties/" + pointer_token(name));
      kvs.emplace_back(rule(literal(json(name).dump()) + " ws \":\" ws " + v), required.count(name) != 0);
    }
    std::string after_one, from_start;  // A(i + 1) and B(i + 1); empty past the last property
    for (size_t i = kvs.size(); i-- > 0;) {
      const auto& [kv, req] = kvs[i];
      const std::string then = after_one.empty() ? "" : " " + after_one;
      const std::string a = req ? "\",\" ws " + kv + then : "(\",\" ws " + kv + ")?" + then;
      // (An optional property with nothing optional before the end: "(kv A)?", never a trailing '|',
      // which would take the next line into the rule.)
      const std::string b = req ? kv + then : from_start.empty() ? "(" + kv + then + ")?" : kv + then + " | " + from_start;
      after_one = rule(a);
      from_start = rule(b);
    }
    return "\"{\" ws " + from_start + " \"}\" ws";
  }

  // A property name as a JSON pointer token ('~' and '/' escaped).
  static std::string pointer_token(const std::string& name) {
    std::string out;
    for (const char c : name) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
  }

  const json& root_;
  size_t depth_ = 0;
  std::ostringstream rules_;
  size_t n_rules_ = 0;
  std::map<std::string, std::string> refs_;
  std::map<std::string, std::string> done_;  // a schema's place → its rule
};

}  // namespace

std::string_view json_object_gbnf() {
  static const std::string k_object = "root   ::= object\n" + std::string(k_json_rules);
  return k_object;
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) { return SchemaConverter(schema).convert(); }

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  return Grammar::parse(json_schema_to_gbnf(schema), "(from the JSON schema)");
}

}  // namespace vkllm
