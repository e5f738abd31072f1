// Session files: writing them whole or appending updates, and loading them into an engine (format
// in the header).
#include "store/session_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include "atomic_file.h"
#include "base/commas.h"
#include "base/input_file.h"
#include "store/session_codec.h"

namespace vkllm {
namespace session_codec {

// HEAD's payload for `info`.
std::vector<uint8_t> encode_head(const SessionInfo& info) {
  VKLLM_CHECK(info.model.name.size() <= kMaxModelName, "model name too long for a session file");
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
  return std::move(head.bytes());
}

// HEAD, TOKS, CONV and SAMP of `info`, as the base and every update carry them.
void put_state(Writer& w, const SessionInfo& info) {
  w.section("HEAD", encode_head(info));
  w.section("TOKS", std::span(reinterpret_cast<const uint8_t*>(info.tokens.data()), info.tokens.size() * 4));
  w.section("CONV", std::span(reinterpret_cast<const uint8_t*>(info.conversation.data()), info.conversation.size()));
  w.section("SAMP", info.sampler);
}

}  // namespace session_codec

using namespace session_codec;

namespace {

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

SessionJournal::Geometry geometry_of(const SessionInfo& info) {
  return {info.n_layer, info.n_head_kv, info.head_dim, info.type_k, info.type_v, info.row_bytes_k, info.row_bytes_v};
}

int64_t mtime_ns(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

void note_file(SessionJournal& j, const std::string& path, const struct stat& st) {
  j.path = path;
  j.dev = st.st_dev;
  j.ino = st.st_ino;
  j.size = static_cast<uint64_t>(st.st_size);
  j.mtime_ns = mtime_ns(st);
}

// Makes `j` describe the file at `path` as just written or read (when it is still `size` bytes;
// else `j` stays empty): updates go at `end`, and token i's rows (row_ids()[i]) are the i-th row of
// `extents`.
void start_journal(SessionJournal& j, const std::string& path, uint64_t size, uint64_t end, uint64_t model, const SessionInfo& info,
                   bool version3, std::span<const uint64_t> ids, std::span<const Extent> extents) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || uint64_t(st.st_size) != size) return;
  note_file(j, path, st);
  j.end = end;
  j.model = model;
  j.geometry = geometry_of(info);
  j.version3 = version3;
  j.appended = 0;
  j.rows.clear();
  size_t i = 0;
  for (const Extent& x : extents)
    for (uint32_t r = 0; r < x.count; ++r) j.rows[ids[i++]] = {x.section, x.first + r};
}

// Writes all of `bytes` at `offset`; false (errno set) when it cannot.
bool write_at(int fd, std::span<const uint8_t> bytes, uint64_t offset) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

// Appends an update of `info` (the whole cache) to the file `j` describes: the rows the file lacks
// and the state. nullopt, with nothing written, where the file must be written whole instead: it
// changed since `j`, the rows it holds are not a prefix of the logical sequence, or the update would
// leave it more than `j.max_growth` times the size of a whole file (an append that fails throws, the file's last
// whole update intact).
std::optional<uint64_t> append_update(const std::string& path, SessionJournal& j, const SessionInfo& info, const KvCache& cache) {
  const std::vector<uint64_t>& ids = cache.row_ids();
  const uint32_t n = static_cast<uint32_t>(info.tokens.size());
  uint32_t held = 0;  // the file has the rows of tokens [0, held)
  while (held < n && j.rows.count(ids[held])) ++held;
  for (uint32_t i = held; i < n; ++i)
    if (j.rows.count(ids[i])) return std::nullopt;
  std::vector<Extent> extents;
  for (uint32_t i = 0; i < held; ++i) {
    const SessionJournal::Place at = j.rows.at(ids[i]);
    if (!extents.empty() && extents.back().section == at.section && extents.back().first + extents.back().count == at.row) ++extents.back().count;
    else extents.push_back({at.section, at.row, 1});
  }
  const uint64_t row_bytes = uint64_t{cache.row_bytes_k() + cache.row_bytes_v()} * info.n_layer;
  Writer w;  // the update after its UPDT section
  if (held < n) {
    const std::vector<uint8_t> rows = cache.read_rows(held, n - held);
    std::vector<uint8_t> payload(8 + rows.size());
    const uint32_t count = n - held;
    std::memcpy(payload.data(), &count, 4);
    std::memcpy(payload.data() + 8, rows.data(), rows.size());
    w.section("ROWS", payload);
    extents.push_back({j.end + kFrameBytes + 8, 0, count});
  }
  put_state(w, info);
  Writer list;
  list.put<uint32_t>(static_cast<uint32_t>(extents.size()));
  list.put<uint32_t>(0);
  for (const Extent& x : extents) {
    list.put<uint64_t>(x.section);
    list.put<uint32_t>(x.first);
    list.put<uint32_t>(x.count);
  }
  w.section("LIST", list.bytes());
  Writer update;
  const uint64_t total = kFrameBytes + 8 + w.bytes().size();
  update.section("UPDT", std::span(reinterpret_cast<const uint8_t*>(&total), 8));
  update.put_bytes(w.bytes().data(), w.bytes().size());
  // What a whole file would take: the state (as the update carries it) and every row once.
  const uint64_t whole = kPreambleBytes + w.bytes().size() - (held < n ? kFrameBytes + 8 + (n - held) * row_bytes : 0) + n * row_bytes;
  if (double(j.end + total) > j.max_growth * double(whole)) return std::nullopt;

  // Non-blocking: a FIFO put in the file's place would block the open (it is not appended to; the
  // whole write refuses it).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  // Two processes appending to one file at once: the lock orders them, and the second then finds
  // the file changed (another size) and writes it whole.
  // (A whole write by another process renames a new file over the path: the one this descriptor
  // holds would be gone.)
  struct stat st {}, at_path {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || ::flock(fd, LOCK_EX) != 0 || ::fstat(fd, &st) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  if (st.st_dev != j.dev || st.st_ino != j.ino || uint64_t(st.st_size) != j.size || mtime_ns(st) != j.mtime_ns ||
      ::stat(path.c_str(), &at_path) != 0 || at_path.st_ino != st.st_ino || at_path.st_dev != st.st_dev) {
    ::close(fd);
    j.replaced_changed = true;  // written whole over what another process saved
    return std::nullopt;
  }
  const auto fail = [&](const char* what) {
    const int e = errno;
    if (::ftruncate(fd, static_cast<off_t>(j.end)) != 0) {}  // best effort: the ignored tail goes either way
    ::close(fd);
    j.path.clear();  // the next save writes the file whole
    throw Error(path + ": cannot append to the session file (" + what + "): " + std::strerror(e));
  };
  // A save cut short left bytes after the last whole update: they go first.
  if (j.size > j.end && ::ftruncate(fd, static_cast<off_t>(j.end)) != 0) fail("truncate");
  // Version 3 and its section count in one write (no single flipped bit makes a version-2 file one).
  const uint32_t preamble[2] = {3, kSectionCount + 1};
  if (!j.version3 && !write_at(fd, std::span(reinterpret_cast<const uint8_t*>(preamble), 8), 8)) fail("write");
  if (!write_at(fd, update.bytes(), j.end)) fail("write");
  if (::fdatasync(fd) != 0) fail("fdatasync");
  if (::fstat(fd, &st) != 0) fail("fstat");
  ::close(fd);
  note_file(j, path, st);
  j.version3 = true;
  // The tokens' rows: those the file held, and the new ones in the ROWS section just written.
  std::unordered_map<uint64_t, SessionJournal::Place> rows;
  for (uint32_t i = 0; i < held; ++i) rows[ids[i]] = j.rows.at(ids[i]);
  for (uint32_t i = held; i < n; ++i) rows[ids[i]] = {j.end + kFrameBytes + 8, i - held};
  j.rows = std::move(rows);
  j.appended = total;
  j.end += total;
  return j.size;
}

}  // namespace

std::vector<uint8_t> encode_session(const SessionInfo& info, std::span<const uint8_t> kv) {
  VKLLM_CHECK(kv.size() == uint64_t{info.n_layer} * info.tokens.size() * (info.row_bytes_k + info.row_bytes_v),
              "session KV bytes do not match the token count");
  Writer w;
  w.bytes().reserve(kPreambleBytes + kSectionCount * kFrameBytes + 512 + info.tokens.size() * 4 + info.conversation.size() +
                    info.sampler.size() + kv.size());
  w.put_bytes(kMagic, sizeof kMagic);
  w.put<uint32_t>(kWholeFileVersion);
  w.put<uint32_t>(kSectionCount);
  put_state(w, info);
  w.section("KVDT", kv);
  return std::move(w.bytes());
}

uint64_t save_session(const std::string& path, const Engine& engine, const ModelFingerprint& model, const Sampler* sampler,
                      const std::string& conversation, int64_t n_tokens, SessionJournal* journal) {
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
  const bool whole_cache = n_tokens < 0;
  if (journal) journal->appended = 0, journal->replaced_changed = false;
  if (journal && whole_cache && journal->path == path && journal->model == model.hash && journal->geometry == geometry_of(info))
    if (const std::optional<uint64_t> size = append_update(path, *journal, info, cache)) return *size;
  const std::vector<uint8_t> kv = cache.read_rows(n);
  const std::vector<uint8_t> bytes = encode_session(info, kv);
  try {
    gguf::write_file_atomic(path, bytes);
  } catch (const gguf::Error& e) {
    if (journal) journal->path.clear();
    throw Error(e.what());
  }
  // The file as written: its KVDT holds row i of token i.
  if (journal) {
    journal->path.clear();
    if (whole_cache) {
      const Extent kvdt = {bytes.size() - kFrameBytes - kv.size(), 0, n};
      start_journal(*journal, path, bytes.size(), bytes.size(), model.hash, info, false, cache.row_ids(), std::span(&kvdt, 1));
    }
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
                         int64_t max_tokens, const SessionCheck& check, SessionJournal* journal) {
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
  // The cache's rows are the file's now: the next save appends what comes after them. (A
  // version-1 file's HEAD has no rotation shifts: an update after it would not parse. It is
  // written whole, as version 2, at the next save.)
  if (journal) {
    journal->path.clear();
    if (n == n_used && p.version >= 2)
      start_journal(*journal, path, info.file_bytes, p.end, model.hash, info, p.version >= 3, cache.row_ids(), p.extents);
  }
  info.tokens.resize(n);
  return info;
}

}  // namespace vkllm
