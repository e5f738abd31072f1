// Python's Unicode character properties and full case mappings, from libutf8proc and the tables
// tests/tools/gen_unicode_tables.py writes.
#include "jinja/unicode.h"

#include <algorithm>
#include <iterator>
#include <utf8proc.h>

#include "base/utf8.h"

namespace vkllm::jinja::unicode {
namespace {

struct FullCase {
  uint32_t cp;
  const char* upper;  // UTF-8; nullptr: the simple mapping
  const char* lower;
  const char* title;
};

struct Range {
  uint32_t first, last;  // inclusive
};

#include "jinja/unicode_tables.inc"

template <size_t N>
bool in(const Range (&table)[N], uint32_t cp) {
  const Range* r = std::upper_bound(std::begin(table), std::end(table), cp,
                                    [](uint32_t c, const Range& x) { return c < x.first; });
  return r != std::begin(table) && cp <= std::prev(r)->last;
}

const FullCase* full_case(uint32_t cp) {
  const FullCase* f = std::lower_bound(std::begin(k_full_case), std::end(k_full_case), cp,
                                       [](const FullCase& x, uint32_t c) { return x.cp < c; });
  return f != std::end(k_full_case) && f->cp == cp ? f : nullptr;
}

// utf8proc answers any int32; values past U+10FFFF get the unassigned default (category Cn, no
// mappings), which is what callers passing raw bytes through want.
utf8proc_category_t category(uint32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }

// The full mapping `full` of cp when the table has one, else utf8proc's simple mapping.
void append_case(std::string& out, uint32_t cp, const char* FullCase::*full,
                 utf8proc_int32_t (*simple)(utf8proc_int32_t)) {
  const FullCase* f = full_case(cp);
  if (f && f->*full) out += f->*full;
  else utf8::append(out, static_cast<uint32_t>(simple(static_cast<utf8proc_int32_t>(cp))));
}

}  // namespace

bool is_space(uint32_t cp) {
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

bool is_alpha(uint32_t cp) {
  const utf8proc_category_t c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

bool is_digit(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND || in(k_digit_not_decimal, cp); }

bool is_alnum(uint32_t cp) {
  const utf8proc_category_t c = category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

bool is_lower(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LL || in(k_other_lower, cp); }
bool is_upper(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LU || in(k_other_upper, cp); }
bool is_title(uint32_t cp) { return category(cp) == UTF8PROC_CATEGORY_LT; }
bool is_cased(uint32_t cp) { return is_lower(cp) || is_upper(cp) || is_title(cp); }

bool is_case_ignorable(uint32_t cp) {
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK: return true;
    default: return in(k_ignorable_punct, cp);
  }
}

void append_upper(std::string& out, uint32_t cp) { append_case(out, cp, &FullCase::upper, utf8proc_toupper); }
void append_lower(std::string& out, uint32_t cp) { append_case(out, cp, &FullCase::lower, utf8proc_tolower); }
void append_title(std::string& out, uint32_t cp) { append_case(out, cp, &FullCase::title, utf8proc_totitle); }

}  // namespace vkllm::jinja::unicode
