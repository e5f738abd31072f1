// `vkllm tokenize`: a prompt's token ids, pieces or count, as llama.cpp would tokenize it.
#include <chrono>
#include <cstdio>
#include <unistd.h>

#include "base/input_file.h"
#include "commands.h"
#include "base/error.h"
#include "chat/prompt.h"
#include "gguf.h"
#include "text/tokenizer.h"

namespace vkllm::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string prompt;
  std::string file;
  bool ids = false;
  bool pieces = false;
  bool count = false;
  bool no_bos = false;
  bool special = false;
  bool bench = false;
};

std::string read_input(const TokenizeOptions& o, const CLI::App& cmd) {
  if (cmd.count("--prompt")) return o.prompt;
  if (!o.file.empty()) return read_text_input(o.file, "the input file");
  // A terminal is read as `cat` reads it, said first (it waited in silence).
  if (isatty(STDIN_FILENO) == 1) std::fprintf(stderr, "vkllm: reading the text from the terminal until Ctrl+D (or give -p TEXT or -f FILE)\n");
  return read_fd_input(STDIN_FILENO, "stdin", "the input");
}

// A piece on one line: control bytes, backslash and bytes of unfinished UTF-8 are escaped.
std::string printable(const std::string& s) {
  std::string out;
  char buf[8];
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c < 0x80) {
      out += char(c);
    } else {
      const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      bool whole = n > 1 && i + n <= s.size();
      for (size_t k = 1; whole && k < n; ++k) whole = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (whole) {
        out.append(s, i, n);
        i += n - 1;
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    }
  }
  return out;
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the tokens of a text (from -p, -f or stdin)");
  cmd->add_option("-m,--model", o->model, "GGUF model or vocabulary-only file")->required();
  auto* prompt = cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize");
  cmd->add_option("-f,--file", o->file, "File whose bytes to tokenize")->excludes(prompt);
  auto* ids = cmd->add_flag("--ids", o->ids, "Token ids on one line, space-separated (the default)");
  auto* pieces = cmd->add_flag("--pieces", o->pieces, "One 'id<TAB>piece' line per token")->excludes(ids);
  cmd->add_flag("--count", o->count, "Only the number of tokens")->excludes(ids)->excludes(pieces);
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS (and EOS) the model asks for");
  cmd->add_flag("--special", o->special, "Turn special-token text such as <|im_end|> into its token");
  cmd->add_flag("--bench", o->bench, "Also report tokenizer throughput on stderr");
  cmd->callback([o, cmd] {
    const std::string text = read_input(*o, *cmd);
    const gguf::File f = gguf::File::open(o->model);
    const Tokenizer tok = Tokenizer::from_gguf(f);
    for (const std::string& w : tok.warnings()) std::fprintf(stderr, "vkllm: warning: %s: %s\n", o->model.c_str(), w.c_str());

    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> tokens = tok.tokenize(text, !o->no_bos, o->special);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o->no_bos && starts_with_two_bos(tok, tokens)) std::fprintf(stderr, "vkllm: warning: %s (--no-bos leaves the model's out)\n", two_bos_warning(tok).c_str());

    if (o->count) {
      std::printf("%zu\n", tokens.size());
    } else if (o->pieces) {
      for (int32_t id : tokens) std::printf("%d\t%s\n", id, printable(tok.token_to_piece(id, true)).c_str());
    } else {
      std::string line;
      for (int32_t id : tokens) {
        if (!line.empty()) line += ' ';
        line += std::to_string(id);
      }
      std::printf("%s\n", line.c_str());
    }
    if (o->bench) {
      const double mib = double(text.size()) / (1024.0 * 1024.0);
      std::fprintf(stderr, "vkllm: %s: %zu bytes → %zu tokens in %.3f s: %.2f MiB/s\n", o->model.c_str(), text.size(),
                   tokens.size(), seconds, seconds > 0 ? mib / seconds : 0.0);
    }
  });
}

}  // namespace vkllm::cli
