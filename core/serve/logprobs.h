// Log-probabilities of generated tokens as a response reports them (OpenAI's `logprobs`): made
// on the device thread as each token's text is released to the client, turned into JSON by the
// API layer (api.h). docs/server.md, "Log-probabilities".
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vkllm::serve {

struct TokenLogprobs {
  std::string token;          // the token's bytes (llama.cpp's token_to_piece)
  float logprob = 0;          // under the model's logits, before penalties and temperature
  uint32_t text_offset = 0;   // where its text starts in the completion's text
  std::vector<std::pair<std::string, float>> top;  // the most likely tokens of its step, most likely first
};

}  // namespace vkllm::serve
