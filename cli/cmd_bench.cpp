// `vkllm bench`: llama-bench style prefill and decode throughput, and (--ops) the raw matvec /
// matmul kernel throughput per weight type.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <span>

#include "commands.h"
#include "common.h"
#include "cpu_steal.h"
#include "format.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "model/kv_layout.h"

namespace vkllm::cli {
namespace {

struct BenchCommand {
  RunOptions opts;
  uint32_t n_prompt = 512, n_gen = 128, reps = 3;
  std::vector<uint32_t> ctx_fill = {0};  // depths: each test runs at each, in turn
  uint32_t parallel = 1;  // sequences decoded in one step (decode_batch), as `serve --parallel` runs them
  bool json = false, ops = false;
  uint32_t ops_size = 4096;
  bool no_matmul = false;  // --ops: matvec and the read ceilings only
  std::vector<std::string> ops_types = {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
                                          "iq4_nl", "iq4_xs"};
  std::optional<uint32_t> device;
};

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Stat {
  double median = 0, min = 0, max = 0;
};
// The median of an even count is the mean of the two middle values.
Stat stat_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return {v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2, v.front(), v.back()};
}

std::vector<int32_t> random_tokens(uint32_t n, uint32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(rng() % n_vocab);
  return t;
}

// One --ctx-fill depth's results: tok/s of each measured repetition, decode against the first depth
// in each repetition, and the GPU timings of its measured tests (--profile).
struct DepthResult {
  uint32_t fill = 0;
  std::vector<double> pp, tg, tg_vs_first;
  std::vector<double> tg_steal;  // the host's CPU steal during each measured decode test, where known
  double dispatches_per_step = 0, barriers_per_step = 0;  // of the decode test
  std::vector<DispatchTiming> timings;
};

void bench_model(BenchCommand& c) {
  const uint32_t max_fill = *std::max_element(c.ctx_fill.begin(), c.ctx_fill.end());
  const uint64_t needed = uint64_t{max_fill} + std::max(c.n_prompt, c.n_gen);  // the deepest fill and the longer test
  if (needed + 16 > k_max_ctx)
    throw CLI::ValidationError("--ctx-fill " + std::to_string(max_fill) + " and a test of " + std::to_string(needed - max_fill) +
                               " tokens need a cache of " + std::to_string(needed) + " tokens, more than the largest --ctx (" +
                               std::to_string(k_max_ctx - 16) + " with the test's margin)");
  if (c.opts.ctx == 0) c.opts.ctx = static_cast<uint32_t>(needed + 16);
  // Each test starts from the filled cache: a depth the cache cannot hold with the test's tokens
  // would measure a ring that dropped the fill, under the fill's name.
  if (needed > c.opts.ctx)
    throw CLI::ValidationError("--ctx-fill " + std::to_string(max_fill) + " and a test of " + std::to_string(needed - max_fill) +
                " tokens do not fit --ctx " + std::to_string(c.opts.ctx) + "; use --ctx " + std::to_string(needed) + " or more");
  c.opts.quiet = c.json;
  // Each depth has its own `parallel` sequences (engines sharing the weights), so that every
  // repetition can run the depths in turn without filling a cache again.
  const uint32_t n_depths = static_cast<uint32_t>(c.ctx_fill.size());
  c.opts.sequences = c.parallel * n_depths;
  Session s = open_session(c.opts);
  s.pipelines->wait_prepared();  // no kernel is still being made beside the measurements
  Engine& e = *s.engine;
  std::vector<Engine*> all{&e};
  for (const auto& more : s.more_engines) all.push_back(more.get());
  const uint32_t n_vocab = e.config().n_vocab;
  std::vector<DepthResult> depths(n_depths);
  for (uint32_t d = 0; d < n_depths; ++d) depths[d].fill = c.ctx_fill[d];
  // The --ctx-fill tokens are decoded once per sequence; each test truncates the caches back to
  // them (or decodes them again where a window ring no longer holds what they need). One warm-up
  // pass builds the pipelines; then `reps` measured passes, each running every depth in turn, so
  // that a drift of the machine's speed touches all depths alike.
  // Progress: the tests run (the warm-up's too), and the fill being decoded (a deep --ctx-fill
  // takes minutes on a CPU driver).
  ProgressBar bar("bench", "tests", c.opts.quiet);
  uint64_t tests_done = 0;
  const uint64_t tests_total = uint64_t{c.reps + 1} * n_depths * ((c.n_prompt > 0) + (c.n_gen > 0));
  const auto test_done = [&] { bar.update(++tests_done, tests_total); };
  const auto back_to_fill = [&](Engine& en, uint32_t fill) {
    KvCache& kv = en.cache();
    if (kv.used() >= fill && kv.reusable(fill) == fill) return kv.truncate(fill);
    kv.clear();
    if (fill)
      en.decode(random_tokens(fill, n_vocab, 100), LogitsMode::Last, [&](uint64_t done, uint64_t total) {
        bar.update(tests_done, tests_total, " · --ctx-fill " + with_commas(done) + " / " + with_commas(total) + " tok");
      });
  };
  for (uint32_t r = 0; r <= c.reps; ++r) {
    for (uint32_t d = 0; d < n_depths; ++d) {
      DepthResult& res = depths[d];
      const std::span<Engine* const> seqs(all.data() + d * c.parallel, c.parallel);
      Engine& lead = *seqs[0];
      if (r == 0 && c.parallel > 1 && !lead.can_decode_batch(seqs))
        throw Error("--parallel " + std::to_string(c.parallel) + ": this model and device cannot decode the sequences in one step");
      // The lead engine's timings of this repetition's tests (not of the fills).
      const auto keep_timings = [&](size_t from) {
        if (r) res.timings.insert(res.timings.end(), lead.timings().begin() + std::ptrdiff_t(from), lead.timings().end());
      };
      if (c.n_prompt) {
        back_to_fill(lead, res.fill);
        const size_t from = lead.timings().size();
        const auto t0 = Clock::now();
        lead.decode(random_tokens(c.n_prompt, n_vocab, r), LogitsMode::Last);
        if (r) res.pp.push_back(c.n_prompt / seconds(t0));
        keep_timings(from);
        test_done();
      }
      if (c.n_gen) {
        for (Engine* en : seqs) back_to_fill(*en, res.fill);
        // Step i decodes token i of every sequence (each its own tokens) in one forward pass; one
        // sequence as `vkllm run` decodes (a server's lone step may take another kernel on GPUs).
        const std::vector<int32_t> toks = random_tokens(c.n_gen * c.parallel, n_vocab, 200 + r);
        const uint64_t d0 = lead.dispatches_recorded(), b0 = lead.barriers_recorded();
        const size_t from = lead.timings().size();
        const std::optional<CpuTimes> cpu0 = cpu_times();
        const auto t0 = Clock::now();
        for (uint32_t i = 0; i < c.n_gen; ++i) {
          const std::span<const int32_t> step(&toks[i * c.parallel], c.parallel);
          if (c.parallel == 1) lead.decode(step, LogitsMode::Last);
          else lead.decode_batch(seqs, step);
        }
        const double secs = seconds(t0);
        if (const auto steal = steal_share(cpu0, cpu_times()); r && steal) res.tg_steal.push_back(*steal);
        res.dispatches_per_step = double(lead.dispatches_recorded() - d0) / c.n_gen;
        res.barriers_per_step = double(lead.barriers_recorded() - b0) / c.n_gen;
        if (r) res.tg.push_back(double(c.n_gen) * c.parallel / secs);
        keep_timings(from);
        test_done();
      }
    }
  }
  bar.finish();
  // Decode at each depth against the first, per repetition (the depths of a repetition ran back to
  // back): the median of those ratios.
  std::vector<double> ratio(n_depths, 1.0);
  for (uint32_t d = 1; d < n_depths && c.n_gen; ++d) {
    for (uint32_t r = 0; r < c.reps; ++r) depths[d].tg_vs_first.push_back(depths[d].tg[r] / depths[0].tg[r]);
    ratio[d] = stat_of(depths[d].tg_vs_first).median;
  }
  if (c.opts.profile) {
    for (const DepthResult& res : depths)
      print_profile(res.timings, "measured tests" + (n_depths > 1 ? " at --ctx-fill " + std::to_string(res.fill) : std::string()));
  }
  // Bytes one decode step reads: every weight, plus the K/V of each sequence's cache (half full on
  // average; a sliding-window layer reads no more than its window). Steps per second are tok/s over
  // the sequences.
  const auto kv_avg = [&](const DepthResult& res) {
    const ModelConfig& mc = e.config();
    const KvCache& kv = e.cache();
    double sum = 0;  // step i reads the fill and the i tokens before it, and its own
    for (uint32_t i = 0; i < c.n_gen; ++i)
      sum += double(kv_cache_bytes(mc, kv.type_k(), kv.type_v(), kv.capacity(), mc.has_swa() ? mc.n_swa : 0, res.fill + i + 1));
    return c.n_gen ? sum / c.n_gen * c.parallel : 0.0;
  };
  const auto bytes_per_step = [&](const DepthResult& res) { return double(s.model->weight_bytes()) + kv_avg(res); };
  const auto tests_json = [&](const DepthResult& res, nlohmann::json& j) {
    if (!res.pp.empty()) {
      const Stat st = stat_of(res.pp);
      j["prefill"] = {{"tokens", c.n_prompt}, {"tok_s", st.median}, {"tok_s_min", st.min}, {"tok_s_max", st.max}};
    }
    if (!res.tg.empty()) {
      const Stat st = stat_of(res.tg);
      const double bytes = bytes_per_step(res);
      j["decode"] = {{"tokens", c.n_gen}, {"tok_s", st.median}, {"tok_s_min", st.min}, {"tok_s_max", st.max},
                     {"bytes_per_token", bytes / c.parallel}, {"effective_gb_s", bytes * st.median / c.parallel / 1e9},
                     {"dispatches_per_token", res.dispatches_per_step / c.parallel},
                     {"barriers_per_token", res.barriers_per_step / c.parallel}};
      if (!res.tg_steal.empty()) j["decode"]["cpu_steal"] = stat_of(res.tg_steal).median;
    }
  };
  nlohmann::json j = {{"model", c.opts.model}, {"device", s.ctx->info().name}, {"weight_bytes", s.model->weight_bytes()},
                      {"kv_cache_type", cache_type_name(e.cache().type_k())}, {"attention", attention_kernel_name(c.opts.attention)}, {"reps", c.reps},
                      {"parallel", c.parallel}};
  if (n_depths == 1) {
    j["ctx_fill"] = depths[0].fill;
    tests_json(depths[0], j);
  } else {
    // Several depths: one entry each, and decode at each against the first (per-repetition median).
    j["ctx_fill"] = c.ctx_fill;
    j["depths"] = nlohmann::json::array();
    for (uint32_t d = 0; d < n_depths; ++d) {
      nlohmann::json t = {{"ctx_fill", depths[d].fill}};
      tests_json(depths[d], t);
      if (c.n_gen) t["decode_vs_first"] = ratio[d];
      j["depths"].push_back(t);
    }
  }
  if (c.json) {
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("%-34s %-14s %12s %22s\n", "model", "test", "tok/s", "min … max");
  const std::string name = c.opts.model.substr(c.opts.model.find_last_of('/') + 1);
  // Decode of several sequences per step: "tg128 x4", tok/s of all of them together.
  const std::string streams = c.parallel > 1 ? " x" + std::to_string(c.parallel) : "";
  for (const DepthResult& res : depths) {
    // llama-bench's names: pp512, tg128, and "@ d4096" for a cache filled before the test.
    const std::string depth = res.fill ? " @ d" + std::to_string(res.fill) : "";
    if (!res.pp.empty()) {
      const Stat st = stat_of(res.pp);
      std::printf("%-34s %-14s %12.2f %10.2f … %-10.2f\n", name.c_str(), ("pp" + std::to_string(c.n_prompt) + depth).c_str(),
                  st.median, st.min, st.max);
    }
    if (!res.tg.empty()) {
      const Stat st = stat_of(res.tg);
      std::printf("%-34s %-14s %12.2f %10.2f … %-10.2f\n", name.c_str(),
                  ("tg" + std::to_string(c.n_gen) + streams + depth).c_str(), st.median, st.min, st.max);
    }
  }
  for (const DepthResult& res : depths) {
    if (res.tg.empty()) continue;
    const double bytes = bytes_per_step(res);
    std::printf("decode%s reads %s per step (weights %s + KV %s) → %.2f GB/s effective\n",
                n_depths > 1 ? (" @ d" + std::to_string(res.fill)).c_str() : "", human_bytes(uint64_t(bytes)).c_str(),
                human_bytes(s.model->weight_bytes()).c_str(), human_bytes(uint64_t(kv_avg(res))).c_str(),
                bytes * stat_of(res.tg).median / c.parallel / 1e9);
  }
  // On a shared host the CPU time taken by other machines moves a CPU driver's tok/s with it; the
  // share of each decode test says how far this run's figures can be trusted.
  for (const DepthResult& res : depths) {
    if (res.tg_steal.empty()) continue;
    std::string reps;
    for (const double v : res.tg_steal) reps += (reps.empty() ? "" : ", ") + std::to_string(int(v * 100 + 0.5)) + "%";
    std::printf("decode%s: the host took %s of the CPU time (steal, per repetition)\n",
                n_depths > 1 ? (" @ d" + std::to_string(res.fill)).c_str() : "", reps.c_str());
  }
  for (uint32_t d = 1; d < n_depths && c.n_gen; ++d) {
    std::string reps;
    for (const double v : depths[d].tg_vs_first) {
      char one[32];
      std::snprintf(one, sizeof one, "%s%.2f", reps.empty() ? "" : ", ", v);
      reps += one;
    }
    std::printf("decode @ d%u against @ d%u: %.2f× (median of the repetitions, each running the depths in turn: %s)\n", depths[d].fill,
                depths[0].fill, ratio[d], reps.c_str());
  }
}

// matvec GB/s (weight bytes read) and matmul GFLOP/s for an n×n matrix of each weight type, and the
// read ceiling: the same bytes streamed with uvec4 loads and no arithmetic, timed in the same run.
void bench_ops(const BenchCommand& c) {
  ContextOptions co;
  co.device_index = c.device;
  VulkanContext ctx(co);
  Pipelines pipes(ctx, "");
  const uint32_t n = c.ops_size, n_tok = 512;
  std::vector<gguf::TensorType> types;
  for (const std::string& name : c.ops_types) {
    const std::optional<gguf::TensorType> t = gguf::type_from_name(name);
    if (!t || !weight_type_supported(*t)) throw CLI::ValidationError("--ops-types: '" + name + "' is not a weight type vkllm runs");
    const uint32_t block = gguf::type_info(static_cast<uint32_t>(*t))->block_size;
    if (n % block != 0)
      throw CLI::ValidationError("--ops-size " + std::to_string(n) + " is not a multiple of " + gguf::type_name(*t) + "'s block of " + std::to_string(block) +
                  " elements");
    if (std::find(types.begin(), types.end(), *t) == types.end()) types.push_back(*t);
  }
  Buffer x(ctx, uint64_t{n_tok} * n * 4, MemoryUse::Device, "bench x");
  Buffer y(ctx, uint64_t{n_tok} * n * 4, MemoryUse::Device, "bench y");
  CommandRecorder rec(ctx, &pipes);
  // Times `record` over `iters` recordings after one warm-up (which builds the pipeline).
  auto time_it = [&](const std::function<void()>& record, uint32_t iters) {
    record();
    rec.submit_and_wait();
    const auto t0 = Clock::now();
    for (uint32_t i = 0; i < iters; ++i) {
      record();
      rec.barrier();
    }
    rec.submit_and_wait();
    return seconds(t0) / iters;
  };
  // The ceiling over the largest type's bytes (Q8_0-sized or more), so every row compares with it.
  const uint64_t ceiling_bytes = uint64_t{n} * n * 4;
  Buffer data(ctx, ceiling_bytes, MemoryUse::Device, "bench read ceiling");
  Buffer sink(ctx, read_ceiling_out_bytes(ctx, ceiling_bytes), MemoryUse::Device, "bench read sink");
  // Two ceilings: storage-buffer loads (the definition) and texel loads, the faster path
  // the CPU-driver kernels read weights through.
  auto ceiling_of = [&](bool texel) {
    double s = 0;  // one binding at a time: all bytes over the time of all parts
    for (uint64_t off = 0; off < ceiling_bytes; off += ctx.max_storage_range()) {
      const BufferView part = data.view(off, std::min<uint64_t>(ctx.max_storage_range(), ceiling_bytes - off));
      s += time_it([&] { record_read_ceiling(rec, part, sink.view(), texel); }, 5);
    }
    return double(ceiling_bytes) / s / 1e9;
  };
  const double ceiling = ceiling_of(false), texel_ceiling = ceiling_of(true);
  nlohmann::json out = {{"device", ctx.info().name},      {"size", n},
                        {"read_ceiling_gb_s", ceiling}, {"texel_ceiling_gb_s", texel_ceiling},
                        {"types", nlohmann::json::array()}};
  if (!c.json)
    std::printf("%s: %u×%u matrix, matmul with %u tokens; of ceiling: of the storage-buffer read ceiling (of the texel one);\n"
                "4 columns: columns per second of a 4-column matvec over 1\n"
                "%-13s %12s %18s %13s %16s\n%-13s %12.2f %18s %13s %16s\n%-13s %12.2f %18s %13s %16s\n",
                ctx.info().name.c_str(), n, n, n_tok, "type", "matvec GB/s", "of ceiling", "4 columns", "matmul GFLOP/s",
                "read ceiling", ceiling, "100%", "-", "-", "texel ceiling", texel_ceiling, "-", "-", "-");
  for (gguf::TensorType t : types) {
    const uint64_t bytes = gguf::type_bytes(t, uint64_t{n} * n);
    // Bytes of 0x3C: every f16/bf16 scale is a finite ~1.0, so no kernel sees NaN or Inf.
    std::vector<uint8_t> w_data(bytes, 0x3C);
    WeightArena arena(ctx);
    const DeviceTensor w = arena.upload("bench", t, n, n, w_data.data());
    // One column and four (a decode step of four sequences, MatmulKernel::Columns), in turns, the
    // fastest of each kept: their ratio is what a 4-sequence step gains over one.
    double mv = 1e30, mv4 = 1e30;
    for (uint32_t round = 0; round < 4; ++round) {
      mv = std::min(mv, time_it([&] { record_matmul(rec, w, x.view(), n, 1, y.view(), n); }, 3));
      mv4 = std::min(mv4, time_it([&] { record_matmul(rec, w, x.view(), n, 4, y.view(), n, MatmulStore::Overwrite, MatmulKernel::Columns); }, 3));
    }
    const double mm = !c.no_matmul ? time_it([&] { record_matmul(rec, w, x.view(), n, n_tok, y.view(), n); }, 1) : 0;
    const double gbs = double(bytes) / mv / 1e9, gflops = mm > 0 ? 2.0 * n * n * n_tok / mm / 1e9 : 0, columns4 = 4 * mv / mv4;
    out["types"].push_back({{"type", gguf::type_name(t)}, {"matvec_gb_s", gbs}, {"matvec_of_ceiling", gbs / ceiling},
                            {"matvec_of_texel_ceiling", gbs / texel_ceiling},
                            {"columns4_gain", columns4},
                            {"matmul_gflop_s", mm > 0 ? nlohmann::json(gflops) : nlohmann::json(nullptr)}, {"bytes", bytes}});  // null: --no-matmul
    if (!c.json) {
      char mm_text[32] = "-";
      if (mm > 0) std::snprintf(mm_text, sizeof mm_text, "%.2f", gflops);
      char share[32];
      std::snprintf(share, sizeof share, "%.0f%% (%.0f%%)", 100 * gbs / ceiling, 100 * gbs / texel_ceiling);
      std::printf("%-13s %12.2f %18s %12.2f× %16s\n", gguf::type_name(t).c_str(), gbs, share, columns4, mm_text);
      std::fflush(stdout);
    }
  }
  if (c.json) std::printf("%s\n", out.dump(1).c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto c = std::make_shared<BenchCommand>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode throughput (or kernel throughput with --ops)");
  std::vector<CLI::Option*> model_run;  // what --ops does not take
  model_run.push_back(cmd->add_option("-m,--model", c->opts.model, "GGUF model file"));
  cmd->add_option("--device", c->device, "Vulkan device index");
  model_run.push_back(cmd->add_option("-p,--n-prompt", c->n_prompt, "Prompt tokens for the prefill test (default 512; 0: skip)"));
  model_run.push_back(cmd->add_option("-n,--n-gen", c->n_gen, "Tokens for the decode test (default 128; 0: skip)"));
  model_run.push_back(cmd->add_option("-r,--reps", c->reps, "Measured repetitions (default 3)")->check(CLI::Range(1u, 100u)));
  model_run.push_back(cmd->add_option("--ctx-fill", c->ctx_fill,
                                      "Tokens already in the cache before the prefill and decode tests; several (0,4096) run in "
                                      "turn in each repetition, each on its own caches, and decode at each is compared with the first")
                          ->delimiter(',')
                          ->allow_extra_args(false));
  model_run.push_back(add_attention_option(cmd, c->opts.attention));
  model_run.push_back(cmd->add_option("-c,--ctx", c->opts.ctx, "KV cache capacity (default: enough for the test)")->check(CLI::Range(0u, k_max_ctx)));
  model_run.push_back(cmd->add_option("--cache-type", c->opts.cache_type, "KV cache type: f16, q8_0, q4_0")
                          ->check(cache_type_names()));
  model_run.push_back(cmd->add_option("--cache-type-k", c->opts.cache_type_k, "KV cache type for K (as --cache-type)")->check(cache_type_names()));
  model_run.push_back(cmd->add_option("--cache-type-v", c->opts.cache_type_v, "KV cache type for V (as --cache-type)")->check(cache_type_names()));
  model_run.push_back(
      cmd->add_option("--ubatch", c->opts.ubatch, "Prompt tokens per prefill chunk (default: 512 on GPUs, 64 on CPU drivers)")
          ->check(CLI::Range(1u, 8192u)));
  CLI::Option* ops = cmd->add_flag("--ops", c->ops, "Benchmark the matvec/matmul kernels for every weight type instead");
  cmd->add_option("--ops-size", c->ops_size, "Matrix size for --ops")->check(CLI::Range(64u, 16384u))->needs(ops);
  cmd->add_option("--ops-types", c->ops_types, "Weight types for --ops (default: all)")->delimiter(',')->needs(ops);
  cmd->add_flag("--no-matmul", c->no_matmul, "--ops: matvec and the read ceiling only")->needs(ops);
  model_run.push_back(cmd->add_option("--parallel", c->parallel,
                                      "Sequences decoded together in each decode step (as serve --parallel); tok/s of all")
                          ->check(CLI::Range(1u, 64u)));
  model_run.push_back(cmd->add_flag("--profile", c->opts.profile, "Print GPU time per op at the end"));
  cmd->add_flag("--json", c->json, "Print JSON");
  // --ops times kernels on synthetic matrices: a model run's options would be ignored in silence.
  for (CLI::Option* o : model_run) ops->excludes(o);
  cmd->callback([c] {
    if (c->ops) return bench_ops(*c);
    if (c->opts.model.empty()) throw CLI::ValidationError("bench needs -m MODEL (or --ops)");
    if (c->n_prompt == 0 && c->n_gen == 0) throw CLI::ValidationError("bench: -p 0 and -n 0 leave nothing to measure");
    c->opts.device = c->device;
    bench_model(*c);
  });
}

}  // namespace vkllm::cli
