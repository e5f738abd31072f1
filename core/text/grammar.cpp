// Grammars: the pushdown matcher over code points and tokens (the parser is grammar_parser.cpp).
#include "text/grammar.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_set>

#include "base/commas.h"
#include "base/error.h"
#include "text/tokenizer.h"

namespace vkllm {
namespace {

using Op = Grammar::Op;
using Element = Grammar::Element;

constexpr size_t k_max_stacks = 4096;               // ways to continue the text at one point
constexpr size_t k_max_walk = 256;                  // code points of a piece the recursive rejection follows
constexpr size_t k_max_work = 10'000'000;           // steps to decide one token (GrammarMatcher::spend)
constexpr size_t k_expansion_cost = 20;             // steps a rule expansion counts for (copies a stack)

// Decodes a token's bytes after `partial` as llama.cpp's grammar does: code points up to the end
// or a NUL byte, then a terminating 0. A byte that cannot begin a character (or continue the
// partial one) makes the piece not UTF-8: no code points, tail n_remain −1.
std::vector<uint32_t> decode_piece(std::string_view bytes, PartialUtf8 partial, PartialUtf8& tail) {
  static constexpr int k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
  std::vector<uint32_t> cps;
  cps.reserve(bytes.size() + 1);
  size_t pos = 0;
  const auto more = [&] { return pos < bytes.size() && bytes[pos] != '\0'; };
  uint32_t value = partial.value;
  int n_remain = partial.n_remain;
  while (more() && n_remain > 0) {
    const auto b = uint8_t(bytes[pos]);
    if ((b >> 6) != 2) {
      tail = {0, -1};
      return {0};
    }
    value = (value << 6) | (b & 0x3Fu);
    ++pos;
    --n_remain;
  }
  if (partial.n_remain > 0 && n_remain == 0) cps.push_back(value);
  while (more()) {
    const auto lead = uint8_t(bytes[pos]);
    n_remain = k_len[lead >> 4] - 1;
    if (n_remain < 0) {
      tail = {0, -1};
      return {0};
    }
    value = lead & ((1u << (7 - n_remain)) - 1);
    for (++pos; more() && n_remain > 0; ++pos, --n_remain) value = (value << 6) | (uint8_t(bytes[pos]) & 0x3Fu);
    if (n_remain == 0) cps.push_back(value);
  }
  cps.push_back(0);
  tail = {value, n_remain};
  return cps;
}

// Whether code point c satisfies the character element at `at` (a class, a negated class or
// '.'), and the position after the element.
std::pair<bool, uint32_t> match_char(const std::vector<Element>& e, uint32_t at, uint32_t c) {
  const bool positive = e[at].op == Op::Char || e[at].op == Op::CharAny;
  bool found = false;
  do {
    if (e[at + 1].op == Op::RangeUpper) {
      found = found || (e[at].value <= c && c <= e[at + 1].value);
      at += 2;
    } else {
      found = found || e[at].op == Op::CharAny || e[at].value == c;
      at += 1;
    }
  } while (e[at].op == Op::CharAlt);
  return {found == positive, at};
}

// Whether some completion of an unfinished UTF-8 character could satisfy the element at `at`.
bool match_partial_char(const std::vector<Element>& e, uint32_t at, PartialUtf8 partial) {
  const bool positive = e[at].op == Op::Char || e[at].op == Op::CharAny;
  // Not UTF-8, or a 7-bit character spread over two bytes (overlong).
  if (partial.n_remain < 0 || (partial.n_remain == 1 && partial.value < 2)) return false;
  const int bits = partial.n_remain * 6;
  uint32_t low = partial.value << bits;
  const uint32_t high = low | ((1u << bits) - 1);
  if (low == 0 && partial.n_remain == 2) low = 1u << 11;
  if (low == 0 && partial.n_remain == 3) low = 1u << 16;
  do {
    if (e[at + 1].op == Op::RangeUpper) {
      if (e[at].value <= high && low <= e[at + 1].value) return positive;
      at += 2;
    } else {
      if (e[at].op == Op::CharAny) return true;
      if (low <= e[at].value && e[at].value <= high) return positive;
      at += 1;
    }
  } while (e[at].op == Op::CharAlt);
  return !positive;
}

struct StackHash {
  size_t operator()(const std::vector<uint32_t>& s) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the positions
    for (const uint32_t v : s) h = (h ^ v) * 1099511628211ull;
    return size_t(h);
  }
};

}  // namespace

