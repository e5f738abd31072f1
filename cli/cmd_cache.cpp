// `vkllm cache list|clear`: what the prompt cache holds, and emptying it.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>

#include "base/utf8.h"
#include "commands.h"
#include "format.h"
#include "persistence.h"
#include "store/prompt_cache.h"

namespace vkllm::cli {
namespace {

struct CacheCommand {
  std::string dir;
  CLI::Option* dir_opt = nullptr;
};

// --dir, or the default directory. A --dir that names nothing is an error (a typo would list or
// clear nothing and say so with status 0), and so is an empty one (`--dir "$DIR"` with DIR unset
// is not the default); the default directory may not exist yet (nothing stored).
std::string dir_of(const CacheCommand& c) {
  const bool given = c.dir_opt && c.dir_opt->count() > 0;
  if (given && c.dir.empty()) throw Error("--dir: an empty directory name (leave --dir out for the default, " + default_prompt_cache_dir() + ")");
  PersistenceOptions o;
  o.prompt_cache_dir = c.dir;
  const std::string dir = prompt_cache_dir(o, "--dir");
  std::error_code ec;
  const bool exists = std::filesystem::exists(dir, ec);
  if (ec) throw Error(dir + ": " + ec.message());  // e.g. a parent that cannot be searched
  if (exists && !std::filesystem::is_directory(dir, ec)) throw Error(dir + ": not a directory");
  if (!exists && given) throw Error(dir + ": no such directory");
  return dir;
}

void list(const CacheCommand& c) {
  const std::string dir = dir_of(c);
  const std::vector<PromptCacheEntry> entries = list_prompt_cache(dir);
  uint64_t total = 0;
  // stdout: one entry per line, most recently used first.
  std::printf("%-19s  %10s  %9s  %-9s  %-24s  %s\n", "last used", "size", "tokens", "cache", "model", "file");
  for (const PromptCacheEntry& e : entries) {
    total += e.bytes;
    char when[32];
    const std::time_t t = static_cast<std::time_t>(e.last_used);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    const std::string file = e.path.substr(e.path.find_last_of('/') + 1);
    if (!e.valid) {
      std::printf("%-19s  %10s  %9s  %-9s  %-24s  %s (unreadable: %s)\n", when, human_bytes(e.bytes).c_str(), "-", "-", "-", file.c_str(),
                  e.error.c_str());
      continue;
    }
    const std::string types = std::string(cache_type_name(e.info.type_k)) + "/" + cache_type_name(e.info.type_v);
    // A longer name is cut (not inside a character) and marked; the file's name begins with the
    // model's fingerprint, which tells apart files that share a name.
    const std::string& full = e.info.model.name;
    const std::string cut = full.size() <= 24 ? full : full.substr(0, 21);
    const std::string name = cut.substr(0, utf8::complete_prefix(cut)) + (full.size() <= 24 ? "" : "...");
    std::printf("%-19s  %10s  %9s  %-9s  %-24s  %s\n", when, human_bytes(e.bytes).c_str(), with_commas(e.info.tokens.size()).c_str(),
                types.c_str(), name.c_str(), file.c_str());
  }
  // The summary only once the list is out; a list that could not be written is main's to report,
  // with the cause (the errno is gone by then).
  if (std::fflush(stdout) != 0) {
    note_stdout_error(errno);
    return;
  }
  std::fprintf(stderr, "vkllm: %s: %s %s, %s\n", dir.c_str(), with_commas(entries.size()).c_str(), entries.size() == 1 ? "entry" : "entries",
               human_bytes(total).c_str());
}

void clear(const CacheCommand& c) {
  const std::string dir = dir_of(c);
  const uint64_t freed = clear_prompt_cache(dir);
  std::fprintf(stderr, "vkllm: %s: cleared, %s freed\n", dir.c_str(), human_bytes(freed).c_str());
}

}  // namespace

void add_cache_command(CLI::App& app) {
  auto c = std::make_shared<CacheCommand>();
  CLI::App* cmd = app.add_subcommand("cache", "List or clear the prompt cache (vkllm run --prompt-cache)");
  cmd->require_subcommand(1);
  CLI::App* ls = cmd->add_subcommand("list", "List the entries, most recently used first");
  CLI::App* cl = cmd->add_subcommand("clear", "Remove every entry");
  for (const auto& [sub, run] : {std::pair{ls, &list}, std::pair{cl, &clear}}) {
    CLI::Option* dir = sub->add_option("--dir", c->dir, "Prompt cache directory (default $XDG_CACHE_HOME/vkllm/prompt-cache)");
    sub->callback([c, dir, run] {
      c->dir_opt = dir;
      run(*c);
    });
  }
}

}  // namespace vkllm::cli
