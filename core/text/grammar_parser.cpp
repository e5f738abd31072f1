// Grammars: the GBNF parser (llama.cpp's syntax and rewrite rules) and the checks that keep the
// matcher finite (left recursion, a root that can end).
#include "text/grammar.h"

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "base/commas.h"
#include "base/error.h"

namespace vkllm {
namespace {

using Op = Grammar::Op;
using Element = Grammar::Element;

constexpr uint32_t k_unbounded = std::numeric_limits<uint32_t>::max();
constexpr uint32_t k_max_repetitions = Grammar::k_max_repetitions;
constexpr size_t k_max_elements = size_t(1) << 22;  // 4M elements, 32 MiB
constexpr size_t k_max_nesting = 256;               // groups inside groups (the parser recurses into each)

bool is_word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

// GBNF as llama.cpp reads it: `name ::= alternatives` rules, one per line (a rule continues on
// the next lines only inside parentheses or after '|'), "literals" and [classes] with \x \u \U
// \t \r \n \\ \" \[ \] escapes, '.', groups, and * + ? {m} {m,} {m,n} rewritten into generated
// rules as llama.cpp rewrites them. Names are letters, digits and '-'; '#' comments to the end
// of the line. Stricter than llama.cpp where it would accept a grammar it then mishandles or
// crashes on: empty or backwards classes, {m,n} with n < m, left recursion through rules that
// match the empty text, and NUL bytes are errors.
class GrammarParser {
 public:
  GrammarParser(std::string_view src, const std::string& origin) : src_(src), origin_(origin) {}

  std::shared_ptr<const Grammar> parse() {
    if (const size_t nul = src_.find('\0'); nul != std::string_view::npos) fail(nul, "a NUL byte");
    skip_space(true);
    while (pos_ < src_.size()) parse_rule();
    if (rules_.empty()) throw Error("grammar " + origin_ + " has no rules");
    for (size_t id = 0; id < rules_.size(); ++id) {
      if (!defined_[id]) fail(first_use_[id], "rule '" + names_[id] + "' is used but never defined");
    }
    const auto root = ids_.find("root");
    if (root == ids_.end()) throw Error("grammar " + origin_ + " has no rule 'root' (generation starts there)");
    check_left_recursion();
    if (!derivable(true)[root->second]) {
      fail(defined_at_[root->second], "rule 'root' can never end: every way through it refers back to itself without end");
    }

    auto g = std::shared_ptr<Grammar>(new Grammar());
    g->root_ = root->second;
    for (std::vector<Element>& rule : rules_) {
      g->rule_at_.push_back(uint32_t(g->elems_.size()));
      g->elems_.insert(g->elems_.end(), rule.begin(), rule.end());
    }
    for (uint32_t id = 0; id < rules_.size(); ++id) {
      std::vector<uint32_t> starts{g->rule_at_[id]};
      for (uint32_t at = g->rule_at_[id]; g->elems_[at].op != Op::End; ++at) {
        if (g->elems_[at].op == Op::Alt) starts.push_back(at + 1);
      }
      g->alts_.push_back(std::move(starts));
    }
    return g;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& msg) const {
    const size_t end = std::min(at, src_.size());
    const size_t newline = end == 0 ? std::string_view::npos : src_.rfind('\n', end - 1);
    const size_t column = end - (newline == std::string_view::npos ? 0 : newline + 1) + 1;
    throw Error("grammar " + origin_ + ": " + where(end) + ", column " + std::to_string(column) + ": " + msg);
  }
  char peek(size_t ahead = 0) const { return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0'; }
  bool at_end() const { return pos_ >= src_.size(); }

  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\r' && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (is_word_char(peek())) ++pos_;
    if (pos_ == start) fail(start, "expecting a rule name (letters, digits and '-')");
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t parse_int() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (is_digit(peek())) {
      v = std::min<uint64_t>(v * 10 + uint64_t(peek() - '0'), uint64_t(k_unbounded));
      ++pos_;
    }
    if (pos_ == start) fail(start, "expecting a number");
    return uint32_t(v);
  }

  uint32_t parse_hex(size_t digits) {
    const size_t start = pos_;
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i, ++pos_) {
      const char c = peek();
      const int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) fail(start, "expecting " + std::to_string(digits) + " hex digits");
      v = (v << 4) | uint32_t(d);
    }
    return v;
  }

