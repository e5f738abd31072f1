// What the model-running subcommands share: their flags, loading a model onto the device with a
// progress bar and a memory plan, and stderr output helpers.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/draft_model.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "gguf.h"
#include "model/model.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "text/grammar.h"
#include "text/tokenizer.h"
#include "vk/context.h"
#include "vk/pipeline.h"

namespace vkllm::cli {

struct RunOptions {
  std::string model;
  std::string model_draft;  // -md: a draft model for speculative decoding (run, chat, serve); empty: none
  std::optional<uint32_t> device;
  uint32_t ctx = 0;  // 0: min(trained context, 4096)
  std::string cache_type, cache_type_k, cache_type_v;  // empty: not given (f16)
  int32_t keep = -1;  // -1: BOS plus the system prompt
  uint32_t ubatch = 0;  // 0: the device's (512 on GPUs, 64 on CPU drivers)
  bool swa_full = false;
  bool quiet = false;
  bool profile = false;
  AttentionKernel attention = AttentionKernel::Auto;  // --attention
  uint32_t sequences = 1;  // engines (KV cache + activations each) sharing the weights: `serve --parallel`
  MatmulUse kernels;       // the matvec kernels made while the weights load (perplexity takes one kind)
  RopeOverrides rope;      // --rope-*, --yarn-*
  SamplerParams sampling;
};

// -m, --device, --ctx, --cache-type[-k|-v], --keep, --ubatch, --swa-full, --quiet, --profile,
// --attention and the RoPE flags
void add_model_options(CLI::App* cmd, RunOptions& o);
// --attention auto|tiled|simd|lanes: which attention kernel runs (Auto: by device and list; the
// others for comparisons, and to run the GPUs' kernel on a CPU driver).
CLI::Option* add_attention_option(CLI::App* cmd, AttentionKernel& k);
std::string attention_kernel_name(AttentionKernel k);
// The check of a cache-type option: one of k_cache_types' names.
CLI::IsMember cache_type_names();
// The K and V cache types the flags ask for (f16 where none is given; the names are checked by the
// options, their agreement by open_session).
std::pair<CacheType, CacheType> cache_types(const RunOptions& o);
// llama.cpp's RoPE flags: --rope-scaling, --rope-scale, --rope-freq-scale, --rope-freq-base,
// --yarn-orig-ctx, --yarn-ext-factor, --yarn-attn-factor, --yarn-beta-fast, --yarn-beta-slow.
void add_rope_options(CLI::App* cmd, RopeOverrides& r);
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --frequency-penalty,
// --presence-penalty, --seed. Returns the options, whose count() says which the command line gave
// (a resumed session takes those: apply_sampling_flags).
std::vector<CLI::Option*> add_sampling_options(CLI::App* cmd, SamplerParams& s);

// llama.cpp's --grammar GBNF, --grammar-file FILE, -j/--json-schema SCHEMA and --json-schema-file
// FILE (one of them): the generated text follows the grammar (docs/sampling.md, "Grammars").
struct GrammarFlags {
  std::string grammar, grammar_file, json_schema, json_schema_file;
};
void add_grammar_options(CLI::App* cmd, GrammarFlags& g);
// The grammar those flags give, parsed (an error names the flag or the file), or null for none.
std::shared_ptr<const Grammar> read_grammar_flags(const GrammarFlags& g);

// llama.cpp's --spec-type (none, ngram-simple), --draft-max, --draft-min, --spec-ngram-size-n,
// --spec-ngram-size-m, and -md/--model-draft with --draft-p-min: speculative decoding from the
// context's n-grams or a draft model (docs/speculative.md).
std::vector<CLI::Option*> add_speculative_options(CLI::App* cmd, SpeculativeOptions& s, std::string& model_draft);
// One note naming the draft-tuning flags given (`given`: add_speculative_options') that the drafts
// chosen do not read (--draft-max with no source of drafts, --draft-p-min with n-grams, …).
void note_idle_draft_flags(std::span<CLI::Option* const> given, const SpeculativeOptions& s, bool quiet);
// Refuses a --draft-min past --draft-max, --spec-ngram-size-m or what a pass of an explicit
// --ubatch (0: the device's) holds (no draft could ever run), and -md beside --spec-type
// ngram-simple (one source of drafts); with -md the type becomes SpecType::DraftModel.
void check_speculative_options(SpeculativeOptions& s, uint32_t ubatch, const std::string& model_draft);
// Where speculation was asked for: refuses a --draft-min past the drafts one of the engine's
// passes holds (--ubatch, a window ring), and says on stderr (unless quiet) when the engine
// cannot verify drafts exactly (Engine::verify_exact): the generation steps plainly.
void check_speculation(const SpeculativeOptions& s, const Engine& engine, bool quiet);
// " · drafts 96 of 120 taken (80%)", " · no drafts": a speculative generation's share in the stats.
std::string draft_summary(const GenerationStats& st);

// llama.cpp's -l/--logit-bias TOKEN_ID(+|-)BIAS, repeatable ("15043+1", "2-inf" bans token 2).
void add_logit_bias_option(CLI::App* cmd, std::vector<std::string>& biases);
// The biases those flags give; the ids are checked against n_vocab where it is known (> 0).
std::vector<std::pair<int32_t, float>> read_logit_bias(const std::vector<std::string>& biases, int32_t n_vocab);

// What --version prints (and the server's /props build_info).
inline constexpr const char* k_version = "vkllm 0.1.0";

// -n, --n-predict for run and chat: a count ≥ 0, -1 for endless generation through the ring, or
// unset (GenerateOptions::kUntilFull: stop when the cache is full). `what` names the unit.
void add_n_predict_option(CLI::App* cmd, int32_t& n_predict, const std::string& what);
// --stop STRING (repeatable): `what` ends where the first of them to occur begins.
void add_stop_option(CLI::App* cmd, std::vector<std::string>& stop, const std::string& what);

// The reason a write to stdout failed, kept where it first fails (main() reports it; errno is
// gone by then). 0: none noted.
void note_stdout_error(int error);
int noted_stdout_error();
// Writes generated text to stdout at once; false (the reason noted) when it cannot be written (a
// closed pipe, a full disk), where a generation stops.
bool write_stdout(const std::string& text);

// The largest --ctx: 16,777,216 tokens, past every model's context, and low enough that no count
// of slots (or of their score blocks) wraps 32 bits.
constexpr uint32_t k_max_ctx = 1u << 24;

// Everything a run needs, loaded in order; members are declared so that they destroy in reverse.
struct Session {
  gguf::File file;
  std::unique_ptr<VulkanContext> ctx;
  std::unique_ptr<Pipelines> pipelines;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  std::vector<std::unique_ptr<Engine>> more_engines;  // RunOptions::sequences − 1 more
  // RunOptions::model_draft: the draft model, and per sequence its engine (its own KV cache of the
  // same capacity and type) and what drafts with it.
  std::optional<gguf::File> draft_file;
  std::unique_ptr<Model> draft_model;
  std::vector<std::unique_ptr<Engine>> draft_engines;
  std::vector<std::unique_ptr<DraftModel>> drafters;
  DraftModel* drafter() const { return drafters.empty() ? nullptr : drafters[0].get(); }  // the first sequence's
};
// With a draft model that will draft (-md, an engine that verifies exactly, room in the cache for a
// draft): brings the draft's cache to the model's tokens now, under a "draft prefill" progress bar,
// so that a long prompt's draft prefill is not a silent pause at the reply's first draft. Returns
// the milliseconds it took (0 where there is nothing to do), which the reply's first token waited.
double catch_up_draft(const Session& s, const SpeculativeOptions& spec, bool quiet);
// Opens the model, checks the memory plan against the device, uploads the weights (progress bar
// on a terminal), builds the engine. Prints one summary line and the plan unless quiet.
// `check_input`, when given, runs once the tokenizer is read, with the cache's capacity, before
// anything else is printed or allocated: a command refuses input the model cannot take (an error)
// without loading the weights.
using InputCheck = std::function<void(const gguf::File&, const Tokenizer&, uint32_t capacity)>;
Session open_session(const RunOptions& o, const InputCheck& check_input = {});

// Progress on stderr once the work has taken over a second: a bar redrawn in place on a terminal;
// elsewhere (a log, a pipe) a plain line every 10 s once it has taken 10 s, none under -q. `update`
// may be called often; `extra` is appended (a running estimate).
class ProgressBar {
 public:
  explicit ProgressBar(std::string label, std::string unit = "", bool quiet = false);
  ~ProgressBar();
  void update(uint64_t done, uint64_t total, const std::string& extra = "");
  void finish();

 private:
  std::string label_, unit_;
  std::chrono::steady_clock::time_point start_, last_;
  bool shown_ = false;
  bool tty_, quiet_;
};

// Warns (stderr) of a chat whose pin (BOS and the system prompt, `wanted` tokens) is longer than the
// `pinned` the cache can hold: the rest of the system prompt is evicted once the ring wraps.
// Returns whether it warned (false when the pin fits).
bool warn_pin_cut(uint32_t wanted, uint32_t pinned, const KvCache& cache);

// `line` cut to one row of the terminal stderr is (bytes, never inside a UTF-8 character): a line
// redrawn in place that wraps would leave a row behind at each redraw.
std::string fit_terminal_row(std::string line);

bool stderr_is_tty();
bool stdout_is_tty();
// Prints "vkllm: warning: …" lines for tokenizer warnings.
void print_warnings(const Tokenizer& tok);
// The per-op GPU time table of --profile, on stderr.
void print_profile(const std::vector<DispatchTiming>& timings, const std::string& what = "whole run");
// "3.2 ms" / "1.25 s".
std::string fmt_ms(double ms);

}  // namespace vkllm::cli
