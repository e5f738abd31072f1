// Where vkllm keeps what it caches between runs (kernels' pipeline cache, the prompt cache).
#pragma once
#include <string>

namespace vkllm {

// $XDG_CACHE_HOME/vkllm, or ~/.cache/vkllm when XDG_CACHE_HOME is unset, empty or relative (the
// XDG base directory spec: a relative path is invalid and ignored, or a run would write caches
// under whatever directory it was started in); "" when neither is known.
std::string user_cache_dir();
// The same rule for $XDG_STATE_HOME/vkllm, else ~/.local/state/vkllm (chat's input history).
std::string user_state_dir();

}  // namespace vkllm
