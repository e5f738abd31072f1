// Reporting of broken internal invariants.
#include "base/error.h"

namespace vkllm {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(std::string("internal error at ") + file + ":" + std::to_string(line) + ": " + expr +
                         (msg.empty() ? "" : ": " + msg));
}

}  // namespace vkllm
