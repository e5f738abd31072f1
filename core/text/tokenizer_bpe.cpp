// Byte-level BPE as llama.cpp's llm_tokenizer_bpe: pre-tokenize with the vocabulary's regexes,
// map bytes to GPT-2's printable code points, then merge the lowest-ranked adjacent pair.
#include <queue>

#include "text/tokenizer_impl.h"
#include "base/utf8.h"

namespace vkllm {
namespace {

struct ByteMap {
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 512> from_cpt;  // every mapped code point is below 512

  ByteMap() {
    from_cpt.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes stand for themselves; the rest move to U+0100 upwards in order.
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const uint32_t cpt = printable ? b : next++;
      utf8::append(to_utf8[b], cpt);
      from_cpt[cpt] = int16_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap k_map;
  return k_map;
}

struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the word
  size_t n;       // bytes; 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  size_t size;
};

// Lowest rank first; among equal ranks the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

}  // namespace

const std::string& bpe_byte_to_utf8(uint8_t b) { return byte_map().to_utf8[b]; }

int bpe_cpt_to_byte(uint32_t cpt) { return cpt < 512 ? byte_map().from_cpt[cpt] : -1; }

void BpeSession::tokenize(std::string_view text, std::vector<int32_t>& out) {
  // llama.cpp decodes the text to code points first (bad bytes become U+FFFD), so the regexes
  // and the byte encoding see valid UTF-8 only.
  const std::string clean = utf8::sanitize(text);
  const ByteMap& bm = byte_map();
  std::string word;
  for (const auto& [off, len] : v_.pretokenizer->split(clean)) {
    word.clear();
    for (size_t i = off; i < off + len; ++i) word += bm.to_utf8[uint8_t(clean[i])];
    const auto hit = cache_.find(word);
    if (hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      continue;
    }
    std::vector<int32_t> ids;
    encode_word(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    cache_.emplace(word, std::move(ids));
  }
}

void BpeSession::encode_word(const std::string& word, std::vector<int32_t>& out) {
  if (v_.ignore_merges) {
    const int32_t id = v_.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> symbols;
  if (word.empty()) return;
  for (size_t offs = 0; offs < word.size();) {
    const size_t n = std::min(utf8::seq_len(uint8_t(word[offs])), word.size() - offs);
    const int index = int(symbols.size());
    symbols.push_back({index - 1, offs + n == word.size() ? -1 : index + 1, offs, n});
    offs += n;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  std::string key;
  auto add_bigram = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[size_t(left)];
    const Symbol& r = symbols[size_t(right)];
    key.assign(word, l.offset, l.n);
    key += '\0';
    key.append(word, r.offset, r.n);
    const int32_t rank = v_.bpe_ranks.find(key);
    if (rank < 0) return;
    queue.push({left, right, rank, l.n + r.n});
  };
  for (int i = 1; i < int(symbols.size()); ++i) add_bigram(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(b.left)];
    Symbol& right = symbols[size_t(b.right)];
    // Stale entry: both ends of a pair stay put, so an unchanged pair has an unchanged size.
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = b.left;
    add_bigram(left.prev, b.left);
    add_bigram(b.left, left.next);
  }
  for (int i = 0; i != -1; i = symbols[size_t(i)].next) {
    const std::string_view text = std::string_view(word).substr(symbols[size_t(i)].offset, symbols[size_t(i)].n);
    const int32_t id = v_.find(text);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // As llama.cpp: look each byte up as a one-byte token; bytes without one are dropped.
    for (char c : text) {
      const int32_t b = v_.find(std::string_view(&c, 1));
      if (b >= 0) out.push_back(b);
    }
  }
}

}  // namespace vkllm
