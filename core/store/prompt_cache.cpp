// The prompt cache directory: lookup by longest token prefix, store, LRU eviction under flock.
#include "store/prompt_cache.h"

#include "atomic_file.h"
#include "base/cache_dir.h"
#include "base/commas.h"
#include "engine/generate.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>

namespace vkllm {
namespace fs = std::filesystem;
namespace {

bool is_hex(std::string_view s, size_t n) { return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string_view::npos; }

// An entry's name, as store() makes it: "<model fingerprint>-<type k>-<type v>-<token hash>.vkv"
// (16 hex digits each). Nothing else in the directory is ever evicted or cleared: a session file
// or any other file a person keeps there stays.
bool is_entry_name(std::string_view name) {
  if (name.size() < 4 || !name.ends_with(".vkv")) return false;
  name.remove_suffix(4);
  std::string_view part[4];
  for (int i = 0; i < 3; ++i) {
    const size_t dash = name.find('-');
    if (dash == std::string_view::npos) return false;
    part[i] = name.substr(0, dash);
    name.remove_prefix(dash + 1);
  }
  part[3] = name;
  const auto type = [](std::string_view t) { return t == "f16" || t == "q8_0" || t == "q4_0"; };
  return is_hex(part[0], 16) && type(part[1]) && type(part[2]) && is_hex(part[3], 16);
}

// A temporary write_file_atomic leaves only if its writer was killed mid-write: ".<entry>.<PID>.XXXXXX".
bool is_entry_temporary(std::string_view name) {
  if (!name.starts_with('.')) return false;
  const size_t vkv = name.find(".vkv.");
  return vkv != std::string_view::npos && is_entry_name(name.substr(1, vkv + 3));
}

// Whether a directory entry is a regular file itself (not a link, FIFO, device or directory): only
// those are ever read, listed, evicted or cleared as entries.
bool is_plain_file(const fs::directory_entry& de) {
  std::error_code ec;
  return de.symlink_status(ec).type() == fs::file_type::regular;
}

// Last use (the modification time) in nanoseconds since the epoch: eviction must order an entry
// this run's lookup touched and one it stores within the same second.
int64_t mtime_ns_of(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec : 0;
}

// The directory's lock for eviction; released when the descriptor closes.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    // The umask decides its mode, as for the entries; another user's lock is taken through a
    // read-only descriptor (flock needs no more), so every user of a shared directory can evict.
    const std::string path = dir + "/.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) error_ = errno;
    if (fd_ < 0 && error_ == EACCES) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // (its failure keeps the first error)
    if (fd_ >= 0) error_ = 0;
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      error_ = errno;
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  bool held() const { return fd_ >= 0; }
  // Why it is not held: the directory cannot be written (a read-only cache is read without one).
  bool read_only() const { return error_ == EROFS || error_ == EACCES || error_ == EPERM; }

 private:
  int fd_ = -1;
  int error_ = 0;
};

}  // namespace

std::string default_prompt_cache_dir() {
  const std::string dir = user_cache_dir();
  return dir.empty() ? "" : dir + "/prompt-cache";
}

std::vector<PromptCacheEntry> list_prompt_cache(const std::string& dir) {
  std::vector<PromptCacheEntry> out;
  std::error_code ec;
  for (const fs::directory_entry& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    if (!is_entry_name(name) || !is_plain_file(de)) continue;
    PromptCacheEntry e;
    e.path = de.path().string();
    e.bytes = de.file_size(ec);
    if (ec) continue;  // removed meanwhile
    e.last_used = mtime_ns_of(e.path) / 1000000000;
    try {
      e.info = read_session_info(e.path, false);
    } catch (const Error& err) {
      e.valid = false;
      e.error = err.what();
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.last_used > b.last_used; });
  return out;
}

