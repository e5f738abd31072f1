// The prompt cache: prompt prefixes' KV state kept on disk between runs, found by the longest
// shared token prefix.
//
// ## Layout
//
// One directory (default $XDG_CACHE_HOME/vkllm/prompt-cache). Every entry is a session file
// (core/store/session_file.h) with no sampler state and no conversation, named
//
//     <model fingerprint, 16 hex>-<type_k>-<type_v>-<XXH64 of the tokens, 16 hex>.vkv
//
// so entries of other models and cache types are skipped by name without being opened, and
// storing the same prompt twice replaces one file. The file's mtime is its last use (touched
// on every hit): the size cap evicts least recently used entries first.
//
// ## Concurrency
//
// Entries are written with gguf::write_file_atomic (temporary file, fsync, rename), so readers
// see a whole old file or a whole new one. Eviction takes an exclusive flock on `.lock` in the
// directory so two runs never evict from one listing twice. A reader whose entry vanishes
// (evicted by another run) falls back to a full prefill. An entry that fails validation —
// truncated, corrupt, or not what its name says — is skipped with a warning and removed.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "store/session_file.h"

namespace vkllm {

// user_cache_dir()/prompt-cache (base/cache_dir.h); "" when no cache directory is known.
std::string default_prompt_cache_dir();

struct PromptCacheEntry {
  std::string path;
  uint64_t bytes = 0;
  int64_t last_used = 0;  // mtime, seconds since the epoch
  SessionInfo info;       // HEAD and TOKS only (no KV, no sampler)
  bool valid = true;
  std::string error;      // why not valid
};
// Every entry in `dir`, most recently used first (headers read, KV not).
std::vector<PromptCacheEntry> list_prompt_cache(const std::string& dir);
// Removes every entry (and stray temporaries); returns the bytes freed.
uint64_t clear_prompt_cache(const std::string& dir);

// Whether an entry of `entry_tokens` that shares its first `shared` tokens with a prompt is worth
// reading (a load reads the whole entry, and marks it used for the LRU): at least 8 tokens shared
// (all of a shorter entry), since every prompt shares its BOS and often a first word with every
// entry, and at least 1/16 of the entry, so that a prefill of a few tokens is not replaced by a read
// of thousands (docs/session-format.md, "The prompt cache").
constexpr uint64_t k_min_shared_tokens = 8, k_max_read_per_reused = 16;
bool worth_loading(uint64_t shared, uint64_t entry_tokens);

struct PromptCacheMatch {
  std::string path;             // best entry ("" when none shares a token)
  uint32_t matched = 0;         // leading tokens shared with it
  bool worth_loading = false;   // worth_loading(matched, entry_tokens): load() takes only such a match
  uint32_t entry_tokens = 0;
  uint32_t entries_seen = 0;    // entries for this model and cache type
  uint32_t partial_skipped = 0; // whole_only: the longest match of an entry passed over for being partial
};

class PromptCache {
 public:
  PromptCache(std::string dir, uint64_t max_bytes, ModelFingerprint model, CacheType type_k, CacheType type_v);

  // The entry sharing the longest token prefix with `tokens`, among those worth loading if any are
  // (else the longest match, for the divergence message). Unreadable entries are removed
  // and reported through take_warnings(). whole_only (caches with window rings, whose entries
  // hold the window rows of their last tokens only): only entries `tokens` contains whole, or
  // all but their last token, qualify.
  PromptCacheMatch find(std::span<const int32_t> tokens, bool whole_only = false);
  // Loads the first n tokens of `m`'s entry into the engine's cache (n ≤ m.matched). Returns
  // false, with the cache unchanged, when the match is not worth loading, or (with a warning) when
  // the entry vanished or is corrupt.
  bool load(const PromptCacheMatch& m, uint32_t n, Engine& engine);
  // find() and load() for a prompt about to run: loads the best entry's shared prefix, all but the
  // prompt's last token (which always runs, for fresh logits), where that is more than the engine's
  // cache already holds. An entry found corrupt at load time is removed, and the next best is
  // tried (a few times). Returns the match it settled on.
  PromptCacheMatch restore(std::span<const int32_t> tokens, Engine& engine);
  // Stores the first n tokens of the engine's cache as an entry, removes the entries it supersedes
  // (below), then evicts least recently used entries until the directory is under the cap.
  // Failures become warnings: the cache is an optimisation and never fails a run. Returns the
  // entry's size (0: not stored).
  //
  // An entry of at least 8 tokens whose tokens begin the new one's and that is at least half as
  // long is superseded: a load takes any prefix of the new entry, so it serves the prompts the old
  // one served, reading at most twice the bytes, but for those sharing under 1/16 of the new entry
  // (worth_loading), which now prefill those ≤ 1/8 of the old entry's tokens. A chat that resends
  // its conversation otherwise stored one entry per turn, each a copy of the last one and more:
  // disk use grew with the square of the turns. Models with window layers keep theirs (a run with
  // rings reuses only whole entries).
  uint64_t store(const Engine& engine, uint32_t n);

  // What went wrong but did not stop the run, one line each, for the CLI to print.
  // The warnings since the last call (each is reported once).
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }

 private:
  std::string entry_prefix() const;
  // `stored`: this run stored an entry (a read-only directory's missing lock is then worth a warning).
  void evict_to_cap(bool stored);
  void drop(const std::string& path, const std::string& why);
  // Removes this model's entries that `tokens` supersedes (see store).
  void drop_superseded(std::span<const int32_t> tokens, const std::string& except);

  std::string dir_;
  uint64_t max_bytes_;
  ModelFingerprint model_;
  CacheType type_k_, type_v_;
  std::vector<std::string> warnings_;
};

}  // namespace vkllm
