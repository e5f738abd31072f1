// UTF-8 decoding, re-encoding and the streaming boundary check used by the tokenizers.
#include "base/utf8.h"

namespace vkllm::utf8 {
namespace {

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

constexpr uint32_t k_replacement = 0xFFFD;

// Decodes one code point at `pos`, advancing it; returns k_replacement and advances one byte on
// a malformed sequence (llama.cpp's rule: lead byte, then the right number of continuations).
uint32_t decode_one(std::string_view s, size_t& pos) {
  const uint8_t b0 = uint8_t(s[pos]);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  size_t n = 0;
  uint32_t cpt = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cpt = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cpt = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cpt = b0 & 0x07;
  } else {
    pos += 1;
    return k_replacement;
  }
  if (pos + n > s.size()) {
    pos += 1;
    return k_replacement;
  }
  for (size_t i = 1; i < n; ++i) {
    const uint8_t b = uint8_t(s[pos + i]);
    if (!is_cont(b)) {
      pos += 1;
      return k_replacement;
    }
    cpt = (cpt << 6) | (b & 0x3F);
  }
  pos += n;
  // Surrogates and code points past U+10FFFF are not Unicode scalar values; PCRE2 would read
  // them as invalid UTF-8 (llama.cpp throws on the latter).
  if ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt > 0x10FFFF) return k_replacement;
  return cpt;
}

}  // namespace

uint32_t next(std::string_view text, size_t& pos) { return decode_one(text, pos); }

void append(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out += char(cpt);
  } else if (cpt < 0x800) {
    out += char(0xC0 | (cpt >> 6));
    out += char(0x80 | (cpt & 0x3F));
  } else if (cpt < 0x10000) {
    out += char(0xE0 | (cpt >> 12));
    out += char(0x80 | ((cpt >> 6) & 0x3F));
    out += char(0x80 | (cpt & 0x3F));
  } else {
    out += char(0xF0 | (cpt >> 18));
    out += char(0x80 | ((cpt >> 12) & 0x3F));
    out += char(0x80 | ((cpt >> 6) & 0x3F));
    out += char(0x80 | (cpt & 0x3F));
  }
}

std::string sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    if (uint8_t(text[pos]) < 0x80) {
      out += text[pos++];
      continue;
    }
    append(out, decode_one(text, pos));
  }
  return out;
}

bool valid(std::string_view text) { return sanitize(text) == text; }

size_t complete_prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  // A sequence is at most 4 bytes, so only the last 3 can belong to an unfinished one.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = uint8_t(bytes[n - back]);
    if (is_cont(b)) continue;
    if (b < 0x80) return n;
    size_t need = 0;
    if ((b & 0xE0) == 0xC0) need = 2;
    else if ((b & 0xF0) == 0xE0) need = 3;
    else if ((b & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

}  // namespace vkllm::utf8
