// The vocabulary shared by the tokenizer's source files (not part of the public API).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/pretokenizer.h"
#include "base/string_index.h"
#include "text/tokenizer.h"

namespace vkllm {

// Token attributes as llama.cpp's llama_token_attr bits (derived from tokenizer.ggml.token_type).
namespace token_attr {
constexpr uint32_t k_undefined = 0;
constexpr uint32_t k_unknown = 1u << 0;
constexpr uint32_t k_unused = 1u << 1;
constexpr uint32_t k_normal = 1u << 2;
constexpr uint32_t k_control = 1u << 3;
constexpr uint32_t k_user_defined = 1u << 4;
constexpr uint32_t k_byte = 1u << 5;
constexpr uint32_t k_special = k_control | k_user_defined | k_unknown;  // matched whole in text (special_tokens)
constexpr uint32_t k_lstrip = 1u << 7;  // a special match also swallows whitespace on its left
constexpr uint32_t k_rstrip = 1u << 8;  // … and on its right
}  // namespace token_attr

enum class VocabType { Spm, Bpe };

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = token_attr::k_normal;
};

struct Tokenizer::Impl {
  VocabType type = VocabType::Spm;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre, "" when absent
  std::vector<TokenData> tokens;  // [n_vocab]
  StringIndex token_to_id;
  // BPE merges: key is left + '\0' + right (byte-level token texts never hold a NUL), value the
  // rank (line number in tokenizer.ggml.merges; the first of duplicates wins).
  StringIndex bpe_ranks;
  std::unique_ptr<PreTokenizer> pretokenizer;  // BPE only
  std::array<int32_t, 256> byte_ids{};          // SPM: id of <0xXX>, -1 when absent
  // SPM: no token holds a ▁ right after another character, so no merge can cross the point
  // before a ▁ that follows a non-▁ character, and the text can be merged word by word with the
  // same result (much faster than one queue over a long text).
  bool spm_word_split = false;

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_space_prefix = false;
  bool add_bos = false;
  bool add_eos = false;
  bool ignore_merges = false;
  bool clean_spaces = false;

  std::vector<int32_t> special_tokens;  // control, user-defined, unknown; longest text first
  std::vector<uint8_t> eog;             // [n_vocab] 1 for end-of-generation tokens
  std::vector<std::string> pieces;      // [n_vocab] token_to_piece with render_special
  std::vector<std::string> warnings;

  int32_t find(std::string_view text) const { return token_to_id.find(text); }
  int32_t n_vocab() const { return int32_t(tokens.size()); }
};

// SentencePiece BPE over `text`, whose spaces are already ▁ (tokenizer_spm.cpp). split_words
// (only valid when v.spm_word_split) merges word by word; the result is the same.
void spm_tokenize(const Tokenizer::Impl& v, std::string_view text, bool split_words, std::vector<int32_t>& out);

// The vocabulary behind a Tokenizer, for tests that compare internal paths.
const Tokenizer::Impl& tokenizer_impl(const Tokenizer& tok);

// Byte-level BPE over one raw-text fragment: pre-tokenize, byte-encode, merge (tokenizer_bpe.cpp).
class BpeSession {
 public:
  explicit BpeSession(const Tokenizer::Impl& v) : v_(v) {}
  void tokenize(std::string_view text, std::vector<int32_t>& out);

 private:
  void encode_word(const std::string& word, std::vector<int32_t>& out);
  const Tokenizer::Impl& v_;
  // A word's ids depend on the word alone; English text repeats words, so they are remembered.
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// The GPT-2 byte→unicode mapping: the UTF-8 of the code point that stands for byte b.
const std::string& bpe_byte_to_utf8(uint8_t b);
// Its inverse: the byte a code point stands for, or -1.
int bpe_cpt_to_byte(uint32_t cpt);

// token_to_piece(id, render_special = true), uncached (detokenizer.cpp).
std::string compute_piece(const Tokenizer::Impl& v, int32_t id);

}  // namespace vkllm
