// Session files: model fingerprint, writing and fully validated reading (format in the header).
#include "store/session_file.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>
#include <filesystem>
#include <fstream>
#include <functional>

#include "atomic_file.h"
#include "base/commas.h"
#include "base/input_file.h"
#include "base/utf8.h"

namespace vkllm {
namespace {

static_assert(std::endian::native == std::endian::little, "session files are written little-endian");

constexpr char kMagic[8] = {'V', 'K', 'L', 'L', 'M', 'S', 'E', 'S'};
constexpr uint32_t kSectionCount = 5;
constexpr uint64_t kPreambleBytes = 16;
constexpr uint64_t kFrameBytes = 16 + 8;  // tag, reserved, length; checksum after the payload
constexpr uint32_t kMaxName = 256;
constexpr const char* kTags[kSectionCount] = {"HEAD", "TOKS", "CONV", "SAMP", "KVDT"};
enum Section { kHead, kToks, kConv, kSamp, kKvdt };

uint32_t tag_value(const char* tag) {
  uint32_t v;
  std::memcpy(&v, tag, 4);
  return v;
}

std::string printable_tag(uint32_t v) {
  char c[4];
  std::memcpy(c, &v, 4);
  std::string s;
  for (char ch : c) s += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return s;
}

// ---- fingerprint -------------------------------------------------------------------------

void hash_value(XXH3_state_t* st, const gguf::Value& v);

void hash_bytes(XXH3_state_t* st, const void* p, size_t n) { XXH3_64bits_update(st, p, n); }
template <typename T>
void hash_pod(XXH3_state_t* st, T v) {
  hash_bytes(st, &v, sizeof v);
}
void hash_string(XXH3_state_t* st, const std::string& s) {
  hash_pod<uint64_t>(st, s.size());
  hash_bytes(st, s.data(), s.size());
}

void hash_array(XXH3_state_t* st, const gguf::Array& a) {
  hash_pod<uint32_t>(st, static_cast<uint32_t>(a.elem_type));
  hash_pod<uint64_t>(st, a.count);
  hash_bytes(st, a.raw.data(), a.raw.size());
  for (const std::string& s : a.strings) hash_string(st, s);
  for (const gguf::Value& v : a.arrays) hash_value(st, v);
}

void hash_value(XXH3_state_t* st, const gguf::Value& v) {
  hash_pod<uint32_t>(st, static_cast<uint32_t>(v.type));
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) hash_string(st, x);
        else if constexpr (std::is_same_v<T, gguf::Array>) hash_array(st, x);
        else hash_pod(st, x);
      },
      v.data);
}

// ---- writing -----------------------------------------------------------------------------

