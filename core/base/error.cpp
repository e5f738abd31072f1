// Reporting of broken internal invariants.
#include "base/error.h"

namespace vkllm {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(std::string("internal error at ") + file + ":" + std::to_string(line) + ": " + expr +
                         (msg.empty() ? "" : ": " + msg));
}

std::string json_error_text(const std::exception& e) {
  const std::string what = e.what();
  for (const char* lead : {"parse error at ", "parse error: "}) {
    const size_t at = what.find(lead);
    if (at != std::string::npos) return what.substr(at + std::string(lead).size());
  }
  return what;
}

}  // namespace vkllm