GrammarVocab::GrammarVocab(const Tokenizer& tok) {
  const auto n = size_t(tok.n_vocab());
  pieces_.reserve(n);
  eog_.reserve(n);
  tail_.reserve(n);
  at_.reserve(n + 1);
  at_.push_back(0);
  for (int32_t id = 0; id < int32_t(n); ++id) {
    pieces_.push_back(tok.token_to_piece(id, true));
    eog_.push_back(tok.is_eog(id) ? 1 : 0);
    PartialUtf8 tail;
    const std::vector<uint32_t> cps = decode_piece(pieces_.back(), {}, tail);
    cps_.insert(cps_.end(), cps.begin(), cps.end());
    at_.push_back(uint32_t(cps_.size()));
    tail_.push_back(tail);
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  const std::vector<Element>& e = grammar_->elements();
  for (uint32_t alt : grammar_->root_alternatives()) {
    Stack s;
    if (!Grammar::ends(e[alt].op)) s.push_back(alt);
    advance(std::move(s), stacks_);
  }
  dedup(stacks_);
}

// Stacks in sorted order without repeats; more than k_max_stacks is an error.
void GrammarMatcher::dedup(std::vector<Stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > k_max_stacks) {
    throw GrammarError("grammar: more than " + with_commas(k_max_stacks) + " ways to continue the text (the grammar is too ambiguous)");
  }
}

// Expands the rule references on top of `stack` until every resulting stack has a character
// element on top (or is empty: the text may end), appending them to `out`, which the caller
// dedups (sorting once costs less than a search per stack). A stack with a reference on top is
// expanded once (as llama.cpp does): a repetition of an item that can match the empty text comes
// back to it, and alternatives that can each be empty (`("a"? | "b"?){0,16}`) reach the same stacks
// by many ways (expanding each way again took alternatives^16 steps).
void GrammarMatcher::advance(Stack stack, std::vector<Stack>& out) const {
  const std::vector<Element>& e = grammar_->elements();
  std::vector<Stack> todo;
  todo.push_back(std::move(stack));
  std::unordered_set<Stack, StackHash> expanded_stacks;
  while (!todo.empty()) {
    Stack s = std::move(todo.back());
    todo.pop_back();
    if (s.empty() || e[s.back()].op != Op::Ref) {
      out.push_back(std::move(s));
      if (out.size() > 4 * k_max_stacks) dedup(out);
      continue;
    }
    if (!expanded_stacks.insert(s).second) continue;
    const uint32_t at = s.back();
    s.pop_back();
    if (!Grammar::ends(e[at + 1].op)) s.push_back(at + 1);
    const std::vector<uint32_t>& alts = grammar_->alternatives(e[at].value);
    spend(k_expansion_cost * alts.size());  // a copy of the stack each
    for (auto it = alts.rbegin(); it != alts.rend(); ++it) {
      Stack next = s;
      if (!Grammar::ends(e[*it].op)) next.push_back(*it);
      todo.push_back(std::move(next));
    }
  }
}

// `stack` with its character element on top read: the element after it (if its alternative goes
// on) in its place, advanced into `out`.
void GrammarMatcher::advance_past(const Stack& stack, std::vector<Stack>& out) const {
  const std::vector<Element>& e = grammar_->elements();
  const uint32_t after = match_char(e, stack.back(), 0).second;
  Stack s(stack.begin(), stack.end() - 1);
  if (!Grammar::ends(e[after].op)) s.push_back(after);
  advance(std::move(s), out);
}

void GrammarMatcher::accept_code_point(uint32_t cp) {
  const std::vector<Element>& e = grammar_->elements();
  std::vector<Stack> next;
  for (const Stack& s : stacks_)
    if (!s.empty() && match_char(e, s.back(), cp).first) advance_past(s, next);
  dedup(next);
  stacks_ = std::move(next);
}

