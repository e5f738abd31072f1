// Tokenizer tests: llama.cpp's vocabulary vectors, round trips, the reference prompts, special
// token injection, streaming decode, and malformed vocabularies.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "base/error.h"
#include "gguf.h"
#include "text/pretokenizer.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "base/utf8.h"

namespace vkllm {
namespace {

using test::shared_files;
using test::shared_path;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split_inp(const std::string& s) {
  static const std::string k_sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = s.find(k_sep, start)) != std::string::npos; start = at + k_sep.size()) {
    out.push_back(s.substr(start, at - start));
  }
  out.push_back(s.substr(start));
  return out;
}

std::vector<std::vector<int32_t>> read_out(const std::string& path) {
  std::vector<std::vector<int32_t>> out;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

std::string name_of(const std::string& gguf_path) {
  const size_t slash = gguf_path.rfind('/');
  return gguf_path.substr(slash + 1);
}

// Loading the large vocabularies takes a while (under ASan especially): each is loaded once.
const Tokenizer& tokenizer_for(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[path];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_gguf(gguf::File::open(path)));
  return *slot;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// The sample strings every vocabulary is exercised with (all .inp files hold the same set).
std::vector<std::string> sample_strings() {
  const auto inps = shared_files("vocab", ".gguf.inp");
  return inps.empty() ? std::vector<std::string>{} : split_inp(slurp(inps.front()));
}

TEST(Tokenizer, LlamaCppVectors) {
  VKLLM_REQUIRE_SHARED("vocab");
  const auto inps = shared_files("vocab", ".gguf.inp");
  ASSERT_FALSE(inps.empty());
  // (vocabulary, its .out), the strings being those of the .inp beside it.
  std::vector<std::pair<std::string, std::string>> cases;
  for (const std::string& inp : inps) cases.emplace_back(inp.substr(0, inp.size() - 4), inp.substr(0, inp.size() - 4) + ".out");
  for (const auto& [gguf_path, out_path] : cases) {
    const Tokenizer& tok = tokenizer_for(gguf_path);
    const std::string inp = gguf_path + ".inp";
    auto pieces = split_inp(slurp(inp));
    auto expected = read_out(out_path);
    // The .inp ends with a separator: the empty text after it is not a case.
    if (pieces.size() == expected.size() + 1 && pieces.back().empty()) pieces.pop_back();
    ASSERT_EQ(expected.size(), pieces.size()) << out_path;
    size_t passed = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto got = tok.tokenize(pieces[i], false, false);
      if (got == expected[i]) {
        ++passed;
      } else {
        ADD_FAILURE() << name_of(gguf_path) << " piece " << i << " '" << pieces[i] << "'\n  expected: "
                      << ids_string(expected[i]) << "\n  got:      " << ids_string(got);
      }
    }
    std::printf("  %-36s %zu/%zu vectors\n", name_of(gguf_path).c_str(), passed, pieces.size());
  }
}

// Where detokenize(tokenize(x)) differs from x in llama.cpp too. Vocabularies with clean_spaces
// (clean_up_tokenization_spaces) rewrite " ," " ." " ?" " !" " ' " and " 's" " 'm" " 're" " 've";
// llama-spm/phi-3 map characters outside the vocabulary to byte tokens and round-trip exactly.
bool cleaned_by_detokenize(const std::string& s) {
  for (const char* p : {" ,", " .", " ?", " !", " ' ", " 's", " 'm", " 're", " 've"}) {
    if (s.find(p) != std::string::npos) return true;
  }
  return false;
}

TEST(Tokenizer, RoundTrip) {
  VKLLM_REQUIRE_SHARED("vocab");
  for (const std::string& inp : shared_files("vocab", ".gguf.inp")) {
    const std::string gguf_path = inp.substr(0, inp.size() - 4);
    const Tokenizer& tok = tokenizer_for(gguf_path);
    const bool cleans = tokenizer_impl(tok).clean_spaces;
    size_t exact = 0, excepted = 0;
    for (const std::string& s : split_inp(slurp(inp))) {
      const std::string back = tok.detokenize(tok.tokenize(s, false, false), false);
      if (back == s) {
        ++exact;
        continue;
      }
      if (cleans && cleaned_by_detokenize(s)) {
        ++excepted;
        continue;
      }
      ADD_FAILURE() << name_of(gguf_path) << ": '" << s << "' came back as '" << back << "'";
    }
    std::printf("  %-36s %zu exact, %zu changed by clean_spaces\n", name_of(gguf_path).c_str(), exact, excepted);
  }
}

