// Grammars: GBNF text (llama.cpp's format) compiled to rules, and the pushdown matcher that says
// which tokens may come next (docs/sampling.md, "Grammars").
//
// A compiled rule is llama.cpp's flat layout: its alternatives one after another, each closed by
// Alt and the last by End; a character class is a Char (or CharNot) followed by CharAlt and
// RangeUpper elements. The matcher holds every way the text so far can continue as a set of
// stacks of positions in those rules (the top is the next character element), and the bytes of
// an unfinished UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace vkllm {

class Tokenizer;

// A grammar that cannot go on with the generation it constrains (no token fits, too ambiguous):
// the request's fault, not the device's (the server answers 400).
class GrammarError : public Error {
 public:
  using Error::Error;
};

class Grammar {
 public:
  enum class Op : uint8_t { End, Alt, Ref, Char, CharNot, RangeUpper, CharAlt, CharAny };
  struct Element {
    Op op;
    uint32_t value;  // the code point, or the rule of a Ref
  };
  // The most times `{m,n}` repeats an item (llama.cpp's MAX_REPETITION_THRESHOLD).
  static constexpr uint32_t k_max_repetitions = 2000;
  // An element that ends an alternative (End or Alt).
  static constexpr bool ends(Op op) { return op == Op::End || op == Op::Alt; }

  // Parses GBNF. `origin` names the text in errors ("g.gbnf", "the request's grammar"): every
  // error is a vkllm::Error "grammar ORIGIN: line L, column C: …" or names the rule at fault.
  static std::shared_ptr<const Grammar> parse(std::string_view text, const std::string& origin);

  const std::vector<Element>& elements() const { return elems_; }
  // The positions in elements() where each alternative of a rule (of the start rule) begins.
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return alts_[rule]; }
  const std::vector<uint32_t>& root_alternatives() const { return alts_[root_]; }

 private:
  friend class GrammarParser;
  Grammar() = default;

  std::vector<Element> elems_;      // every rule, one after another
  std::vector<uint32_t> rule_at_;   // the position where rule i begins
  std::vector<std::vector<uint32_t>> alts_;  // the positions where rule i's alternatives begin
  uint32_t root_ = 0;
};

// Where decoding stopped inside a UTF-8 character: its bits so far and the continuation bytes it
// still needs (−1: the bytes were not UTF-8).
struct PartialUtf8 {
  uint32_t value = 0;
  int n_remain = 0;
};

// The vocabulary as the grammar reads it: each token's text with special tokens rendered
// (llama.cpp's token_to_piece), decoded to code points once, and which tokens end generation.
class GrammarVocab {
 public:
  explicit GrammarVocab(const Tokenizer& tok);
  size_t size() const { return at_.size() - 1; }
  bool is_eog(int32_t id) const { return eog_[size_t(id)] != 0; }
  // An empty piece, or one starting with a NUL byte: never allowed (as llama.cpp).
  bool no_text(int32_t id) const { return pieces_[size_t(id)].empty() || pieces_[size_t(id)][0] == '\0'; }
  const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
  // The code points of the piece decoded from a fresh start, 0-terminated, and where it stopped.
  const uint32_t* code_points(int32_t id) const { return cps_.data() + at_[size_t(id)]; }
  size_t n_code_points(int32_t id) const { return at_[size_t(id) + 1] - at_[size_t(id)] - 1; }
  PartialUtf8 tail(int32_t id) const { return tail_[size_t(id)]; }

 private:
  std::vector<std::string> pieces_;
  std::vector<uint8_t> eog_;
  std::vector<uint32_t> cps_;
  std::vector<uint32_t> at_;
  std::vector<PartialUtf8> tail_;
};

class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab);

  // Whether `token` may come next. An end-of-generation token may once the text is complete.
  bool allows(int32_t token) const;
  // Sets the logit of every token the grammar does not allow next to −inf; returns how many
  // tokens keep a logit above −inf.
  size_t mask(std::span<float> logits) const;
  // Advances past `token` when it is allowed (as allows() would say, in the same walk) and says
  // whether it was; the state is unchanged when not.
  bool try_accept(int32_t token);
  // Advances past `token`, which must be allowed (throws GrammarError otherwise).
  void accept(int32_t token);
  // The text so far is a whole sentence of the grammar (end of generation is allowed).
  bool complete() const;

 private:
  using Stack = std::vector<uint32_t>;
  struct Candidate {
    uint32_t index;
    const uint32_t* cp;  // the next code point of the token's piece, 0 at its end
    PartialUtf8 partial;
  };
  static void dedup(std::vector<Stack>& stacks);
  void advance(Stack stack, std::vector<Stack>& out) const;
  void advance_past(const Stack& stack, std::vector<Stack>& out) const;
  void accept_code_point(uint32_t cp);
  std::vector<Candidate> reject(const std::vector<Stack>& stacks, const std::vector<Candidate>& candidates) const;
  void spend(size_t steps) const;
  bool walk(const std::vector<uint32_t>& cps, PartialUtf8 tail);
  bool allows_by_walking(const std::vector<uint32_t>& cps, PartialUtf8 tail) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const GrammarVocab> vocab_;
  std::vector<Stack> stacks_;
  PartialUtf8 partial_;
  mutable size_t work_ = 0;  // steps spent on the token being decided
};

}  // namespace vkllm
