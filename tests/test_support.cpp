// Helpers shared by the tests.
#include "test_support.h"

#include <algorithm>
#include <fstream>
#include <iterator>

namespace vkllm::test {

std::string shared_path(const std::string& rel) { return std::string(VKLLM_SHARED_DIR) + "/" + rel; }

bool shared_exists(const std::string& rel) { return std::filesystem::exists(shared_path(rel)); }

std::string missing_message(const std::string& rel) {
  return "skipped: missing " + shared_path(rel) + " (the shared test data beside the repository)";
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> shared_files(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (!shared_exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(shared_path(dir))) {
    const std::string p = e.path().string();
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace vkllm::test
