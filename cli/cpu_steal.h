// The CPU time a virtual machine's host gave to others ("steal" in /proc/stat). Benchmarks report
// it: on a shared host a CPU driver's tok/s moves with it (docs/performance.md, "CPU steal").
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace vkllm::cli {

struct CpuTimes {
  uint64_t steal = 0, total = 0;  // clock ticks since boot, all CPUs
};

// The "cpu" line of /proc/stat ("cpu  user nice system idle iowait irq softirq steal …"), or
// nothing where the line is not that.
std::optional<CpuTimes> parse_cpu_times(const std::string& line);
// Now, from /proc/stat; nothing where it cannot be read.
std::optional<CpuTimes> cpu_times();
// The share of the CPU time between two readings that was stolen (0 … 1); nothing where either is
// missing or no time passed.
std::optional<double> steal_share(const std::optional<CpuTimes>& from, const std::optional<CpuTimes>& to);

}  // namespace vkllm::cli
