// Tokenizer: reading the vocabulary from GGUF, special tokens, splitting special tokens out of
// the text, and tokenize() for both vocabulary types.
#include <algorithm>
#include <cstdio>

#include "base/ascii.h"
#include "base/error.h"
#include "gguf.h"
#include "text/tokenizer_impl.h"

namespace vkllm {
namespace {

constexpr std::string_view k_tokens_key = "tokenizer.ggml.tokens";
constexpr std::string_view k_spm_space = "\xE2\x96\x81";  // ▁, SentencePiece's space

[[noreturn]] void bad_vocab(const gguf::File& f, std::string_view key, const std::string& what) {
  throw Error(f.path() + ": key '" + std::string(key) + "': " + what);
}

enum class ElemKind { String, Float, Integer };

bool elem_is(gguf::ValueType t, ElemKind kind) {
  using T = gguf::ValueType;
  switch (kind) {
    case ElemKind::String: return t == T::STRING;
    case ElemKind::Float: return t == T::F32 || t == T::F64;
    case ElemKind::Integer:
      return t == T::U8 || t == T::I8 || t == T::U16 || t == T::I16 || t == T::U32 || t == T::I32 || t == T::U64 ||
             t == T::I64;
  }
  return false;
}

// The array under `key`, whose elements must be of `kind`; nullptr when absent and !required.
const gguf::Array* find_array(const gguf::File& f, std::string_view key, ElemKind kind, bool required) {
  static constexpr const char* k_kind_names[] = {"strings", "floats", "integers"};
  const gguf::Value* v = f.find(key);
  if (!v) {
    if (required) bad_vocab(f, key, "missing");
    return nullptr;
  }
  if (v->type != gguf::ValueType::ARRAY) bad_vocab(f, key, std::string("is a ") + gguf::value_type_name(v->type) + ", expected an array");
  const auto& a = std::get<gguf::Array>(v->data);
  if (!elem_is(a.elem_type, kind)) {
    bad_vocab(f, key, std::string("holds ") + gguf::value_type_name(a.elem_type) + ", expected " + k_kind_names[int(kind)]);
  }
  return &a;
}

// Sets a token id from `key` when present. 0xFFFFFFFF (-1) means "none" in converted files and
// keeps the default, as llama.cpp does; any other id outside the vocabulary is an error.
void read_token_id(const gguf::File& f, std::string_view key, int32_t n_vocab, int32_t& id) {
  const gguf::Value* v = f.find(key);
  if (!v) return;
  std::string shown;  // the value as written, for the message
  int64_t value = 0;
  if (const auto* u = std::get_if<uint64_t>(&v->data); u && v->type != gguf::ValueType::BOOL) {
    if (*u == 0xFFFFFFFFull || *u == ~0ull) return;
    shown = std::to_string(*u);
    value = *u > uint64_t(INT32_MAX) ? INT64_MAX : int64_t(*u);
  } else if (const auto* i = std::get_if<int64_t>(&v->data)) {
    if (*i == -1) return;
    shown = std::to_string(*i);
    value = *i;
  } else {
    bad_vocab(f, key, std::string("is a ") + gguf::value_type_name(v->type) + ", expected an integer token id");
  }
  if (value < 0 || value >= n_vocab) {
    bad_vocab(f, key, "token id " + shown + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
  }
  id = int32_t(value);
}

uint32_t attr_from_type(int64_t type) {
  switch (type) {
    case 1: return token_attr::k_normal;
    case 2: return token_attr::k_unknown;
    case 3: return token_attr::k_control;
    case 4: return token_attr::k_user_defined;
    case 5: return token_attr::k_unused;
    case 6: return token_attr::k_byte;
    default: return token_attr::k_undefined;
  }
}

// Finds the first of `names` in the vocabulary for an unset id, making it a control token as
// llama.cpp does. llama.cpp walks a hash map, so its pick among several present names is
// arbitrary; this takes them in the listed order.
void detect_special(Tokenizer::Impl& v, int32_t& id, std::initializer_list<std::string_view> names,
                    std::vector<std::string>& retyped) {
  if (id != -1) return;
  for (std::string_view name : names) {
    const int32_t found = v.find(name);
    if (found < 0) continue;
    id = found;
    if (!(v.tokens[size_t(found)].attr & token_attr::k_control)) {
      retyped.push_back(std::string(name));
      v.tokens[size_t(found)].attr = token_attr::k_control;
    }
    return;
  }
}

void load_special_tokens(Tokenizer::Impl& v, const gguf::File& f) {
  const int32_t n = v.n_vocab();
  const std::pair<std::string_view, int32_t*> keys[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},           {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},           {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},       {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},       {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre},   {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid},   {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep},   {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},    {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& [key, id] : keys) read_token_id(f, key, n, *id);
  v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", v.add_bos);
  v.add_eos = f.get_bool_or("tokenizer.ggml.add_eos_token", v.add_eos);

  std::vector<std::string> retyped;  // control-looking tokens that were not typed control
  detect_special(v, v.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "_<EOT>",
                            "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"}, retyped);
  detect_special(v, v.eom, {"<|eom_id|>"}, retyped);
  detect_special(v, v.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>"}, retyped);
  detect_special(v, v.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>"}, retyped);
  detect_special(v, v.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>"}, retyped);
  detect_special(v, v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<PAD>"}, retyped);
  detect_special(v, v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"}, retyped);
  detect_special(v, v.fim_sep, {"<|file_sep|>"}, retyped);

  // End of generation: the FIM pad/repo/file-separator tokens, every token with an end-of-turn
  // text, and eos/eot/eom.
  v.eog.assign(size_t(n), 0);
  for (int32_t id : {v.fim_pad, v.fim_rep, v.fim_sep, v.eos, v.eot, v.eom}) {
    if (id >= 0) v.eog[size_t(id)] = 1;
  }
  for (std::string_view name : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                                "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
                                // (PaddleOCR's; llama.cpp retypes it in every vocabulary that has it, as here)
                                "</s>"}) {
    int32_t id = -1;
    detect_special(v, id, {name}, retyped);
    if (id >= 0) v.eog[size_t(id)] = 1;
  }
  if (!retyped.empty()) {
    std::string list;
    for (const std::string& t : retyped) {
      if (!list.empty()) list += ", ";
      list += t;
    }
    v.warnings.push_back("control-looking tokens not typed control, treated as control (as llama.cpp): " + list);
  }
}

// Per-model attribute fixes llama.cpp applies by name (they only matter for parse_special).
void apply_name_rules(Tokenizer::Impl& v, const gguf::File& f) {
  auto set = [&](std::string_view text, uint32_t bit, bool on) {
    const int32_t id = v.find(text);
    if (id < 0) return;
    auto& a = v.tokens[size_t(id)].attr;
    a = on ? (a | bit) : (a & ~bit);
  };
  const std::string name = ascii_lower(f.get_string_or("general.name", ""));
  if (v.pre == "jina-v2-de" || v.pre == "jina-v2-es" || v.pre == "jina-v2-code") {
    set("<mask>", token_attr::k_lstrip, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int32_t id : v.special_tokens) v.tokens[size_t(id)].attr |= token_attr::k_rstrip;
    set("</s>", token_attr::k_rstrip, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, token_attr::k_rstrip, false);
  }
}

std::unique_ptr<Tokenizer::Impl> load(const gguf::File& f) {
  auto v = std::make_unique<Tokenizer::Impl>();
  if (!f.find("tokenizer.ggml.model")) bad_vocab(f, "tokenizer.ggml.model", "missing");
  v->model = f.get_string("tokenizer.ggml.model");
  v->pre = f.get_string_or("tokenizer.ggml.pre", "");

  if (v->model == "llama") {
    v->type = VocabType::Spm;
    v->bos = 1;
    v->eos = 2;
    v->unk = 0;
    v->add_space_prefix = true;
    v->add_bos = true;
  } else if (v->model == "gpt2") {
    v->type = VocabType::Bpe;
    v->bos = 11;  // llama.cpp's default for BPE vocabularies without bos_token_id
    v->eos = 11;
    if (v->pre.empty()) {
      v->warnings.push_back("no tokenizer.ggml.pre: using the 'default' pre-tokenizer (quality may suffer)");
      v->pretokenizer = std::make_unique<PreTokenizer>(PreTokenizer::default_set());
    } else {
      bool known = false;
      v->pretokenizer = std::make_unique<PreTokenizer>(PreTokenizer::for_name(v->pre, known));
      if (!known) v->warnings.push_back("unknown pre-tokenizer '" + v->pre + "': using the GPT-2 regex");
    }
    const PreTokenizerFlags& fl = v->pretokenizer->flags();
    v->clean_spaces = fl.clean_spaces;
    v->ignore_merges = fl.ignore_merges;
    if (fl.add_bos) v->add_bos = true;
    if (fl.null_bos) v->bos = -1;
  } else {
    bad_vocab(f, "tokenizer.ggml.model", "'" + v->model + "' is not supported (llama, gpt2)");
  }
  v->add_space_prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", v->add_space_prefix);

  const gguf::Array* tokens = find_array(f, k_tokens_key, ElemKind::String, true);
  if (tokens->strings.empty()) bad_vocab(f, k_tokens_key, "the vocabulary is empty");
  if (tokens->strings.size() > size_t(INT32_MAX)) bad_vocab(f, k_tokens_key, "too many tokens");
  const size_t n = tokens->strings.size();
  const gguf::Array* scores = find_array(f, "tokenizer.ggml.scores", ElemKind::Float, false);
  const gguf::Array* types = find_array(f, "tokenizer.ggml.token_type", ElemKind::Integer, false);
  if (scores && scores->count != n) bad_vocab(f, "tokenizer.ggml.scores", std::to_string(scores->count) + " scores for " + std::to_string(n) + " tokens");
  if (types && types->count != n) bad_vocab(f, "tokenizer.ggml.token_type", std::to_string(types->count) + " types for " + std::to_string(n) + " tokens");

  v->tokens.resize(n);
  v->token_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v->tokens[i];
    t.text = tokens->strings[i];
    if (t.text.empty()) {
      v->warnings.push_back("empty token at index " + std::to_string(i));
      t.text = "[EMPTY_" + std::to_string(i) + "]";
    }
    if (scores) t.score = float(scores->float_at(i));
    if (types) t.attr = attr_from_type(types->int_at(i));
    if (!v->token_to_id.insert(t.text, int32_t(i))) {
      bad_vocab(f, k_tokens_key, "token " + std::to_string(i) + " '" + t.text + "' appears twice");
    }
  }

  if (v->type == VocabType::Bpe) {
    const gguf::Array* merges = find_array(f, "tokenizer.ggml.merges", ElemKind::String, true);
    v->bpe_ranks.reserve(merges->strings.size());
    for (size_t i = 0; i < merges->strings.size(); ++i) {
      const std::string& m = merges->strings[i];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) continue;  // llama.cpp stores ("", ""), which never matches
      std::string key = m;
      key[sp] = '\0';
      v->bpe_ranks.insert(key, int32_t(i));
    }
  } else {
    v->spm_word_split = true;
    for (const TokenData& t : v->tokens) {
      for (size_t at = t.text.find(k_spm_space, 1); at != std::string::npos; at = t.text.find(k_spm_space, at + 1)) {
        if (at < 3 || t.text.compare(at - 3, 3, k_spm_space) != 0) v->spm_word_split = false;
      }
    }
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      v->byte_ids[size_t(b)] = v->find(name);
    }
  }

  load_special_tokens(*v, f);

  for (int32_t id = 0; id < v->n_vocab(); ++id) {
    if (v->tokens[size_t(id)].attr & token_attr::k_special) {
      v->special_tokens.push_back(id);
    }
  }
  std::stable_sort(v->special_tokens.begin(), v->special_tokens.end(), [&](int32_t a, int32_t b) {
    return v->tokens[size_t(a)].text.size() > v->tokens[size_t(b)].text.size();
  });

  v->pieces.resize(n);
  for (int32_t id = 0; id < v->n_vocab(); ++id) v->pieces[size_t(id)] = compute_piece(*v, id);

  apply_name_rules(*v, f);
  return v;
}

// A piece of the text to tokenize: raw text [offset, offset + length) of the buffer, or a token.
struct Fragment {
  int32_t token;  // -1 for raw text
  size_t offset;
  size_t length;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// llama.cpp's tokenizer_st_partition: each special token in turn (longest first) is cut out of
// every raw fragment, left to right. Control and unknown tokens only when parse_special.
void partition(const Tokenizer::Impl& v, std::string_view text, bool parse_special, std::vector<Fragment>& out) {
  if (text.empty()) return;  // no fragment at all: "" gets no SPM space prefix either
  std::vector<Fragment> frags{{-1, 0, text.size()}};
  std::vector<Fragment> next;
  for (int32_t id : v.special_tokens) {
    const TokenData& tok = v.tokens[size_t(id)];
    if (!parse_special && (tok.attr & (token_attr::k_control | token_attr::k_unknown))) continue;
    const std::string_view needle = tok.text;
    if (text.find(needle) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t off = fr.offset;
      size_t len = fr.length;
      while (len > 0) {
        const size_t rel = text.substr(off, len).find(needle);
        if (rel == std::string_view::npos) break;
        size_t left_len = rel;
        if (tok.attr & token_attr::k_lstrip) {
          while (left_len > 0 && is_space(text[off + left_len - 1])) --left_len;
        }
        if (left_len > 0) next.push_back({-1, off, left_len});
        next.push_back({id, 0, 0});
        size_t right_off = off + rel + needle.size();
        size_t right_len = len - rel - needle.size();
        if (tok.attr & token_attr::k_rstrip) {
          while (right_len > 0 && is_space(text[right_off])) {
            ++right_off;
            --right_len;
          }
        }
        off = right_off;
        len = right_len;
      }
      if (len > 0) next.push_back({-1, off, len});
    }
    frags.swap(next);
  }
  out.insert(out.end(), frags.begin(), frags.end());
}

void escape_whitespace(std::string& s) {
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (char c : s) {
    if (c == ' ') out += k_spm_space;
    else out += c;
  }
  s.swap(out);
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

const Tokenizer::Impl& tokenizer_impl(const Tokenizer& tok) { return *tok.impl_; }

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  try {
    return Tokenizer(load(f));
  } catch (const gguf::Error& e) {
    throw Error(e.what());
  }
}

std::vector<int32_t> Tokenizer::tokenize(std::string_view text, bool add_bos, bool parse_special) const {
  const TextPiece piece{text, parse_special};
  return tokenize(std::span<const TextPiece>(&piece, 1), add_bos);
}

std::vector<int32_t> Tokenizer::tokenize(std::span<const TextPiece> pieces, bool add_bos, int32_t after) const {
  const Impl& v = *impl_;
  // Consecutive pieces with the same flag are one text for partitioning; raw fragments that end
  // up adjacent (across a flag change) are joined, so the pieces tokenize as one text.
  std::string buffer;
  std::vector<Fragment> frags;
  for (size_t i = 0; i < pieces.size();) {
    const bool special = pieces[i].parse_special;
    std::string group;
    for (; i < pieces.size() && pieces[i].parse_special == special; ++i) group += pieces[i].text;
    std::vector<Fragment> group_frags;
    partition(v, group, special, group_frags);
    for (const Fragment& fr : group_frags) {
      if (fr.token >= 0) {
        frags.push_back(fr);
        continue;
      }
      const size_t at = buffer.size();
      buffer.append(group, fr.offset, fr.length);
      if (!frags.empty() && frags.back().token < 0 && frags.back().offset + frags.back().length == at) {
        frags.back().length += fr.length;
      } else {
        frags.push_back({-1, at, fr.length});
      }
    }
  }

  std::vector<int32_t> out;
  const std::string_view all = buffer;
  if (v.type == VocabType::Spm) {
    bool prev_special = after < 0 || is_special(after);  // the first fragment gets the space prefix
    if (add_bos && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        out.push_back(fr.token);
        prev_special = true;
        continue;
      }
      std::string s;
      if (v.add_space_prefix && prev_special) s = " ";
      s += all.substr(fr.offset, fr.length);
      escape_whitespace(s);
      spm_tokenize(v, s, v.spm_word_split, out);
      prev_special = false;
    }
  } else {
    if (add_bos && v.add_bos && v.bos >= 0) out.push_back(v.bos);
    BpeSession session(v);
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) out.push_back(fr.token);
      else session.tokenize(all.substr(fr.offset, fr.length), out);
    }
  }
  if (add_bos && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  return out;
}

int32_t Tokenizer::n_vocab() const { return impl_->n_vocab(); }
int32_t Tokenizer::bos() const { return impl_->bos; }
int32_t Tokenizer::eos() const { return impl_->eos; }
int32_t Tokenizer::eot() const { return impl_->eot; }
int32_t Tokenizer::eom() const { return impl_->eom; }
int32_t Tokenizer::unk() const { return impl_->unk; }
int32_t Tokenizer::pad() const { return impl_->pad; }
bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && impl_->eog[size_t(id)]; }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < n_vocab() && (impl_->tokens[size_t(id)].attr & token_attr::k_special);
}
bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() && (impl_->tokens[size_t(id)].attr & token_attr::k_control);
}
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab()) + ")");
  return impl_->tokens[size_t(id)].text;
}
std::string Tokenizer::model() const { return impl_->model; }
std::string Tokenizer::pre() const { return impl_->pre; }
const std::vector<std::string>& Tokenizer::warnings() const { return impl_->warnings; }

}  // namespace vkllm
