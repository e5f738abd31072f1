// Number formatting for people.
#include "format.h"

#include <cstdio>

namespace vkllm::cli {

std::string count_of(uint64_t n, const std::string& noun) { return with_commas(n) + " " + noun + (n == 1 ? "" : "s"); }

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)n);
  else std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::string human_count(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)n);
  return buf;
}

}  // namespace vkllm::cli
