// Model fingerprints: which model's bytes a session file or a prompt-cache entry was saved with.
#include "store/fingerprint.h"

#include <xxhash.h>

#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "model/config.h"

namespace vkllm {
namespace {

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
  if (fp.name.size() + suffix.size() > kMaxModelName) fp.name.resize(kMaxModelName - suffix.size());
  fp.name += suffix;
  return fp;
}

}  // namespace vkllm
