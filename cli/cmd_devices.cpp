// `vkllm devices`: every Vulkan device with the limits and features vkllm depends on.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "format.h"
#include "vk/context.h"

namespace vkllm::cli {

void add_devices_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("devices", "List Vulkan devices with their limits and features");
  cmd->add_flag("--json", *json, "Print a JSON array instead of text");
  cmd->callback([json] {
    const std::vector<DeviceInfo> devices = list_devices();
    if (*json) {
      nlohmann::json out = nlohmann::json::array();
      for (const DeviceInfo& d : devices) {
        nlohmann::json heaps = nlohmann::json::array();
        for (const auto& [bytes, local] : d.heaps) heaps.push_back({{"bytes", bytes}, {"device_local", local}});
        out.push_back({{"index", d.index}, {"name", d.name}, {"type", d.type}, {"driver", d.driver},
                       {"api_version", d.api_version}, {"heaps", heaps}, {"subgroup_size", d.subgroup_size},
                       {"fp16", d.fp16}, {"int8", d.int8}, {"int_dot", d.int_dot}, {"int64", d.int64}, {"wide_int64", d.wide_int64},
                       {"storage_16bit", d.storage16}, {"storage_8bit", d.storage8},
                       {"push_descriptor", d.push_descriptor}, {"max_storage_buffer_range", d.max_storage_buffer_range},
                       {"max_allocation_size", d.max_allocation_size}, {"max_shared_memory", d.max_shared_memory},
                       {"usable", d.missing.empty()}, {"missing", d.missing}});
      }
      std::printf("%s\n", out.dump(1).c_str());
      return;
    }
    if (devices.empty()) std::printf("no Vulkan devices\n");
    for (const DeviceInfo& d : devices) {
      std::printf("device %u: %s (%s, Vulkan %s)\n", d.index, d.name.c_str(), d.type.c_str(), d.api_version.c_str());
      std::printf("  driver                    %s\n", d.driver.c_str());
      for (size_t i = 0; i < d.heaps.size(); ++i)
        std::printf("  memory heap %zu             %s%s\n", i, human_bytes(d.heaps[i].first).c_str(),
                    d.heaps[i].second ? " (device-local)" : "");
      std::printf("  subgroup size             %u\n", d.subgroup_size);
      std::printf("  fp16 / int8 arithmetic    %s / %s\n", d.fp16 ? "yes" : "no", d.int8 ? "yes" : "no");
      std::printf("  integer dot products      %s\n", d.int_dot ? "yes" : "no");
      std::printf("  16-bit / 8-bit storage    %s / %s\n", d.storage16 ? "yes" : "no", d.storage8 ? "yes" : "no");
      std::printf("  int64 arithmetic          %s\n", !d.int64 ? "no" : d.wide_int64 ? "yes, one instruction per subgroup (AVX-512 DQ)" : "yes");
      std::printf("  max storage buffer range  %s\n", human_bytes(d.max_storage_buffer_range).c_str());
      std::printf("  max allocation size       %s\n", human_bytes(d.max_allocation_size).c_str());
      std::printf("  shared memory             %s\n", human_bytes(d.max_shared_memory).c_str());
      std::printf("  usable by vkllm           %s\n", d.missing.empty() ? "yes" : ("no, lacks " + d.missing).c_str());
    }
  });
}

}  // namespace vkllm::cli