  // One character of a literal or a class: an escape or a UTF-8 sequence.
  uint32_t parse_char() {
    const size_t start = pos_;
    if (at_end()) fail(start, "unexpected end of the grammar");
    if (peek() == '\\') {
      if (pos_ + 1 >= src_.size()) fail(start, "unexpected end of the grammar");
      const char c = peek(1);
      pos_ += 2;
      switch (c) {
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        case 't': return '\t';
        case 'r': return '\r';
        case 'n': return '\n';
        case '\\': case '"': case '[': case ']': return uint32_t(uint8_t(c));
        default: fail(start, "unknown escape '\\" + std::string(1, c) + "'");
      }
    }
    const auto lead = uint8_t(peek());
    const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > src_.size()) fail(start, "the grammar is not UTF-8 here");
    uint32_t v = len == 1 ? lead : lead & (0x7Fu >> len);
    for (size_t i = 1; i < len; ++i) {
      const auto b = uint8_t(src_[pos_ + i]);
      if ((b >> 6) != 2) fail(start, "the grammar is not UTF-8 here");
      v = (v << 6) | (b & 0x3Fu);
    }
    pos_ += len;
    return v;
  }

  uint32_t symbol(const std::string& name, size_t at) {
    const auto [it, inserted] = ids_.emplace(name, uint32_t(rules_.size()));
    if (inserted) add_symbol(name, at);
    return it->second;
  }
  // A rule generated for a group or a repetition inside rule `parent`.
  uint32_t new_symbol(uint32_t parent) {
    const auto id = uint32_t(rules_.size());
    add_symbol(names_[parent], pos_);
    generated_.back() = true;
    return id;
  }
  void add_symbol(const std::string& name, size_t at) {
    names_.push_back(name);
    rules_.emplace_back();
    defined_.push_back(false);
    generated_.push_back(false);
    first_use_.push_back(at);
    defined_at_.push_back(at);
  }
  // `at`: where the definition (a rule's name, a group's '(', a repetition's operator) is.
  void define(uint32_t id, std::vector<Element> rule, size_t at) {
    grow(rule.size());
    rules_[id] = std::move(rule);  // a rule defined twice: the last definition holds (as llama.cpp)
    defined_[id] = true;
    defined_at_[id] = at;
  }
  // A rule as errors name it.
  std::string rule_name(uint32_t id) const {
    return generated_[id] ? "a group or repetition in rule '" + names_[id] + "'" : "rule '" + names_[id] + "'";
  }
  void grow(size_t n) {
    n_elements_ += n;
    if (n_elements_ > k_max_elements) {
      fail(pos_, "the grammar grows past " + with_commas(k_max_elements) + " elements (repetitions of long items)");
    }
  }

  void parse_rule() {
    const size_t at = pos_;
    const std::string name = parse_name();
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=") {
      fail(pos_, "expecting '::=' after the rule name '" + name + "' (names are letters, digits and '-')");
    }
    pos_ += 3;
    skip_space(true);
    parse_alternates(symbol(name, at), false, at);
    if (peek() == '\r') {
      pos_ += peek(1) == '\n' ? 2 : 1;
    } else if (peek() == '\n') {
      ++pos_;
    } else if (!at_end()) {
      fail(pos_, peek() == '<' ? "token references (<…>) are not supported"
                               : "expecting the end of the line after rule '" + name + "'");
    }
    skip_space(true);
  }

  void parse_alternates(uint32_t id, bool nested, size_t at) {
    std::vector<Element> rule;
    parse_sequence(rule, id, nested);
    while (peek() == '|') {
      rule.push_back({Op::Alt, 0});
      ++pos_;
      skip_space(true);
      parse_sequence(rule, id, nested);
    }
    rule.push_back({Op::End, 0});
    define(id, std::move(rule), at);
  }

  void parse_sequence(std::vector<Element>& rule, uint32_t id, bool nested) {
    size_t last_start = rule.size();  // where the item a repetition applies to begins
    while (!at_end()) {
      const size_t at = pos_;
      const char c = peek();
      if (c == '"') {
        ++pos_;
        last_start = rule.size();
        while (peek() != '"') {
          if (at_end()) fail(at, "this string literal never ends");
          rule.push_back({Op::Char, parse_char()});
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        const Op first = peek() == '^' ? Op::CharNot : Op::Char;
        if (first == Op::CharNot) ++pos_;
        last_start = rule.size();
        while (peek() != ']') {
          if (at_end()) fail(at, "this character class never ends");
          const uint32_t lo = parse_char();
          rule.push_back({rule.size() > last_start ? Op::CharAlt : first, lo});
          if (peek() == '-' && peek(1) != ']' && !at_end()) {
            ++pos_;
            const size_t hi_at = pos_;
            const uint32_t hi = parse_char();
            if (hi < lo) fail(hi_at, "the range's end is below its start");
            rule.push_back({Op::RangeUpper, hi});
          }
        }
        if (rule.size() == last_start) fail(at, "an empty character class");
        ++pos_;
      } else if (is_word_char(c)) {
        const uint32_t ref = symbol(parse_name(), at);
        last_start = rule.size();
        rule.push_back({Op::Ref, ref});
      } else if (c == '(') {
        if (++depth_ > k_max_nesting) fail(at, "groups nest deeper than " + std::to_string(k_max_nesting) + " levels");
        ++pos_;
        skip_space(true);
        const uint32_t sub = new_symbol(id);
        parse_alternates(sub, true, at);
        if (peek() != ')') fail(pos_, "expecting ')' to close the group opened at " + where(at));
        ++pos_;
        --depth_;
        last_start = rule.size();
        rule.push_back({Op::Ref, sub});
      } else if (c == '.') {
        ++pos_;
        last_start = rule.size();
        rule.push_back({Op::CharAny, 0});
      } else if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        repeat(rule, last_start, c == '+' ? 1 : 0, c == '?' ? 1 : k_unbounded, id, at);
      } else if (c == '{') {
        ++pos_;
        skip_space(nested);
        const uint32_t min = parse_int();
        uint32_t max = min;
        skip_space(nested);
        if (peek() == ',') {
          ++pos_;
          skip_space(nested);
          max = is_digit(peek()) ? parse_int() : k_unbounded;
          skip_space(nested);
        }
        if (peek() != '}') fail(pos_, "expecting '}' to close the repetition");
        ++pos_;
        repeat(rule, last_start, min, max, id, at);
      } else {
        break;
      }
      skip_space(nested);
    }
  }

  // item{min,max}: `min` copies of the item, then rules for the optional rest (llama.cpp's rewrite):
  //   S{m,n} → S…S (m) S'(n−m),  S'(k) ::= S S'(k−1) | ,  S'(1) ::= S |
  //   S{m,}  → S…S (m) S',       S' ::= S S' |
  void repeat(std::vector<Element>& rule, size_t last_start, uint32_t min, uint32_t max, uint32_t id, size_t at) {
    if (last_start == rule.size()) fail(at, "a repetition needs an item before it");
    if (min > k_max_repetitions || (max != k_unbounded && max > k_max_repetitions)) {
      fail(at, "more than " + with_commas(k_max_repetitions) + " repetitions");
    }
    if (max < min) fail(at, "the repetition's maximum is below its minimum");
    const std::vector<Element> item(rule.begin() + ptrdiff_t(last_start), rule.end());
    if (min == 0) rule.resize(last_start);
    for (uint32_t i = 1; i < min; ++i) {
      grow(item.size());
      rule.insert(rule.end(), item.begin(), item.end());
    }
    const uint32_t n_optional = max == k_unbounded ? 1 : max - min;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n_optional; ++i) {
      const uint32_t rest = new_symbol(id);
      std::vector<Element> r = item;
      if (max == k_unbounded) r.push_back({Op::Ref, rest});
      else if (i > 0) r.push_back({Op::Ref, last});
      r.push_back({Op::Alt, 0});
      r.push_back({Op::End, 0});
      define(rest, std::move(r), at);
      last = rest;
    }
    if (n_optional > 0) rule.push_back({Op::Ref, last});
  }

  std::string where(size_t at) const {
    const size_t line = size_t(std::count(src_.begin(), src_.begin() + ptrdiff_t(at), '\n')) + 1;
    return "line " + std::to_string(line);
  }

  // The rules that can derive a text (with `chars_pass`: any text; without: the empty text, a
  // character blocking its alternative). An alternative is done once each of its references is;
  // each reference is counted down once, when its rule is found (Knuth's worklist: linear, where a
  // pass over all rules per rule found was quadratic in a chain of them).
  std::vector<char> derivable(bool chars_pass) const {
    const size_t n = rules_.size();
    constexpr uint32_t k_blocked = std::numeric_limits<uint32_t>::max() / 2;
    std::vector<std::pair<uint32_t, uint32_t>> alts;  // (rule, references not yet done)
    std::vector<std::vector<uint32_t>> users(n);     // rule → the alternatives that refer to it, once per reference
    std::vector<uint32_t> found;
    for (uint32_t r = 0; r < n; ++r) {
      alts.emplace_back(r, 0);
      for (const Element& e : rules_[r]) {
        if (Grammar::ends(e.op)) {
          if (alts.back().second == 0) found.push_back(r);
          if (e.op == Op::Alt) alts.emplace_back(r, 0);
        } else if (e.op == Op::Ref) {
          users[e.value].push_back(uint32_t(alts.size() - 1));
          ++alts.back().second;
        } else if (!chars_pass && e.op != Op::RangeUpper && e.op != Op::CharAlt) {
          alts.back().second += k_blocked;
        }
      }
    }
    std::vector<char> done(n, 0);
    while (!found.empty()) {
      const uint32_t r = found.back();
      found.pop_back();
      if (done[r]) continue;
      done[r] = 1;
      for (const uint32_t a : users[r])
        if (--alts[a].second == 0) found.push_back(alts[a].first);
    }
    return done;
  }

  // Left recursion: a rule that can reach itself before reading a character, with more of the
  // rule to read after the way back (a reference that is not the last of its alternative), pushes
  // onto the stack without end, so the matcher would expand it forever. Rules that match the empty
  // text are found first (through references too, where llama.cpp looks at empty alternatives
  // only). Then the "can begin with" edges between rules, each marked when it grows the stack, go
  // into strongly connected components: a marked edge inside one is on such a cycle. A cycle of
  // unmarked edges (a repetition of an item that can be empty, `("a"?)*`) comes back to the same
  // stack, which the matcher expands once (as llama.cpp does), so it is taken.
  void check_left_recursion() const {
    const size_t n = rules_.size();
    const std::vector<char> nullable = derivable(false);
    struct Edge {
      uint32_t to;
      bool grows;
    };
    std::vector<std::vector<Edge>> begins(n);  // r → the rules r can begin with
    std::vector<std::vector<uint32_t>> begun_by(n);
    for (size_t r = 0; r < n; ++r) {
      bool open = true;
      const std::vector<Element>& rule = rules_[r];
      for (size_t i = 0; i < rule.size(); ++i) {
        const Element& e = rule[i];
        if (Grammar::ends(e.op)) {
          open = true;
        } else if (open && e.op == Op::Ref) {
          begins[r].push_back({e.value, !Grammar::ends(rule[i + 1].op)});
          begun_by[e.value].push_back(uint32_t(r));
          open = nullable[e.value] != 0;
        } else {
          open = false;
        }
      }
    }
    // Kosaraju, without recursion: finishing order on the edges, then components on the reversed ones.
    std::vector<uint32_t> order;
    std::vector<char> seen(n, 0);
    for (uint32_t start = 0; start < n; ++start) {
      if (seen[start]) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{start, 0}};
      seen[start] = 1;
      while (!path.empty()) {
        auto& [r, next] = path.back();
        if (next == begins[r].size()) {
          order.push_back(r);
          path.pop_back();
        } else if (const uint32_t q = begins[r][next++].to; !seen[q]) {
          seen[q] = 1;
          path.push_back({q, 0});
        }
      }
    }
    constexpr uint32_t k_none = std::numeric_limits<uint32_t>::max();
    std::vector<uint32_t> component(n, k_none);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (component[*it] != k_none) continue;
      std::vector<uint32_t> todo{*it};
      component[*it] = *it;
      while (!todo.empty()) {
        const uint32_t r = todo.back();
        todo.pop_back();
        for (const uint32_t q : begun_by[r]) {
          if (component[q] == k_none) {
            component[q] = *it;
            todo.push_back(q);
          }
        }
      }
    }
    for (uint32_t r = 0; r < n; ++r) {
      for (const Edge& e : begins[r]) {
        if (e.grows && component[e.to] == component[r]) {
          fail(defined_at_[r], rule_name(r) + " is left-recursive: it can reach itself before reading a character, with more to read "
                               "after it (write it with a repetition, as item*)");
        }
      }
    }
  }

  std::string_view src_;
  std::string origin_;
  size_t pos_ = 0;
  std::map<std::string, uint32_t, std::less<>> ids_;
  std::vector<std::string> names_;  // per rule: its name (a generated rule: the rule it came from)
  std::vector<std::vector<Element>> rules_;
  std::vector<bool> defined_;
  std::vector<bool> generated_;    // per rule: made for a group or a repetition
  std::vector<size_t> first_use_;  // where each rule is first named
  std::vector<size_t> defined_at_;
  size_t n_elements_ = 0;
  size_t depth_ = 0;  // groups open around the parser
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text, const std::string& origin) {
  return GrammarParser(text, origin).parse();
}

}  // namespace vkllm
