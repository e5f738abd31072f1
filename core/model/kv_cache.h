// KvCache: the ring-buffered KV cache in device memory and the CPU-side map of which token sits
// in which slot. Design in docs/kv-cache.md.
//
// The cache holds a *logical sequence* of tokens: the pinned tokens (the first n_keep, never
// evicted) followed by the window (the most recent tokens, oldest first). Logical index i is also
// the token's RoPE position (StreamingLLM): positions are assigned within the cache, so after the
// ring wraps the sinks keep positions 0…n_keep−1 and the window stays contiguous after them. K is
// stored un-rotated and attention rotates it at the position read from kv_pos, so re-assigning
// positions moves no data.
//
// Slots: pinned token i lives in slot i; the window occupies slots n_keep … capacity−1 as a ring
// whose oldest entry is at `head_`. Appending to a full cache overwrites the oldest window slot.
//
// Sliding-window layers (Gemma) may keep a ring of their own, smaller than the capacity
// (window_ring_slots()): every token gets a serial number when appended (consecutive along the
// logical sequence, reused after a truncation) and sits in window slot serial % ring slots. A
// host-side table of which serial each window slot holds tells exactly which tokens' window rows
// are still there: a truncation must keep the rows the next token's window reads (reusable()),
// and session files carry zeros for rows the ring no longer holds.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/kv_layout.h"
#include "model/config.h"
#include "vk/buffer.h"

namespace vkllm {

struct KvCacheOptions {
  uint32_t capacity = 4096;        // slots (--ctx)
  CacheType type_k = CacheType::F16;
  CacheType type_v = CacheType::F16;
  uint32_t n_ubatch = 512;         // the longest chunk appended at once (sizes the window layers' rings)
  bool swa_full = false;           // window layers keep every slot, as llama.cpp's --swa-full (any prefix reusable)
  bool rotated_k = false;          // keep the rotated copy of K (f16 K; the engine asks for it where the
                                   // CPU drivers' decode kernel reads it)
};

// The slots of the window layers' rings a cache with these options has (0: none).
uint32_t window_ring_for(const ModelConfig& c, const KvCacheOptions& o);
// Why a pin of n tokens (below `capacity`) is refused: past what window rings of `ring_slots` leave
// (KvCache::max_keep()); "" when it fits. For checks before a cache exists.
std::string keep_refusal(uint32_t n, uint32_t capacity, uint32_t ring_slots);
// The positions a rope table must cover for a cache with these options: its capacity, or twice
// that with the rotated copy of K (whose rotation positions the cache keeps below it).
inline uint32_t rope_positions_for(const KvCacheOptions& o) { return o.rotated_k ? 2 * o.capacity : o.capacity; }

class KvCache {
 public:
  KvCache(const VulkanContext& ctx, const ModelConfig& config, const KvCacheOptions& o);

  // Where the next `n` tokens go, in order; appends them to the logical sequence, evicting the
  // oldest window tokens when full. Returns the slots; `positions` receives their positions.
  std::vector<int32_t> append(std::span<const int32_t> tokens, std::vector<int32_t>& positions);
  // The whole logical sequence as attention reads it: slot and position of every live token.
  void attention_lists(std::vector<int32_t>& slots, std::vector<int32_t>& positions) const;
  // With window rings: the window slots of the last n logical tokens (where a chunk's K and V go
  // in the window layers), and the slots and positions the window layers read for a chunk of the
  // last n_new tokens (its window before it and the chunk itself).
  std::vector<int32_t> window_slots_of_last(uint32_t n) const;
  void window_lists(uint32_t n_new, std::vector<int32_t>& slots, std::vector<int32_t>& positions) const;
  // The longest truncation target ≤ n that keeps every row the next token's window reads: n, or 0
  // when a window ring no longer holds them (a rewind past what the ring kept). Callers that
  // truncate to reuse a prefix truncate to reusable(n) instead.
  uint32_t reusable(uint32_t n) const;
  // Keeps the first n logical tokens (n ≤ used(), reusable(n) == n). Pinned tokens beyond n are unpinned.
  void truncate(uint32_t n);
  void clear() { truncate(0); }
  // Pins the first n logical tokens (n ≤ capacity − 1; with window rings, n ≤ capacity − ring
  // slots, so the window layers never need a pinned token the ring has overwritten; an Error
  // says so): they are never evicted.
  void set_keep(uint32_t n);

