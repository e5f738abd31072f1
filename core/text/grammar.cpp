// Grammars: the GBNF parser (llama.cpp's syntax and rewrite rules), the checks that keep the
// matcher finite, and the pushdown matcher over code points and tokens.
#include "text/grammar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "base/commas.h"
#include "base/error.h"
#include "text/tokenizer.h"

namespace vkllm {
namespace {

using Op = Grammar::Op;
using Element = Grammar::Element;

constexpr uint32_t k_unbounded = std::numeric_limits<uint32_t>::max();
constexpr uint32_t k_max_repetitions = 2000;        // llama.cpp's MAX_REPETITION_THRESHOLD
constexpr size_t k_max_elements = size_t(1) << 22;  // 4M elements, 32 MiB
constexpr size_t k_max_stacks = 4096;               // ways to continue the text at one point
constexpr size_t k_max_nesting = 256;               // groups inside groups (the parser recurses into each)
constexpr size_t k_max_walk = 256;                  // code points of a piece the recursive rejection follows
constexpr size_t k_max_work = 10'000'000;           // steps to decide one token (GrammarMatcher::spend)
constexpr size_t k_expansion_cost = 20;             // steps a rule expansion counts for (copies a stack)

bool is_word_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool end_of_sequence(Op op) { return op == Op::End || op == Op::Alt; }

// Decodes a token's bytes after `partial` as llama.cpp's grammar does: code points up to the end
// or a NUL byte, then a terminating 0. A byte that cannot begin a character (or continue the
// partial one) makes the piece not UTF-8: no code points, tail n_remain −1.
std::vector<uint32_t> decode_piece(std::string_view bytes, PartialUtf8 partial, PartialUtf8& tail) {
  static constexpr int k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
  std::vector<uint32_t> cps;
  cps.reserve(bytes.size() + 1);
  size_t pos = 0;
  const auto more = [&] { return pos < bytes.size() && bytes[pos] != '\0'; };
  uint32_t value = partial.value;
  int n_remain = partial.n_remain;
  while (more() && n_remain > 0) {
    const auto b = uint8_t(bytes[pos]);
    if ((b >> 6) != 2) {
      tail = {0, -1};
      return {0};
    }
    value = (value << 6) | (b & 0x3Fu);
    ++pos;
    --n_remain;
  }
  if (partial.n_remain > 0 && n_remain == 0) cps.push_back(value);
  while (more()) {
    const auto lead = uint8_t(bytes[pos]);
    n_remain = k_len[lead >> 4] - 1;
    if (n_remain < 0) {
      tail = {0, -1};
      return {0};
    }
    value = lead & ((1u << (7 - n_remain)) - 1);
    for (++pos; more() && n_remain > 0; ++pos, --n_remain) value = (value << 6) | (uint8_t(bytes[pos]) & 0x3Fu);
    if (n_remain == 0) cps.push_back(value);
  }
  cps.push_back(0);
  tail = {value, n_remain};
  return cps;
}

// Whether code point c satisfies the character element at `at` (a class, a negated class or
// '.'), and the position after the element.
std::pair<bool, uint32_t> match_char(const std::vector<Element>& e, uint32_t at, uint32_t c) {
  const bool positive = e[at].op == Op::Char || e[at].op == Op::CharAny;
  bool found = false;
  do {
    if (e[at + 1].op == Op::RangeUpper) {
      found = found || (e[at].value <= c && c <= e[at + 1].value);
      at += 2;
    } else {
      found = found || e[at].op == Op::CharAny || e[at].value == c;
      at += 1;
    }
  } while (e[at].op == Op::CharAlt);
  return {found == positive, at};
}

// Whether some completion of an unfinished UTF-8 character could satisfy the element at `at`.
bool match_partial_char(const std::vector<Element>& e, uint32_t at, PartialUtf8 partial) {
  const bool positive = e[at].op == Op::Char || e[at].op == Op::CharAny;
  // Not UTF-8, or a 7-bit character spread over two bytes (overlong).
  if (partial.n_remain < 0 || (partial.n_remain == 1 && partial.value < 2)) return false;
  const int bits = partial.n_remain * 6;
  uint32_t low = partial.value << bits;
  const uint32_t high = low | ((1u << bits) - 1);
  if (low == 0 && partial.n_remain == 2) low = 1u << 11;
  if (low == 0 && partial.n_remain == 3) low = 1u << 16;
  do {
    if (e[at + 1].op == Op::RangeUpper) {
      if (e[at].value <= high && low <= e[at + 1].value) return positive;
      at += 2;
    } else {
      if (e[at].op == Op::CharAny) return true;
      if (low <= e[at].value && e[at].value <= high) return positive;
      at += 1;
    }
  } while (e[at].op == Op::CharAlt);
  return !positive;
}

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
    const bool cyclic = check_left_recursion();
    if (!derivable(true)[root->second]) {
      fail(defined_at_[root->second], "rule 'root' can never end: every way through it refers back to itself without end");
    }

