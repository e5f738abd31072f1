// DRY: the repeat lengths by a Z-function over the reversed history, then the penalties.
#include "engine/dry.h"

#include <algorithm>
#include <cmath>

#include "text/tokenizer.h"

namespace vkllm {
namespace {

constexpr size_t kMaxBreakerBytes = 40;  // llama.cpp's limits
constexpr size_t kMaxTailTokens = 20;

void add_tail(DryBreakers& b, int32_t head, std::vector<int32_t> tail) {
  const auto [first, last] = b.tails.equal_range(head);
  for (auto it = first; it != last; ++it)
    if (it->second == tail) return;
  b.tails.emplace(head, std::move(tail));
}

}  // namespace

DryBreakers dry_breakers(const Tokenizer& tok, std::span<const std::string> breakers) {
  DryBreakers out;
  std::vector<std::string> texts(size_t(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id) texts[size_t(id)] = tok.detokenize(std::span(&id, 1), true);
  std::vector<std::string> seen;
  for (std::string b : breakers) {
    if (b.empty()) continue;
    if (b.size() > kMaxBreakerBytes) b.resize(kMaxBreakerBytes);
    if (std::find(seen.begin(), seen.end(), b) != seen.end()) continue;  // the same tails again
    seen.push_back(b);
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
      const std::string& text = texts[size_t(id)];
      if (text.find(b) != std::string::npos) {
        add_tail(out, id, {});
        continue;
      }
      // Where the text's end begins the breaker: the breaker's rest must follow, as tokens.
      for (size_t at = text.find(b[0]); at != std::string::npos; at = text.find(b[0], at + 1)) {
        const size_t n = text.size() - at;  // < b.size(): the text does not hold b
        if (text.compare(at, n, b, 0, n) != 0) continue;
        std::vector<int32_t> tail = tok.tokenize(std::string_view(b).substr(n), false, false);
        if (tail.size() > kMaxTailTokens) tail.resize(kMaxTailTokens);
        add_tail(out, id, std::move(tail));
      }
    }
  }
  return out;
}

void dry_penalize(std::span<float> logits, const std::deque<int32_t>& history, const DryBreakers& breakers, const DryParams& p) {
  const size_t n = size_t(std::min<uint64_t>(history.size(), p.window));
  if (n <= size_t(p.allowed_length)) return;
  // r[i]: the i-th token from the end (r[0] the last one).
  std::vector<int32_t> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = history[history.size() - 1 - i];
  // A repeat reaches back at most to the nearest breaker: the first (from the end) token that
  // begins one whose tail follows it; its longest such tail counts.
  size_t limit = n;
  for (size_t i = 0; i < n; ++i) {
    const auto [first, last] = breakers.tails.equal_range(r[i]);
    long longest = -1;
    for (auto it = first; it != last; ++it) {
      const std::vector<int32_t>& tail = it->second;
      if (long(tail.size()) <= longest || tail.size() > i) continue;
      bool match = true;
      for (size_t k = 0; k < tail.size() && match; ++k) match = tail[k] == r[i - 1 - k];
      if (match) longest = long(tail.size());
    }
    if (longest >= 0) {
      limit = i - size_t(longest);
      break;
    }
  }
  if (limit < size_t(p.allowed_length)) return;
  // z[k]: how many tokens ending at r[k] match the ones ending at the last token (the Z-function
  // of r), at most `limit`.
  std::vector<size_t> z(n, 0);
  for (size_t k = 1, lo = 0, hi = 0; k < n; ++k) {  // [lo, hi): the rightmost match window found
    size_t m = k < hi ? std::min(hi - k, z[k - lo]) : 0;
    while (k + m < n && r[m] == r[k + m]) ++m;
    z[k] = m;
    if (k + m > hi) lo = k, hi = k + m;
  }
  // The token after each repeat (r[k - 1] follows r[k]) would extend it: its longest repeat.
  std::unordered_map<int32_t, size_t> longest;
  for (size_t k = 1; k < n; ++k) {
    const size_t len = std::min(z[k], limit);
    if (len < size_t(p.allowed_length)) continue;
    size_t& l = longest[r[k - 1]];
    l = std::max(l, len);
  }
  // base^exponent stays below FLT_MAX.
  const int max_exponent = p.base > 1.000001f ? int(88.7228391f / std::log(p.base)) : 0;
  for (const auto& [token, len] : longest) {
    if (size_t(token) >= logits.size()) continue;
    const auto [first, last] = breakers.tails.equal_range(token);
    if (std::any_of(first, last, [](const auto& t) { return t.second.empty(); })) continue;
    int exponent = int(len) - p.allowed_length;
    if (max_exponent > 0) exponent = std::min(exponent, max_exponent);
    logits[size_t(token)] -= float(double(p.multiplier) * std::pow(double(p.base), exponent));
  }
}

}  // namespace vkllm
