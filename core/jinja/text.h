// Python str semantics on UTF-8 text for the Jinja interpreter: code points, strip, split, case,
// and the character-class methods, on every script (jinja/unicode.h has the per-code-point data).
//
// Text is decoded as llama.cpp decodes it (utf8::next in base/utf8.h): a byte that does not start
// a complete sequence is a character of its own. Case mapping passes undecodable bytes (those, and
// encoded surrogates) through unchanged; they are neither letters, digits, spaces nor cased.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vkllm::jinja {

// The code points of `s`, each as its UTF-8 bytes (invalid bytes stand alone).
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

// str.strip/lstrip/rstrip: `chars` empty optional → Python (Unicode) whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split/rsplit: `sep` empty optional → runs of Unicode whitespace; maxsplit < 0 → no limit.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, long maxsplit,
                                  bool from_right);
// str.replace with an optional count (< 0: all).
std::string py_replace(std::string_view s, std::string_view old, std::string_view with, long count);

// str.upper/lower with full case mappings ('ß' → "SS", 'և' → "ԵՒ", 'İ' → "i̇"); lower() makes a
// capital sigma final ('ς') at the end of a word.
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.capitalize (Python ≥ 3.8): the first code point titlecased ('ǆ' → 'ǅ', 'ß' → "Ss"), the rest
// lowercased. str.title: titlecase after an uncased code point, lowercase after a cased one.
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
// Jinja's `title` filter: words split at runs of whitespace, '-', '(', '{', '[', '<', each
// becoming word[0].upper() + word[1:].lower() (so 'ǆ' → 'Ǆ', unlike str.title).
std::string jinja_title_filter(std::string_view s);

// str.isalpha/isdigit/isalnum/isspace: non-empty, and every code point in the class.
bool py_isalpha(std::string_view s);
bool py_isdigit(std::string_view s);
bool py_isalnum(std::string_view s);
bool py_isspace(std::string_view s);
// str.isupper/islower: some cased code point, and none lowercase (uppercase) or titlecase.
bool py_isupper(std::string_view s);
bool py_islower(std::string_view s);

}  // namespace vkllm::jinja
