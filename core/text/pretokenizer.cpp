// The per-`tokenizer.ggml.pre` regex sets (as llama.cpp's llm_tokenizer_bpe lists them) and
// splitting text with them through PCRE2.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenizer.h"

#include <pcre2.h>

#include <array>

#include "base/error.h"
#include "base/utf8.h"

namespace vkllm {
namespace {

// GPT-2's regex. llama.cpp drops the trailing `|\s+`; text no alternative matches stays a piece
// of its own anyway, so the split is the same.
constexpr std::string_view k_gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3's regex with the case-insensitive group spelled out: PCRE2's (?i) would also fold
// U+017F and U+212A, which llama.cpp's adapted form does not.
constexpr std::string_view k_llama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_qwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// The letters DeepSeek LLM's tokenizer.json lists, as code points (several of them change
// under Unicode normalisation, so they are not written literally).
constexpr std::string_view k_deepseek_llm_letters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr std::string_view k_cjk_hangul = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr std::string_view k_finnish = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";
// Tekken and GPT-4o as llama.cpp adapts them: "upper" is any letter but a-z, "lower" any but A-Z.
constexpr std::string_view k_tekken =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_gpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct NamedSet {
  std::vector<std::string_view> names;
  std::vector<std::string_view> patterns;
  PreTokenizerFlags flags;
};

// Every name llama.cpp accepts for a byte-level BPE vocabulary, with its regexes and flags.
const std::vector<NamedSet>& named_sets() {
  static const std::vector<NamedSet> k_sets = {
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)", k_gpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"},
       {}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {k_llama3},
       {.ignore_merges = true, .add_bos = true}},
      {{"dbrx", "smaug-bpe"}, {k_llama3}, {}},
      {{"chatglm-bpe"}, {k_llama3}, {.null_bos = true}},
      {{"glm4"}, {k_llama3}, {}},
      {{"deepseek-llm"},
       {"[\\r\\n]", k_deepseek_llm_letters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)",
        k_cjk_hangul, R"(\p{N}+)"},
       {.clean_spaces = false}},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       {.clean_spaces = false}},
      {{"deepseek-coder"},
       {"[\\r\\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", k_cjk_hangul, R"(\p{N})"},
       {.clean_spaces = false}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", k_gpt2, "[0-9][0-9][0-9]"}, {}},
      {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", k_gpt2}, {}},
      {{"command-r", "smollm"}, {R"(\p{N})", k_gpt2}, {.clean_spaces = false}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de",
        "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais"},
       {k_gpt2},
       {}},
      {{"qwen2", "deepseek-r1-qwen"}, {k_qwen2}, {.clean_spaces = false}},
      {{"stablelm2", "megrez"}, {k_qwen2}, {}},
      {{"poro-chat"}, {k_finnish}, {.clean_spaces = false}},
      {{"bloom", "gpt3-finnish"}, {k_finnish}, {}},
      {{"viking"}, {k_finnish, R"(\p{N})"}, {.clean_spaces = false}},
      {{"tekken"}, {k_tekken}, {.clean_spaces = false, .ignore_merges = true, .add_bos = true}},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", R"(\p{N})",
        R"([\p{P}!-/:-@\[-`{-~])", k_gpt2},
       {.clean_spaces = false, .add_bos = true}},
      {{"gpt-4o", "llama4"}, {k_gpt4o}, {.clean_spaces = false}},
  };
  return k_sets;
}

// llama.cpp's whitespace is Unicode's White_Space property. PCRE2's \s under UCP also matches
// U+180E (Mongolian vowel separator, White_Space only before Unicode 6.3), so \s and \S are
// spelled out as this set.
constexpr std::string_view k_white_space =
    R"(\t\n\x0B\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string spell_out_whitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[++i];
      if (n == 's') {
        out += in_class ? std::string(k_white_space) : "[" + std::string(k_white_space) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(k_white_space) + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const std::vector<std::string_view>& patterns, PreTokenizerFlags flags) : flags_(flags) {
  for (std::string_view p : patterns) {
    const std::string pattern = spell_out_whitespace(p);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto r = std::make_unique<Regex>();
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (!r->code) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      VKLLM_CHECK(false, "pre-tokenizer regex does not compile at " + std::to_string(err_off) + ": " +
                             reinterpret_cast<const char*>(msg.data()));
    }
    // JIT is an optimisation only: without it pcre2_match interprets the same pattern.
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);
    regexes_.push_back(std::move(r));
  }
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

PreTokenizer PreTokenizer::for_name(std::string_view name, bool& known) {
  for (const NamedSet& s : named_sets()) {
    for (std::string_view n : s.names) {
      if (n == name) {
        known = true;
        return PreTokenizer(s.patterns, s.flags);
      }
    }
  }
  known = false;
  return PreTokenizer({k_gpt2}, {});
}

PreTokenizer PreTokenizer::default_set() { return PreTokenizer(named_sets().front().patterns, {}); }

std::vector<std::pair<size_t, size_t>> PreTokenizer::split(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> pieces;
  if (text.empty()) return pieces;
  pieces.emplace_back(0, text.size());
  std::vector<std::pair<size_t, size_t>> next;
  for (const auto& re : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
    VKLLM_CHECK(md != nullptr, "out of memory for PCRE2 match data");
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const auto& [off, len] : pieces) {
      // Each piece is its own subject, so lookaheads and `$` stop at its end as in llama.cpp.
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + off);
      size_t start = 0;  // end of the previous match
      size_t pos = 0;    // where the next search begins
      while (pos < len) {
        const int rc = pcre2_match(re->code, subject, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) {
          VKLLM_CHECK(rc == PCRE2_ERROR_NOMATCH, "PCRE2 match failed with code " + std::to_string(rc));
          break;
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t m_begin = ov[0];
        const size_t m_end = ov[1];
        if (m_end == m_begin) {  // an empty match splits nothing; step over one character
          pos = m_begin + utf8::seq_len(uint8_t(text[off + m_begin]));
          continue;
        }
        if (m_begin > start) next.emplace_back(off + start, m_begin - start);
        next.emplace_back(off + m_begin, m_end - m_begin);
        start = pos = m_end;
      }
      if (start < len) next.emplace_back(off + start, len - start);
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace vkllm
