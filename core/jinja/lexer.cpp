// Jinja lexer: template source → text and tag tokens, applying trim_blocks, lstrip_blocks and
// the '-'/'+' whitespace markers exactly as Jinja2's lexer does.
#include "jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "base/error.h"
#include "jinja/text.h"
#include "base/utf8.h"

namespace vkllm::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Jinja2 normalises every newline sequence to '\n' and drops one trailing newline
// (keep_trailing_newline=False).
std::string normalize_source(const std::string& in) {
  std::string s;
  s.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      s += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      s += in[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class Lexer {
 public:
  Lexer(const std::string& src, const LexOptions& o) : s_(normalize_source(src)), o_(o) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (true) {
      size_t p = find_tag(pos);
      std::string text = s_.substr(pos, (p == std::string::npos ? s_.size() : p) - pos);
      if (p == std::string::npos) {
        emit_text(std::move(text), pos);
        break;
      }
      const char type = s_[p + 1];  // '{', '%' or '#'
      const char ctrl = p + 2 < s_.size() ? s_[p + 2] : '\0';
      strip_before_tag(text, type, ctrl, line_starting);
      emit_text(std::move(text), pos);
      size_t q = p + 2 + (ctrl == '-' || ctrl == '+' ? 1 : 0);
      if (type == '#') {
        pos = end_of_comment(p, q);
      } else if (type == '%' && is_raw_tag(q, "raw")) {
        pos = lex_raw(p, q);
      } else {
        pos = lex_tag(p, q, type == '{');
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    toks_.push_back(Token{Tok::Eof, "", 0, 0});
    set_pos(toks_.back(), s_.size());
    return std::move(toks_);
  }

 private:
  const std::string s_;
  const LexOptions o_;
  std::vector<size_t> line_starts_;
  std::vector<Token> toks_;

  void set_pos(Token& t, size_t pos) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    const size_t li = static_cast<size_t>(it - line_starts_.begin()) - 1;
    t.line = static_cast<int>(li + 1);
    t.col = static_cast<int>(pos - line_starts_[li] + 1);
  }

  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    Token t;
    set_pos(t, pos);
    throw Error("line " + std::to_string(t.line) + ", column " + std::to_string(t.col) + ": " + msg);
  }

  size_t find_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1))
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  void emit_text(std::string text, size_t pos) {
    if (text.empty()) return;
    Token t{Tok::Text, std::move(text), 0, 0};
    set_pos(t, pos);
    toks_.push_back(std::move(t));
  }

  void strip_before_tag(std::string& text, char type, char ctrl, bool line_starting) const {
    if (ctrl == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (ctrl != '+' && o_.lstrip_blocks && type != '{') {
      const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          std::all_of(text.begin() + static_cast<long>(l_pos), text.end(), is_space))
        text.resize(l_pos);
    }
  }

  // Position after a tag end at `end` (pointing at '%' or '#' or '}' of the closing pair, with
  // `ctrl` the character before it), applying '-' and trim_blocks.
  size_t after_tag_end(size_t close_end, char ctrl, bool trims) const {
    size_t pos = close_end;
    if (ctrl == '-') {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
    } else if (ctrl != '+' && trims && o_.trim_blocks && pos < s_.size() && s_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t end_of_comment(size_t start, size_t q) const {
    size_t e = s_.find("#}", q);
    if (e == std::string::npos) fail(start, "comment is never closed with '#}'");
    const char ctrl = e > q && (s_[e - 1] == '-' || s_[e - 1] == '+') ? s_[e - 1] : '\0';
    return after_tag_end(e + 2, ctrl, true);
  }

  // Whether `{%[-+]? *name *[-+]?%}` starts at the tag body `q`.
  bool is_raw_tag(size_t q, const char* name) const {
    while (q < s_.size() && is_space(s_[q])) ++q;
    const std::string n(name);
    if (s_.compare(q, n.size(), n) != 0) return false;
    q += n.size();
    while (q < s_.size() && is_space(s_[q])) ++q;
    if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
    return s_.compare(q, 2, "%}") == 0;
  }

  size_t lex_raw(size_t start, size_t q) {
    size_t close = s_.find("%}", q);
    const char ctrl = s_[close - 1] == '-' || s_[close - 1] == '+' ? s_[close - 1] : '\0';
    size_t body = after_tag_end(close + 2, ctrl, true);
    for (size_t p = s_.find("{%", body); p != std::string::npos; p = s_.find("{%", p + 2)) {
      const char c = p + 2 < s_.size() ? s_[p + 2] : '\0';
      const size_t bq = p + 2 + (c == '-' || c == '+' ? 1 : 0);
      if (!is_raw_tag(bq, "endraw")) continue;
      std::string text = s_.substr(body, p - body);
      strip_before_tag(text, '%', c, body > 0 && s_[body - 1] == '\n');
      emit_text(std::move(text), body);
      size_t e = s_.find("%}", bq);
      const char ectrl = s_[e - 1] == '-' || s_[e - 1] == '+' ? s_[e - 1] : '\0';
      return after_tag_end(e + 2, ectrl, true);
    }
    fail(start, "'raw' block is never closed with '{% endraw %}'");
  }

  void push(Tok kind, std::string text, size_t pos) {
    Token t{kind, std::move(text), 0, 0};
    set_pos(t, pos);
    toks_.push_back(std::move(t));
  }

  size_t lex_tag(size_t start, size_t q, bool is_var) {
    push(is_var ? Tok::VarBegin : Tok::BlockBegin, is_var ? "{{" : "{%", start);
    const char close = is_var ? '}' : '%';
    int depth = 0;
    size_t i = q;
    while (true) {
      while (i < s_.size() && is_space(s_[i])) ++i;
      if (i >= s_.size()) fail(start, std::string("tag is never closed with '") + (is_var ? "}}" : "%}") + "'");
      // The end marker, with an optional control character.
      const bool ctrl = depth == 0 && (s_[i] == '-' || (s_[i] == '+' && !is_var)) && i + 2 < s_.size() &&
                        s_[i + 1] == close && s_[i + 2] == '}';
      if (ctrl || (depth == 0 && s_[i] == close && i + 1 < s_.size() && s_[i + 1] == '}')) {
        push(is_var ? Tok::VarEnd : Tok::BlockEnd, "", i);
        return after_tag_end(i + (ctrl ? 3 : 2), ctrl ? s_[i] : '\0', !is_var);
      }
      const char c = s_[i];
      if (is_name_start(c)) {
        size_t j = i;
        while (j < s_.size() && is_name_char(s_[j])) ++j;
        push(Tok::Name, s_.substr(i, j - i), i);
        i = j;
      } else if (is_digit(c)) {
        i = lex_number(i);
      } else if (c == '\'' || c == '"') {
        i = lex_string(i);
      } else {
        static const char* k_ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                      "=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "|"};
        std::string op;
        for (const char* o : k_ops)
          if (s_.compare(i, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        if (op.empty()) fail(i, "unexpected character '" + utf8_chars(std::string_view(s_).substr(i, 4))[0] + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        push(Tok::Op, op, i);
        i += op.size();
      }
    }
  }

  size_t lex_number(size_t i) {
    size_t j = i;
    bool is_float = false;
    while (j < s_.size() && (is_digit(s_[j]) || s_[j] == '_')) ++j;
    if (j + 1 < s_.size() && s_[j] == '.' && is_digit(s_[j + 1])) {
      is_float = true;
      ++j;
      while (j < s_.size() && (is_digit(s_[j]) || s_[j] == '_')) ++j;
    }
    if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
      size_t k = j + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && is_digit(s_[k])) {
        is_float = true;
        j = k;
        while (j < s_.size() && is_digit(s_[j])) ++j;
      }
    }
    std::string digits;
    for (size_t k = i; k < j; ++k)
      if (s_[k] != '_') digits += s_[k];
    push(is_float ? Tok::Float : Tok::Int, digits, i);
    return j;
  }

  size_t lex_string(size_t i) {
    const char q = s_[i];
    std::string out;
    size_t j = i + 1;
    for (; j < s_.size() && s_[j] != q; ++j) {
      if (s_[j] != '\\' || j + 1 >= s_.size()) {
        out += s_[j];
        continue;
      }
      const char e = s_[++j];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case '\\':
        case '\'':
        case '"': out += e; break;
        case '\n': break;
        case 'u':
        case 'x': {
          const size_t n = e == 'u' ? 4 : 2;
          unsigned long cp = 0;
          for (size_t k = 1; k <= n; ++k) {
            const char h = j + k < s_.size() ? s_[j + k] : '\0';
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail(j - 1, std::string("bad \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<unsigned long>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          utf8::append(out, static_cast<uint32_t>(cp));
          j += n;
          break;
        }
        default: out += '\\'; out += e;
      }
    }
    if (j >= s_.size()) fail(i, "string literal is never closed");
    push(Tok::String, out, i);
    return j + 1;
  }
};

}  // namespace

std::vector<Token> lex_template(const std::string& source, const LexOptions& o) { return Lexer(source, o).run(); }

}  // namespace vkllm::jinja
