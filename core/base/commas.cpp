// A count written for people, with thousands separated.
#include "base/commas.h"

namespace vkllm {

std::string with_commas(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

}  // namespace vkllm