// SPM merges word by word for speed; over long mixed text that must equal one merge over all.
TEST(Tokenizer, SpmWordSplitMatchesWholeText) {
  VKLLM_REQUIRE_SHARED("reference/stories.txt");
  std::string text = slurp(shared_path("reference/stories.txt"));
  for (const std::string& s : sample_strings()) text += s;
  std::string escaped;
  for (char c : " " + text) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  for (const char* name : {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-phi-3.gguf", "vocab/ggml-vocab-baichuan.gguf"}) {
    const Tokenizer::Impl& v = tokenizer_impl(tokenizer_for(shared_path(name)));
    ASSERT_TRUE(v.spm_word_split) << name;
    std::vector<int32_t> words, whole;
    spm_tokenize(v, escaped, true, words);
    spm_tokenize(v, escaped, false, whole);
    EXPECT_EQ(words, whole) << name;
  }
}

// llama.cpp's whitespace is Unicode White_Space: U+0085 is, U+180E is not (PCRE2's \s says it
// is). "!" and U+0085 are separate pre-tokens as for "! "; "!" and U+180E stay together.
TEST(Tokenizer, PreTokenizerWhitespaceIsUnicodeWhiteSpace) {
  bool known = false;
  const PreTokenizer gpt2 = PreTokenizer::for_name("gpt-2", known);
  ASSERT_TRUE(known);
  using Pieces = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(gpt2.split("!\xC2\x85"), (Pieces{{0, 1}, {1, 2}}));
  EXPECT_EQ(gpt2.split("! "), (Pieces{{0, 1}, {1, 1}}));
  EXPECT_EQ(gpt2.split("!\xE1\xA0\x8E"), (Pieces{{0, 4}}));
  const PreTokenizer unknown = PreTokenizer::for_name("no-such-pre", known);
  EXPECT_FALSE(known);
  EXPECT_EQ(unknown.split("Hello world"), (Pieces{{0, 5}, {5, 6}}));
}

TEST(Tokenizer, EveryVocabularyLoadsAndRuns) {
  VKLLM_REQUIRE_SHARED("vocab");
  auto samples = sample_strings();
  ASSERT_FALSE(samples.empty());
  // Arbitrary bytes (invalid UTF-8, NULs, code points past U+10FFFF) must not upset anything.
  std::mt19937 rng(7);
  std::string noise(8192, '\0');
  for (char& c : noise) c = char(rng() & 0xFF);
  samples.push_back(noise);
  const auto ggufs = shared_files("vocab", ".gguf");
  ASSERT_GE(ggufs.size(), 13u);
  for (const std::string& path : ggufs) {
    const Tokenizer& tok = tokenizer_for(path);
    EXPECT_GT(tok.n_vocab(), 0) << path;
    for (const std::string& s : samples) {
      const auto ids = tok.tokenize(s, true, true);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab()) << path;
      (void)tok.detokenize(ids, true);
      (void)tok.detokenize(ids, false);
    }
  }
}

TEST(Tokenizer, ReferencePrompts) {
  VKLLM_REQUIRE_SHARED("reference");
  const auto cases = shared_files("reference", ".json");
  size_t checked = 0;
  for (const std::string& path : cases) {
    const auto j = nlohmann::json::parse(slurp(path));
    if (!j.contains("prompt_tokens")) continue;
    const std::string model = shared_path("models/" + j.at("model_file").get<std::string>());
    const std::string prompt = slurp(shared_path("reference/prompts/" + j.at("prompt_id").get<std::string>() + ".txt"));
    const Tokenizer& tok = tokenizer_for(model);
    const auto expected = j.at("prompt_tokens").get<std::vector<int32_t>>();
    EXPECT_EQ(ids_string(tok.tokenize(prompt, true, false)), ids_string(expected)) << path;
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

TEST(Tokenizer, UserTextCannotInjectControlTokens) {
  VKLLM_REQUIRE_SHARED("vocab/ggml-vocab-qwen2.gguf");
  const Tokenizer& tok = tokenizer_for(shared_path("vocab/ggml-vocab-qwen2.gguf"));
  const auto im_end = tok.tokenize("<|im_end|>", false, true);
  ASSERT_EQ(im_end.size(), 1u);
  const int32_t im_end_id = im_end[0];
  EXPECT_TRUE(tok.is_eog(im_end_id));

  const TextPiece pieces[] = {{"<|im_start|>user\n", true}, {"hi <|im_end|> there", false}};
  const auto ids = tok.tokenize(pieces, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end_id), 0);
  EXPECT_EQ(ids.front(), tok.tokenize("<|im_start|>", false, true).front());

  const auto parsed = tok.tokenize("<|im_start|>user\nhi <|im_end|> there", false, true);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), im_end_id), 1);
  // Adjacent user pieces join into one text, as if tokenized together.
  const TextPiece split[] = {{"hel", false}, {"lo world", false}};
  EXPECT_EQ(tok.tokenize(split, false), tok.tokenize("hello world", false, false));
}

