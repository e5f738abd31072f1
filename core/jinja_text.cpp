// Python str semantics on UTF-8 text for the Jinja interpreter: code points, strip, split, case.
#include "jinja_text.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "utf8.h"

namespace vkllm::jinja {

namespace {

size_t utf8_seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) return 2;
  if ((c & 0xf0) == 0xe0) return 3;
  if ((c & 0xf8) == 0xf0) return 4;
  return 1;
}

char to_upper(char c) { return static_cast<char>(std::toupper(static_cast<unsigned char>(c))); }
char to_lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) || static_cast<unsigned char>(c) >= 0x80; }

}  // namespace

bool is_py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_seq_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) i += std::min(utf8_seq_len(static_cast<unsigned char>(s[i])), s.size() - i);
  return n;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<std::string> cs = utf8_chars(s);
  std::vector<std::string> set = chars ? utf8_chars(*chars) : std::vector<std::string>{};
  auto strippable = [&](const std::string& c) {
    if (!chars) return c.size() == 1 && is_py_space(c[0]);
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strippable(cs[b])) ++b;
  if (right)
    while (e > b && strippable(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, long maxsplit,
                                  bool from_right) {
  std::vector<std::string> out;
  if (!sep) {
    // Whitespace runs; leading/trailing whitespace never yields empty parts.
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i == s.size()) break;
      size_t j = i;
      while (j < s.size() && !is_py_space(s[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) out.emplace_back(s.substr(b, e - b));
      return out;
    }
    const size_t n = static_cast<size_t>(maxsplit);
    if (!from_right) {
      for (size_t k = 0; k < n; ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      std::string rest(s.substr(words[n].first));
      while (!rest.empty() && is_py_space(rest.back())) rest.pop_back();
      out.push_back(rest);
    } else {
      const size_t first = words.size() - n;
      std::string rest(s.substr(0, words[first - 1].second));
      rest.erase(0, words[0].first);
      out.push_back(rest);
      for (size_t k = first; k < words.size(); ++k)
        out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return out;
  }
  const std::string& d = *sep;
  std::vector<size_t> cuts;  // start of each separator occurrence
  for (size_t p = s.find(d); p != std::string_view::npos && !d.empty(); p = s.find(d, p + d.size())) cuts.push_back(p);
  if (maxsplit >= 0 && cuts.size() > static_cast<size_t>(maxsplit)) {
    if (from_right) cuts.erase(cuts.begin(), cuts.end() - maxsplit);
    else cuts.resize(static_cast<size_t>(maxsplit));
  }
  size_t start = 0;
  for (size_t c : cuts) {
    out.emplace_back(s.substr(start, c - start));
    start = c + d.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view with, long count) {
  std::string out;
  size_t i = 0;
  long done = 0;
  if (old.empty()) {
    // Python inserts `with` between every character and at both ends.
    for (const std::string& c : utf8_chars(s)) {
      if (count < 0 || done++ < count) out += with;
      out += c;
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  while (count < 0 || done < count) {
    size_t p = s.find(old, i);
    if (p == std::string_view::npos) break;
    out.append(s.substr(i, p - i));
    out.append(with);
    i = p + old.size();
    ++done;
  }
  out.append(s.substr(i));
  return out;
}

namespace {

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other code
// points are left unchanged.
uint32_t to_upper_cp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    const bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

uint32_t to_lower_cp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    const bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

// Decodes one code point of a well-formed 2- or 3-byte sequence; other bytes pass through.
bool decode(const std::string& ch, uint32_t& cp) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(ch[i])); };
  if (ch.size() == 1) cp = b(0);
  else if (ch.size() == 2 && (b(0) & 0xe0) == 0xc0) cp = ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
  else if (ch.size() == 3 && (b(0) & 0xf0) == 0xe0) cp = ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
  else return false;
  return true;
}

std::string map_case(std::string_view s, uint32_t (*f)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  for (const std::string& ch : utf8_chars(s)) {
    uint32_t cp = 0;
    if (decode(ch, cp)) utf8::append(out, f(cp));
    else out += ch;
  }
  return out;
}

}  // namespace

std::string py_upper(std::string_view s) { return map_case(s, to_upper_cp); }
std::string py_lower(std::string_view s) { return map_case(s, to_lower_cp); }

std::string py_capitalize(std::string_view s) {
  std::string out = py_lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_alpha = false;
  for (char& c : out) {
    c = prev_alpha ? to_lower(c) : to_upper(c);
    prev_alpha = is_alpha(c);
  }
  return out;
}

std::string jinja_title_filter(std::string_view s) {
  std::string out(s);
  bool word_start = true;
  for (char& c : out) {
    const bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
  }
  return out;
}

}  // namespace vkllm::jinja
