// `vkllm perplexity`: perplexity of a text file, chunked as llama-perplexity or streamed through the ring.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/input_file.h"
#include "commands.h"
#include "common.h"
#include "format.h"
#include "engine/perplexity.h"

namespace vkllm::cli {
namespace {

struct PerplexityCommand {
  RunOptions opts;
  std::string file;
  bool json = false, stream = false;
};

void run(PerplexityCommand& c) {
  if (!c.stream && c.opts.keep >= 0) throw CLI::ValidationError("--keep pins tokens of the ring, which only --stream runs through");
  if (c.opts.ctx == 0) c.opts.ctx = 512;
  // (A chunk needs BOS and a second half to score; --stream takes any --ctx a cache takes.)
  if (!c.stream && c.opts.ctx < 4)
    throw CLI::ValidationError("--ctx " + std::to_string(c.opts.ctx) + " is too small for perplexity (at least 4)");
  const std::string text = read_text_input(c.file, "the text file");
  // Chunked mode evaluates whole chunks from an empty cache: ubatch covers a chunk when it can.
  if (!c.stream) c.opts.ubatch = std::max(c.opts.ubatch, c.opts.ctx);
  // A stream runs only the kernels for one column. (Chunks take both: a chunk is cut where the
  // logits of a piece reach the device's storage range too, 261 rows of a 128k vocabulary on
  // lavapipe, so a piece may end in a group of one column.)
  c.opts.kernels = {.one_column = true, .columns = !c.stream};
  std::vector<int32_t> tokens;
  // The text is tokenized and its length checked before the weights load.
  Session s = open_session(c.opts, [&](const gguf::File&, const Tokenizer& tok, uint32_t) {
    tokens = tok.tokenize(text, true, false);
    try {
      check_perplexity_text(tokens.size(), c.opts.ctx, c.stream);
    } catch (const Error& e) {
      throw Error(c.file + ": " + e.what());
    }
  });
  PerplexityResult r;
  {
    ProgressBar bar(c.stream ? "scoring" : "chunks", c.stream ? "tok" : "chunks", c.opts.quiet);
    const auto progress = [&](uint64_t done, uint64_t total, double running) {
      char estimate[48];
      std::snprintf(estimate, sizeof estimate, ", ppl %.4f", running);
      bar.update(done, total, estimate);
    };
    if (c.stream) {
      const uint32_t keep = c.opts.keep >= 0 ? uint32_t(c.opts.keep) : (tokens[0] == s.tokenizer->bos() ? 1u : 0u);
      r = perplexity_stream(*s.engine, tokens, keep, progress);
    } else {
      const int32_t bos = tokens.empty() || tokens[0] != s.tokenizer->bos() ? -1 : s.tokenizer->bos();
      r = perplexity_chunked(*s.engine, tokens, c.opts.ctx, bos, progress);
    }
  }
  if (c.json) {
    // (A perplexity past a double's range is JSON's null; the mean −log p it is e to stays finite.)
    nlohmann::json j = {{"perplexity", r.perplexity}, {"mean_nll", r.mean_nll()},
                        {"tokens_scored", r.tokens_scored}, {"chunks", r.chunks},
                        {"mode", c.stream ? "stream" : "chunked"}, {"ctx", c.opts.ctx}, {"text_tokens", tokens.size()},
                        {"kv_evicted", s.engine->cache().evicted()}, {"kv_cache_type", cache_type_name(s.engine->cache().type_k())}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %s (%s)\n", r.perplexity, count_of(r.tokens_scored, "token").c_str(),
                c.stream ? ("streamed through a ring of " + std::to_string(c.opts.ctx) + " slots, " + count_of(s.engine->cache().evicted(), "eviction")).c_str()
                         : (count_of(r.chunks, "chunk") + " of " + std::to_string(c.opts.ctx)).c_str());
  }
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto c = std::make_shared<PerplexityCommand>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text, as llama-perplexity computes it");
  add_model_options(cmd, c->opts);
  cmd->get_option("--ctx")->description("Tokens per chunk, and the KV cache capacity (default: 512, as llama-perplexity)");
  cmd->add_option("-f,--file", c->file, "Text file to score")->required();
  cmd->add_flag("--stream", c->stream, "Feed the whole text token by token through the ring (--ctx, --keep), scoring every token");
  cmd->add_flag("--json", c->json, "Print {\"perplexity\", \"tokens_scored\", \"chunks\"} as JSON");
  cmd->callback([c] { run(*c); });
}

}  // namespace vkllm::cli