    auto g = std::shared_ptr<Grammar>(new Grammar());
    g->root_ = root->second;
    g->cyclic_ = cyclic;
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
        if (end_of_sequence(e.op)) {
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
  // Returns whether some (stack-preserving) cycle remains.
  bool check_left_recursion() const {
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
        if (end_of_sequence(e.op)) {
          open = true;
        } else if (open && e.op == Op::Ref) {
          begins[r].push_back({e.value, !end_of_sequence(rule[i + 1].op)});
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
    bool cyclic = false;
    for (uint32_t r = 0; r < n; ++r) {
      for (const Edge& e : begins[r]) {
        if (component[e.to] != component[r]) continue;
        if (e.grows) {
          fail(defined_at_[r], rule_name(r) + " is left-recursive: it can reach itself before reading a character, with more to read "
                               "after it (write it with a repetition, as item*)");
        }
        cyclic = true;
      }
    }
    return cyclic;
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

GrammarVocab::GrammarVocab(const Tokenizer& tok) {
  const auto n = size_t(tok.n_vocab());
  pieces_.reserve(n);
  eog_.reserve(n);
  tail_.reserve(n);
  at_.reserve(n + 1);
  at_.push_back(0);
  for (int32_t id = 0; id < int32_t(n); ++id) {
    pieces_.push_back(tok.token_to_piece(id, true));
    eog_.push_back(tok.is_eog(id) ? 1 : 0);
    PartialUtf8 tail;
    const std::vector<uint32_t> cps = decode_piece(pieces_.back(), {}, tail);
    cps_.insert(cps_.end(), cps.begin(), cps.end());
    at_.push_back(uint32_t(cps_.size()));
    tail_.push_back(tail);
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  const std::vector<Element>& e = grammar_->elements();
  for (uint32_t alt : grammar_->root_alternatives()) {
    Stack s;
    if (!end_of_sequence(e[alt].op)) s.push_back(alt);
    advance(std::move(s), stacks_);
  }
  dedup(stacks_);
}

// Stacks in sorted order without repeats; more than k_max_stacks is an error.
void GrammarMatcher::dedup(std::vector<Stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > k_max_stacks) {
    throw GrammarError("grammar: more than " + with_commas(k_max_stacks) + " ways to continue the text (the grammar is too ambiguous)");
  }
}

// Expands the rule references on top of `stack` until every resulting stack has a character
// element on top (or is empty: the text may end), appending them to `out`, which the caller
// dedups (sorting once costs less than a search per stack). A stack with a reference on top is
// expanded once: a repetition of an item that can match the empty text comes back to it.
void GrammarMatcher::advance(Stack stack, std::vector<Stack>& out) const {
  const std::vector<Element>& e = grammar_->elements();
  std::vector<Stack> todo;
  todo.push_back(std::move(stack));
  std::set<Stack> expanded_stacks;
  while (!todo.empty()) {
    Stack s = std::move(todo.back());
    todo.pop_back();
    if (s.empty() || e[s.back()].op != Op::Ref) {
      out.push_back(std::move(s));
      if (out.size() > 4 * k_max_stacks) dedup(out);
      continue;
    }
    if (grammar_->cyclic() && !expanded_stacks.insert(s).second) continue;
    const uint32_t at = s.back();
    s.pop_back();
    if (!end_of_sequence(e[at + 1].op)) s.push_back(at + 1);
    const std::vector<uint32_t>& alts = grammar_->alternatives(e[at].value);
    spend(k_expansion_cost * alts.size());  // a copy of the stack each
    for (auto it = alts.rbegin(); it != alts.rend(); ++it) {
      Stack next = s;
      if (!end_of_sequence(e[*it].op)) next.push_back(*it);
      todo.push_back(std::move(next));
    }
  }
}

void GrammarMatcher::accept_code_point(uint32_t cp) {
  const std::vector<Element>& e = grammar_->elements();
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;
    const auto [ok, after] = match_char(e, s.back(), cp);
    if (!ok) continue;
    Stack n(s.begin(), s.end() - 1);
    if (!end_of_sequence(e[after].op)) n.push_back(after);
    advance(std::move(n), next);
  }
  dedup(next);
  stacks_ = std::move(next);
}

// The candidates no stack can take: llama.cpp's rejection (a candidate is allowed when some stack
// takes its code points, followed down the stacks they lead to), with a level's candidates grouped
// by the set of stacks that take their next code point: each group goes one level down once, on
// the union of those stacks advanced past it. A stack finds its code points by looking its class's
// characters and ranges up among the level's (sorted) distinct code points, so an enum of
// thousands of strings costs its matches, not stacks × vocabulary; and two stacks that take the
// same characters (`([a-z]+)*`) go on together, where following each alone cost 2^length on a
// token rejected deep down.
std::vector<GrammarMatcher::Candidate> GrammarMatcher::reject(const std::vector<Stack>& stacks,
                                                              const std::vector<Candidate>& candidates) const {
  if (candidates.empty() || stacks.empty()) return candidates;
  const std::vector<Element>& e = grammar_->elements();
  std::vector<char> accepted(candidates.size(), 0);
  std::vector<std::pair<uint32_t, uint32_t>> by_cp;  // (next code point, position in candidates)
  for (uint32_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (*c.cp != 0) {
      by_cp.emplace_back(*c.cp, i);
    } else if (c.partial.n_remain == 0) {
      accepted[i] = 1;  // used up with no character open: any stack takes it (llama.cpp rejects it on none)
    } else if (c.partial.n_remain > 0) {  // inside a character: a stack its completion could satisfy
      spend(stacks.size());
      accepted[i] = std::any_of(stacks.begin(), stacks.end(),
                                [&](const Stack& s) { return !s.empty() && match_partial_char(e, s.back(), c.partial); });
    }  // (n_remain < 0: not UTF-8, never)
  }
  spend(by_cp.size());
  std::sort(by_cp.begin(), by_cp.end());
  std::vector<uint32_t> cps, run_at;  // the distinct next code points, and where each one's run begins in by_cp
  for (uint32_t k = 0; k < by_cp.size(); ++k) {
    if (k == 0 || by_cp[k].first != by_cp[k - 1].first) {
      cps.push_back(by_cp[k].first);
      run_at.push_back(k);
    }
  }
  run_at.push_back(uint32_t(by_cp.size()));
  std::vector<std::vector<uint32_t>> takers(cps.size());  // the stacks that take each code point
  const auto take = [&](size_t d, uint32_t si) {
    spend(1);
    if (takers[d].empty() || takers[d].back() != si) takers[d].push_back(si);
  };
  for (uint32_t si = 0; si < stacks.size(); ++si) {
    if (stacks[si].empty()) continue;  // takes only used-up pieces: above
    const uint32_t top = stacks[si].back();
    if (e[top].op == Op::Char) {  // a class or a literal's character: look its characters and ranges up
      uint32_t at = top;
      do {
        const uint32_t lo = e[at].value, hi = e[at + 1].op == Op::RangeUpper ? e[at + 1].value : lo;
        for (size_t d = size_t(std::lower_bound(cps.begin(), cps.end(), lo) - cps.begin()); d < cps.size() && cps[d] <= hi; ++d) take(d, si);
        at += e[at + 1].op == Op::RangeUpper ? 2 : 1;
      } while (e[at].op == Op::CharAlt);
    } else {  // a negated class or '.': each code point tested
      for (size_t d = 0; d < cps.size(); ++d) {
        spend(1);
        if (match_char(e, top, cps[d]).first) take(d, si);
      }
    }
  }
  std::vector<std::vector<Stack>> after(stacks.size());  // each stack past its character, advanced (once)
  std::vector<char> advanced(stacks.size(), 0);
  const auto advanced_stack = [&](uint32_t si) -> const std::vector<Stack>& {
    if (!advanced[si]) {
      advanced[si] = 1;
      const uint32_t past = match_char(e, stacks[si].back(), 0).second;
      Stack s(stacks[si].begin(), stacks[si].end() - 1);
      if (!end_of_sequence(e[past].op)) s.push_back(past);
      advance(std::move(s), after[si]);
      dedup(after[si]);
    }
    return after[si];
  };
  // The code points taken by the same stacks go on together: one union of those stacks, one level
  // down for all their candidates.
  std::map<std::vector<uint32_t>, std::vector<uint32_t>> groups;  // the stacks that take them → the code points
  for (uint32_t d = 0; d < cps.size(); ++d)
    if (!takers[d].empty()) groups[takers[d]].push_back(d);
  for (const auto& [who, ds] : groups) {
    std::vector<Stack> joined;
    if (who.size() > 1) {
      for (const uint32_t si : who) {
        const std::vector<Stack>& part = advanced_stack(si);
        spend(part.size() * k_expansion_cost);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      dedup(joined);
    }
    const std::vector<Stack>& next_stacks = who.size() > 1 ? joined : advanced_stack(who.front());
    std::vector<Candidate> next;
    for (const uint32_t d : ds) {
      for (uint32_t k = run_at[d]; k < run_at[d + 1]; ++k) {
        const Candidate& c = candidates[by_cp[k].second];
        next.push_back({c.index, c.cp + 1, c.partial});
      }
    }
    std::vector<uint32_t> rejected;
    for (const Candidate& c : reject(next_stacks, next)) rejected.push_back(c.index);
    std::sort(rejected.begin(), rejected.end());
    for (const uint32_t d : ds) {
      for (uint32_t k = run_at[d]; k < run_at[d + 1]; ++k)
        if (!std::binary_search(rejected.begin(), rejected.end(), candidates[by_cp[k].second].index)) accepted[by_cp[k].second] = 1;
    }
  }
  std::vector<Candidate> rejects;
  for (uint32_t i = 0; i < candidates.size(); ++i)
    if (!accepted[i]) rejects.push_back(candidates[i]);
  return rejects;
}

// Counts work toward the bound on deciding one token: a grammar whose stacks make every token cost
// thousands of steps stops with an error instead of stalling the generation (and a server's other
// requests) for minutes.
void GrammarMatcher::spend(size_t steps) const {
  work_ += steps;
  if (work_ > k_max_work) {
    throw GrammarError("grammar: more than " + with_commas(k_max_work) + " steps to decide the next token (the grammar is too ambiguous)");
  }
}

// Accepts a piece's code points on these stacks and says whether it fits: some stack took them all
// and, where it ends inside a character, could take the character's completion.
bool GrammarMatcher::walk(const std::vector<uint32_t>& cps, PartialUtf8 tail) {
  for (size_t i = 0; i + 1 < cps.size() && !stacks_.empty(); ++i) accept_code_point(cps[i]);
  if (tail.n_remain == 0) return !stacks_.empty();
  const std::vector<Element>& e = grammar_->elements();
  return std::any_of(stacks_.begin(), stacks_.end(), [&](const Stack& s) { return !s.empty() && match_partial_char(e, s.back(), tail); });
}

// Whether a piece fits, walked on a copy of the stacks (for one token, and for a piece too long
// for mask()'s recursive rejection).
bool GrammarMatcher::allows_by_walking(const std::vector<uint32_t>& cps, PartialUtf8 tail) const {
  GrammarMatcher walker = *this;
  return walker.walk(cps, tail);
}

bool GrammarMatcher::complete() const {
  return partial_.n_remain == 0 && std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarMatcher::allows(int32_t token) const {
  work_ = 0;
  if (token < 0 || size_t(token) >= vocab_->size()) return false;
  if (vocab_->is_eog(token)) return complete();
  if (vocab_->no_text(token)) return false;
  // Walked a code point at a time, not through mask()'s rejection: two ways to the same answer
  // (Grammar.MaskAgreesWithSingleTokenChecks holds them to it).
  PartialUtf8 tail;
  return allows_by_walking(decode_piece(vocab_->piece(token), partial_, tail), tail);
}

size_t GrammarMatcher::mask(std::span<float> logits) const {
  work_ = 0;
  constexpr float k_none = -std::numeric_limits<float>::infinity();
  const bool can_end = complete();
  const bool fresh = partial_.n_remain == 0;
  std::vector<std::vector<uint32_t>> decoded;  // the pieces decoded after an unfinished character
  std::vector<Candidate> candidates;
  for (size_t id = 0; id < logits.size(); ++id) {
    const auto tok = int32_t(id);
    if (logits[id] == k_none) continue;
    if (id >= vocab_->size() || (vocab_->is_eog(tok) ? !can_end : vocab_->no_text(tok))) {
      logits[id] = k_none;
      continue;
    }
    if (vocab_->is_eog(tok)) continue;
    if (fresh && vocab_->n_code_points(tok) <= k_max_walk) {
      candidates.push_back({uint32_t(id), vocab_->code_points(tok), vocab_->tail(tok)});
      continue;
    }
    // Inside a character only continuation bytes can come next: the rest go undecoded.
    if (!fresh && (uint8_t(vocab_->piece(tok)[0]) & 0xC0) != 0x80) {
      logits[id] = k_none;
      continue;
    }
    PartialUtf8 tail;
    decoded.push_back(decode_piece(vocab_->piece(tok), partial_, tail));
    if (decoded.back().size() - 1 > k_max_walk) {
      if (!allows_by_walking(decoded.back(), tail)) logits[id] = k_none;
      continue;
    }
    candidates.push_back({uint32_t(id), decoded.back().data(), tail});
  }
  for (const Candidate& c : reject(stacks_, candidates)) logits[c.index] = k_none;
  return size_t(std::count_if(logits.begin(), logits.end(), [&](float l) { return l != k_none; }));
}

void GrammarMatcher::accept(int32_t token) {
  const auto refuse = [&] { return GrammarError("grammar: token " + std::to_string(token) + " does not continue the text the grammar allows"); };
  if (token < 0 || size_t(token) >= vocab_->size()) throw refuse();
  if (vocab_->is_eog(token)) {
    if (!complete()) throw refuse();
    return;
  }
  if (vocab_->no_text(token)) throw refuse();
  work_ = 0;
  PartialUtf8 tail;
  const std::vector<uint32_t> cps = decode_piece(vocab_->piece(token), partial_, tail);
  std::vector<Stack> before = stacks_;
  bool fits = false;
  try {
    fits = walk(cps, tail);
  } catch (...) {  // a bound passed midway: the stacks stay as they were
    stacks_ = std::move(before);
    throw;
  }
  if (!fits) {
    stacks_ = std::move(before);
    throw refuse();
  }
  partial_ = tail;
}

}  // namespace vkllm