  uint32_t capacity() const { return capacity_; }
  // The most tokens set_keep accepts: capacity − 1, or with window rings capacity − ring slots.
  uint32_t max_keep() const { return ring_slots_ ? capacity_ - ring_slots_ : capacity_ - 1; }
  uint32_t used() const { return n_pinned_ + n_window_; }
  uint32_t keep() const { return n_keep_; }
  uint64_t evicted() const { return n_evicted_; }   // tokens overwritten since the last clear
  const std::vector<int32_t>& tokens() const { return tokens_; }  // logical sequence
  // Per logical token, an id of its rows: given when the token's rows are written (append,
  // restore), unique in the process (across caches too), kept while the token stays. Equal ids
  // mean the same rows, so a session file's journal writes only the rows it does not hold yet.
  const std::vector<uint64_t>& row_ids() const { return row_ids_; }
  CacheType type_k() const { return type_k_; }
  CacheType type_v() const { return type_v_; }
  uint64_t bytes_per_token() const { return bytes_per_token_; }
  uint64_t bytes_used() const;                      // rows held: window rings hold at most their slots
  uint64_t device_bytes() const;                    // allocated: the sum over layers of slots × row bytes
  uint32_t window_ring() const { return ring_slots_; }  // slots of the window layers' rings; 0: none
  uint64_t row_bytes_k() const { return row_bytes_k_; }
  uint64_t row_bytes_v() const { return row_bytes_v_; }

  // Layer l's K or V rows: [capacity][row bytes] in the cache type.
  const Buffer& k(uint32_t layer) const { return k_[layer]; }
  const Buffer& v(uint32_t layer) const { return v_[layer]; }

  // The rotated copy of K (docs/kv-cache.md, "The rotated copy of K"): layer l's K rows, each
  // rotated by RoPE at its slot's rotation position, for the layers that read the global slots
  // (null for the others, and without the option). A slot's rotation position is its token's
  // position plus the evictions between the copy's base and the token's append, so the window's
  // rows all stay one shift (evictions since the base) ahead of their positions and pinned rows
  // keep theirs; at most two shifts along the logical sequence (else, and when the shift would
  // reach the capacity, the copy is rebased: every row's rotation position becomes its position,
  // to be rebuilt by the engine before its next pass, as after a restore).
  const Buffer* k_rotated(uint32_t layer) const { return k_rot_.empty() || is_ring_layer(layer) ? nullptr : &k_rot_[layer]; }
  // Each live token's rotation position in logical order; returns how many leading ones share the
  // first one's shift (the rest share another).
  uint32_t rotation_list(std::vector<int32_t>& rot) const;
  // The rotation positions of the last n logical tokens (where kv_store rotates them).
  std::vector<int32_t> rotations_of_last(uint32_t n) const;
  // The copy's shifts (rotation position − position) as a session carries them, so that a restore
  // rebuilds the same rows and the same logits bit for bit: the first `split` live tokens rotate
  // `first` ahead of their positions, the rest `rest` ahead, and the next appended token `next`
  // ahead (the evictions since the copy's base). All 0 and split = used() without a copy.
  struct Shifts {
    uint32_t split = 0;
    uint32_t first = 0, rest = 0, next = 0;
  };
  Shifts rotation_shifts() const;
  // Whether the copy must be rebuilt from the cache (every live row) before the next pass reads it;
  // the engine says when a pass that rebuilt it has run.
  bool rotated_stale() const { return rot_stale_; }
  void rotated_rebuilt() { rot_stale_ = false; }
  // Slot of logical index i.
  int32_t slot_of(uint32_t i) const;

