// Python str semantics on UTF-8 text for the Jinja interpreter: code points, strip, split, case.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vkllm::jinja {

// The code points of `s`, each as its UTF-8 bytes (invalid bytes stand alone).
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

// str.strip/lstrip/rstrip: `chars` empty optional → Python whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split/rsplit: `sep` empty optional → runs of whitespace; maxsplit < 0 → no limit.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, long maxsplit,
                                  bool from_right);
// str.replace with an optional count (< 0: all).
std::string py_replace(std::string_view s, std::string_view old, std::string_view with, long count);
// str.upper/str.lower (ASCII, Latin-1/Extended-A, Greek, Cyrillic).
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.capitalize, str.title, and Jinja's `title` filter (words split at whitespace, '-', brackets).
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
std::string jinja_title_filter(std::string_view s);
bool is_py_space(char c);

}  // namespace vkllm::jinja
