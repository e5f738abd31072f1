// SentencePiece BPE as llama.cpp's llm_tokenizer_spm: merge the adjacent pair whose joined text
// is the highest-scoring token until none is left, then fall back to <0xXX> byte tokens.
#include <queue>

#include "base/error.h"
#include "text/tokenizer_impl.h"
#include "base/utf8.h"

namespace vkllm {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the text
  size_t n;       // bytes; 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Highest score first; among equal scores the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

class SpmSession {
 public:
  explicit SpmSession(const Tokenizer::Impl& v) : v_(v) {}

  void run(std::string_view text, std::vector<int32_t>& out) {
    text_ = text;
    symbols_.clear();
    if (text_.empty()) return;
    for (size_t offs = 0; offs < text_.size();) {
      const size_t n = std::min(utf8::seq_len(uint8_t(text_[offs])), text_.size() - offs);
      const int index = int(symbols_.size());
      symbols_.push_back({index - 1, offs + n == text_.size() ? -1 : index + 1, offs, n});
      offs += n;
    }
    for (int i = 1; i < int(symbols_.size()); ++i) try_add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[size_t(b.left)];
      Symbol& right = symbols_[size_t(b.right)];
      // Stale entry: one side was merged away or has grown since.
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[size_t(right.next)].prev = b.left;
      try_add_bigram(left.prev, b.left);
      try_add_bigram(b.left, left.next);
    }
    for (int i = 0; i != -1; i = symbols_[size_t(i)].next) emit(symbols_[size_t(i)], out);
  }

 private:
  std::string_view text_of(const Symbol& s) const { return text_.substr(s.offset, s.n); }

  // A final symbol is a token (merges only ever form tokens) or a single character that is not
  // one, which is emitted as its <0xXX> byte tokens. (llama.cpp's rev_merge fallback therefore
  // never fires and is left out.)
  void emit(const Symbol& s, std::vector<int32_t>& out) const {
    const std::string_view text = text_of(s);
    const int32_t id = v_.find(text);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    for (char c : text) {
      int32_t b = v_.byte_ids[uint8_t(c)];
      if (b < 0) b = v_.unk;
      if (b < 0) throw Error("tokenizer: byte " + std::to_string(uint8_t(c)) + " has no <0xXX> token and the vocabulary has no unknown token");
      out.push_back(b);
    }
  }

  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols_[size_t(left)];
    const Symbol& r = symbols_[size_t(right)];
    const std::string_view text = text_.substr(l.offset, l.n + r.n);
    const int32_t id = v_.find(text);
    if (id < 0) return;
    queue_.push({left, right, v_.tokens[size_t(id)].score, text.size()});
  }

  const Tokenizer::Impl& v_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
};

}  // namespace

void spm_tokenize(const Tokenizer::Impl& v, std::string_view text, bool split_words, std::vector<int32_t>& out) {
  SpmSession session(v);
  if (!split_words) {
    session.run(text, out);
    return;
  }
  // Cut before every ▁ whose preceding character (as the session splits characters) is not ▁;
  // a word's ids depend on the word alone, and words repeat.
  constexpr std::string_view k_space = "\xE2\x96\x81";
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  auto word = [&](std::string_view w) {
    auto [it, fresh] = cache.try_emplace(w);
    if (fresh) session.run(w, it->second);
    out.insert(out.end(), it->second.begin(), it->second.end());
  };
  size_t begin = 0;
  size_t prev = 0;  // start of the previous character
  for (size_t offs = 0; offs < text.size();) {
    const size_t n = std::min(utf8::seq_len(uint8_t(text[offs])), text.size() - offs);
    if (offs > begin && text.substr(offs, n) == k_space && text.substr(prev, offs - prev) != k_space) {
      word(text.substr(begin, offs - begin));
      begin = offs;
    }
    prev = offs;
    offs += n;
  }
  word(text.substr(begin));
}

}  // namespace vkllm
