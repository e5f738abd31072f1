// Reference forward pass of a llama/qwen2 GGUF model, composed only of the reference ops in ref_ops.h.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "gguf.h"

namespace vkllm::ref {

// Runs `tokens` (positions 0..n-1) through the model as one batch and returns the logits of every
// position: [n_tokens][n_vocab] f32. Weights are dequantized row by row and all math is f32; K and
// V pass through a cache of type kv_type (F32, F16, Q8_0 or Q4_0) as an engine would store them.
// Throws gguf::Error naming a missing tensor.
std::vector<float> forward(const gguf::File& model, std::span<const int32_t> tokens, gguf::TensorType kv_type);

}  // namespace vkllm::ref