class Writer {
 public:
  template <typename T>
  void put(T v) {
    put_bytes(&v, sizeof v);
  }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  // Frames `payload` as one section.
  void section(const char* tag, std::span<const uint8_t> payload) {
    put<uint32_t>(tag_value(tag));
    put<uint32_t>(0);
    put<uint64_t>(payload.size());
    put_bytes(payload.data(), payload.size());
    put<uint64_t>(XXH64(payload.data(), payload.size(), tag_value(tag)));
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// ---- reading -----------------------------------------------------------------------------

// Bounds-checked little-endian reads of one section's payload; errors name the file, the
// section and the absolute offset.
class PayloadReader {
 public:
  PayloadReader(const std::string& path, const char* tag, uint64_t base, std::span<const uint8_t> p)
      : path_(path), tag_(tag), base_(base), p_(p) {}
  template <typename T>
  T get(const char* what) {
    if (p_.size() - pos_ < sizeof(T)) fail(std::string("truncated before ") + what);
    T v;
    std::memcpy(&v, p_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::span<const uint8_t> get_bytes(uint64_t n, const char* what) {
    if (p_.size() - pos_ < n) fail(std::string("truncated in ") + what);
    auto s = p_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  void expect_end() {
    if (pos_ != p_.size()) fail(std::to_string(p_.size() - pos_) + " unexpected bytes at the end of the section");
  }
  uint64_t offset() const { return base_ + pos_; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(path_ + ": section '" + tag_ + "' at offset " + std::to_string(base_ + pos_) + ": " + msg);
  }

 private:
  const std::string& path_;
  const char* tag_;
  uint64_t base_;
  std::span<const uint8_t> p_;
  uint64_t pos_ = 0;
};

// A file read in pieces: the whole file for a load, only the first sections for an index.
using Fetch = std::function<std::span<const uint8_t>(uint64_t offset, uint64_t n)>;

struct Parsed {
  SessionInfo info;
  std::span<const uint8_t> kv;   // KVDT payload (empty unless read)
  uint64_t kv_offset = 0;
};

// Whether `head` (a file's first bytes, any number) is how a session file begins.
bool begins_like_a_session(const void* head, size_t n) { return std::memcmp(head, kMagic, std::min(n, sizeof kMagic)) == 0; }

Parsed parse(const std::string& path, uint64_t file_size, const Fetch& fetch, bool with_kv) {
  Parsed out;
  SessionInfo& info = out.info;
  info.file_bytes = file_size;
  // A short file is "truncated" only if what it has begins like a session file.
  if (file_size > 0) {
    const auto head = fetch(0, std::min<uint64_t>(file_size, sizeof kMagic));
    if (!begins_like_a_session(head.data(), head.size()))
      throw Error(path + ": offset 0: not a vkllm session file (no 'VKLLMSES' magic)");
  }
  if (file_size < kPreambleBytes)
    throw Error(path + ": truncated: " + std::to_string(file_size) + " bytes, a session file starts with " +
                std::to_string(kPreambleBytes));
  auto pre = fetch(0, kPreambleBytes);
  uint32_t version, n_sections;
  std::memcpy(&version, pre.data() + 8, 4);
  std::memcpy(&n_sections, pre.data() + 12, 4);
  // A number no release will reach is damage, not a newer format (one flipped bit makes 16,386).
  if (version > kSessionVersion + 100)
    throw Error(path + ": offset 8: format version " + std::to_string(version) + " is no version of this format (the file is corrupted)");
  if (version > kSessionVersion)
    throw Error(path + ": offset 8: format version " + std::to_string(version) + " is newer than this vkllm reads (" +
                std::to_string(kSessionVersion) + "); update vkllm");
  if (version < kOldestSessionVersion)
    throw Error(path + ": offset 8: format version " + std::to_string(version) + " is not supported");
  if (n_sections != kSectionCount)
    throw Error(path + ": offset 12: " + std::to_string(n_sections) + " sections, version " + std::to_string(version) + " has " +
                std::to_string(kSectionCount));

  uint64_t at = kPreambleBytes;
  const int last = with_kv ? kKvdt : kToks;
  for (int s = 0; s <= last; ++s) {
    const char* tag = kTags[s];
    if (file_size - at < 16)
      throw Error(path + ": truncated: section '" + tag + "' at offset " + std::to_string(at) + " needs a 16-byte header, only " +
                  std::to_string(file_size - at) + " bytes left");
    auto hdr = fetch(at, 16);
    uint32_t got_tag, reserved;
    uint64_t len;
    std::memcpy(&got_tag, hdr.data(), 4);
    std::memcpy(&reserved, hdr.data() + 4, 4);
    std::memcpy(&len, hdr.data() + 8, 8);
    if (got_tag != tag_value(tag))
      throw Error(path + ": offset " + std::to_string(at) + ": expected section '" + tag + "', found '" + printable_tag(got_tag) +
                  "' (the file is corrupted)");
    if (reserved != 0) throw Error(path + ": section '" + tag + "' at offset " + std::to_string(at + 4) + ": reserved field is not 0");
    const uint64_t left = file_size - at - 16;
    if (len > left || left - len < 8)
      throw Error(path + ": truncated: section '" + tag + "' at offset " + std::to_string(at) + " declares " + with_commas(len) +
                  " bytes of payload and a checksum, only " + with_commas(left) + " bytes left");
    if (s == kToks && len != info.tokens.size() * 4)
      throw Error(path + ": section 'TOKS' at offset " + std::to_string(at + 16) + ": " + with_commas(len) + " bytes, expected " +
                  with_commas(info.tokens.size() * 4) + " for " + with_commas(info.tokens.size()) + " tokens");
    if (s == kKvdt) {
      // Checked before it is read (the rest is small): a length the header does not account for
      // would otherwise be read whole first. The factors are bounded; their product is checked.
      uint64_t want = 0;
      const bool overflow =
          __builtin_mul_overflow(uint64_t{info.n_layer} * info.tokens.size(), info.row_bytes_k + info.row_bytes_v, &want);
      if (overflow || len != want)
        throw Error(path + ": section 'KVDT' at offset " + std::to_string(at + 16) + ": " + with_commas(len) + " bytes of KV, expected " +
                    with_commas(want) + " (" + std::to_string(info.n_layer) + " layers × " + with_commas(info.tokens.size()) + " tokens × " +
                    std::to_string(info.row_bytes_k + info.row_bytes_v) + " bytes)");
    }
    auto payload = fetch(at + 16, len);
    auto sum = fetch(at + 16 + len, 8);
    uint64_t stored;
    std::memcpy(&stored, sum.data(), 8);
    if (XXH64(payload.data(), payload.size(), tag_value(tag)) != stored)
      throw Error(path + ": section '" + tag + "' at offset " + std::to_string(at) + " (" + with_commas(len) +
                  " bytes): checksum mismatch (the file is corrupted)");
    PayloadReader r(path, tag, at + 16, payload);
    switch (s) {
      case kHead: {
        info.model.hash = r.get<uint64_t>("the model fingerprint");
        const auto name_len = r.get<uint32_t>("the model name length");
        if (name_len > kMaxName) r.fail("model name length " + std::to_string(name_len) + " exceeds " + std::to_string(kMaxName));
        auto name = r.get_bytes(name_len, "the model name");
        // Only shown (in errors, `vkllm cache list`): control characters (C0, DEL, C1) and
        // malformed UTF-8 of a damaged or crafted file do not reach a terminal.
        const std::string_view raw(reinterpret_cast<const char*>(name.data()), name.size());
        for (size_t at = 0; at < raw.size();) {
          const uint32_t cp = utf8::next(raw, at);
          if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) info.model.name += '?';
          else utf8::append(info.model.name, cp);
        }
        info.n_layer = r.get<uint32_t>("n_layer");
        info.n_head_kv = r.get<uint32_t>("n_head_kv");
        info.head_dim = r.get<uint32_t>("head_dim");
        const auto tk = r.get<uint32_t>("type_k"), tv = r.get<uint32_t>("type_v");
        if (tk > 2 || tv > 2) r.fail("cache type " + std::to_string(std::max(tk, tv)) + " is not f16 (0), q8_0 (1) or q4_0 (2)");
        info.type_k = static_cast<CacheType>(tk);
        info.type_v = static_cast<CacheType>(tv);
        info.row_bytes_k = r.get<uint64_t>("row_bytes_k");
        info.row_bytes_v = r.get<uint64_t>("row_bytes_v");
        info.capacity = r.get<uint32_t>("capacity");
        info.n_keep = r.get<uint32_t>("n_keep");
        const auto n_used = r.get<uint32_t>("n_used");
        info.n_evicted = r.get<uint64_t>("n_evicted");
        if (version >= 2) {
          info.shifts.split = r.get<uint32_t>("rot_split");
          info.shifts.first = r.get<uint32_t>("rot_first");
          info.shifts.rest = r.get<uint32_t>("rot_rest");
          info.shifts.next = r.get<uint32_t>("rot_next");
          info.has_shifts = true;
        }
        r.expect_end();
        if (info.n_layer == 0 || info.n_layer > 4096 || info.row_bytes_k == 0 || info.row_bytes_v == 0 ||
            info.row_bytes_k > (1u << 24) || info.row_bytes_v > (1u << 24))
          r.fail("implausible geometry: " + std::to_string(info.n_layer) + " layers, rows of " + std::to_string(info.row_bytes_k) +
                 " / " + std::to_string(info.row_bytes_v) + " bytes");
        // Every token needs 4 bytes of TOKS: bounding n_used by the file size keeps the
        // allocation below a small multiple of the file.
        if (uint64_t{n_used} * 4 > file_size) r.fail(with_commas(n_used) + " tokens cannot fit in a " + with_commas(file_size) + "-byte file");
        info.tokens.resize(n_used);
        break;
      }
      case kToks:
        std::memcpy(info.tokens.data(), payload.data(), len);
        for (size_t i = 0; i < info.tokens.size(); ++i)
          if (info.tokens[i] < 0)
            throw Error(path + ": section 'TOKS' at offset " + std::to_string(at + 16 + 4 * i) + ": token " + std::to_string(i) + " = " +
                        std::to_string(info.tokens[i]) + " is negative");
        break;
      case kConv:
        info.conversation.assign(payload.begin(), payload.end());
        break;
      case kSamp:
        info.sampler.assign(payload.begin(), payload.end());
        break;
      case kKvdt: {
        out.kv = payload;
        out.kv_offset = at + 16;
        break;
      }
    }
    at += kFrameBytes + len;
  }
  if (with_kv && at != file_size)
    throw Error(path + ": offset " + std::to_string(at) + ": " + with_commas(file_size - at) + " bytes after the last section");
  return out;
}

// A session file read in the pieces parse() asks for, each kept alive while parsing: the preamble
// and the section headers are checked before a payload is read, so a large file that is no
// session (a model passed by mistake) costs 16 bytes, not its size in memory.
class FileFetch {
 public:
  explicit FileFetch(const std::string& path) : path_(path) {
    require_regular_file(path, "a session file");
    f_.open(path, std::ios::binary | std::ios::ate);
    if (!f_) {
      // A file gone (evicted by another run meanwhile) is the callers' ordinary case; any other
      // failure to open says nothing of the content.
      const int e = errno;
      const std::string what = path + ": cannot open the session file: " + std::strerror(e);
      if (e == ENOENT) throw Error(what);
      throw CannotOpenSession(what);
    }
    size_ = static_cast<uint64_t>(std::max<std::streamoff>(f_.tellg(), 0));
  }
  uint64_t size() const { return size_; }
  std::span<const uint8_t> operator()(uint64_t off, uint64_t n) {
    pieces_.emplace_back(n);
    f_.seekg(static_cast<std::streamoff>(off));
    if (!f_.read(reinterpret_cast<char*>(pieces_.back().data()), static_cast<std::streamsize>(n)))
      throw Error(path_ + ": cannot read " + with_commas(n) + " bytes at offset " + std::to_string(off));
    return pieces_.back();
  }

 private:
  const std::string& path_;
  std::ifstream f_;
  uint64_t size_ = 0;
  std::vector<std::vector<uint8_t>> pieces_;
};

}  // namespace

std::string ModelFingerprint::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

ModelFingerprint model_fingerprint(const gguf::File& f, uint32_t n_ctx, const RopeOverrides& rope) {
  XXH3_state_t* st = XXH3_createState();
  VKLLM_CHECK(st != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(st);
  hash_pod<uint32_t>(st, f.version());
  for (const auto& [key, value] : f.metadata()) {
    hash_string(st, key);
    hash_value(st, value);
  }
  constexpr uint64_t kSample = 4096;
  for (const gguf::TensorInfo& t : f.tensors()) {
    hash_string(st, t.name);
    hash_pod<uint32_t>(st, t.n_dims);
    hash_bytes(st, t.ne, sizeof t.ne);
    hash_pod<uint32_t>(st, static_cast<uint32_t>(t.type));
    hash_pod<uint64_t>(st, t.offset);
    if (t.data == nullptr) continue;
    // Start, middle and end of every tensor: a re-quantized or fine-tuned file with identical
    // metadata still differs here, without reading gigabytes.
    if (t.n_bytes <= 3 * kSample) {
      hash_bytes(st, t.data, t.n_bytes);
    } else {
      hash_bytes(st, t.data, kSample);
      hash_bytes(st, t.data + t.n_bytes / 2, kSample);
      hash_bytes(st, t.data + t.n_bytes - kSample, kSample);
    }
  }
  // Which of Phi-3's two RoPE factor sets this context takes (Model::rope_factors).
  std::string rope_set;
  if (f.find_tensor("rope_factors_long.weight")) {
    const ModelConfig c = read_model_config(f);
    if (c.arch == Arch::Phi3) rope_set = c.long_rope(n_ctx) ? "long" : "short";
  }
  if (!rope_set.empty()) hash_string(st, "rope factors " + rope_set);
  const std::string rope_flags = rope_override_summary(f, rope);
  if (!rope_flags.empty()) hash_string(st, "rope flags " + rope_flags);
  ModelFingerprint fp;
  fp.hash = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  fp.name = f.get_string_or("general.name", "");
  if (fp.name.empty()) fp.name = std::filesystem::path(f.path()).filename().string();
  const std::string suffix = (rope_set.empty() ? "" : " (" + rope_set + " RoPE factors)") + (rope_flags.empty() ? "" : " (RoPE flags)");
  if (fp.name.size() + suffix.size() > kMaxName) fp.name.resize(kMaxName - suffix.size());
  fp.name += suffix;
  return fp;
}

std::vector<uint8_t> encode_session(const SessionInfo& info, std::span<const uint8_t> kv) {
  VKLLM_CHECK(info.model.name.size() <= kMaxName, "model name too long for a session file");
  VKLLM_CHECK(kv.size() == uint64_t{info.n_layer} * info.tokens.size() * (info.row_bytes_k + info.row_bytes_v),
              "session KV bytes do not match the token count");
  Writer head;
  head.put<uint64_t>(info.model.hash);
  head.put<uint32_t>(static_cast<uint32_t>(info.model.name.size()));
  head.put_bytes(info.model.name.data(), info.model.name.size());
  head.put<uint32_t>(info.n_layer);
  head.put<uint32_t>(info.n_head_kv);
  head.put<uint32_t>(info.head_dim);
  head.put<uint32_t>(static_cast<uint32_t>(info.type_k));
  head.put<uint32_t>(static_cast<uint32_t>(info.type_v));
  head.put<uint64_t>(info.row_bytes_k);
  head.put<uint64_t>(info.row_bytes_v);
  head.put<uint32_t>(info.capacity);
  head.put<uint32_t>(info.n_keep);
  head.put<uint32_t>(static_cast<uint32_t>(info.tokens.size()));
  head.put<uint64_t>(info.n_evicted);
  head.put<uint32_t>(info.shifts.split);
  head.put<uint32_t>(info.shifts.first);
  head.put<uint32_t>(info.shifts.rest);
  head.put<uint32_t>(info.shifts.next);

  Writer w;
  w.bytes().reserve(kPreambleBytes + kSectionCount * kFrameBytes + head.bytes().size() + info.tokens.size() * 4 +
                    info.conversation.size() + info.sampler.size() + kv.size());
  w.put_bytes(kMagic, sizeof kMagic);
  w.put<uint32_t>(kSessionVersion);
  w.put<uint32_t>(kSectionCount);
  w.section("HEAD", head.bytes());
  w.section("TOKS", std::span(reinterpret_cast<const uint8_t*>(info.tokens.data()), info.tokens.size() * 4));
  w.section("CONV", std::span(reinterpret_cast<const uint8_t*>(info.conversation.data()), info.conversation.size()));
  w.section("SAMP", info.sampler);
  w.section("KVDT", kv);
  return std::move(w.bytes());
}

uint64_t save_session(const std::string& path, const Engine& engine, const ModelFingerprint& model, const Sampler* sampler,
                      const std::string& conversation, int64_t n_tokens) {
  // A file that holds something else (chat's `/save model.gguf`, a typo onto notes) is not replaced.
  // (Only a regular file is read: a FIFO or a terminal there would block; write_file_atomic refuses those.)
  struct stat st {};
  if (std::ifstream existing; ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (existing.open(path, std::ios::binary), existing)) {
    char head[sizeof kMagic] = {};
    existing.read(head, sizeof head);
    if (existing.gcount() > 0 && !begins_like_a_session(head, size_t(existing.gcount())))
      throw Error(path + ": exists and is not a vkllm session file: not overwritten (remove it, or save under another name)");
  }
  const KvCache& cache = engine.cache();
  const ModelConfig& c = engine.config();
  const uint32_t n = n_tokens < 0 ? cache.used() : static_cast<uint32_t>(std::min<int64_t>(n_tokens, cache.used()));
  SessionInfo info;
  info.model = model;
  info.n_layer = c.n_layer;
  info.n_head_kv = c.n_head_kv;
  info.head_dim = c.head_dim;
  info.type_k = cache.type_k();
  info.type_v = cache.type_v();
  info.row_bytes_k = cache.row_bytes_k();
  info.row_bytes_v = cache.row_bytes_v();
  info.capacity = cache.capacity();
  // The pin as set (it may run past the tokens held: the ring pins tokens as they come), unless
  // only a prefix is saved.
  info.n_keep = n == cache.used() ? cache.keep() : std::min(cache.keep(), n);
  info.n_evicted = cache.evicted();
  // The rotated copy's shifts: a whole save carries them; a prefix is rebased when loaded.
  if (n == cache.used()) info.shifts = cache.rotation_shifts();
  else info.shifts.split = n;
  info.has_shifts = true;
  info.tokens.assign(cache.tokens().begin(), cache.tokens().begin() + n);
  info.conversation = conversation;
  if (sampler) info.sampler = sampler->save_state();
  const std::vector<uint8_t> bytes = encode_session(info, cache.read_rows(n));
  try {
    gguf::write_file_atomic(path, bytes);
  } catch (const gguf::Error& e) {
    throw Error(e.what());
  }
  return bytes.size();
}

void check_session_model(const std::string& path, const SessionInfo& info, const ModelFingerprint& model) {
  if (info.model.hash != model.hash)
    throw Error(path + ": saved with " + info.model.name + " " + info.model.hex() + ", this is " + model.name + " " + model.hex());
}

void check_session_cache_types(const std::string& path, const SessionInfo& info, CacheType type_k, CacheType type_v) {
  if (info.type_k == type_k && info.type_v == type_v) return;
  const std::string hint = info.type_k == info.type_v ? std::string("rerun with --cache-type ") + cache_type_name(info.type_k)
                                                      : std::string("this version runs K and V in one type only");
  throw Error(path + ": saved with KV cache type " + cache_type_name(info.type_k) + "/" + cache_type_name(info.type_v) +
              ", this cache is " + cache_type_name(type_k) + "/" + cache_type_name(type_v) + "; " + hint);
}

SessionInfo read_session_info(const std::string& path, bool with_kv) {
  FileFetch file(path);
  return parse(path, file.size(), std::ref(file), with_kv).info;
}

SessionInfo load_session(const std::string& path, Engine& engine, const ModelFingerprint& model, Sampler* sampler,
                         int64_t max_tokens, const SessionCheck& check) {
  FileFetch file(path);
  Parsed p = parse(path, file.size(), std::ref(file), true);
  SessionInfo& info = p.info;
  KvCache& cache = engine.cache();
  const ModelConfig& c = engine.config();

  // Everything is checked before anything changes.
  check_session_model(path, info, model);
  if (info.n_layer != c.n_layer || info.n_head_kv != c.n_head_kv || info.head_dim != c.head_dim)
    throw Error(path + ": section 'HEAD' at offset " + std::to_string(kPreambleBytes + 16) + ": saved for " + std::to_string(info.n_layer) +
                " layers × " + std::to_string(info.n_head_kv) + " KV heads × head dim " + std::to_string(info.head_dim) + ", this model has " +
                std::to_string(c.n_layer) + " × " + std::to_string(c.n_head_kv) + " × " + std::to_string(c.head_dim));
  check_session_cache_types(path, info, cache.type_k(), cache.type_v());
  if (info.row_bytes_k != cache.row_bytes_k() || info.row_bytes_v != cache.row_bytes_v())
    throw Error(path + ": saved with K/V rows of " + std::to_string(info.row_bytes_k) + "/" + std::to_string(info.row_bytes_v) +
                " bytes, this cache has " + std::to_string(cache.row_bytes_k()) + "/" + std::to_string(cache.row_bytes_v()));
  const uint32_t n_used = static_cast<uint32_t>(info.tokens.size());
  const uint32_t n = max_tokens < 0 ? n_used : static_cast<uint32_t>(std::min<int64_t>(max_tokens, n_used));
  if (n > cache.capacity())
    throw TooLongForCache(path + ": holds " + with_commas(n_used) + " tokens" + (n < n_used ? "; the " + with_commas(n) + " to load are" : ",") +
                          " more than --ctx " + with_commas(cache.capacity()) + " can hold; use --ctx " + std::to_string(n) + " or more");
  // A whole file keeps its pin: one that fills this --ctx would leave the ring no room (a prefix
  // load, the prompt cache's, pins within the prefix instead).
  if (max_tokens < 0 && info.n_keep >= cache.capacity())
    throw Error(path + ": the session pins " + std::to_string(info.n_keep) + " tokens; --ctx " + std::to_string(cache.capacity()) +
                " leaves no room after them; use --ctx " + std::to_string(uint64_t{info.n_keep} + 1) + " or more");
  for (uint32_t i = 0; i < n; ++i)
    if (static_cast<uint32_t>(info.tokens[i]) >= c.n_vocab)
      throw Error(path + ": token " + std::to_string(i) + " = " + std::to_string(info.tokens[i]) + " is outside this vocabulary of " +
                  std::to_string(c.n_vocab));
  Sampler restored = sampler ? *sampler : Sampler(SamplerParams{});
  if (sampler && !info.sampler.empty()) {
    try {
      restored.restore_state(info.sampler);
    } catch (const Error& e) {
      throw Error(path + ": section 'SAMP': " + e.what());
    }
  }
  if (check) check(info);

  // Commit. The rows of a prefix are the first n of every layer's K and V runs.
  const uint64_t rk = info.row_bytes_k, rv = info.row_bytes_v;
  const uint64_t layer_in = uint64_t{n_used} * (rk + rv), layer_out = uint64_t{n} * (rk + rv);
  std::vector<uint8_t> prefix;
  std::span<const uint8_t> rows = p.kv;
  if (n < n_used) {
    prefix.resize(layer_out * info.n_layer);
    for (uint32_t l = 0; l < info.n_layer; ++l) {
      std::memcpy(prefix.data() + l * layer_out, p.kv.data() + l * layer_in, n * rk);
      std::memcpy(prefix.data() + l * layer_out + n * rk, p.kv.data() + l * layer_in + n_used * rk, n * rv);
    }
    rows = prefix;
  }
  // A whole file keeps its pin (which may run past its tokens), a prefix pins within itself; a pin
  // longer than this cache allows (its window rings may be larger) is shortened.
  const uint32_t keep = std::min(n < n_used ? std::min(info.n_keep, n) : info.n_keep, cache.max_keep());
  const KvCache::Shifts* shifts = info.has_shifts && n == n_used ? &info.shifts : nullptr;
  if (!cache.restore(std::span(info.tokens).first(n), keep, n < n_used ? 0 : info.n_evicted, rows, shifts))
    throw MissingWindowRows(path + ": the sliding-window layers' rows of the " + std::to_string(engine.config().n_swa) + " tokens before token " +
                std::to_string(n) + " are not in the file (its window rings had moved past them); load it whole");
  if (sampler && !info.sampler.empty()) *sampler = std::move(restored);
  info.tokens.resize(n);
  return info;
}

}  // namespace vkllm
