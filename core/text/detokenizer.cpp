// Token ids back to bytes: token_to_piece, detokenize (with llama.cpp's clean_spaces passes) and
// the streaming decoder that holds back unfinished UTF-8 characters.
#include <cstdio>

#include "base/error.h"
#include "text/tokenizer_impl.h"
#include "base/utf8.h"

namespace vkllm {
namespace {

constexpr uint32_t k_special_attr = token_attr::k_unknown | token_attr::k_control;

std::string spm_unescape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// GPT-2 code points back to bytes; a code point outside the mapping is spelled out as llama.cpp
// does ("[UNK_BYTE_0x…" + the token text + "]").
std::string bpe_decode(const std::string& text) {
  std::string out;
  for (size_t pos = 0; pos < text.size();) {
    const uint32_t cpt = utf8::next(text, pos);
    const int b = bpe_cpt_to_byte(cpt);
    if (b >= 0) {
      out += char(b);
      continue;
    }
    std::string enc;
    utf8::append(enc, cpt);
    out += "[UNK_BYTE_0x";
    char hex[3];
    for (char c : enc) {
      std::snprintf(hex, sizeof hex, "%02x", unsigned(uint8_t(c)));
      out += hex;
    }
    out += text + "]";
  }
  return out;
}

// llama.cpp's clean_up_tokenization_spaces, three byte passes: drop the space in " ?", " !",
// " .", " ,"; turn " ' " into "'"; drop the space before "'s", "'m", "'re", "'ve".
std::string clean_spaces(const std::string& in) {
  std::string a;
  a.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char x = in[i];
    if (i > 0 && in[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') && !a.empty()) a.pop_back();
    a += x;
  }
  std::string b;
  b.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const char x = a[i];
    if (i > 0 && x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();  // the space before
      b += x;
      // The space after is skipped and, as in llama.cpp, overwritten with NUL so that it no
      // longer counts as "the space before" for the next character.
      a[++i] = '\0';
      continue;
    }
    b += x;
  }
  std::string c;
  c.reserve(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const char x = b[i];
    if (i > 0 && b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
      const bool drop = x1 == 's' || x1 == 'm' || (i + 2 < b.size() && ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')));
      if (drop) c.pop_back();
    }
    c += x;
  }
  return c;
}

}  // namespace

std::string compute_piece(const Tokenizer::Impl& v, int32_t id) {
  const TokenData& t = v.tokens[size_t(id)];
  if (t.attr & (k_special_attr | token_attr::k_user_defined)) return t.text;
  if (v.type == VocabType::Spm) {
    if (t.attr & token_attr::k_normal) return spm_unescape(t.text);
    if (t.attr & token_attr::k_byte) {
      // "<0xXX>": llama.cpp reads the two hex digits at offset 3.
      const std::string hex = t.text.size() >= 5 ? t.text.substr(3, 2) : std::string();
      return std::string(1, char(std::strtol(hex.c_str(), nullptr, 16)));
    }
    return {};
  }
  if (t.attr & token_attr::k_normal) return bpe_decode(t.text);
  return {};  // byte, unused and undefined tokens have no text in a BPE vocabulary
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab()) + ")");
  }
  if (!render_special && (impl_->tokens[size_t(id)].attr & k_special_attr)) return {};
  return impl_->pieces[size_t(id)];
}

std::string Tokenizer::detokenize(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = token_to_piece(ids[i], render_special);
    // The space prefix comes off the first token only, even when that token renders empty.
    const bool strip = i == 0 && impl_->add_space_prefix && !piece.empty() && piece[0] == ' ';
    out.append(piece, strip ? 1 : 0);
  }
  return impl_->clean_spaces ? clean_spaces(out) : out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool render_special) : tok_(&tok), render_special_(render_special) {}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_to_piece(id, render_special_);
  const size_t ready = utf8::complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace vkllm
