// Text ↔ token ids exactly as llama.cpp computes them, for SentencePiece ("llama") and
// byte-level BPE ("gpt2") vocabularies read from GGUF metadata.
//
// Supported: tokenizer.ggml.model = llama (SPM with scores, <0xXX> byte fallback, ▁ for space,
// add_space_prefix) and gpt2 (merges by rank, GPT-2 byte↔unicode mapping, the pre-tokenizer regex
// set named by tokenizer.ggml.pre). Special tokens (control, user-defined, unknown) are split out
// of the text longest first; user-defined ones always, control ones only when asked to.
// See docs/tokenizer.md for the decisions and the known differences. A Tokenizer does not change
// after loading; its const methods may be called from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gguf {
class File;
}

namespace vkllm {

// A run of text to tokenize: template markup (parse_special: special-token strings in it become
// their tokens) or user content (never turned into special tokens).
struct TextPiece {
  std::string_view text;
  bool parse_special;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from `f`. Throws vkllm::Error naming the key when the vocabulary is
  // missing, malformed, or a special-token id is out of range. Works on vocabulary-only files.
  static Tokenizer from_gguf(const gguf::File& f);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `add_bos` is llama.cpp's add_special: when true, BOS is prepended if the vocabulary asks for
  // it (add_bos()) and EOS appended if it asks for that (add_eos()); when false neither is.
  std::vector<int32_t> tokenize(std::string_view text, bool add_bos, bool parse_special) const;
  // Tokenizes the pieces as one text: adjacent runs of user text join before tokenizing, and
  // only parse_special pieces can produce control tokens. `after` is the token the text follows
  // (-1: none, the text starts the sequence): SPM's space prefix goes on text at the start or
  // after a special token, as in the whole text, so a continuation after ordinary text gets none.
  std::vector<int32_t> tokenize(std::span<const TextPiece> pieces, bool add_bos, int32_t after = -1) const;
  // Whether tokenize() emits id as a whole fragment of the text (control, user-defined, unknown).
  bool is_special(int32_t id) const;

  // The bytes of one token as llama.cpp's token_to_piece (no lstrip): control and unknown
  // tokens are empty unless render_special. Throws vkllm::Error when id is out of range.
  std::string token_to_piece(int32_t id, bool render_special) const;
  // llama.cpp's detokenize with remove_special = false: the SPM space prefix is dropped from the
  // first token, and vocabularies with clean_spaces tidy " ," " ." " 's" and the like.
  std::string detokenize(std::span<const int32_t> ids, bool render_special) const;

  int32_t n_vocab() const;
  int32_t bos() const;  // -1 if none
  int32_t eos() const;
  int32_t eot() const;
  int32_t eom() const;
  int32_t unk() const;
  int32_t pad() const;
  // End of generation: eos, eot, eom, and tokens such as <|im_end|>, <|eot_id|>, <|endoftext|>.
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const;
  bool add_bos() const;
  bool add_eos() const;
  const std::string& token_text(int32_t id) const;
  std::string model() const;  // "llama" or "gpt2"
  std::string pre() const;    // tokenizer.ggml.pre as read ("" when absent)
  // What llama.cpp would log as a warning while loading (unknown pre-tokenizer, control-looking
  // tokens retyped, …). core/ never prints; callers may.
  const std::vector<std::string>& warnings() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  friend const Impl& tokenizer_impl(const Tokenizer& tok);
  std::unique_ptr<Impl> impl_;
};

// Turns generated token ids into text without ever emitting part of a UTF-8 character: bytes of
// an unfinished character are held until a later token completes it. No space prefix is removed
// (generated text continues the prompt). The Tokenizer must outlive the decoder.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = false);
  // The text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held (an unfinished character's bytes, as they are).
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace vkllm