uint64_t clear_prompt_cache(const std::string& dir) {
  // Entries (regular files) and the temporaries of killed writers (gguf::is_orphaned_temporary, as
  // eviction: a running writer's is left, or its entry would be lost); nothing else. The lock is
  // taken only where there is something to remove: a directory that holds no entry gets no `.lock`.
  const auto removable = [](const fs::directory_entry& de) {
    const std::string name = de.path().filename().string();
    if ((!is_entry_name(name) && !is_entry_temporary(name)) || !is_plain_file(de)) return false;
    return !is_entry_temporary(name) || gguf::is_orphaned_temporary(de.path());
  };
  std::error_code ec;
  const auto any = [&] {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (removable(*it)) return true;
    return false;
  };
  if (!any()) return 0;
  uint64_t freed = 0;
  size_t failed = 0;
  std::string why;
  DirLock lock(dir);
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!removable(*it)) continue;
    std::error_code ec2;
    const uint64_t size = it->file_size(ec2);
    if (fs::remove(it->path(), ec2)) {
      freed += size;
    } else if (ec2) {
      ++failed;
      why = ec2.message();
    }
  }
  if (failed > 0)
    throw Error(dir + ": " + with_commas(failed) + (failed == 1 ? " prompt-cache file" : " prompt-cache files") + " could not be removed: " + why);
  return freed;
}

PromptCache::PromptCache(std::string dir, uint64_t max_bytes, ModelFingerprint model, CacheType type_k, CacheType type_v)
    : dir_(std::move(dir)), max_bytes_(max_bytes), model_(std::move(model)), type_k_(type_k), type_v_(type_v) {}

std::string PromptCache::entry_prefix() const {
  return model_.hex() + "-" + cache_type_name(type_k_) + "-" + cache_type_name(type_v_) + "-";
}

void PromptCache::drop(const std::string& path, const std::string& why) {
  // (An error from reading the file already starts with its path.)
  warnings_.push_back("prompt cache: skipping and removing " + (why.rfind(path + ": ", 0) == 0 ? why : path + ": " + why));
  std::error_code ec;
  fs::remove(path, ec);
}

PromptCacheMatch PromptCache::find(std::span<const int32_t> tokens, bool whole_only) {
  PromptCacheMatch best;
  const std::string prefix = entry_prefix();
  std::error_code ec;
  for (const fs::directory_entry& de : fs::directory_iterator(dir_, ec)) {
    const std::string name = de.path().filename().string();
    if (!is_entry_name(name) || name.rfind(prefix, 0) != 0) continue;  // another model or cache type
    if (!is_plain_file(de)) continue;
    const std::string path = de.path().string();
    SessionInfo info;
    try {
      info = read_session_info(path, false);
    } catch (const CannotOpenSession& e) {  // not damage: kept (no descriptor left, another user's file)
      warnings_.push_back(std::string("prompt cache: skipping ") + e.what());
      continue;
    } catch (const Error& e) {
      if (!fs::exists(path)) continue;  // evicted by another run while we read it
      drop(path, e.what());
      continue;
    }
    if (info.model.hash != model_.hash || info.type_k != type_k_ || info.type_v != type_v_) {
      drop(path, "its header (" + info.model.name + " " + info.model.hex() + ", " + cache_type_name(info.type_k) + "/" +
                     cache_type_name(info.type_v) + ") does not match its name");
      continue;
    }
    ++best.entries_seen;
    uint32_t m = 0;
    while (m < info.tokens.size() && m < tokens.size() && info.tokens[m] == tokens[m]) ++m;
    if (whole_only && uint64_t{m} + 1 < info.tokens.size()) {
      best.partial_skipped = std::max(best.partial_skipped, m);
      continue;
    }
    // Entries worth reading first, then the longest match; on a tie the shorter entry (less to read).
    const bool worth = worth_loading(m, info.tokens.size());
    if (best.path.empty() || worth > best.worth_loading || (worth == best.worth_loading && m > best.matched) ||
        (worth == best.worth_loading && m == best.matched && info.tokens.size() < best.entry_tokens)) {
      best.path = path;
      best.matched = m;
      best.entry_tokens = static_cast<uint32_t>(info.tokens.size());
      best.worth_loading = worth;
    }
  }
  if (best.matched == 0 && best.entries_seen == 0) best.path.clear();
  return best;
}

