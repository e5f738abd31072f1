// Error tiers: vkllm::Error for bad user input (caught once in cli/), CHECK for broken invariants.
#pragma once
#include <stdexcept>
#include <string>

namespace vkllm {

// Bad input from the user or the environment: a file, a flag, a device that lacks a feature.
// The message is one line that names what is wrong.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

// Where and why a JSON text did not parse, from nlohmann::json's parse_error: "line 3, column 7:
// syntax error while parsing object key - …" (its "[json.exception.…] parse error at " cut off).
std::string json_error_text(const std::exception& e);

}  // namespace vkllm

// An internal invariant; failing it is a bug in vkllm, not in the input.
#define VKLLM_CHECK(cond, msg)                                                   \
  do {                                                                           \
    if (!(cond)) ::vkllm::check_failed(#cond, __FILE__, __LINE__, (msg));        \
  } while (0)
