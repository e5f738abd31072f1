#include "base/cache_dir.h"

#include <cstdlib>

namespace vkllm {

std::string user_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && x[0] == '/') return std::string(x) + "/vkllm";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/vkllm";
  return "";
}

}  // namespace vkllm