bool worth_loading(uint64_t shared, uint64_t entry_tokens) {
  return shared >= std::min(entry_tokens, k_min_shared_tokens) && shared * k_max_read_per_reused >= entry_tokens;
}

PromptCacheMatch PromptCache::restore(std::span<const int32_t> tokens, Engine& engine) {
  const bool whole_only = engine.cache().window_ring() != 0;
  PromptCacheMatch m = find(tokens, whole_only);
  for (int tries = 0; tries < 4; ++tries) {
    // (What the engine reuses, not its match: a window ring's may be far less.)
    const uint32_t n = std::min<uint32_t>(m.matched, uint32_t(tokens.size()) - 1);
    if (n <= reusable_prefix(engine.cache(), tokens) || load(m, n, engine) || m.path.empty() || fs::exists(m.path)) break;
    m = find(tokens, whole_only);  // the entry was removed (corrupt) or evicted: the next best
  }
  return m;
}

bool PromptCache::load(const PromptCacheMatch& m, uint32_t n, Engine& engine) {
  if (m.path.empty() || n == 0 || !m.worth_loading) return false;

  // The entry's pin is the storing run's: this run keeps its own (the loaded prefix sits in its own
  // slots, so the pin can move).
  const uint32_t keep = engine.cache().keep();
  try {
    load_session(m.path, engine, model_, nullptr, n);
  } catch (const MissingWindowRows& e) {  // a valid entry, only not for this prefix
    warnings_.push_back(std::string("prompt cache: ") + e.what() + "; prefilling the whole prompt");
    return false;
  } catch (const TooLongForCache& e) {  // a valid entry, only not for this --ctx: kept
    warnings_.push_back(std::string("prompt cache: ") + e.what() + "; prefilling the whole prompt");
    return false;
  } catch (const CannotOpenSession& e) {  // kept, as in find()
    warnings_.push_back(std::string("prompt cache: ") + e.what() + "; prefilling the whole prompt");
    return false;
  } catch (const Error& e) {
    if (!fs::exists(m.path)) {
      warnings_.push_back("prompt cache: " + m.path + " was evicted by another run; prefilling the whole prompt");
      return false;
    }
    drop(m.path, e.what());
    return false;
  }
  if (engine.cache().keep() != keep) engine.cache().set_keep(std::min(keep, engine.cache().max_keep()));
  ::utimensat(AT_FDCWD, m.path.c_str(), nullptr, 0);  // last use, for LRU
  evict_to_cap(false);  // a run that only reads still holds the directory to --prompt-cache-size
  return true;
}

