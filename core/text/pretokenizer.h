// Pre-tokenizers for byte-level BPE vocabularies: the regex sets llama.cpp uses per
// `tokenizer.ggml.pre`, run with PCRE2 (UTF + Unicode properties, JIT).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vkllm {

// What a `tokenizer.ggml.pre` name selects besides its regexes (llama.cpp's per-name flags).
struct PreTokenizerFlags {
  bool clean_spaces = true;    // detokenize removes " ," " ." " 's"… (clean_up_tokenization_spaces)
  bool ignore_merges = false;  // a whole pre-token that is in the vocabulary is taken as is
  bool add_bos = false;        // adds BOS by default (metadata can still override)
  bool null_bos = false;       // the vocabulary has no BOS (chatglm-bpe)
};

// A compiled list of regexes. Each regex splits every piece the previous ones produced; text
// between matches stays a piece of its own (llama.cpp's unicode_regex_split).
class PreTokenizer {
 public:
  // `name` is `tokenizer.ggml.pre`; empty means absent. Returns false in `known` when the name
  // is not one llama.cpp recognises: the GPT-2 regex is used then.
  static PreTokenizer for_name(std::string_view name, bool& known);
  // The set llama.cpp falls back to when a vocabulary has no `tokenizer.ggml.pre`.
  static PreTokenizer default_set();

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  const PreTokenizerFlags& flags() const { return flags_; }
  // Splits valid UTF-8 `text` into pre-tokens: [offset, length) byte ranges in order that
  // together cover `text`.
  std::vector<std::pair<size_t, size_t>> split(std::string_view text) const;

 private:
  struct Regex;
  PreTokenizer(const std::vector<std::string_view>& patterns, PreTokenizerFlags flags);
  std::vector<std::unique_ptr<Regex>> regexes_;
  PreTokenizerFlags flags_;
};

}  // namespace vkllm
