// libFuzzer target: GBNF from a client (the server's 'grammar' field), or a JSON schema (its
// json_schema) when the input's first part is JSON, must become a grammar or fail with a
// vkllm::Error, and a grammar must take any text without crashing or growing without bound. The
// input is the grammar or schema, then (after a NUL byte) text fed to the matcher a byte at a time
// as the LLaMA vocabulary's byte tokens (the first 256): each byte is checked, and accepted when
// allowed; the mask over the whole vocabulary runs once at the end.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "gguf.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"

namespace {

struct ByteVocab {
  std::unique_ptr<vkllm::Tokenizer> tok;
  std::shared_ptr<const vkllm::GrammarVocab> vocab;
  std::map<uint8_t, int32_t> byte_token;
};

const ByteVocab& byte_vocab() {
  static const ByteVocab v = [] {
    ByteVocab b;
    try {
      b.tok = std::make_unique<vkllm::Tokenizer>(
          vkllm::Tokenizer::from_gguf(gguf::File::open(VKLLM_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf")));
    } catch (const std::exception&) {
      return b;  // without ../shared, the parser alone is fuzzed
    }
    b.vocab = std::make_shared<const vkllm::GrammarVocab>(*b.tok);
    for (int32_t id = 0; id < b.tok->n_vocab(); ++id) {
      const std::string& t = b.tok->token_text(id);
      if (t.size() == 6 && t.rfind("<0x", 0) == 0) b.byte_token[uint8_t(std::stoi(t.substr(3, 2), nullptr, 16))] = id;
    }
    return b;
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view gbnf = input.substr(0, nul), text = nul == std::string_view::npos ? "" : input.substr(nul + 1, 256);
  try {
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(gbnf, nullptr, false);
    const std::shared_ptr<const vkllm::Grammar> g =
        vkllm::Grammar::parse(schema.is_discarded() ? std::string(gbnf) : vkllm::json_schema_to_gbnf(schema), "fuzz");
    const ByteVocab& v = byte_vocab();
    if (!v.vocab) return 0;
    vkllm::GrammarMatcher m(g, v.vocab);
    for (const char c : text) {
      const int32_t t = v.byte_token.at(uint8_t(c));
      if (m.allows(t)) m.accept(t);
    }
    if (!text.empty()) {
      std::vector<float> logits(v.vocab->size(), 0.0f);
      m.mask(logits);
    }
  } catch (const vkllm::Error&) {
  }
  return 0;
}