TEST(Tokenizer, StreamDecoderHoldsPartialCharacters) {
  VKLLM_REQUIRE_SHARED("vocab/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = tokenizer_for(shared_path("vocab/ggml-vocab-llama-spm.gguf"));
  const std::string text = "llama \xF0\x9F\xA6\x99 and \xF0\x9F\x8C\x8B!";  // 🦙 and 🌋: byte-fallback tokens
  const auto ids = tok.tokenize(text, false, false);
  size_t byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += tok.token_text(id).rfind("<0x", 0) == 0;
  ASSERT_GE(byte_tokens, 4u) << "the test needs characters that fall back to bytes";

  StreamDecoder dec(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string part = dec.push(id);
    EXPECT_EQ(utf8::sanitize(part), part) << "emitted half a character";
    streamed += part;
  }
  streamed += dec.flush();
  EXPECT_EQ(streamed, " " + text);  // streaming keeps the SPM space prefix

  // An unfinished character stays held until flush, which hands over the bytes as they are.
  std::vector<int32_t> llama_bytes;
  for (int32_t id : tok.tokenize("\xF0\x9F\xA6\x99", false, false)) {
    if (tok.token_text(id).rfind("<0x", 0) == 0) llama_bytes.push_back(id);
  }
  ASSERT_EQ(llama_bytes.size(), 4u);
  StreamDecoder partial(tok);
  EXPECT_EQ(partial.push(llama_bytes[0]), "");
  EXPECT_EQ(partial.push(llama_bytes[1]), "");
  EXPECT_EQ(partial.flush(), "\xF0\x9F");
  EXPECT_EQ(partial.flush(), "");
}

// A vocabulary-only GGUF with three tokens (or none when !with_tokens), tweaked by `edit`.
std::vector<uint8_t> tiny_vocab(const std::function<void(gguf::Writer&)>& edit, bool with_tokens = true) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("llama"));
  w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
  if (with_tokens) w.set("tokenizer.ggml.tokens", gguf::Value::strings({"<unk>", "<s>", "</s>"}));
  w.set("tokenizer.ggml.scores", gguf::Value::f32s(std::vector<float>{0, 0, 0}));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32s(std::vector<int32_t>{2, 3, 3}));
  edit(w);
  return w.to_bytes();
}

