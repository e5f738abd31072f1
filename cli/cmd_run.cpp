// `vkllm run`: one prompt in, the generated text out on stdout, one stats line on stderr.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "commands.h"
#include "common.h"
#include "format.h"
#include "generate.h"
#include "prompt.h"

namespace vkllm::cli {
namespace {

struct RunCommand {
  RunOptions opts;
  std::string prompt, prompt_file, system, chat_template;
  bool chat = false, json = false, ignore_eos = false;
  int32_t n_predict = -1;
  std::vector<std::string> stop;
};

std::string read_all(std::istream& in) { return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}; }

// stdin (when it is not a terminal) first, then -f FILE, then -p TEXT: the static part of a
// prompt (a manual piped in) comes before the question, so the cache can reuse it.
std::string gather_prompt(const RunCommand& c) {
  std::string text;
  if (!isatty(STDIN_FILENO)) text += read_all(std::cin);
  if (!c.prompt_file.empty()) {
    std::ifstream f(c.prompt_file, std::ios::binary);
    if (!f) throw Error(c.prompt_file + ": cannot open the prompt file");
    text += read_all(f);
  }
  text += c.prompt;
  return text;
}

void print_stats(const GenerationStats& st, const KvCache& kv) {
  std::fprintf(stderr, "vkllm: prompt %s tok (cached %s) · TTFT %s · prefill %.1f tok/s · decode %.1f tok/s · %s tok generated (%s) · KV %s used, %s, %s/token\n",
               with_commas(st.prompt_tokens).c_str(), with_commas(st.cached_tokens).c_str(), fmt_ms(st.ttft_ms).c_str(),
               st.prefill_tok_s(), st.decode_tok_s(), with_commas(st.generated).c_str(), st.stop_reason.c_str(),
               human_bytes(kv.bytes_used()).c_str(), cache_type_name(kv.type_k()), human_bytes(kv.bytes_per_token()).c_str());
}

void run(const RunCommand& c) {
  const std::string text = gather_prompt(c);
  Session s = open_session(c.opts);
  const Tokenizer& tok = *s.tokenizer;
  KvCache& cache = s.engine->cache();

  PromptTokens p = c.chat ? chat_prompt(s.file, tok, c.chat_template, c.system, text) : raw_prompt(tok, text);
  cache.set_keep(c.opts.keep >= 0 ? std::min<uint32_t>(uint32_t(c.opts.keep), cache.capacity() - 1)
                                  : std::min<uint32_t>(p.pinned, cache.capacity() - 1));

  Sampler sampler(c.opts.sampling);
  Generator gen(*s.engine, tok, sampler);
  {
    ProgressBar bar("prefill", "tok");
    gen.prefill(p.tokens, [&](uint64_t done, uint64_t total) { bar.update(done, total); });
  }
  GenerateOptions go;
  go.n_predict = c.n_predict;
  go.stop = c.stop;
  go.ignore_eos = c.ignore_eos;
  std::string out;
  gen.generate(go, [&](const std::string& piece) {
    if (c.json) {
      out += piece;
    } else {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  const GenerationStats& st = gen.stats();
  if (c.json) {
    const nlohmann::json j = {
        {"text", out},
        {"tokens", st.tokens},
        {"prompt_tokens", st.prompt_tokens},
        {"cached_tokens", st.cached_tokens},
        {"generated_tokens", st.generated},
        {"stop_reason", st.stop_reason},
        {"ttft_ms", st.ttft_ms},
        {"prefill_tok_s", st.prefill_tok_s()},
        {"decode_tok_s", st.decode_tok_s()},
        {"kv_cache_type", cache_type_name(cache.type_k())},
        {"kv_bytes_per_token", cache.bytes_per_token()},
        {"kv_bytes_used", cache.bytes_used()},
        {"kv_tokens_used", cache.used()},
        {"kv_capacity", cache.capacity()},
        {"kv_evicted", cache.evicted()},
        {"seed", sampler.seed()},
    };
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (!out.empty() || st.generated > 0) {
    if (stdout_is_tty()) std::printf("\n");
  }
  if (!c.opts.quiet && !c.json) print_stats(st, cache);
  if (c.opts.profile) print_profile(s.engine->timings());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto c = std::make_shared<RunCommand>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt (stdin, -f FILE and -p TEXT, in that order)");
  add_model_options(cmd, c->opts);
  add_sampling_options(cmd, c->opts.sampling);
  cmd->add_option("-p,--prompt", c->prompt, "Prompt text (after stdin and -f)");
  cmd->add_option("-f,--file", c->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", c->n_predict, "Tokens to generate (-1: until end of generation)");
  cmd->add_option("--stop", c->stop, "Stop when this string is generated (repeatable)");
  cmd->add_flag("--chat", c->chat, "Wrap the prompt in the model's chat template as a user message");
  cmd->add_option("--system", c->system, "System prompt (with --chat)");
  cmd->add_option("--chat-template", c->chat_template, "Chat template: a built-in name or a Jinja file");
  cmd->add_flag("--ignore-eos", c->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--json", c->json, "Print one JSON object with the text and statistics instead");
  cmd->callback([c] { run(*c); });
}

}  // namespace vkllm::cli
