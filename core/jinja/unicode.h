// Per-code-point Unicode properties and case mappings as CPython's str methods see them:
// categories and simple mappings from libutf8proc, the rest from generated tables.
#pragma once
#include <cstdint>
#include <string>

namespace vkllm::jinja::unicode {

// str.isspace: bidirectional class WS, B or S, or category Zs (U+001C-U+001F, U+0085, U+00A0,
// U+2000-U+200A, U+3000, ...).
bool is_space(uint32_t cp);
// str.isalpha: categories Lu, Ll, Lt, Lm, Lo.
bool is_alpha(uint32_t cp);
// str.isdigit: Numeric_Type Decimal (Nd) or Digit (superscripts, circled digits, ...).
bool is_digit(uint32_t cp);
// str.isalnum: letters and numbers (categories L* and N*, which equals Python's
// isalpha or isdecimal or isdigit or isnumeric).
bool is_alnum(uint32_t cp);
// The Lowercase and Uppercase properties (Ll/Lu plus Other_Lowercase/Other_Uppercase), Lt, and
// Cased (any of the three).
bool is_lower(uint32_t cp);
bool is_upper(uint32_t cp);
bool is_title(uint32_t cp);
bool is_cased(uint32_t cp);
// Case_Ignorable: Mn, Me, Cf, Lm, Sk, and apostrophes, periods and colons inside words.
bool is_case_ignorable(uint32_t cp);

// Appends the full case mapping of `cp` as UTF-8 (Python's str.upper/lower/title on a single
// code point: 'ß' → "SS"/"ß"/"Ss", 'İ' → "İ"/"i̇"/"İ"). Lowercasing a capital sigma depends on
// its neighbours; that is the caller's part.
void append_upper(std::string& out, uint32_t cp);
void append_lower(std::string& out, uint32_t cp);
void append_title(std::string& out, uint32_t cp);

}  // namespace vkllm::jinja::unicode