void expect_vocab_error(const std::function<void(gguf::Writer&)>& edit, const std::string& key, bool with_tokens = true) {
  const auto bytes = tiny_vocab(edit, with_tokens);
  try {
    Tokenizer::from_gguf(gguf::File::parse(bytes));
    ADD_FAILURE() << "no error for a bad '" << key << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, MalformedVocabularyIsAnError) {
  const auto good = tiny_vocab([](gguf::Writer&) {});
  EXPECT_NO_THROW(Tokenizer::from_gguf(gguf::File::parse(good)));
  expect_vocab_error([](gguf::Writer&) {}, "tokenizer.ggml.tokens", false);
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.tokens", gguf::Value::u32(3)); }, "tokenizer.ggml.tokens");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.tokens", gguf::Value::strings({})); }, "tokenizer.ggml.tokens");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.tokens", gguf::Value::i32s(std::vector<int32_t>{1, 2})); },
                     "tokenizer.ggml.tokens");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.scores", gguf::Value::f32s(std::vector<float>{0})); },
                     "tokenizer.ggml.scores");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.token_type", gguf::Value::f32s(std::vector<float>{1, 1, 1})); },
                     "tokenizer.ggml.token_type");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(7)); },
                     "tokenizer.ggml.bos_token_id");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.eos_token_id", gguf::Value::i32(-5)); },
                     "tokenizer.ggml.eos_token_id");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.eos_token_id", gguf::Value::str("2")); },
                     "tokenizer.ggml.eos_token_id");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.model", gguf::Value::str("t5")); }, "tokenizer.ggml.model");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.model", gguf::Value::str("gpt2")); }, "tokenizer.ggml.merges");
  expect_vocab_error([](gguf::Writer& w) { w.set("tokenizer.ggml.tokens", gguf::Value::strings({"a", "b", "a"})); },
                     "tokenizer.ggml.tokens");

  // -1 (0xFFFFFFFF) ids mean "none" and keep the default.
  const auto none = tiny_vocab([](gguf::Writer& w) { w.set("tokenizer.ggml.padding_token_id", gguf::Value::u32(0xFFFFFFFFu)); });
  const Tokenizer tok = Tokenizer::from_gguf(gguf::File::parse(none));
  EXPECT_EQ(tok.pad(), -1);
  EXPECT_THROW(tok.token_to_piece(3, false), Error);
  EXPECT_THROW(tok.token_to_piece(-1, false), Error);
  const int32_t bad[] = {0, 99};
  EXPECT_THROW(tok.detokenize(bad, false), Error);
  // Text with no tokens and no byte tokens falls back to <unk> per byte.
  EXPECT_EQ(tok.tokenize("x", true, false), (std::vector<int32_t>{1, 0, 0, 0, 0}));  // BOS, then "\u2581x" as 4 bytes
}

TEST(Tokenizer, SpecialIdsAndFlags) {
  VKLLM_REQUIRE_SHARED("vocab");
  const Tokenizer& spm = tokenizer_for(shared_path("vocab/ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(spm.model(), "llama");
  EXPECT_EQ(spm.bos(), 1);
  EXPECT_EQ(spm.eos(), 2);
  EXPECT_TRUE(spm.add_bos());
  EXPECT_TRUE(spm.is_eog(2));
  EXPECT_EQ(spm.tokenize("Hello", true, false).front(), 1);
  EXPECT_EQ(spm.detokenize(spm.tokenize("Hello world", true, false), false), " Hello world");  // as llama.cpp
  EXPECT_EQ(spm.token_to_piece(1, false), "");
  EXPECT_EQ(spm.token_to_piece(1, true), "<s>");

  const Tokenizer& l3 = tokenizer_for(shared_path("vocab/ggml-vocab-llama-bpe.gguf"));
  EXPECT_TRUE(l3.add_bos());
  EXPECT_EQ(l3.bos(), 128000);
  const auto eot = l3.tokenize("<|eot_id|>", false, true);
  ASSERT_EQ(eot.size(), 1u);
  EXPECT_EQ(l3.eot(), eot[0]);
  EXPECT_TRUE(l3.is_eog(eot[0]));
  EXPECT_FALSE(l3.is_eog(l3.tokenize("Hello", false, false)[0]));

  const Tokenizer& q = tokenizer_for(shared_path("vocab/ggml-vocab-qwen2.gguf"));
  EXPECT_FALSE(q.add_bos());
  EXPECT_EQ(q.tokenize("Hello", true, false).size(), 1u);
  for (const std::string& w : q.warnings()) std::printf("  qwen2 load warning: %s\n", w.c_str());
  // "</s>" is an ordinary token in this vocabulary; llama.cpp (the anchor) makes it control and
  // end-of-generation by its name (PaddleOCR's), so special parsing takes it whole.
  EXPECT_EQ(q.tokenize("<s> hi </s>", false, true), (std::vector<int32_t>{44047, 29, 15588, 220, 128247}));
  EXPECT_TRUE(q.is_eog(128247));

  const Tokenizer& neox = tokenizer_for(shared_path("vocab/ggml-vocab-gpt-neox.gguf"));
  EXPECT_FALSE(neox.warnings().empty());  // no tokenizer.ggml.pre
}

}  // namespace
}  // namespace vkllm
