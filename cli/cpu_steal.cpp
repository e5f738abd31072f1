#include "cpu_steal.h"

#include <fstream>
#include <sstream>

namespace vkllm::cli {

std::optional<CpuTimes> parse_cpu_times(const std::string& line) {
  std::istringstream in(line);
  std::string name;
  if (!(in >> name) || name != "cpu") return std::nullopt;
  // user nice system idle iowait irq softirq steal: guest time is already inside user and nice.
  uint64_t field[8];
  for (uint64_t& f : field)
    if (!(in >> f)) return std::nullopt;
  CpuTimes t;
  for (const uint64_t f : field) t.total += f;
  t.steal = field[7];
  return t;
}

std::optional<CpuTimes> cpu_times() {
  std::ifstream stat("/proc/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  return parse_cpu_times(line);
}

std::optional<double> steal_share(const std::optional<CpuTimes>& from, const std::optional<CpuTimes>& to) {
  if (!from || !to || to->total <= from->total || to->steal < from->steal) return std::nullopt;
  return double(to->steal - from->steal) / double(to->total - from->total);
}

}  // namespace vkllm::cli
