#include "base/cache_dir.h"

#include <cstdlib>

namespace vkllm {

namespace {

// $VAR/vkllm for an absolute VAR, else $HOME/under/vkllm, else "".
std::string xdg_dir(const char* var, const char* under) {
  if (const char* x = std::getenv(var); x && x[0] == '/') return std::string(x) + "/vkllm";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/" + under + "/vkllm";
  return "";
}

}  // namespace

std::string user_cache_dir() { return xdg_dir("XDG_CACHE_HOME", ".cache"); }
std::string user_state_dir() { return xdg_dir("XDG_STATE_HOME", ".local/state"); }

}  // namespace vkllm
