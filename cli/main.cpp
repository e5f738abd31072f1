// vkllm: entry point. Parses the subcommand and turns any input error into one line on stderr:
// exit status 2 for a bad command line, 1 for bad input (a file, a device), 2 for a bug.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "common.h"
#include "base/error.h"
#include "base/utf8.h"
#include "gguf.h"

namespace {

// Says why stdout could not be written (`error`, 0 when unknown) and returns the status. A closed
// pipe (`| head` took what it wanted) is the reader's choice, not news: status 1 without a word, as
// coreutils die of SIGPIPE without one.
int stdout_failed(int error, int status) {
  // A write that failed inside printf left no errno behind: a pipe whose reader is gone polls as an error.
  if (pollfd out{STDOUT_FILENO, 0, 0}; error == 0 && ::poll(&out, 1, 0) == 1 && (out.revents & POLLERR) != 0) error = EPIPE;
  if (error != EPIPE) std::fprintf(stderr, "vkllm: error: cannot write to stdout: %s\n", std::strerror(error ? error : EIO));
  return status == 0 ? 1 : status;
}

// Output that did not reach stdout (a full disk, a closed descriptor) fails the command: a script
// must not take a lost answer for success. Returns the exit status.
int checked_stdout(int status) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  return stdout_failed(errno ? errno : vkllm::cli::noted_stdout_error(), status);
}

// Every option of every subcommand, for the rules that hold for all of them.
void for_each_option(CLI::App& app, const std::function<void(CLI::Option&)>& fn) {
  for (CLI::Option* opt : app.get_options()) fn(*opt);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) for_each_option(*sub, fn);
}

// CLI11 reads integers with strtoll's base 0, so "010" was 8 and "0x10" 16: a script's
// zero-padded count (printf %03d) silently became another number. Every integer option reads
// decimal: leading zeros are dropped, a 0x/0b/0o prefix is refused. And an option of one value
// given twice takes the last, as llama.cpp's do (a script's defaults, then "$@"); CLI11 refused it.
void option_rules(CLI::App& app) {
  const CLI::Validator decimal(
      [](std::string& v) {
        v.erase(0, std::min(v.find_first_not_of(" \t\n\v\f\r"), v.size()));  // strtoll skips it, then reads base 0
        const size_t digits = v.find_first_not_of("+-");
        if (digits == std::string::npos || digits > 1 || v.size() - digits < 2 || v[digits] != '0') return std::string();
        if (v.find_first_not_of("0123456789", digits) != std::string::npos) return v + " is not a decimal number";
        const size_t first = std::min(v.find_first_not_of('0', digits), v.size() - 1);
        v.erase(digits, first - digits);
        return std::string();
      },
      "");
  for_each_option(app, [&](CLI::Option& opt) {
    const std::string type = opt.get_type_name();
    if (type.starts_with("INT") || type.starts_with("UINT")) opt.transform(decimal);
    if (opt.get_items_expected_max() == 1 && opt.get_multi_option_policy() == CLI::MultiOptionPolicy::Throw)
      opt.multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  });
}

