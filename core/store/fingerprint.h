// Model fingerprints: the identity of a model's bytes, as session files and the prompt cache
// record it.
#pragma once
#include <cstdint>
#include <string>

#include "gguf.h"
#include "model/config.h"

namespace vkllm {

// The longest model name a fingerprint carries (bytes), as session files store it.
inline constexpr uint32_t kMaxModelName = 256;

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

}  // namespace vkllm