uint64_t PromptCache::store(const Engine& engine, uint32_t n) {
  const KvCache& cache = engine.cache();
  if (n == 0) return 0;
  if (cache.evicted() != 0) {  // only a true prefix is reusable
    warnings_.push_back("prompt cache: not stored: the prompt overflowed --ctx " + std::to_string(cache.capacity()) + " (the ring evicted " +
                        std::to_string(cache.evicted()) + " of its tokens), so the cache no longer holds it from its start");
    return 0;
  }
  if (n > cache.used()) return 0;
  // Window rings must still hold the window before n and before n − 1 (a load runs the last token again).
  if (cache.reusable(n) != n || cache.reusable(n - 1) != n - 1) return 0;
  // An entry larger than the cap would be evicted by the pass that follows its write: not stored,
  // and said (the rows alone here; the file's header and token list are checked once written).
  const auto too_large = [&](uint64_t bytes) {
    const auto bytes_text = [](uint64_t b) { return with_commas(b) + (b == 1 ? " byte" : " bytes"); };
    warnings_.push_back("prompt cache: not stored: the entry for these " + with_commas(n) + " tokens takes " + bytes_text(bytes) +
                        ", more than --prompt-cache-size (" + bytes_text(max_bytes_) + ")");
    return uint64_t{0};
  };
  if (uint64_t{n} * cache.bytes_per_token() > max_bytes_) return too_large(uint64_t{n} * cache.bytes_per_token());
  const std::span<const int32_t> toks(cache.tokens().data(), n);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(XXH64(toks.data(), toks.size_bytes(), 0)));
  const std::string path = dir_ + "/" + entry_prefix() + hash + ".vkv";
  std::error_code ec;
  if (fs::create_directories(dir_, ec); ec) {  // a read-only file system, a file in the way
    warnings_.push_back("prompt cache: not stored: cannot create " + dir_ + ": " + ec.message());
    return 0;
  }
  uint64_t bytes = 0;
  // Only a regular file of this name is ours: a link (even a dangling one) is not written through,
  // nor anything else replaced.
  const fs::file_type there = fs::symlink_status(path, ec).type();
  if (ec && there != fs::file_type::not_found) {
    warnings_.push_back("prompt cache: not stored: " + path + ": " + ec.message());
    return 0;
  }
  if (there != fs::file_type::not_found && there != fs::file_type::regular) {
    warnings_.push_back("prompt cache: not stored: " + path + " exists and is not a regular file");
    return 0;
  }
  if (there == fs::file_type::regular) {
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // same tokens already stored
  } else {
    try {
      bytes = save_session(path, engine, model_, nullptr, "", n);
    } catch (const Error& e) {
      warnings_.push_back(std::string("prompt cache: not stored: ") + e.what());
      return 0;
    }
    if (bytes > max_bytes_) {
      fs::remove(path, ec);
      return too_large(bytes);
    }
    // (A model with window layers keeps them: another run's rings reuse only whole entries.)
    if (!engine.config().has_swa()) drop_superseded(toks, path);
  }
  evict_to_cap(true);
  return bytes;
}

void PromptCache::drop_superseded(std::span<const int32_t> tokens, const std::string& except) {
  DirLock lock(dir_);
  if (!lock.held()) return;  // evict_to_cap says so
  const std::string prefix = entry_prefix();
  std::error_code ec;
  for (const fs::directory_entry& de : fs::directory_iterator(dir_, ec)) {
    const std::string name = de.path().filename().string();
    if (!is_entry_name(name) || name.rfind(prefix, 0) != 0 || !is_plain_file(de) || de.path().string() == except) continue;
    SessionInfo info;
    try {
      info = read_session_info(de.path().string(), false);
    } catch (const Error&) {
      continue;  // another run's business (find() removes a damaged entry when it meets one)
    }
    const size_t n = info.tokens.size();
    if (n < k_min_shared_tokens || n >= tokens.size() || 2 * n < tokens.size() ||
        !std::equal(info.tokens.begin(), info.tokens.end(), tokens.begin()))
      continue;
    std::error_code ec2;
    fs::remove(de.path(), ec2);
  }
}

void PromptCache::evict_to_cap(bool stored) {
  DirLock lock(dir_);
  if (!lock.held()) {
    // A read-only directory is only read: nothing to evict, nothing to say, unless this run stored.
    if (stored || !lock.read_only()) warnings_.push_back("prompt cache: cannot lock " + dir_ + "/.lock; eviction skipped");
    return;
  }
  struct Item {
    std::string path;
    uint64_t bytes;
    int64_t last_used;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const std::string name = it->path().filename().string();
    // The temporaries of writers killed mid-write (gguf::is_orphaned_temporary: process gone, an hour old).
    if (is_entry_temporary(name) && is_plain_file(*it) && gguf::is_orphaned_temporary(it->path())) {
      fs::remove(it->path(), ec2);
      continue;
    }
    if (!is_entry_name(name) || !is_plain_file(*it)) continue;
    const uint64_t b = it->file_size(ec2);
    if (ec2) continue;
    items.push_back({it->path().string(), b, mtime_ns_of(it->path().string())});
    total += b;
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.last_used < b.last_used; });
  for (const Item& it : items) {
    if (total <= max_bytes_) break;
    std::error_code ec2;
    if (fs::remove(it.path, ec2)) {
      total -= it.bytes;
    } else if (ec2) {
      warnings_.push_back("prompt cache: cannot remove " + it.path + " (" + ec2.message() + "); the directory stays above --prompt-cache-size");
      break;
    }
  }
}

}  // namespace vkllm
