// ASCII case for names, units, suffixes and origins (not text: Unicode case is jinja/unicode's).
#pragma once
#include <cctype>
#include <string>

namespace vkllm {

inline std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace vkllm
