// vkllm: entry point. Parses the subcommand and turns any input error into one line on stderr:
// exit status 2 for a bad command line, 1 for bad input (a file, a device), 2 for a bug.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <exception>

#include "commands.h"
#include "common.h"
#include "base/error.h"
#include "gguf.h"

namespace {

// Output that did not reach stdout (a full disk, a closed descriptor) fails the command: a script
// must not take a lost answer for success. Returns the exit status.
int checked_stdout(int status) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  const int error = errno ? errno : vkllm::cli::noted_stdout_error();
  std::fprintf(stderr, "vkllm: error: cannot write to stdout: %s\n", std::strerror(error ? error : EIO));
  return status == 0 ? 1 : status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vkllm: run GGUF language models on Vulkan compute shaders"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "vkllm 0.1.0");
  vkllm::cli::add_info_command(app);
  vkllm::cli::add_run_command(app);
  vkllm::cli::add_perplexity_command(app);
  vkllm::cli::add_bench_command(app);
  vkllm::cli::add_devices_command(app);
  vkllm::cli::add_tokenize_command(app);
  vkllm::cli::add_template_command(app);
  vkllm::cli::add_chat_command(app);
  vkllm::cli::add_cache_command(app);
  vkllm::cli::add_serve_command(app);
  // An error is one line whatever it quotes (a file's strings may hold newlines or escape codes):
  // control bytes are printed as \n, \t or \xHH.
  const auto one_line = [](const char* what) {
    std::string out;
    for (const char* p = what; *p; ++p) {
      const auto ch = static_cast<unsigned char>(*p);
      if (ch == '\n') out += "\\n";
      else if (ch == '\t') out += "\\t";
      else if (ch < 0x20 || ch == 0x7F) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", ch);
        out += hex;
      } else {
        out += static_cast<char>(ch);
      }
    }
    return out;
  };
  // A first word that is no subcommand is named (CLI11 said only "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    const auto subs = app.get_subcommands([&](const CLI::App* sub) { return sub->check_name(argv[1]); });
    if (subs.empty()) {
      std::fprintf(stderr, "vkllm: error: unknown command '%s' (see --help)\n", one_line(argv[1]).c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return checked_stdout(e.get_exit_code());  // a subcommand's own exit status (chat: 130 after Ctrl+C)
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::fprintf(stderr, "vkllm: error: %s (see --help)\n", one_line(msg.c_str()).c_str());
    return 2;
  } catch (const vkllm::Error& e) {
    std::fprintf(stderr, "vkllm: error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const gguf::Error& e) {
    std::fprintf(stderr, "vkllm: error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vkllm: internal error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  return checked_stdout(0);
}
