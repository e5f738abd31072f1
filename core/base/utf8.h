// UTF-8 helpers for the tokenizers: sequence lengths, decoding the way llama.cpp does, streaming.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vkllm::utf8 {

// Bytes in the sequence a lead byte starts, from its high nibble alone (llama.cpp's
// unicode_len_utf8): 0x00-0xBF → 1 (a stray continuation byte counts as one), 0xC0-0xDF → 2,
// 0xE0-0xEF → 3, 0xF0-0xFF → 4. The caller clamps to the bytes that remain.
inline size_t seq_len(uint8_t lead) {
  static constexpr uint8_t k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return k_len[lead >> 4];
}

void append(std::string& out, uint32_t cpt);

// Decodes the code point at `pos` and advances past it; a malformed sequence yields U+FFFD and
// advances one byte (llama.cpp's unicode_cpts_from_utf8 rule). Surrogates and values past
// U+10FFFF also yield U+FFFD.
uint32_t next(std::string_view text, size_t& pos);

// Re-encodes `text` as valid UTF-8, decoding as llama.cpp's unicode_cpts_from_utf8 does: a byte
// that does not start a complete sequence becomes U+FFFD and decoding resumes at the next byte.
// Overlong forms decode to their code point (re-encoded canonically); surrogates and values
// past U+10FFFF, which PCRE2 refuses, become U+FFFD.
std::string sanitize(std::string_view text);
// Whether `text` is UTF-8 that sanitize() leaves as it is (what JSON can carry unchanged).
bool valid(std::string_view text);

// Length of the longest prefix of `bytes` that does not end inside an unfinished sequence:
// trailing bytes are held back only while they could still become a complete code point
// (a lead byte followed by fewer continuation bytes than it needs).
size_t complete_prefix(std::string_view bytes);

}  // namespace vkllm::utf8
