// The subcommands of the vkllm binary: each file cmd_<name>.cpp registers one.
#pragma once
#include <CLI/CLI.hpp>

namespace vkllm::cli {

void add_info_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_devices_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_template_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_cache_command(CLI::App& app);
void add_serve_command(CLI::App& app);

}  // namespace vkllm::cli
