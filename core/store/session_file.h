// Session files: the KV cache, its token history, the sampler state and an opaque conversation
// on disk, so a conversation (or an expensive prompt prefix) survives between runs.
//
// ## Format, version 2 (little-endian; docs/session-format.md has the rationale)
//
//   offset 0   u8[8]  magic "VKLLMSES"
//   offset 8   u32    format version (2 for a file written whole; 3 once updates are appended, below;
//                      1 is read too). A larger number is a newer vkllm's file: refused.
//   offset 12  u32    section count (5; 6 in version 3, below)
//   then the sections, in this order, each framed as
//        u32 tag (4 ASCII bytes) · u32 0 · u64 length · u8 payload[length] · u64 XXH64(payload,
//        seed = tag)
//   HEAD  the model and the cache geometry:
//          u64 model fingerprint (model_fingerprint(): XXH3-64 over metadata, tensor table and a
//              sample of tensor data — it covers the tokenizer and the chat template)
//          u32 name length (≤ 256) · u8 name[]      general.name, else the file name
//          u32 n_layer · u32 n_head_kv · u32 head_dim
//          u32 type_k · u32 type_v                  CacheType: 0 f16, 1 q8_0, 2 q4_0
//          u64 row_bytes_k · u64 row_bytes_v        bytes of one token's K / V row in one layer
//          u32 capacity                             slots of the cache that saved it (informative)
//          u32 n_keep                               pinned prefix (the first n_keep tokens)
//          u32 n_used                               tokens in the logical sequence
//          u64 n_evicted                            tokens the ring had overwritten (0: the
//                                                   sequence is a true prefix of the text)
//          u32 rot_split · u32 rot_first · u32 rot_rest · u32 rot_next
//                                                   (version 2) the rotated copy of K's shifts,
//                                                   KvCache::Shifts; not in version 1 files
//   TOKS  i32 tokens[n_used]: the logical sequence (pinned, then window, oldest first)
//   CONV  the conversation: UTF-8 JSON text chosen by the caller (chat: its messages), or empty
//   SAMP  Sampler::save_state() (its own magic, version and checksum), or empty
//   KVDT  for each layer: K rows [n_used][row_bytes_k], then V rows [n_used][row_bytes_v], in
//         logical order — only the occupied slots, so the size grows with tokens, not capacity
//   nothing after the last section (version 2).
//
// ## Updates (version 3)
//
// A later save of the same cache to the same file (save_session with a SessionJournal) appends an
// update instead of rewriting the file: a version-3 file is a version-2 file (its *base*) followed
// by updates. Its preamble says version 3 and 6 sections (the base's five, then updates; no single
// flipped bit turns a version-2 preamble into this one). An update is framed as the sections above:
//   UPDT  u64 the update's bytes, this section included
//   ROWS  (where the file lacks rows) u32 n · u32 0 · for each layer: K rows [n][row_bytes_k], then
//         V rows [n][row_bytes_v]: the rows of tokens the file did not hold yet
//   HEAD, TOKS, CONV, SAMP  as in the base, for the state saved (HEAD's fingerprint, geometry and
//         cache types the base's)
//   LIST  u32 n_extents · u32 0 · n_extents × { u64 offset of a KVDT or ROWS section before it ·
//         u32 first row in that section · u32 rows }: the logical sequence's rows, in order (the
//         rows add up to HEAD's n_used)
// The file holds the state of its last update (of its base without one). A file that ends inside
// an update (before the bytes its UPDT counts) is a save cut short: that update is ignored
// (SessionInfo::unfinished_bytes) and the next save cuts it off. Any other damage is refused.
// The first append writes the version-3 preamble before anything else.
//
// Positions are logical indices and K is stored un-rotated (see kv_cache.h), so a restored
// sequence goes to slots 0…n_used−1 of any cache with capacity ≥ n_used.
//
// Loading parses and checks the whole file (every length against the bytes left, every
// checksum, the version, the fingerprint, the geometry, the token ids, the sampler blob)
// before it touches the engine or the sampler; a failed load leaves both exactly as they were.
// Errors are one line naming the file, the section and its byte offset.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "store/fingerprint.h"

