// Helpers shared by the tests: where ../shared is, and skipping when a file is missing.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace vkllm::test {

// Path of a file under ../shared (e.g. "models/stories260K.gguf").
std::string shared_path(const std::string& rel);
// Whether ../shared/<rel> exists; when it does not, the caller should GTEST_SKIP with
// missing_message(rel).
bool shared_exists(const std::string& rel);
std::string missing_message(const std::string& rel);
std::vector<uint8_t> read_file(const std::string& path);
// Every file in ../shared/<dir> whose name ends in `suffix`, sorted.
std::vector<std::string> shared_files(const std::string& dir, const std::string& suffix);

}  // namespace vkllm::test

// Skips the current test, naming the missing file, when ../shared/<rel> is absent.
#define VKLLM_REQUIRE_SHARED(rel)                                         \
  do {                                                                    \
    if (!::vkllm::test::shared_exists(rel)) GTEST_SKIP() << ::vkllm::test::missing_message(rel); \
  } while (0)