// llama.cpp's multi-letter short flags, which CLI11 reads as grouped one-letter flags ("-ctk q8_0"
// became "--ctx tk", and the error named --ctx; "-hf" became "-h -f" and printed the help, status
// 0; "-mli" became "-m li", silently replaced by a later -m). Those vkllm has under another name are
// renamed (also in the "=" form), -ngl and -fa (every layer runs on the GPU; attention is always
// fused) are dropped with their value and a note, and llama.cpp's other such words, or a word of
// letters whose first letter is no option here (or is -h), are refused, named. vkllm's own groups
// (-qm M, -pOnce) pass as before. A word that is the value of the option before it (`-p -ub`,
// `--stop -p`) is left as it is, as is all after a "--" that is no value.
std::vector<char*> llama_cpp_spellings(int argc, char** argv, const CLI::App& command, std::deque<std::string>& storage) {
  static const std::map<std::string_view, const char*> renamed = {
      {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-ub", "--ubatch"}, {"-np", "--parallel"}, {"-jf", "--json-schema-file"},
      {"-md", "--model-draft"}};
  static const std::set<std::string_view> llama_cpp_words = {
      "-hf",   "-hfr",  "-hff",  "-hfv",   "-hffv", "-hft",   "-hfd",  "-hfrd", "-cnv",  "-no-cnv", "-mli",  "-sys", "-sysf",
      "-cb",   "-nocb", "-nkvo", "-fit",   "-fitt", "-fitc",  "-mg",   "-mu",   "-sm",   "-ts",     "-ctxcp", "-cram", "-cmoe",
      "-ncmoe", "-cd",  "-ctkd", "-ctvd",  "-cpent", "-nr",   "-dkvc", "-dt",   "-td",     "-tb",   "-tbd", "-Cr",
      "-Crb",  "-bs",   "-lv",   "-dev",   "-devd", "-ot",    "-otd",  "-ps",   "-pg",   "-mmp",    "-embd", "-lcs", "-lcd",
      "-sp",   "-dio",  "-rea",   "-dr",   "-spf",   "-sps",  "-npp",  "-ntg",  "-npl",    "-kvu",  "-sysp", "-cmoed"};
  struct Ignored {
    std::vector<std::string_view> names;
    bool (*is_value)(std::string_view);
    const char* why;
  };
  static const Ignored ignored[] = {
      {{"-ngl", "--n-gpu-layers", "--gpu-layers", "-ngld", "--n-gpu-layers-draft", "--gpu-layers-draft"},
       [](std::string_view v) {
         return v == "auto" || v == "all" ||
                (v.find_first_of("0123456789") != std::string_view::npos && v.find_first_not_of("-0123456789,") == std::string_view::npos);
       },
       "vkllm runs every layer on the GPU"},
      {{"-fa", "--flash-attn"},
       [](std::string_view v) { return v == "on" || v == "off" || v == "auto" || (!v.empty() && v.find_first_not_of("01,") == std::string_view::npos); },
       "vkllm's attention kernels always fuse the softmax"},
  };
  const auto takes_value = [&](std::string_view word) {
    const CLI::Option* opt = word.starts_with("-") ? command.get_option_no_throw(std::string(word)) : nullptr;
    return opt != nullptr && opt->get_items_expected_min() > 0;  // (CLI11 reads an optional value only if it is no option)
  };
  std::vector<char*> out;
  bool value_next = false;  // the word before took a value, and this is it
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i == 0 || value_next) {
      out.push_back(argv[i]);
      value_next = false;
      continue;
    }
    if (arg == "--") {
      out.insert(out.end(), argv + i, argv + argc);
      break;
    }
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    if (const auto it = renamed.find(name); it != renamed.end()) {
      if (!command.get_option_no_throw(it->second))  // (renamed, CLI11 named the long form, after the value)
        throw CLI::ExtrasError("unknown option " + std::string(name) + " (llama.cpp's " + it->second + ", which `vkllm " +
                                   command.get_name() + "` does not take; its options are listed by --help)",
                               CLI::ExitCodes::ExtrasError);
      storage.push_back(std::string(it->second) + (eq == std::string_view::npos ? "" : std::string(arg.substr(eq))));
      out.push_back(storage.back().data());
      value_next = eq == std::string_view::npos && takes_value(it->second);
      continue;
    }
    const auto skip = std::find_if(std::begin(ignored), std::end(ignored), [&](const Ignored& g) {
      return std::find(g.names.begin(), g.names.end(), name) != g.names.end();
    });
    if (skip != std::end(ignored)) {
      std::string value = eq == std::string_view::npos ? "" : std::string(arg.substr(eq + 1));
      if (value.empty() && i + 1 < argc && skip->is_value(argv[i + 1])) value = argv[++i];
      std::fprintf(stderr, "vkllm: note: %s%s%s ignored: %s\n", std::string(name).c_str(), value.empty() ? "" : " ", value.c_str(), skip->why);
      continue;
    }
    const bool letters = arg.size() >= 3 && arg[0] == '-' && std::isalpha(static_cast<unsigned char>(arg[1])) &&
                         arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-", 1) == std::string_view::npos;
    if (llama_cpp_words.count(name) || (letters && (arg[1] == 'h' || !command.get_option_no_throw(std::string("-") + arg[1]))))
      throw CLI::ExtrasError("unknown option " + std::string(name) + " (llama.cpp's? vkllm's options are listed by --help)",
                             CLI::ExitCodes::ExtrasError);
    out.push_back(argv[i]);
    value_next = eq == std::string_view::npos && takes_value(arg);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // A closed pipe (`vkllm run … | head`) is a failed write, not death by SIGPIPE: the generation
  // stops there, a --session is saved and the error is one line, status 1 (checked_stdout).
  std::signal(SIGPIPE, SIG_IGN);
  // A file-size limit (`ulimit -f`) makes a write past it fail (EFBIG: one line, the previous file
  // intact, a prompt-cache entry a warning) rather than kill the process mid-save.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"vkllm: run GGUF language models on Vulkan compute shaders"};
  app.require_subcommand(1);
  const std::string version = vkllm::cli::k_version;
  app.set_version_flag("--version", version);
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
  // Every subcommand takes --version too, as every llama.cpp tool does (`llama-cli --version`).
  const std::function<void(CLI::App&)> versioned = [&](CLI::App& level) {
    for (CLI::App* sub : level.get_subcommands({})) {
      sub->set_version_flag("--version", version);
      versioned(*sub);
    }
  };
  versioned(app);
  option_rules(app);
  // An error is one line whatever it quotes (a file's strings may hold newlines, escape codes or
  // bytes that are not UTF-8): control bytes and bytes of no valid UTF-8 sequence are printed as \n,
  // \t or \xHH.
  const auto one_line = [](const char* what) {
    const std::string_view text(what);
    std::string out;
    for (size_t pos = 0; pos < text.size();) {
      const auto ch = static_cast<unsigned char>(text[pos]);
      const size_t start = pos;
      // A sequence is printed as it is when it is the shortest form of a code point past the C1
      // controls (U+0080–U+009F, the 8-bit CSI among them); utf8::next decodes overlong forms too.
      uint32_t cp = ch;
      if (ch >= 0x80) cp = vkllm::utf8::next(text, pos);
      const size_t len = ch < 0x80 ? 1 : pos - start;
      const bool valid = ch < 0x80 || ((cp != 0xFFFD || text.substr(start, 3) == "\xEF\xBF\xBD") && cp >= 0xA0 &&
                                       len == (cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u));
      pos = start + (valid ? len : 1);
      if (ch == '\n') out += "\\n";
      else if (ch == '\t') out += "\\t";
      else if (ch < 0x20 || ch == 0x7F || !valid) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", ch);
        out += hex;
      } else {
        out += text.substr(start, pos - start);
      }
    }
    return out;
  };
  // A first word that is no subcommand is named (CLI11 said only "A subcommand is required").
  // (The same one level down: `vkllm cache bogus`.)
  CLI::App* level = &app;
  std::string words;
  for (int i = 1; i < argc && argv[i][0] != '-' && !level->get_subcommands({}).empty(); ++i) {
    words += (words.empty() ? "" : " ") + std::string(argv[i]);
    const auto subs = level->get_subcommands([&](const CLI::App* sub) { return sub->check_name(argv[i]); });
    if (subs.empty()) {
      std::fprintf(stderr, "vkllm: error: unknown command '%s' (see --help)\n", one_line(words.c_str()).c_str());
      return 2;
    }
    level = subs.front();
  }
  try {
    std::deque<std::string> spelled;  // the renamed words the parse reads
    std::vector<char*> args = llama_cpp_spellings(argc, argv, *level, spelled);
    app.parse(int(args.size()), args.data());
  } catch (const CLI::RuntimeError& e) {
    return checked_stdout(e.get_exit_code());  // a subcommand's own exit status (chat: 130 after Ctrl+C)
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: CLI11 prints them.
    // (Through std::cout: a --help that cannot be written fails as any output does.)
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      errno = 0;
      app.exit(e);
      int error = errno;
      if (std::cout.flush() && !std::cout.fail()) return checked_stdout(0);
      if (error == 0) error = errno;
      return stdout_failed(error, 0);
    }
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::fprintf(stderr, "vkllm: error: %s (see --help)\n", one_line(msg.c_str()).c_str());
    return 2;
  } catch (const vkllm::Error& e) {
    checked_stdout(1);  // an answer that was lost too is said first (a full disk takes both)
    std::fprintf(stderr, "vkllm: error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const gguf::Error& e) {
    checked_stdout(1);
    std::fprintf(stderr, "vkllm: error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vkllm: internal error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  return checked_stdout(0);
}