namespace vkllm {

inline constexpr uint32_t kSessionVersion = 3;
inline constexpr uint32_t kOldestSessionVersion = 1;  // read too: its HEAD has no rotation shifts

// What a session holds besides the KV rows.
// load_session's refusal of a prefix whose sliding-window rows the file does not hold (the file
// itself is valid).
struct MissingWindowRows : Error {
  using Error::Error;
};
// load_session's refusal of more tokens than this cache's capacity (--ctx): the file is valid.
struct TooLongForCache : Error {
  using Error::Error;
};
// A session file that could not be opened (out of descriptors, another user's file): nothing is
// known of its content.
struct CannotOpenSession : Error {
  using Error::Error;
};

struct SessionInfo {
  ModelFingerprint model;
  uint32_t n_layer = 0, n_head_kv = 0, head_dim = 0;
  CacheType type_k = CacheType::F16, type_v = CacheType::F16;
  uint64_t row_bytes_k = 0, row_bytes_v = 0;
  uint32_t capacity = 0, n_keep = 0;
  uint64_t n_evicted = 0;
  KvCache::Shifts shifts;        // the rotated copy's (version 2; zeros without a copy)
  bool has_shifts = false;       // false in version 1 files: a restore rebases the copy
  std::vector<int32_t> tokens;   // the logical sequence
  std::string conversation;      // CONV, opaque
  std::vector<uint8_t> sampler;  // SAMP, may be empty
  uint64_t file_bytes = 0;
  uint64_t unfinished_bytes = 0;  // (version 3) bytes after the last whole update, ignored
};

// What a session file on disk holds of one cache, kept by whoever saves that cache to the same file
// again (the chat after every change; `run --session` from its load to its save), so that the next
// save appends only the rows the file lacks and a small update ("Updates" above) instead of
// rewriting the whole file. A file changed since by anyone else (another size, modification time
// or inode) is rewritten whole, and so is one that an append would make larger than `max_growth`
// times a whole file (the rows of evicted, undone or cleared tokens, and the old updates' states).
struct SessionJournal {
  struct Place {
    uint64_t section = 0;  // offset of the KVDT or ROWS section that holds the row
    uint32_t row = 0;      // the row within it
  };
  std::string path;                                // empty: nothing known, the next save is whole
  bool replaced_changed = false;                   // the last save wrote the file whole over one another process had changed since
  uint64_t dev = 0, ino = 0, size = 0;             // the file as the last save or load left it
  int64_t mtime_ns = 0;
  uint64_t end = 0;                                // where the next update goes (after the last whole one)
  uint64_t model = 0;                              // the fingerprint it was saved with
  struct Geometry {                                // the cache it was saved from (an update must match the base)
    uint32_t n_layer = 0, n_head_kv = 0, head_dim = 0;
    CacheType type_k = CacheType::F16, type_v = CacheType::F16;
    uint64_t row_bytes_k = 0, row_bytes_v = 0;
    bool operator==(const Geometry&) const = default;
  } geometry;
  bool version3 = false;                           // offset 8 says 3 already
  std::unordered_map<uint64_t, Place> rows;        // KvCache::row_ids() → where the file has that token's rows
  uint64_t appended = 0;                           // bytes the last save appended (0: it wrote the file whole)
  double max_growth = 2;                           // appends stop (the file is written whole) where the file would
                                                   // outgrow this many times a whole file's size
};

// The bytes of a session file holding `info` and its KV rows (session layout, see
// KvCache::read_rows). save_session is read_rows + encode_session + gguf::write_file_atomic.
std::vector<uint8_t> encode_session(const SessionInfo& info, std::span<const uint8_t> kv);

// Saves the first `n_tokens` tokens of the engine's cache (all of them when n_tokens is −1),
// with `sampler`'s state (none when null) and `conversation`, atomically
// (gguf::write_file_atomic). Returns the file's size. Throws vkllm::Error naming the path.
// With a `journal` of this file and cache (a whole save, n_tokens −1), appends an update instead
// where it can; either way the journal then describes the file.
uint64_t save_session(const std::string& path, const Engine& engine, const ModelFingerprint& model, const Sampler* sampler,
                      const std::string& conversation, int64_t n_tokens = -1, SessionJournal* journal = nullptr);

// Validates `path` against this engine and model, then replaces the cache with its first
// `max_tokens` tokens (all when −1) and, when `sampler` is given and the file has a state,
// restores the sampler. Throws vkllm::Error (and changes nothing) when the file is not a valid
// session for this model and cache (a whole file whose pin fills the cache included). `check`, when given, sees the fully validated file last,
// before anything changes, and refuses it by throwing (the chat checks its conversation there).
// The caller then runs Generator::resume() (or prefills).
// A whole load given a `journal` leaves it describing the file, so that the next save appends.
using SessionCheck = std::function<void(const SessionInfo&)>;
SessionInfo load_session(const std::string& path, Engine& engine, const ModelFingerprint& model, Sampler* sampler,
                         int64_t max_tokens = -1, const SessionCheck& check = {}, SessionJournal* journal = nullptr);

// Parses and checks the framing and checksums of a whole file without an engine (tests, `vkllm
// cache list`). `with_kv` false reads only HEAD and TOKS from disk (the prompt cache's index).
SessionInfo read_session_info(const std::string& path, bool with_kv = true);

// Throws vkllm::Error ("PATH: saved with NAME HASH, this is NAME HASH") unless `info` was saved with
// `model` (load_session's first check; a run checks it before the weights load too).
void check_session_model(const std::string& path, const SessionInfo& info, const ModelFingerprint& model);
// Throws Error when the session was saved with other cache types than (type_k, type_v).
void check_session_cache_types(const std::string& path, const SessionInfo& info, CacheType type_k, CacheType type_v);

}  // namespace vkllm
