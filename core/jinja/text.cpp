// Python str semantics on UTF-8 text for the Jinja interpreter: code points, strip, split, case.
#include "jinja/text.h"

#include <algorithm>
#include <cstdint>
#include <span>

#include "base/utf8.h"
#include "jinja/unicode.h"

namespace vkllm::jinja {
namespace {

// A byte that is not part of a valid UTF-8 sequence, kept as k_raw + byte so that case mapping
// passes it through unchanged; above U+10FFFF, so it has no case and no category.
constexpr uint32_t k_raw = 0x110000;

// The code points of `s`. What utf8::next replaces with U+FFFD or decodes leniently (overlong
// forms) becomes raw bytes, as Python's surrogateescape would keep them.
std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  std::string canonical;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = utf8::next(s, pos);
    canonical.clear();
    utf8::append(canonical, cp);
    if (canonical == s.substr(start, pos - start)) out.push_back(cp);
    else
      for (size_t i = start; i < pos; ++i) out.push_back(k_raw + static_cast<uint8_t>(s[i]));
  }
  return out;
}

// Appends map(cp), or the raw byte unchanged.
void append_mapped(std::string& out, uint32_t cp, void (*map)(std::string&, uint32_t)) {
  if (cp >= k_raw) out += static_cast<char>(cp - k_raw);
  else map(out, cp);
}

bool is_space_char(std::string_view c) {
  size_t pos = 0;
  const uint32_t cp = utf8::next(c, pos);
  return pos == c.size() && unicode::is_space(cp);
}

// The lowercase of cps[i], where a capital sigma becomes final 'ς' when a cased letter precedes
// it and none follows, skipping case-ignorable code points both ways (CPython's
// handle_capital_sigma). `cps` is the whole string the sigma is judged in.
void append_lower_at(std::string& out, std::span<const uint32_t> cps, size_t i) {
  if (cps[i] != 0x3A3) {
    append_mapped(out, cps[i], unicode::append_lower);
    return;
  }
  auto cased_from = [&](auto first, auto last) {
    auto it = std::find_if_not(first, last, unicode::is_case_ignorable);
    return it != last && unicode::is_cased(*it);
  };
  const bool cased_before = cased_from(cps.rbegin() + static_cast<long>(cps.size() - i), cps.rend());
  const bool cased_after = cased_from(cps.begin() + static_cast<long>(i) + 1, cps.end());
  utf8::append(out, cased_before && !cased_after ? 0x3C2 : 0x3C3);
}

void append_lower(std::string& out, std::span<const uint32_t> cps) {
  for (size_t i = 0; i < cps.size(); ++i) append_lower_at(out, cps, i);
}

bool all_of(std::string_view s, bool (*pred)(uint32_t)) {
  const std::vector<uint32_t> cps = code_points(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

// str.isupper/islower: some code point of case `is_case`, none of the other case or titlecase.
bool all_cased(std::string_view s, bool (*is_case)(uint32_t), bool (*is_other)(uint32_t)) {
  bool cased = false;
  for (uint32_t cp : code_points(s)) {
    if (is_other(cp) || unicode::is_title(cp)) return false;
    cased = cased || is_case(cp);
  }
  return cased;
}

}  // namespace

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    utf8::next(s, pos);
    out.emplace_back(s.substr(start, pos - start));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) utf8::next(s, pos);
  return n;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<std::string> cs = utf8_chars(s);
  std::vector<std::string> set = chars ? utf8_chars(*chars) : std::vector<std::string>{};
  auto strippable = [&](const std::string& c) {
    if (!chars) return is_space_char(c);
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
    // Byte ranges of the whitespace-separated words; leading/trailing whitespace never yields
    // empty parts.
    std::vector<std::pair<size_t, size_t>> words;
    size_t word_start = std::string_view::npos;
    for (size_t pos = 0; pos < s.size();) {
      const size_t start = pos;
      const bool space = unicode::is_space(utf8::next(s, pos));
      if (!space && word_start == std::string_view::npos) word_start = start;
      if (space && word_start != std::string_view::npos) {
        words.emplace_back(word_start, start);
        word_start = std::string_view::npos;
      }
    }
    if (word_start != std::string_view::npos) words.emplace_back(word_start, s.size());
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto [b, e] : words) out.emplace_back(s.substr(b, e - b));
      return out;
    }
    // The unsplit remainder keeps its whitespace on the far side, even when it is a single
    // word: 'a b  '.split(None, 1) → ['a', 'b  '].
    const size_t n = static_cast<size_t>(maxsplit);
    if (!from_right) {
      for (size_t k = 0; k < n; ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      out.emplace_back(s.substr(words[n].first));
    } else {
      const size_t first = words.size() - n;
      out.emplace_back(s.substr(0, words[first - 1].second));
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

std::string py_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (uint32_t cp : code_points(s)) append_mapped(out, cp, unicode::append_upper);
  return out;
}

std::string py_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_lower(out, code_points(s));
  return out;
}

std::string py_capitalize(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) append_mapped(out, cps[0], unicode::append_title);
    else append_lower_at(out, cps, i);
  }
  return out;
}

std::string py_title(std::string_view s) {
  const std::vector<uint32_t> cps = code_points(s);
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (prev_cased) append_lower_at(out, cps, i);
    else append_mapped(out, cps[i], unicode::append_title);
    prev_cased = unicode::is_cased(cps[i]);
  }
  return out;
}

std::string jinja_title_filter(std::string_view s) {
  // Jinja's do_title: split at runs of [-\s({\[<], then item[0].upper() + item[1:].lower() on
  // each word, so a sigma is final or not within the word alone.
  const std::vector<uint32_t> cps = code_points(s);
  auto is_sep = [](uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || unicode::is_space(c);
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size();) {
    if (is_sep(cps[i])) {
      utf8::append(out, cps[i++]);
      continue;
    }
    size_t end = i + 1;
    while (end < cps.size() && !is_sep(cps[end])) ++end;
    append_mapped(out, cps[i], unicode::append_upper);
    append_lower(out, std::span<const uint32_t>(cps).subspan(i + 1, end - i - 1));
    i = end;
  }
  return out;
}

bool py_isalpha(std::string_view s) { return all_of(s, unicode::is_alpha); }
bool py_isdigit(std::string_view s) { return all_of(s, unicode::is_digit); }
bool py_isalnum(std::string_view s) { return all_of(s, unicode::is_alnum); }
bool py_isspace(std::string_view s) { return all_of(s, unicode::is_space); }
bool py_isupper(std::string_view s) { return all_cased(s, unicode::is_upper, unicode::is_lower); }
bool py_islower(std::string_view s) { return all_cased(s, unicode::is_lower, unicode::is_upper); }

}  // namespace vkllm::jinja