// The candidates no stack can take: llama.cpp's rejection (a candidate is allowed when some stack
// takes its code points, followed down the stacks they lead to), with a level's candidates grouped
// by the set of stacks that take their next code point: each group goes one level down once, on
// the union of those stacks advanced past it. A stack finds its code points by looking its class's
// characters and ranges up among the level's (sorted) distinct code points, so an enum of
// thousands of strings costs its matches, not stacks × vocabulary; and two stacks that take the
// same characters (`([a-z]+)*`) go on together, where following each alone cost 2^length on a
// token rejected deep down.
std::vector<GrammarMatcher::Candidate> GrammarMatcher::reject(const std::vector<Stack>& stacks,
                                                              const std::vector<Candidate>& candidates) const {
  if (candidates.empty() || stacks.empty()) return candidates;
  const std::vector<Element>& e = grammar_->elements();
  std::vector<char> accepted(candidates.size(), 0);
  std::vector<std::pair<uint32_t, uint32_t>> by_cp;  // (next code point, position in candidates)
  for (uint32_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (*c.cp != 0) {
      by_cp.emplace_back(*c.cp, i);
    } else if (c.partial.n_remain == 0) {
      accepted[i] = 1;  // used up with no character open: any stack takes it (llama.cpp rejects it on none)
    } else if (c.partial.n_remain > 0) {  // inside a character: a stack its completion could satisfy
      spend(stacks.size());
      accepted[i] = std::any_of(stacks.begin(), stacks.end(),
                                [&](const Stack& s) { return !s.empty() && match_partial_char(e, s.back(), c.partial); });
    }  // (n_remain < 0: not UTF-8, never)
  }
  spend(by_cp.size());
  std::sort(by_cp.begin(), by_cp.end());
  std::vector<uint32_t> cps, run_at;  // the distinct next code points, and where each one's run begins in by_cp
  for (uint32_t k = 0; k < by_cp.size(); ++k) {
    if (k == 0 || by_cp[k].first != by_cp[k - 1].first) {
      cps.push_back(by_cp[k].first);
      run_at.push_back(k);
    }
  }
  run_at.push_back(uint32_t(by_cp.size()));
  std::vector<std::vector<uint32_t>> takers(cps.size());  // the stacks that take each code point
  const auto take = [&](size_t d, uint32_t si) {
    spend(1);
    if (takers[d].empty() || takers[d].back() != si) takers[d].push_back(si);
  };
  for (uint32_t si = 0; si < stacks.size(); ++si) {
    if (stacks[si].empty()) continue;  // takes only used-up pieces: above
    const uint32_t top = stacks[si].back();
    if (e[top].op == Op::Char) {  // a class or a literal's character: look its characters and ranges up
      uint32_t at = top;
      do {
        const uint32_t lo = e[at].value, hi = e[at + 1].op == Op::RangeUpper ? e[at + 1].value : lo;
        for (size_t d = size_t(std::lower_bound(cps.begin(), cps.end(), lo) - cps.begin()); d < cps.size() && cps[d] <= hi; ++d) take(d, si);
        at += e[at + 1].op == Op::RangeUpper ? 2 : 1;
      } while (e[at].op == Op::CharAlt);
    } else {  // a negated class or '.': each code point tested
      for (size_t d = 0; d < cps.size(); ++d) {
        spend(1);
        if (match_char(e, top, cps[d]).first) take(d, si);
      }
    }
  }
  std::vector<std::vector<Stack>> after(stacks.size());  // each stack past its character, advanced (once)
  std::vector<char> advanced(stacks.size(), 0);
  const auto advanced_stack = [&](uint32_t si) -> const std::vector<Stack>& {
    if (!advanced[si]) {
      advanced[si] = 1;
      advance_past(stacks[si], after[si]);
      dedup(after[si]);
    }
    return after[si];
  };
  // The code points taken by the same stacks go on together: one union of those stacks, one level
  // down for all their candidates.
  std::map<std::vector<uint32_t>, std::vector<uint32_t>> groups;  // the stacks that take them → the code points
  for (uint32_t d = 0; d < cps.size(); ++d)
    if (!takers[d].empty()) groups[takers[d]].push_back(d);
  for (const auto& [who, ds] : groups) {
    std::vector<Stack> joined;
    if (who.size() > 1) {
      for (const uint32_t si : who) {
        const std::vector<Stack>& part = advanced_stack(si);
        spend(part.size() * k_expansion_cost);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      dedup(joined);
    }
    const std::vector<Stack>& next_stacks = who.size() > 1 ? joined : advanced_stack(who.front());
    std::vector<Candidate> next;
    for (const uint32_t d : ds) {
      for (uint32_t k = run_at[d]; k < run_at[d + 1]; ++k) {
        const Candidate& c = candidates[by_cp[k].second];
        next.push_back({c.index, c.cp + 1, c.partial});
      }
    }
    std::vector<uint32_t> rejected;
    for (const Candidate& c : reject(next_stacks, next)) rejected.push_back(c.index);
    std::sort(rejected.begin(), rejected.end());
    for (const uint32_t d : ds) {
      for (uint32_t k = run_at[d]; k < run_at[d + 1]; ++k)
        if (!std::binary_search(rejected.begin(), rejected.end(), candidates[by_cp[k].second].index)) accepted[by_cp[k].second] = 1;
    }
  }
  std::vector<Candidate> rejects;
  for (uint32_t i = 0; i < candidates.size(); ++i)
    if (!accepted[i]) rejects.push_back(candidates[i]);
  return rejects;
}

// Counts work toward the bound on deciding one token: a grammar whose stacks make every token cost
// thousands of steps stops with an error instead of stalling the generation (and a server's other
// requests) for minutes.
void GrammarMatcher::spend(size_t steps) const {
  work_ += steps;
  if (work_ > k_max_work) {
    throw GrammarError("grammar: more than " + with_commas(k_max_work) + " steps to decide the next token (the grammar is too ambiguous)");
  }
}

// Accepts a piece's code points on these stacks and says whether it fits: some stack took them all
// and, where it ends inside a character, could take the character's completion.
bool GrammarMatcher::walk(const std::vector<uint32_t>& cps, PartialUtf8 tail) {
  for (size_t i = 0; i + 1 < cps.size() && !stacks_.empty(); ++i) accept_code_point(cps[i]);
  if (tail.n_remain == 0) return !stacks_.empty();
  const std::vector<Element>& e = grammar_->elements();
  return std::any_of(stacks_.begin(), stacks_.end(), [&](const Stack& s) { return !s.empty() && match_partial_char(e, s.back(), tail); });
}

// Whether a piece fits, walked on a copy of the stacks (for one token, and for a piece too long
// for mask()'s recursive rejection).
bool GrammarMatcher::allows_by_walking(const std::vector<uint32_t>& cps, PartialUtf8 tail) const {
  GrammarMatcher walker = *this;
  return walker.walk(cps, tail);
}

bool GrammarMatcher::complete() const {
  return partial_.n_remain == 0 && std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool GrammarMatcher::allows(int32_t token) const {
  work_ = 0;
  if (token < 0 || size_t(token) >= vocab_->size()) return false;
  if (vocab_->is_eog(token)) return complete();
  if (vocab_->no_text(token)) return false;
  // Walked a code point at a time, not through mask()'s rejection: two ways to the same answer
  // (Grammar.MaskAgreesWithSingleTokenChecks holds them to it).
  PartialUtf8 tail;
  return allows_by_walking(decode_piece(vocab_->piece(token), partial_, tail), tail);
}

size_t GrammarMatcher::mask(std::span<float> logits) const {
  work_ = 0;
  constexpr float k_none = -std::numeric_limits<float>::infinity();
  const bool can_end = complete();
  const bool fresh = partial_.n_remain == 0;
  std::vector<std::vector<uint32_t>> decoded;  // the pieces decoded after an unfinished character
  std::vector<Candidate> candidates;
  for (size_t id = 0; id < logits.size(); ++id) {
    const auto tok = int32_t(id);
    if (logits[id] == k_none) continue;
    if (id >= vocab_->size() || (vocab_->is_eog(tok) ? !can_end : vocab_->no_text(tok))) {
      logits[id] = k_none;
      continue;
    }
    if (vocab_->is_eog(tok)) continue;
    if (fresh && vocab_->n_code_points(tok) <= k_max_walk) {
      candidates.push_back({uint32_t(id), vocab_->code_points(tok), vocab_->tail(tok)});
      continue;
    }
    // Inside a character only continuation bytes can come next: the rest go undecoded.
    if (!fresh && (uint8_t(vocab_->piece(tok)[0]) & 0xC0) != 0x80) {
      logits[id] = k_none;
      continue;
    }
    PartialUtf8 tail;
    decoded.push_back(decode_piece(vocab_->piece(tok), partial_, tail));
    if (decoded.back().size() - 1 > k_max_walk) {
      if (!allows_by_walking(decoded.back(), tail)) logits[id] = k_none;
      continue;
    }
    candidates.push_back({uint32_t(id), decoded.back().data(), tail});
  }
  for (const Candidate& c : reject(stacks_, candidates)) logits[c.index] = k_none;
  return size_t(std::count_if(logits.begin(), logits.end(), [&](float l) { return l != k_none; }));
}

bool GrammarMatcher::try_accept(int32_t token) {
  work_ = 0;
  if (token < 0 || size_t(token) >= vocab_->size()) return false;
  if (vocab_->is_eog(token)) return complete();
  if (vocab_->no_text(token)) return false;
  PartialUtf8 tail;
  const std::vector<uint32_t> cps = decode_piece(vocab_->piece(token), partial_, tail);
  std::vector<Stack> before = stacks_;
  bool fits = false;
  try {
    fits = walk(cps, tail);
  } catch (...) {  // a bound passed midway: the stacks stay as they were
    stacks_ = std::move(before);
    throw;
  }
  if (!fits) {
    stacks_ = std::move(before);
    return false;
  }
  partial_ = tail;
  return true;
}

void GrammarMatcher::accept(int32_t token) {
  if (!try_accept(token)) {
    throw GrammarError("grammar: token " + std::to_string(token) + " does not continue the text the grammar allows");
  }
}

}  // namespace vkllm