  // Session files and the prompt cache (core/store/session_file.h) move rows in the *session layout*:
  // for each layer, K rows [n][row_bytes_k] then V rows [n][row_bytes_v], tokens in logical
  // order. read_rows copies the first n logical tokens (n ≤ used()) out of the device; a window
  // layer's rows that its ring no longer holds are zeros. read_rows(first, n) copies logical
  // tokens [first, first + n) in the same layout (n rows a layer).
  std::vector<uint8_t> read_rows(uint32_t n) const { return read_rows(0, n); }
  std::vector<uint8_t> read_rows(uint32_t first, uint32_t n) const;
  // Replaces the whole cache: `tokens` become the logical sequence at slots 0…n−1 (logical i in
  // slot i, i.e. an unwrapped ring), the first min(n, n_keep) of them pinned, `rows` (session
  // layout, n tokens) uploaded. The caller has validated sizes: a mismatch is a bug. A window
  // layer takes the rows of the last tokens its ring holds, skipping rows of zeros (not saved);
  // restore returns false, changing nothing, when the next token's window would miss a row. A
  // cache without rings remembers which tokens' window rows were zeros, so reusable() stays exact.
  // The rotated copy takes `shifts` (rotation_shifts() of the saving cache) when given and within
  // this cache's bounds, else it is rebased; it is rebuilt before the next pass either way.
  bool restore(std::span<const int32_t> tokens, uint32_t n_keep, uint64_t n_evicted, std::span<const uint8_t> rows,
               const Shifts* shifts = nullptr);

 private:
  // Whether logical token i's window row is in its window slot; whether the `count` tokens before n all are.
  bool window_row_held(uint32_t i) const;
  bool window_held_before(uint32_t n, uint32_t count) const;
  bool is_ring_layer(size_t layer) const { return ring_slots_ && ring_layer_[layer]; }
  // The rotated copy: every live row's rotation position becomes its position (rebuilt next pass).
  void rebase_rotations();
  // Whether the live tokens' shifts (rotation position − position) form at most two runs.
  bool two_shift_runs() const;

  const VulkanContext* ctx_;
  uint32_t capacity_;
  uint32_t window_ = 0;      // the model's sliding window (tokens); 0: none
  uint32_t ring_slots_ = 0;  // slots of each window layer's ring; 0: window layers use the global slots
  std::vector<bool> window_layer_;   // layer l is a sliding-window layer
  std::vector<bool> ring_layer_;     // layer l is a window layer with its own ring
  std::vector<int64_t> serial_;      // per logical token: its serial number (window ring slot = serial % ring_slots_)
  std::vector<int64_t> ring_serial_; // per window slot: the serial whose rows it holds (−1: none)
  std::vector<bool> window_absent_;  // without rings: per logical token, its window rows were restored as zeros
  CacheType type_k_, type_v_;
  uint64_t row_bytes_k_, row_bytes_v_, bytes_per_token_;
  std::vector<Buffer> k_, v_;
  uint32_t n_keep_ = 0;    // pinned target: the first n_keep logical tokens
  uint32_t n_pinned_ = 0;  // pinned tokens present (≤ n_keep)
  uint32_t n_window_ = 0;  // window tokens present
  uint32_t head_ = 0;      // window ring index of the oldest window token
  uint64_t n_evicted_ = 0;
  std::vector<int32_t> tokens_;  // logical sequence: pinned then window, oldest first
  std::vector<uint64_t> row_ids_;  // per logical token: the id of its rows (row_ids())
  std::vector<Buffer> k_rot_;    // the rotated copy of K per layer (empty: none; a ring layer's unallocated)
  std::vector<int32_t> rot_;     // per slot: the position its rotated row is rotated at
  uint64_t rot_base_ = 0;        // evictions at the copy's last rebase
  bool rot_stale_ = false;
};

}  // namespace vkllm
