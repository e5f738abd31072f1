// Session files: the KV cache, its token history, the sampler state and an opaque conversation
// on disk, so a conversation (or an expensive prompt prefix) survives between runs.
//
// ## Format, version 2 (little-endian; docs/session-format.md has the rationale)
//
//   offset 0   u8[8]  magic "VKLLMSES"
//   offset 8   u32    format version (2; 1 is read too). A larger number is a newer vkllm's file: refused.
//   offset 12  u32    section count (5)
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
//   nothing after the last section.
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
#include <vector>

#include "engine/engine.h"
#include "gguf.h"
#include "engine/sampler.h"

namespace vkllm {

inline constexpr uint32_t kSessionVersion = 2;
inline constexpr uint32_t kOldestSessionVersion = 1;  // read too: its HEAD has no rotation shifts

// Identity of a model's bytes: same hash ⇔ same weights, tokenizer and template (practically).
struct ModelFingerprint {
  uint64_t hash = 0;
  std::string name;  // general.name, else the file name without directory
  std::string hex() const;  // 16 lower-case hex digits
};
// Hashes the metadata, the tensor table and up to 3 × 4 KiB of every tensor's data. Compute it
// once per loaded model (it reads a few MiB of the mapping on a large model). A cache's rows depend
// on the context too where the model has two sets of RoPE factors (Phi-3's LongRoPE: the long set
// past rope.scaling.original_context_length): then which set a cache of n_ctx slots takes is
// hashed and named, so that rows computed with the other set are another model's (a session is
// refused, a prompt-cache entry not found).
// RoPE flags that change the file's RoPE (rope_override_summary) are hashed too, and named.
ModelFingerprint model_fingerprint(const gguf::File& f, uint32_t n_ctx, const RopeOverrides& rope = {});

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
};

// The bytes of a session file holding `info` and its KV rows (session layout, see
// KvCache::read_rows). save_session is read_rows + encode_session + gguf::write_file_atomic.
std::vector<uint8_t> encode_session(const SessionInfo& info, std::span<const uint8_t> kv);

// Saves the first `n_tokens` tokens of the engine's cache (all of them when n_tokens is −1),
// with `sampler`'s state (none when null) and `conversation`, atomically
// (gguf::write_file_atomic). Returns the file's size. Throws vkllm::Error naming the path.
uint64_t save_session(const std::string& path, const Engine& engine, const ModelFingerprint& model, const Sampler* sampler,
                      const std::string& conversation, int64_t n_tokens = -1);

// Validates `path` against this engine and model, then replaces the cache with its first
// `max_tokens` tokens (all when −1) and, when `sampler` is given and the file has a state,
// restores the sampler. Throws vkllm::Error (and changes nothing) when the file is not a valid
// session for this model and cache (a whole file whose pin fills the cache included). `check`, when given, sees the fully validated file last,
// before anything changes, and refuses it by throwing (the chat checks its conversation there).
// The caller then runs Generator::resume() (or prefills).
using SessionCheck = std::function<void(const SessionInfo&)>;
SessionInfo load_session(const std::string& path, Engine& engine, const ModelFingerprint& model, Sampler* sampler,
                         int64_t max_tokens = -1, const SessionCheck& check = {});

// Parses and checks the framing and checksums of a whole file without an engine (tests, `vkllm
// cache list`). `with_kv` false reads only HEAD and TOKS from disk (the prompt cache's index).
SessionInfo read_session_info(const std::string& path, bool with_kv = true);

// Throws vkllm::Error ("PATH: saved with NAME HASH, this is NAME HASH") unless `info` was saved with
// `model` (load_session's first check; a run checks it before the weights load too).
void check_session_model(const std::string& path, const SessionInfo& info, const ModelFingerprint& model);
// Throws Error when the session was saved with other cache types than (type_k, type_v).
void check_session_cache_types(const std::string& path, const SessionInfo& info, CacheType type_k, CacheType type_v);

}  // namespace vkllm
