// ModelSummary: what `vkllm info` reports about a GGUF model, computed without a device.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "gguf.h"
#include "model/config.h"

namespace vkllm {

struct ModelSummary {
  ModelConfig config;
  uint64_t file_size = 0;
  uint64_t n_params = 0;                        // elements over all tensors
  uint64_t weight_bytes = 0;                    // bytes over all tensors
  std::map<std::string, uint64_t> type_counts;  // ggml type name → tensor count
  std::map<std::string, uint64_t> type_params;  // ggml type name → elements
  uint32_t gguf_version = 0;
  uint64_t n_tensors = 0;

  double bits_per_weight() const { return n_params ? 8.0 * double(weight_bytes) / double(n_params) : 0.0; }
};

// `rope`: the command line's RoPE flags, in the config as the model will run it.
ModelSummary summarize_model(const gguf::File& f, const RopeOverrides& rope = {});

}  // namespace vkllm
