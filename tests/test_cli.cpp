// The vkllm binary end to end: `info` figures, `run` greedy tokens against the references,
// perplexity against llama.cpp / llama2.c, the ring past capacity, stdout purity and one-line
// errors with a non-zero exit.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cpu_steal.h"
#include "test_support.h"

using nlohmann::json;
using vkllm::test::shared_path;

namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

// Runs a shell command line, capturing stdout and stderr separately.
Result vkllm_shell(const std::string& command) {
  const std::string err_path = testing::TempDir() + "/vkllm_cli_stderr.txt";
  const std::string cmd = "{ " + command + "; } 2>" + err_path;
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_path, std::ios::binary);
  r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  return r;
}

// Runs the vkllm binary with `args` (shell words), capturing stdout and stderr separately.
Result vkllm(const std::string& args, const std::string& stdin_text = "") {
  const std::string in_path = testing::TempDir() + "/vkllm_cli_stdin.txt";
  {
    std::ofstream in(in_path, std::ios::binary);
    in << stdin_text;
  }
  return vkllm_shell(std::string(VKLLM_BINARY) + " " + args + " <" + in_path);
}

// `base` + prompt generating 2n tokens at once gives the same tokens as n, saved to `session`,
// then n more from the session (the two calls with `first_more` and `second_more` flags).
void expect_session_continues(const std::string& base, const std::string& prompt, int n, const std::string& session,
                              const std::string& first_more = "", const std::string& second_more = "") {
  std::filesystem::remove(session);
  const std::string count = " -n " + std::to_string(n);
  const Result whole = vkllm(base + " -n " + std::to_string(2 * n) + prompt);
  const Result first = vkllm(base + first_more + count + " --session " + session + prompt);
  const Result second = vkllm(base + second_more + count + " --session " + session);
  ASSERT_EQ(whole.status, 0) << whole.err;
  ASSERT_EQ(first.status, 0) << first.err;
  ASSERT_EQ(second.status, 0) << second.err;
  std::vector<int> split = json::parse(first.out)["tokens"].get<std::vector<int>>();
  const std::vector<int> rest = json::parse(second.out)["tokens"].get<std::vector<int>>();
  split.insert(split.end(), rest.begin(), rest.end());
  EXPECT_EQ(split, json::parse(whole.out)["tokens"].get<std::vector<int>>());
  std::filesystem::remove(session);
}

// A gemma3 with a 16-token window (layers 0–4 window layers, 5 global), Q8_0, written to `path`
// (`extra`: more make_model arguments; `window`: another window).
void make_gemma3_window_model(const std::string& path, const std::string& extra = "", uint32_t window = 16) {
  const std::string make = std::string(VKLLM_MAKE_MODEL) +
                           " --arch gemma3 --layers 6 --embd 256 --ff 512 --heads 4 --kv-heads 2 --head-dim 64 --window " +
                           std::to_string(window) + " --post-norm 8 --rope-base 1000000 --rope-scale 8 --type q8_0 --seed 5 " + extra + " -o " + path + " >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
}

std::string model(const std::string& name) { return shared_path("models/" + name); }

TEST(Cli, InfoReportsStories260K) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const Result text = vkllm("info -m " + model("stories260K.gguf"));
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("layers          5"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("heads           8 (KV heads 4, head dim 8)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("embedding       64"), std::string::npos);
  EXPECT_NE(text.out.find("vocabulary      512 tokens"), std::string::npos);
  EXPECT_NE(text.out.find("640 B"), std::string::npos);
  const Result js = vkllm("info --json --ctx 8192 --seqs 8 -m " + model("stories260K.gguf"));
  ASSERT_EQ(js.status, 0) << js.err;
  const json j = json::parse(js.out);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["n_layer"], 5);
  EXPECT_EQ(j["n_head"], 8);
  EXPECT_EQ(j["n_head_kv"], 4);
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["n_embd"], 64);
  EXPECT_EQ(j["n_vocab"], 512);
  EXPECT_EQ(j["kv_cache"]["types"]["f16"]["bytes_per_token"], 640);
  EXPECT_EQ(j["kv_cache"]["types"]["f16"]["bytes_total"], 640ull * 8192 * 8);
  EXPECT_EQ(j["kv_cache"]["cpu_rotated_k_bytes_per_seq"], 0);  // head dim 8: the decode kernel takes no copy
}

// On this CPU driver `info`'s f16 cache plus its rotated-K line is the KV figure of run's memory
// plan (info printed the cache rows alone).
TEST(Cli, InfoCountsTheRotatedCopyOfK) {
  VKLLM_REQUIRE_SHARED("models/synth-llama-f16.gguf");
  const std::string m = " -m " + model("synth-llama-f16.gguf");
  const Result info = vkllm("info --json --ctx 4096" + m);
  ASSERT_EQ(info.status, 0) << info.err;
  const json kv = json::parse(info.out)["kv_cache"];
  EXPECT_EQ(kv["cpu_rotated_k_bytes_per_seq"], 4u << 20);
  const Result run = vkllm("run -n 1 --ctx 4096 -p Once" + m);
  ASSERT_EQ(run.status, 0) << run.err;
  const uint64_t total = kv["types"]["f16"]["bytes_per_seq"].get<uint64_t>() + kv["cpu_rotated_k_bytes_per_seq"].get<uint64_t>();
  EXPECT_EQ(total, 12u << 20);
  EXPECT_NE(run.err.find("KV cache 12.0 MiB"), std::string::npos) << run.err;
  // From --ctx 32,768 the rope table (two rows a slot) is past one dispatch's grid on lavapipe: no
  // copy, in info as in the engine.
  for (const auto& [ctx, copy] : {std::pair{"32767", true}, std::pair{"32768", false}}) {
    const Result big = vkllm(std::string("info --json --ctx ") + ctx + m), ran = vkllm(std::string("run -n 1 -p Once --ctx ") + ctx + m);
    ASSERT_EQ(big.status, 0) << big.err;
    ASSERT_EQ(ran.status, 0) << ran.err;
    const json k = json::parse(big.out)["kv_cache"];
    EXPECT_EQ(k["cpu_rotated_k_bytes_per_seq"].get<uint64_t>() > 0, copy) << ctx;
    const uint64_t all = k["types"]["f16"]["bytes_per_seq"].get<uint64_t>() + k["cpu_rotated_k_bytes_per_seq"].get<uint64_t>();
    char want[64];
    std::snprintf(want, sizeof want, "KV cache %.1f MiB", double(all) / (1 << 20));
    EXPECT_NE(ran.err.find(want), std::string::npos) << ctx << ": " << want << " in " << ran.err;
  }
}

// `devices`: the JSON carries the int64 features; wide_int64 (four Q4_0 columns per 64-bit multiply)
// only for a CPU driver with shaderInt64, and the text says the same; every feature the text lists
// is in the JSON (integer dot products were not).
TEST(Cli, DevicesReportInt64) {
  const Result js = vkllm("devices --json");
  ASSERT_EQ(js.status, 0) << js.err;
  const json devices = json::parse(js.out);
  ASSERT_FALSE(devices.empty());
  const Result text = vkllm("devices");
  ASSERT_EQ(text.status, 0) << text.err;
  for (const json& d : devices) {
    ASSERT_TRUE(d["int64"].is_boolean() && d["wide_int64"].is_boolean()) << d.dump();
    if (d["wide_int64"]) {
      EXPECT_TRUE(d["int64"].get<bool>() && d["type"] == "cpu") << d.dump();
    }
  }
  const bool wide = devices[0]["wide_int64"], int64 = devices[0]["int64"];
  ASSERT_TRUE(devices[0]["int_dot"].is_boolean()) << devices[0].dump();
  EXPECT_NE(text.out.find(std::string("integer dot products      ") + (devices[0]["int_dot"].get<bool>() ? "yes" : "no")),
            std::string::npos) << text.out;
  const std::string line = std::string("int64 arithmetic          ") +
                           (!int64 ? "no" : wide ? "yes, one instruction per subgroup (AVX-512 DQ)" : "yes");
  EXPECT_NE(text.out.find(line), std::string::npos) << text.out;
}

// bench runs with either attention kernel over a filled cache and reports both tests; a bad kernel
// name is refused.
TEST(Cli, BenchBothAttentionKernelsOverAFilledCache) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  for (const char* kernel : {"tiled", "simd"}) {
    const Result r = vkllm("bench -p 8 -n 4 -r 1 --ctx-fill 40 --json --attention " + std::string(kernel) + " -m " +
                           model("stories260K.gguf"));
    ASSERT_EQ(r.status, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["attention"], kernel);
    EXPECT_EQ(j["ctx_fill"], 40);
    EXPECT_GT(j["prefill"]["tok_s"].get<double>(), 0.0);
    EXPECT_GT(j["decode"]["tok_s"].get<double>(), 0.0);
    // stories260K: 5 layers of about a dozen dispatches each, a barrier after most.
    EXPECT_GT(j["decode"]["dispatches_per_token"].get<double>(), 5 * 8.0);
    EXPECT_GT(j["decode"]["barriers_per_token"].get<double>(), 5 * 4.0);
  }
  const Result bad = vkllm("bench --attention fast -m " + model("stories260K.gguf"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--attention"), std::string::npos) << bad.err;
}

// --attention takes the kernels' names only (not the numbers behind them), and a forced kernel that
// cannot take the model's head dim is one line before the weights load, for every command.
TEST(Cli, AttentionKernelRefusals) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");  // make_model's default vocabulary
  for (const char* name : {"2", "bogus"}) {
    const Result r = vkllm("run -n 2 -p hi --attention " + std::string(name) + " -m " + model("stories260K.gguf"));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.err, "vkllm: error: --attention: " + std::string(name) + " not in {auto,lanes,simd,tiled} (see --help)\n");
  }
  const std::string wide = testing::TempDir() + "/head-dim-128.gguf";
  const std::string make = std::string(VKLLM_MAKE_MODEL) + " --arch llama --layers 1 --embd 256 --ff 256 --heads 2 --kv-heads 1 -o " +
                           wide + " >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const std::string text = testing::TempDir() + "/head-dim-128.txt";
  std::ofstream(text) << "Once upon a time there was a little dog.\n";
  for (const std::string& command : std::vector<std::string>{"run -n 2 -p hi", "serve --port 0", "perplexity --ctx 8 -f " + text, "bench -p 4 -n 2 -r 1"}) {
    const Result r = vkllm(command + " --attention simd -m " + wide);
    EXPECT_EQ(r.status, 1) << command;
    EXPECT_NE(r.err.find("vkllm: error: --attention simd: attention_simd takes head dims that are multiples of 8 up to 64; "
                         "this model's is 128 (use --attention auto)\n"),
              std::string::npos) << command << ": " << r.err;
    EXPECT_EQ(r.err.find("vkllm: memory:"), std::string::npos) << command << ": refused after the memory plan: " << r.err;
  }
  const Result lanes = vkllm("run -n 2 -p hi --attention lanes --json -m " + wide);  // 128 ≤ 256: it runs
  EXPECT_EQ(lanes.status, 0) << lanes.err;
  std::filesystem::remove(wide);
  std::filesystem::remove(text);
}

// The host's CPU steal comes from /proc/stat's "cpu" line (its 8th number), and bench reports it per
// decode test where the file exists.
TEST(Cli, CpuStealFromProcStat) {
  const auto t = vkllm::cli::parse_cpu_times("cpu  100 5 50 800 10 1 2 32 0 0");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->steal, 32u);
  EXPECT_EQ(t->total, 1000u);
  EXPECT_FALSE(vkllm::cli::parse_cpu_times("cpu0 100 5 50 800 10 1 2 32 0 0").has_value());
  EXPECT_FALSE(vkllm::cli::parse_cpu_times("cpu  100 5 50").has_value());
  const vkllm::cli::CpuTimes later{132, 1400};
  EXPECT_DOUBLE_EQ(*vkllm::cli::steal_share(t, later), 100.0 / 400.0);
  EXPECT_FALSE(vkllm::cli::steal_share(later, t).has_value());
  EXPECT_FALSE(vkllm::cli::steal_share(std::nullopt, later).has_value());

  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  if (!vkllm::cli::cpu_times()) GTEST_SKIP() << "/proc/stat: not readable here";
  // 32 tokens: long enough for /proc/stat's clock ticks (10 ms) to move during each test.
  const Result r = vkllm("bench -p 0 -n 32 -r 2 --json -m " + model("stories260K.gguf"));
  ASSERT_EQ(r.status, 0) << r.err;
  const json decode = json::parse(r.out)["decode"];
  ASSERT_TRUE(decode.contains("cpu_steal")) << r.out;
  const double steal = decode["cpu_steal"].get<double>();
  EXPECT_GE(steal, 0.0);
  EXPECT_LE(steal, 1.0);
  const Result text = vkllm("bench -p 0 -n 32 -r 2 -m " + model("stories260K.gguf"));
  EXPECT_NE(text.out.find("of the CPU time (steal, per repetition)"), std::string::npos) << text.out;
}

// bench --ctx-fill with several depths runs each test at every depth on caches of its own, reports
// one entry per depth with decode against the first, and prints one profile per depth.
TEST(Cli, BenchSeveralDepthsInOneRun) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const Result r = vkllm("bench -p 4 -n 4 -r 2 --ctx-fill 0,40 --json --profile -m " + model("stories260K.gguf"));
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["ctx_fill"], json::array({0, 40}));
  ASSERT_EQ(j["depths"].size(), 2u);
  for (const json& d : j["depths"]) {
    EXPECT_GT(d["prefill"]["tok_s"].get<double>(), 0.0);
    EXPECT_GT(d["decode"]["tok_s"].get<double>(), 0.0);
    EXPECT_GT(d["decode"]["bytes_per_token"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["depths"][0]["ctx_fill"], 0);
  EXPECT_EQ(j["depths"][1]["ctx_fill"], 40);
  EXPECT_EQ(j["depths"][0]["decode_vs_first"], 1.0);
  EXPECT_GT(j["depths"][1]["decode_vs_first"].get<double>(), 0.0);
  // 40 cached tokens at 640 bytes each (f16 K and V of 5 layers × 64 dims) more per step.
  EXPECT_NEAR(j["depths"][1]["decode"]["bytes_per_token"].get<double>() - j["depths"][0]["decode"]["bytes_per_token"].get<double>(),
              40 * 640.0, 1.0);
  // The profile of each depth covers its measured tests only: the fill's dispatches are not in it,
  // so both depths' tables count the same norms (the same tests, one prompt chunk each).
  const size_t at0 = r.err.find("GPU time per op (measured tests at --ctx-fill 0)");
  const size_t at40 = r.err.find("GPU time per op (measured tests at --ctx-fill 40)");
  ASSERT_NE(at0, std::string::npos) << r.err;
  ASSERT_NE(at40, std::string::npos) << r.err;
  // The rms_norm calls of the table that starts at `from` (-1 where the table has no such row): the
  // row of rms_norm or, on CPU drivers, rms_norm_texel.
  const auto norm_calls = [&](size_t from) {
    const size_t row_at = r.err.find("  rms_norm", from), next = r.err.find("GPU time per op", from + 1);
    if (row_at == std::string::npos || row_at > next) return -1L;
    std::istringstream row(r.err.substr(row_at));
    std::string op;
    double ms = 0;
    long calls = 0;
    row >> op >> ms >> calls;
    return calls;
  };
  EXPECT_GT(norm_calls(at0), 0);
  EXPECT_EQ(norm_calls(at0), norm_calls(at40)) << r.err;
  const Result text = vkllm("bench -p 0 -n 4 -r 1 --ctx-fill 0,40 -m " + model("stories260K.gguf"));
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("tg4 @ d40"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("decode @ d40 against @ d0:"), std::string::npos) << text.out;
}

// bench --ops times the read ceiling and each chosen type's matvec in one run; unknown types are refused.
TEST(Cli, BenchOpsReportsTheReadCeiling) {
  const Result r = vkllm("bench --ops --ops-types q4_0,F16 --no-matmul --ops-size 512 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_GT(j["read_ceiling_gb_s"].get<double>(), 0.0);
  EXPECT_GT(j["texel_ceiling_gb_s"].get<double>(), 0.0);
  ASSERT_EQ(j["types"].size(), 2u);
  EXPECT_EQ(j["types"][0]["type"], "Q4_0");
  EXPECT_EQ(j["types"][1]["type"], "F16");
  for (const json& t : j["types"]) {
    EXPECT_GT(t["matvec_gb_s"].get<double>(), 0.0);
    EXPECT_NEAR(t["matvec_of_ceiling"].get<double>(), t["matvec_gb_s"].get<double>() / j["read_ceiling_gb_s"].get<double>(), 1e-9);
    EXPECT_NEAR(t["matvec_of_texel_ceiling"].get<double>(), t["matvec_gb_s"].get<double>() / j["texel_ceiling_gb_s"].get<double>(),
                1e-9);
    EXPECT_TRUE(t["matmul_gflop_s"].is_null()) << t;  // --no-matmul: not measured
  }
  const Result bad = vkllm("bench --ops --ops-types q4_9");
  EXPECT_EQ(bad.status, 2);  // a bad command line
  EXPECT_NE(bad.err.find("q4_9"), std::string::npos) << bad.err;
}

TEST(Cli, BadInputIsOneLineAndNonZero) {
  const std::string dir = testing::TempDir();
  {
    std::ofstream f(dir + "/corrupt.gguf", std::ios::binary);
    f << "GGUF\x03";
  }
  for (const std::string& args : {"info -m " + dir + "/corrupt.gguf", "run -m " + dir + "/corrupt.gguf -p hi",
                                  "info -m " + dir + "/does-not-exist.gguf", std::string("run -m x --cache-type q9"),
                                  "bench -p 8 -n 4 -r 1 --ctx 64 --ctx-fill 100 -m " + model("stories260K.gguf"),
                                  std::string("bench --ops --ops-types q4_k --ops-size 64 --no-matmul"),
                                  "bench -p 0 -n 0 -m " + model("stories260K.gguf")}) {
    const Result r = vkllm(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    EXPECT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  const Result r = vkllm("info -m " + dir + "/corrupt.gguf");
  EXPECT_NE(r.err.find("corrupt.gguf"), std::string::npos) << r.err;
  // Mixed K/V cache types are a bad command line (the attention kernels read both in one type), as is
  // --cache-type against an explicit --cache-type-k/-v (it was silently taken over them); the flags
  // are judged before the model is opened.
  const Result mixed = vkllm("run --cache-type-k f16 --cache-type-v q8_0 -p hi -m " + model("stories260K.gguf"));
  EXPECT_EQ(mixed.status, 2) << mixed.err;
  EXPECT_EQ(std::count(mixed.err.begin(), mixed.err.end(), '\n'), 1) << mixed.err;
  EXPECT_NE(mixed.err.find("--cache-type-k f16 and --cache-type-v q8_0 differ"), std::string::npos) << mixed.err;
  const Result contra = vkllm("run --cache-type q8_0 --cache-type-v f16 -p hi -m " + dir + "/does-not-exist.gguf");
  EXPECT_EQ(contra.status, 2) << contra.err;
  EXPECT_NE(contra.err.find("--cache-type-v f16 contradicts --cache-type q8_0"), std::string::npos) << contra.err;
  EXPECT_EQ(vkllm("run --cache-type q8_0 --cache-type-k q8_0 -n 1 --ctx 32 -q -p hi -m " + model("stories260K.gguf")).status, 0);
  // A --keep that pins the whole cache leaves the ring no slot.
  const Result keep = vkllm("run --keep 16 --ctx 16 -p hi -m " + model("stories260K.gguf"));
  EXPECT_EQ(keep.status, 2) << keep.err;
  EXPECT_TRUE(keep.err.starts_with("vkllm: error: --keep 16 pins the whole cache of 16 tokens (--ctx); at most 15 can be pinned")) << keep.err;
  EXPECT_EQ(std::count(keep.err.begin(), keep.err.end(), '\n'), 1) << keep.err;
  // A quantized cache on a KV row that is not whole blocks (80 = 2 heads × 40): the one line, no
  // memory figures before it (they were computed for the truncated row).
  const std::string hd40 = dir + "/vkllm_hd40.gguf";
  ASSERT_EQ(std::system((std::string(VKLLM_MAKE_MODEL) + " --arch llama --layers 1 --embd 64 --ff 64 --heads 4 --kv-heads 2 --head-dim 40 -o " +
                         hd40 + " >/dev/null").c_str()), 0);
  const Result rows = vkllm("run --cache-type q4_0 -n 1 -p hi -m " + hd40);
  EXPECT_EQ(rows.status, 1) << rows.err;
  EXPECT_EQ(rows.err, "vkllm: error: --cache-type q4_0 needs a KV row width that is a multiple of 32; this model's is 80\n");
  // `info` names the types such a model cannot take (they were left out of the table without a word).
  const Result info = vkllm("info -m " + hd40);
  EXPECT_NE(info.out.find("  q8_0   unavailable: needs a KV row width that is a multiple of 32; this model's is 80\n"), std::string::npos)
      << info.out;
  EXPECT_EQ(json::parse(vkllm("info --json -m " + hd40).out)["kv_cache"]["types"]["q4_0"]["unavailable"],
            "needs a KV row width that is a multiple of 32; this model's is 80");
  // q4_0 with heads narrower than a block (stories260K: 8) runs, with a warning of its cost;
  // perplexity --json says which cache type it measured.
  const Result narrow = vkllm("run --cache-type q4_0 -n 1 -p hi -m " + model("stories260K.gguf"));
  EXPECT_EQ(narrow.status, 0) << narrow.err;
  EXPECT_NE(narrow.err.find("vkllm: warning: a q4_0 KV cache with head dim 8: each 32-value block spans more than one head"),
            std::string::npos) << narrow.err;
  const std::string text = dir + "/vkllm_ppl.txt";
  std::ofstream(text) << "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her dog.";
  const Result ppl = vkllm("perplexity --json -q --ctx 16 --cache-type q8_0 -m " + model("stories260K.gguf") + " -f " + text);
  ASSERT_EQ(ppl.status, 0) << ppl.err;
  EXPECT_EQ(json::parse(ppl.out)["kv_cache_type"], "q8_0") << ppl.out;
}

// A model key's 4-byte value overwritten (the key found by name; GGUF stores it as a u64 length,
// the name, a u32 type, then the value): stories260K with that change, written to `path`.
void patch_key_value(const std::string& key, const void* value, const std::string& path) {
  std::ifstream in(model("stories260K.gguf"), std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos) << key;
  std::memcpy(bytes.data() + at + key.size() + 4, value, 4);
  std::ofstream(path, std::ios::binary) << bytes;
}

// A corrupt width or a non-finite epsilon is named by its key before anything is planned or run
// (they were an impossible memory plan, and a model that output token 0 with status 0).
TEST(Cli, CorruptModelKeysAreNamed) {
  const std::string dir = testing::TempDir();
  const uint32_t huge = 0xFFFFFFFFu;
  const float nan = std::nanf("");
  patch_key_value("llama.feed_forward_length", &huge, dir + "/vkllm_ff.gguf");
  patch_key_value("llama.attention.layer_norm_rms_epsilon", &nan, dir + "/vkllm_eps.gguf");
  const uint32_t one = 1;
  patch_key_value("llama.context_length", &one, dir + "/vkllm_ctx.gguf");  // was blamed on a --ctx never given
  patch_key_value("llama.attention.head_count", &huge, dir + "/vkllm_heads.gguf");
  const uint32_t zero = 0;
  patch_key_value("llama.rope.dimension_count", &zero, dir + "/vkllm_rot.gguf");  // ran without RoPE (perplexity 120 for 4.1)
  for (const auto& [file, key] : {std::pair{"vkllm_rot.gguf", "llama.rope.dimension_count"},
                                  std::pair{"vkllm_ff.gguf", "llama.feed_forward_length"},
                                  std::pair{"vkllm_eps.gguf", "llama.attention.layer_norm_rms_epsilon"},
                                  std::pair{"vkllm_ctx.gguf", "llama.context_length"},
                                  std::pair{"vkllm_heads.gguf", "llama.attention.head_count"}}) {
    for (const std::string cmd : {"info", "run -p hi -n 1 --temp 0"}) {
      const Result r = vkllm(cmd + " -m " + dir + "/" + file);
      EXPECT_EQ(r.status, 1) << cmd << " " << file << ": " << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_NE(r.err.find(std::string("key '") + key + "'"), std::string::npos) << r.err;
    }
  }
}

// A RoPE scaling type vkllm does not implement (llama.cpp knows none, linear, yarn and longrope, and
// stops on others) is refused in one line naming the key: run without it, the output would be
// another model's from the first token.
TEST(Cli, UnknownRopeScalingIsRefused) {
  const std::string path = testing::TempDir() + "/vkllm_dynamic.gguf";
  ASSERT_EQ(std::system((std::string(VKLLM_MAKE_MODEL) + " --arch qwen3 --layers 1 --embd 64 --ff 64 --heads 4 --kv-heads 2" +
                         " --rope-scale 4 --rope-scaling dynamic -o " + path + " >/dev/null").c_str()), 0);
  for (const std::string cmd : {"info", "run -p hi -n 1"}) {
    const Result r = vkllm(cmd + " -m " + path);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.err, "vkllm: error: " + path + ": key 'qwen3.rope.scaling.type' is 'dynamic': vkllm implements RoPE scaling " +
                         "'linear', 'yarn' and Phi-3's 'longrope', not 'dynamic'\n");
  }
}

// A block_count lowered by corruption left the other layers' tensors unread and ran a shorter
// model, status 0; as llama.cpp, a file whose tensors the model does not all use is refused.
TEST(Cli, TensorsTheModelDoesNotUseAreRefused) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string path = testing::TempDir() + "/vkllm_blocks.gguf";
  const uint32_t three = 3;
  patch_key_value("llama.block_count", &three, path);
  const Result r = vkllm("run -q -p hi -n 1 --temp 0 -m " + path);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("tensors are not part of a llama model of 3 layers (block_count), the first 'blk.3."), std::string::npos) << r.err;
}

// An error quoting a string from the file stays one line without the file's control bytes (an
// architecture name holding a newline and an escape code printed both raw).
TEST(Cli, ErrorsQuotingTheFileStayOneLine) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  std::ifstream in(model("stories260K.gguf"), std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string key = "general.architecture";
  const size_t at = bytes.find(key) + key.size() + 4;  // past the key and its value type: u64 length, bytes
  uint64_t len;
  std::memcpy(&len, bytes.data() + at, 8);
  const std::string name = "foo\nbar\x1b[31m";
  const uint64_t new_len = name.size();
  bytes.replace(at, 8 + len, std::string(reinterpret_cast<const char*>(&new_len), 8) + name);
  const std::string path = testing::TempDir() + "/vkllm_arch.gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  const Result r = vkllm("info -m " + path);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'foo\\nbar\\x1b[31m'"), std::string::npos) << r.err;
  // Bytes of no UTF-8 sequence are escaped too (a binary file taken for a template was quoted raw);
  // valid multi-byte characters stay as they are.
  const std::string tmpl = testing::TempDir() + "/vkllm_bad_utf8.jinja";
  std::ofstream(tmpl, std::ios::binary) << "caf\xc3\xa9 {{ \x81 }}";
  const Result bad = vkllm("template --chat-template " + tmpl + " --messages /dev/null");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("\\x81"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find('\x81'), std::string::npos) << bad.err;
}

// A directory where a file is read, or a FIFO where a session file is (which would block the open
// until a writer came), is one line naming it and status 1, not an internal error or a hang.
TEST(Cli, DirectoriesAndFifosWhereFilesBelong) {
  const std::string m = " -m " + model("stories260K.gguf");
  const std::string dir = testing::TempDir() + "/vkllm_cli_dir", fifo = testing::TempDir() + "/vkllm_cli_fifo";
  std::filesystem::remove_all(dir);
  std::filesystem::remove(fifo);
  std::filesystem::create_directory(dir);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& args : {"run" + m + " --session " + dir + " -p hi -n 1", "run" + m + " -f " + dir + " -n 1",
                                  "perplexity" + m + " -f " + dir, "tokenize" + m + " -f " + dir,
                                  "chat" + m + " --system-file " + dir, "run" + m + " --session " + fifo + " -p hi -n 1",
                                  "info -m " + fifo, "run -p hi -n 1 -m " + fifo}) {  // (-m a FIFO waited for a writer)
    const Result r = vkllm(args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    EXPECT_TRUE(r.err.starts_with("vkllm: error: ")) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(args.find(fifo) != std::string::npos ? fifo : dir), std::string::npos) << args << ": " << r.err;
  }
  // A pipeline cache that is no regular file is a cold cache, not an internal error (a directory)
  // or a hang (a FIFO).
  for (const bool as_fifo : {false, true}) {
    const std::string cache = dir + "/xdg", bin = cache + "/vkllm/pipelines.bin";
    std::filesystem::remove_all(cache);
    std::filesystem::create_directories(as_fifo ? cache + "/vkllm" : bin);
    if (as_fifo) {
      ASSERT_EQ(mkfifo(bin.c_str(), 0600), 0);
    }
    const std::string cmd = "XDG_CACHE_HOME=" + cache + " timeout 120 " + VKLLM_BINARY + " run -q -n 1" + m + " -p hi </dev/null >/dev/null";
    const int st = std::system(cmd.c_str());
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0) << (as_fifo ? "FIFO" : "directory");
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove(fifo);
}

// An endless text input (a device, a pipe that never ends) stops at 1 GiB with one line naming it,
// status 1, instead of filling the memory.
TEST(Cli, EndlessTextInputsEndInAnError) {
  const std::string m = " -m " + model("stories260K.gguf");
  const Result file = vkllm("run -n 1" + m + " -f /dev/zero");
  EXPECT_EQ(file.status, 1) << file.err;
  EXPECT_TRUE(file.out.empty()) << file.out;
  EXPECT_EQ(std::count(file.err.begin(), file.err.end(), '\n'), 1) << file.err;
  EXPECT_NE(file.err.find("vkllm: error: /dev/zero: the prompt file is longer than 1 GiB"), std::string::npos) << file.err;
  // stdin (the helper above gives every run a file there)
  const std::string err = testing::TempDir() + "/vkllm_cli_endless.txt";
  const int st = std::system(("timeout 120 " + std::string(VKLLM_BINARY) + " run -n 1" + m + " </dev/zero >/dev/null 2>" + err).c_str());
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 1);
  std::ifstream e(err, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_NE(text.find("vkllm: error: stdin: the prompt is longer than 1 GiB"), std::string::npos) << text;
}

// A bad command line (a value of the wrong type, an unknown flag, a missing required option, an
// unknown subcommand, a negative count other than -1) is one "vkllm: error:" line and status 2.
TEST(Cli, ParseErrorsAreOneLineWithStatus2) {
  const std::string m = " -m " + model("stories260K.gguf");
  for (const std::string& args : {"run --temp abc" + m + " -p hi", "run --no-such-flag" + m + " -p hi",
                                  std::string("info"), std::string("no-such-command"), "run -n -5" + m + " -p hi",
                                  "chat -n -2" + m, "run -n lots" + m + " -p hi", "run --keep -2" + m + " -p hi", "run --seed -5" + m + " -p hi", "run --logprobs" + m + " -p hi",
                                  "run --json --top-logprobs 2" + m + " -p hi", "run --json --logprobs --top-logprobs 21" + m + " -p hi",
                                  "run --top-p -0.1" + m + " -p hi", "run --min-p 2" + m + " -p hi", "run --session ''" + m + " -p hi",
                                  "run --seed 18446744073709551616" + m + " -p hi",
                                  "info --seqs 0" + m, std::string("bench --ops --parallel 4"), "bench --ops" + m,
                                  std::string("bench --ops --ctx-fill 0,64"), "bench --ops-size 512" + m,
                                  "run --system sys" + m + " -p hi", "run --chat-template chatml" + m + " -p hi",
                                  // sampling values out of range (were status 1, after the model loaded), a --ctx past
                                  // 2^24 (wrapped the memory hint), a second word after --stop (was a second string)
                                  "run --temp nan" + m + " -p hi", "run --repeat-last-n -2" + m + " -p hi",
                                  "run --ctx 4294967295" + m + " -p hi", "run --stop x y" + m + " -p hi",
                                  std::string("template --chat-template chatml --date 2024-13-45 --messages /dev/null"),
                                  // a hex count (CLI11 read 0x10 as 16 and 010 as 8), a size that is NaN (was taken), a
                                  // --ctx of one token, a perplexity chunk under 4 and a fill past --ctx (were status 1)
                                  "run -n 0x10" + m + " -p hi", "run --prompt-cache-size nan --prompt-cache /tmp" + m + " -p hi",
                                  "run --ctx 1" + m + " -p hi", "perplexity --ctx 2 -f /dev/null" + m,
                                  "bench -p 8 -n 8 -r 1 --ctx 64 --ctx-fill 100" + m,
                                  // an unknown word one level down (CLI11 said "A subcommand is required"), a
                                  // --keep chunked perplexity has no ring for (was ignored)
                                  std::string("cache bogus"), "perplexity --keep 3 -f /dev/null" + m,
                                  // bench's own command-line errors (were status 1), a --ubatch out of range (was taken)
                                  std::string("bench"), std::string("bench --ops --ops-types q9_9"), "bench -p 0 -n 0" + m,
                                  "bench --ubatch 0" + m, "bench -p 16 -n 4294967295 -r 1" + m, "bench -p 16 -n 4 --ctx-fill 4294967295" + m,
                                  "serve --allow-origin http://ui.example/app" + m, "serve --allow-origin http://ui.example:99999" + m}) {
    const Result r = vkllm(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    EXPECT_TRUE(r.err.starts_with("vkllm: error: ")) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  EXPECT_NE(vkllm("run --temp abc" + m + " -p hi").err.find("--temp"), std::string::npos);
  // Zero-padded counts are decimal (a script's printf %03d), as llama.cpp reads them.
  const Result padded = vkllm("run --json -q --temp 0 --ignore-eos -n 010 --ctx 0064" + m + " -p hi");
  ASSERT_EQ(padded.status, 0) << padded.err;
  EXPECT_EQ(json::parse(padded.out)["generated_tokens"], 10);
  EXPECT_EQ(json::parse(padded.out)["kv_capacity"], 64);
  const Result minus5 = vkllm("run -n -5" + m + " -p hi");
  EXPECT_NE(minus5.err.find("-5 is not a token count"), std::string::npos) << minus5.err;
  EXPECT_NE(vkllm("no-such-command").err.find("unknown command 'no-such-command'"), std::string::npos);
  EXPECT_NE(vkllm("cache bogus").err.find("unknown command 'cache bogus'"), std::string::npos);
  EXPECT_NE(vkllm("run --repeat-last-n -2" + m + " -p hi").err.find("repeat_last_n = -2 is out of range"), std::string::npos);
  // --help is not an error.
  const Result help = vkllm("run --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("-1: endless"), std::string::npos) << help.out;
}

// run --special parses special-token text in a raw prompt, as tokenize --special does (and
// llama-cli); without it the text stays text, as in the references.
TEST(Cli, RunSpecialParsesSpecialTokenText) {
  VKLLM_REQUIRE_SHARED("models/synth-qwen2-q4_0.gguf");
  const std::string m = " -m " + model("synth-qwen2-q4_0.gguf") + " -p 'hi<｜end▁of▁sentence｜>'";
  const Result plain = vkllm("run -q -n 1 --json" + m), special = vkllm("run -q -n 1 --json --special" + m),
               count = vkllm("tokenize --special --count" + m);
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(special.status, 0) << special.err;
  ASSERT_EQ(count.status, 0) << count.err;
  EXPECT_EQ(json::parse(special.out)["prompt_tokens"].get<int>(), std::stoi(count.out));
  EXPECT_GT(json::parse(plain.out)["prompt_tokens"].get<int>(), json::parse(special.out)["prompt_tokens"].get<int>());
}

// --version on any subcommand prints the version to stdout with status 0, as every llama.cpp tool
// takes it; a --version that is an option's value stays that value.
TEST(Cli, EverySubcommandTakesVersion) {
  const Result top = vkllm("--version");
  ASSERT_EQ(top.status, 0) << top.err;
  ASSERT_TRUE(top.out.starts_with("vkllm ")) << top.out;
  for (const char* sub : {"run", "chat", "serve", "perplexity", "bench", "info", "tokenize", "template", "devices", "cache", "cache list", "cache clear"}) {
    const Result r = vkllm(std::string(sub) + " --version");
    EXPECT_EQ(r.status, 0) << sub << ": " << r.err;
    EXPECT_EQ(r.out, top.out) << sub;
  }
  const Result value = vkllm("tokenize -m /nonexistent.gguf -p --version");
  EXPECT_NE(value.status, 0);
  EXPECT_EQ(value.out, "");
  EXPECT_NE(value.err.find("/nonexistent.gguf"), std::string::npos) << value.err;
}

// A "<s>" parsed under --special after the BOS the model adds is two BOS tokens: run and tokenize
// warn of it as llama.cpp does (on stderr; -q silences run's), and do not when there is one.
TEST(Cli, TwoBosTokensAreWarnedOf) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = " -m " + model("stories260K.gguf");
  const Result run = vkllm("run -n 1 --temp 0 --special" + m + " -p '<s>Once'"), quiet = vkllm("run -q -n 1 --special" + m + " -p '<s>Once'"),
               tok = vkllm("tokenize --special" + m + " -p '<s>Once'"), once = vkllm("tokenize --special --no-bos" + m + " -p '<s>Once'"),
               plain = vkllm("run -n 1 --temp 0" + m + " -p '<s>Once'");
  for (const Result* r : {&run, &quiet, &tok, &once, &plain}) ASSERT_EQ(r->status, 0) << r->err;
  EXPECT_NE(run.err.find("two BOS tokens"), std::string::npos) << run.err;
  EXPECT_EQ(quiet.err.find("two BOS tokens"), std::string::npos) << quiet.err;
  EXPECT_TRUE(tok.out.starts_with("1 1 ")) << tok.out;
  EXPECT_NE(tok.err.find("two BOS tokens"), std::string::npos) << tok.err;
  EXPECT_TRUE(once.out.starts_with("1 ") && !once.out.starts_with("1 1 ")) << once.out;
  EXPECT_EQ(once.err.find("two BOS tokens"), std::string::npos) << once.err;
  EXPECT_EQ(plain.err.find("two BOS tokens"), std::string::npos) << plain.err;  // "<s>" stays text
}

// A system prompt on a template with no system role (Gemma 2's raises on one) begins the user's
// message, as in llama.cpp; `vkllm template` renders as Hugging Face does unless asked.
TEST(Cli, SystemPromptOnATemplateWithoutSystemRole) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("templates/unrendered/google-gemma-2-2b-it.jinja");
  const std::string t = " --chat-template " + shared_path("templates/unrendered/google-gemma-2-2b-it.jinja");
  const std::string m = " -m " + model("stories260K.gguf") + t;
  const Result with = vkllm("run -q -n 6 --temp 0 --json --chat --system 'Tell a story'" + m + " -p 'Once upon a time'");
  const std::string prompt = testing::TempDir() + "/vkllm_cli_system_prompt.txt";
  std::ofstream(prompt) << "Tell a story\nOnce upon a time";
  const Result joined = vkllm("run -q -n 6 --temp 0 --json --chat" + m + " -f " + prompt);
  ASSERT_EQ(with.status, 0) << with.err;
  ASSERT_EQ(joined.status, 0) << joined.err;
  EXPECT_EQ(json::parse(with.out)["tokens"], json::parse(joined.out)["tokens"]);
  EXPECT_EQ(json::parse(with.out)["prompt_tokens"], json::parse(joined.out)["prompt_tokens"]);
  const std::string messages = testing::TempDir() + "/vkllm_cli_system.json";
  std::ofstream(messages) << R"([{"role":"system","content":"S"},{"role":"user","content":"U"}])";
  const Result hf = vkllm("template --bos '<bos>' --messages " + messages + t);
  EXPECT_EQ(hf.status, 1) << hf.out;
  EXPECT_NE(hf.err.find("System role not supported"), std::string::npos) << hf.err;
  const Result folded = vkllm("template --bos '<bos>' --system-into-user --messages " + messages + t);
  EXPECT_EQ(folded.status, 0) << folded.err;
  EXPECT_EQ(folded.out, "<bos><start_of_turn>user\nS\nU<end_of_turn>\n<start_of_turn>model\n");
}

// A resumed session samples with its saved sampler, but for the sampling flags given: `--temp 0`
// on a session saved at 0.8 gives greedy tokens (it went on sampling at 0.8, with a note).
TEST(Cli, SamplingFlagsGivenOverrideAResumedSession) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = " -m " + model("stories260K.gguf");
  const std::string session = testing::TempDir() + "/vkllm_cli_resume_temp.vkv";
  std::filesystem::remove(session);
  ASSERT_EQ(vkllm("run -q -n 4 --seed 7 -p 'Once upon'" + m + " --session " + session).status, 0);
  const Result greedy = vkllm("run -n 16 --temp 0 --json --logprobs --top-logprobs 1" + m + " --session " + session);
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  EXPECT_NE(greedy.err.find("--temp as given; the other sampling settings and the RNG go on from the file"), std::string::npos) << greedy.err;
  const json j = json::parse(greedy.out);
  ASSERT_EQ(j["tokens"].size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(j["tokens"][i], j["top_logprobs"][i][0]["token"]) << "token " << i;
  // Saved with it: the next resume without flags is greedy too, and says nothing of sampling.
  const Result again = vkllm("run -n 4 --json --logprobs --top-logprobs 1" + m + " --session " + session);
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.err.find("as given"), std::string::npos) << again.err;
  const json k = json::parse(again.out);
  ASSERT_EQ(k["tokens"].size(), 4u);
  for (size_t i = 0; i < k["tokens"].size(); ++i) EXPECT_EQ(k["tokens"][i], k["top_logprobs"][i][0]["token"]) << "token " << i;
  std::filesystem::remove(session);
}

// A context past the device's grid height (65,535 workgroup rows on lavapipe): the RoPE table of
// its positions is filled in several dispatches (it was an internal error).
TEST(Cli, ContextsPastTheGridHeightRun) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = " -m " + model("stories260K.gguf") + " --temp 0 -n 8 --json -p 'Once upon a time'";
  const Result big = vkllm("run --ctx 140000" + m);
  ASSERT_EQ(big.status, 0) << big.err;
  const Result small = vkllm("run --ctx 256" + m);
  ASSERT_EQ(small.status, 0) << small.err;
  EXPECT_EQ(json::parse(big.out)["tokens"], json::parse(small.out)["tokens"]);
}

// Without -n, a run stops at end of generation or when the cache is first full (it would hang
// otherwise on a model that never ends); -n N and -n -1 go on through the ring.
TEST(Cli, RunStopsWhenTheCacheIsFull) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string base = "run -q --json --temp 0 --ignore-eos --ctx 64 -m " + model("stories260K.gguf") + " -p 'Once upon a time'";
  const Result full = vkllm(base);
  ASSERT_EQ(full.status, 0) << full.err;
  const json f = json::parse(full.out);
  EXPECT_EQ(f["stop_reason"], "context full");
  EXPECT_EQ(f["kv_tokens_used"], 64);
  EXPECT_EQ(f["kv_evicted"], 0);
  EXPECT_EQ(f["generated_tokens"].get<int>() + f["prompt_tokens"].get<int>(), 64);
  const Result counted = vkllm(base + " -n 80");
  ASSERT_EQ(counted.status, 0) << counted.err;
  const json c = json::parse(counted.out);
  EXPECT_EQ(c["stop_reason"], "length");
  EXPECT_EQ(c["generated_tokens"], 80);
  EXPECT_GT(c["kv_evicted"].get<int>(), 0);
  // -n -1 is endless: it goes past the full cache and ends only at the stop string, which this
  // greedy story reaches about 110 tokens in (`timeout` keeps a regression from hanging the test).
  const Result endless = vkllm("--version >/dev/null && timeout 120 " + std::string(VKLLM_BINARY) + " " + base + " -n -1 --stop sorry");
  ASSERT_EQ(endless.status, 0) << endless.err;
  const json e = json::parse(endless.out);
  EXPECT_EQ(e["stop_reason"], "stop string");
  EXPECT_GT(e["kv_evicted"].get<int>(), 0);
  // A prompt that fills the cache leaves nothing to generate: refused without -n (it printed
  // nothing with status 0); with -n the ring runs through it, and a warning says so.
  const std::string longer = "run -q --temp 0 --ctx 16 -m " + model("stories260K.gguf") +
                             " -p 'Once upon a time there was a little girl named Lily. She loved to play outside in the park'";
  const Result refused = vkllm(longer);
  EXPECT_EQ(refused.status, 1) << refused.err;
  EXPECT_TRUE(refused.out.empty()) << refused.out;
  EXPECT_NE(refused.err.find("holds no more: nothing would be generated"), std::string::npos) << refused.err;
  const Result through = vkllm(longer + " -n 4 --json");
  ASSERT_EQ(through.status, 0) << through.err;
  EXPECT_EQ(json::parse(through.out)["generated_tokens"], 4);
  EXPECT_NE(through.err.find("warning: the prompt is"), std::string::npos) << through.err;
  // A --ctx past the trained context (stories260K's 2,048) is warned of, as llama.cpp does.
  const Result past = vkllm("run --temp 0 -n 1 --ctx 4096 -p hi -m " + model("stories260K.gguf"));
  ASSERT_EQ(past.status, 0) << past.err;
  EXPECT_NE(past.err.find("vkllm: warning: --ctx 4,096 is more than the 2,048 tokens the model was trained on"), std::string::npos)
      << past.err;
  EXPECT_EQ(vkllm("run --temp 0 -n 1 --ctx 2048 -p hi -m " + model("stories260K.gguf")).err.find("trained on"), std::string::npos);
}

// `vkllm run --temp 0 -n 64` reproduces the reference greedy tokens up to the decided prefix.
// Every case's greedy tokens are checked through the engine in test_engine_reference; here the
// whole binary runs the cases with short prompts (every stories260K and sy-1 case) plus one
// long-prompt case per architecture, which keeps this test inside the CI budget on lavapipe.
TEST(Cli, RunGreedyMatchesReferences) {
  VKLLM_REQUIRE_SHARED("reference/index.json");
  std::ifstream idx_in(shared_path("reference/index.json"));
  const json index = json::parse(idx_in);
  for (const auto& [id, entry] : index.items()) {
    const bool long_prompt = id.ends_with("sy-2");
    if (long_prompt && id != "synth-llama-q4_k_m--sy-2" && id != "synth-qwen2-q8_0--sy-2") continue;
    std::ifstream in(shared_path("reference/" + id + ".json"));
    const json ref = json::parse(in);
    const std::string prompt = shared_path("reference/prompts/" + ref["prompt_id"].get<std::string>() + ".txt");
    const int decided = entry["decided_prefix"].get<int>();
    const Result r = vkllm("run --json -q --temp 0 -n 64 --ignore-eos -m " + model(ref["model_file"]) + " -f " + prompt);
    ASSERT_EQ(r.status, 0) << id << ": " << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["prompt_tokens"].get<size_t>(), ref["prompt_tokens"].size()) << id;
    const std::vector<int> got = out["tokens"].get<std::vector<int>>(), want = ref["greedy"].get<std::vector<int>>();
    ASSERT_GE(got.size(), size_t(decided)) << id;
    for (int s = 0; s < decided; ++s) ASSERT_EQ(got[s], want[s]) << id << " step " << s;
  }
}

// Architectures added after the first round (tests/data/arch, made by scripts/make-arch-refs.sh
// from upstream llama.cpp): the test rebuilds each synthetic model with the same make_model
// arguments, and `vkllm run --temp 0` must tokenize the prompt as llama.cpp did and reproduce
// its greedy tokens, and their log-probabilities, up to the case's decided prefix.
TEST(Cli, NewArchitecturesMatchLlamaCpp) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");  // make_model's default vocabulary
  const std::string dir = VKLLM_TEST_DATA "/arch";
  int n_cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const json ref = json::parse(in);
    const std::string id = ref["case"], gguf = testing::TempDir() + "/" + id + ".gguf";
    SCOPED_TRACE(id);
    std::string args = ref["make_model"].get<std::string>();
    for (size_t at; (at = args.find("@shared")) != std::string::npos;) args.replace(at, 7, shared_path(""));
    const std::string make = std::string(VKLLM_MAKE_MODEL) + " " + args + " -o " + gguf + " >/dev/null";
    ASSERT_EQ(std::system(make.c_str()), 0) << make;
    const std::string prompt = shared_path("reference/prompts/" + ref["prompt_id"].get<std::string>() + ".txt");
    const int decided = ref["decided_prefix"].get<int>();
    const int n = int(ref["greedy"].size());
    const Result r = vkllm("run --json -q --temp 0 --ignore-eos --logprobs -n " + std::to_string(n) + " -m " + gguf + " -f " + prompt);
    ASSERT_EQ(r.status, 0) << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["prompt_tokens"].get<size_t>(), ref["prompt_tokens"].size());
    const std::vector<int> got = out["tokens"].get<std::vector<int>>(), want = ref["greedy"].get<std::vector<int>>();
    ASSERT_GE(got.size(), size_t(decided));
    for (int s = 0; s < decided; ++s) ASSERT_EQ(got[s], want[s]) << "step " << s << " of " << decided << " decided";
    // The chosen tokens' log-probabilities: f32 weights agree closely; with quantized weights
    // llama.cpp's CPU backend also quantizes the activations (measured: ≤ 0.28 at logits of
    // standard deviation 40), so half the decided threshold.
    const std::vector<float> lp = out["logprobs"].get<std::vector<float>>(), want_lp = ref["top1_logprob"].get<std::vector<float>>();
    const float tol = ref["decided_threshold"].get<float>() < 0.1f ? 0.02f : 0.5f;
    for (int s = 0; s < decided; ++s) EXPECT_NEAR(lp[s], want_lp[s], tol) << "step " << s;
    std::filesystem::remove(gguf);
    ++n_cases;
  }
  EXPECT_GE(n_cases, 18) << "cases in " << dir;
}

// Generation under a GBNF grammar (tests/data/grammar, made by scripts/make-grammar-refs.mjs from
// upstream llama.cpp): the greedy tokens and where they stop (llama.cpp allows end of generation
// once the grammar is complete), on stories260K's SentencePiece vocabulary (characters past ASCII
// spelled in byte tokens) and on Qwen2's BPE vocabulary of 151,936 tokens.
TEST(Cli, GrammarGreedyTokensMatchLlamaCpp) {
  const std::string dir = VKLLM_TEST_DATA "/grammar";
  int n_cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const json ref = json::parse(in);
    const std::string model = "models/" + ref["model"].get<std::string>();
    SCOPED_TRACE(entry.path().filename().string());
    VKLLM_REQUIRE_SHARED(model);
    const Result r = vkllm("run --json -q --temp 0 -n " + std::to_string(ref["n_predict"].get<int>()) + " -m " + shared_path(model) +
                               " --grammar-file " + dir + "/" + ref["grammar"].get<std::string>(),
                           ref["prompt"].get<std::string>());
    ASSERT_EQ(r.status, 0) << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["prompt_tokens"].get<size_t>(), ref["prompt_tokens"].size());
    EXPECT_EQ(out["tokens"], ref["tokens"]);
    EXPECT_EQ(out["stop_reason"], ref["stop_reason"]);
    EXPECT_EQ(out["text"], ref["text"]);
    ++n_cases;
  }
  EXPECT_GE(n_cases, 6) << "cases in " << dir;
}

// llama.cpp's DRY and XTC samplers, greedy (tests/data/samplers, made by
// scripts/make-sampler-refs.mjs through ../shared/anchor): the tokens up to the first step whose two
// best tokens llama.cpp scored within 0.005 in log-probability (`compare`) are upstream's, and each
// case's sampler changed them (plain greedy decoding gives other tokens within that stretch).
TEST(Cli, SamplersMatchLlamaCpp) {
  const std::string dir = VKLLM_TEST_DATA "/samplers";
  int n_cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const json ref = json::parse(in);
    const std::string model = "models/" + ref["model"].get<std::string>();
    SCOPED_TRACE(entry.path().filename().string());
    VKLLM_REQUIRE_SHARED(model);
    std::string flags;
    for (const json& f : ref["flags"]) flags += " '" + f.get<std::string>() + "'";
    const std::string base = "run --json -q --temp 0 --ignore-eos -n " + std::to_string(ref["n_predict"].get<int>()) + " -m " +
                             shared_path(model);
    const Result r = vkllm(base + flags, ref["prompt"].get<std::string>());
    const Result plain = vkllm(base, ref["prompt"].get<std::string>());
    ASSERT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(plain.status, 0) << plain.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["prompt_tokens"].get<size_t>(), ref["prompt_tokens"].size());
    const size_t n = ref["compare"].get<size_t>();
    EXPECT_GE(n, 80u) << "a case whose comparable stretch is this short says little";
    const auto first = [n](const json& tokens) {
      const std::vector<int> t = tokens.get<std::vector<int>>();
      return std::vector<int>(t.begin(), t.begin() + std::ptrdiff_t(std::min(n, t.size())));
    };
    EXPECT_EQ(first(out["tokens"]), first(ref["tokens"]));
    EXPECT_NE(first(json::parse(plain.out)["tokens"]), first(ref["tokens"])) << "the sampler changed nothing here";
    ++n_cases;
  }
  EXPECT_GE(n_cases, 4) << "cases in " << dir;
}

// A grammar is read and checked before the model loads (a model path that does not exist is not
// reached); its errors are one line naming the flag or the file, the line and the column.
TEST(Cli, GrammarErrorsComeBeforeTheModelLoads) {
  const std::string missing_model = testing::TempDir() + "/no-such-model.gguf";
  Result r = vkllm("run -m " + missing_model + " -p hi --grammar 'root ::= \"a\" foo'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "vkllm: error: grammar --grammar: line 1, column 14: rule 'foo' is used but never defined\n");
  const std::string file = testing::TempDir() + "/left.gbnf";
  std::ofstream(file) << "root ::= list\nlist ::= list \",\" item | item\nitem ::= [a-z]+\n";
  r = vkllm("run -m " + missing_model + " -p hi --grammar-file " + file);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "vkllm: error: grammar " + file +
                       ": line 2, column 1: rule 'list' is left-recursive: it can reach itself before reading a character, with more to "
                       "read after it (write it with a repetition, as item*)\n");
  r = vkllm("run -m " + missing_model + " -p hi --grammar-file " + file + ".missing");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(file + ".missing"), std::string::npos) << r.err;
  r = vkllm("run -m " + missing_model + " -p hi --grammar-file " + file + " --grammar 'root ::= \"a\"'");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
  // JSON schemas: a keyword the grammar cannot hold, JSON that is not, two grammars at once.
  r = vkllm("run -m " + missing_model + " -p hi -j '{\"type\": \"integer\", \"minimum\": 0}'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "vkllm: error: --json-schema: JSON schema: 'minimum' is not supported: the reply could not be held to it (docs/sampling.md, \"JSON schemas\")\n");
  const std::string schema_file = testing::TempDir() + "/schema.json";
  std::ofstream(schema_file) << "{\"type\": ";
  r = vkllm("run -m " + missing_model + " -p hi -jf " + schema_file);  // llama.cpp's spelling of --json-schema-file
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(schema_file + ": not JSON: "), std::string::npos) << r.err;
  r = vkllm("run -m " + missing_model + " -p hi -j '{}' --grammar-file " + file);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
}

// -l/--logit-bias as llama.cpp's: a banned greedy token gives way to the runner-up, +100 makes a
// token every step's choice; malformed values and ids outside the vocabulary are one line each.
TEST(Cli, LogitBiasBansAndFavoursTokens) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string run = "run --json -q --temp 0 -n 4 -m " + shared_path("models/stories260K.gguf");
  Result r = vkllm(run + " --logprobs --top-logprobs 2", "Once upon a time");
  ASSERT_EQ(r.status, 0) << r.err;
  const json plain = json::parse(r.out);
  const int first = plain["tokens"][0], second = plain["top_logprobs"][0][1]["token"];
  r = vkllm(run + " -l " + std::to_string(first) + "-inf", "Once upon a time");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["tokens"][0], second);
  r = vkllm(run + " --logit-bias 100+100", "Once upon a time");
  EXPECT_EQ(json::parse(r.out)["tokens"], json::array({100, 100, 100, 100}));
  r = vkllm(run + " -l 512+1", "x");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "vkllm: error: --logit-bias 512+1: token 512 is outside the vocabulary of 512 tokens\n");
  r = vkllm(run + " -l 5", "x");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "vkllm: error: --logit-bias 5: expecting TOKEN_ID+BIAS or TOKEN_ID-BIAS (as 15043+1 or 2-inf)\n");
}

// -j: the reply is JSON the schema accepts, ended by the grammar (end of generation once the
// object is closed), its properties in the schema's order.
TEST(Cli, JsonSchemaShapesTheReply) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const Result r = vkllm("run --json -q --temp 0.7 --seed 7 -n 400 -m " + shared_path("models/stories260K.gguf") +
                             " -j '{\"type\": \"object\", \"properties\": {\"who\": {\"type\": \"string\", \"maxLength\": 8}, "
                             "\"mood\": {\"enum\": [\"happy\", \"sad\"]}, \"age\": {\"type\": \"integer\"}}, \"required\": [\"who\", \"mood\", \"age\"]}'",
                         "Once upon a time");
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  ASSERT_EQ(out["stop_reason"], "eos") << out.dump();
  const nlohmann::ordered_json reply = nlohmann::ordered_json::parse(out["text"].get<std::string>());
  ASSERT_EQ(reply.size(), 3u) << reply.dump();
  EXPECT_EQ(reply.begin().key(), "who");
  EXPECT_LE(reply["who"].get<std::string>().size(), 8u);
  EXPECT_TRUE(reply["mood"] == "happy" || reply["mood"] == "sad") << reply.dump();
  EXPECT_TRUE(reply["age"].is_number_integer()) << reply.dump();
}

// A prompt's tokens give the same floats however it is cut into chunks (--ubatch) or reused from
// the prompt cache, across the attention kernels' switch at 256 slots (each query takes the
// kernel it would alone): on a Q4_0 model, whose 9-bit x magnifies a last-bit difference, a chunk
// that reached 256 slots moved log-probabilities by 0.04 and the greedy text within 46 tokens.
TEST(Cli, PromptChunksGiveWhatTokensAloneGive) {
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  VKLLM_REQUIRE_SHARED("reference/prompts/sy-2.txt");
  std::ifstream in(shared_path("reference/prompts/sy-2.txt"), std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string dir = testing::TempDir() + "/chunks", half = dir + "/half.txt", third = dir + "/third.txt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(half, std::ios::binary) << text.substr(0, text.size() / 2);
  std::ofstream(third, std::ios::binary) << text.substr(0, text.size() / 3);
  const std::string run = "run --json -q --temp 0 --ignore-eos --logprobs -n 24 -m " + shared_path("models/synth-llama-q4_0.gguf");
  const auto logprobs = [&](const std::string& args) {
    const Result r = vkllm(run + " " + args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
    const json j = json::parse(r.out, nullptr, false);
    return j.is_discarded() ? json() : json{j["tokens"], j["logprobs"], j["prompt_tokens"], j["cached_tokens"]};
  };
  const json whole = logprobs("--ubatch 64 -f " + half);
  ASSERT_GT(whole[2].get<int>(), 300) << "the prompt must pass 256 slots";
  for (const std::string ubatch : {"1", "7", "300"}) EXPECT_EQ(logprobs("--ubatch " + ubatch + " -f " + half), whole) << "--ubatch " << ubatch;
  // The third's prefix from the half's prompt-cache entry (all of it but its last token reused).
  const json cold = logprobs("-f " + third);
  ASSERT_EQ(logprobs("--prompt-cache " + dir + "/pc -f " + half)[3], 0);
  const json warm = logprobs("--prompt-cache " + dir + "/pc -f " + third);
  EXPECT_EQ(warm[3].get<int>(), cold[2].get<int>() - 1);
  EXPECT_EQ(warm[0], cold[0]);
  EXPECT_EQ(warm[1], cold[1]);
  std::filesystem::remove_all(dir);
}

// --top-logprobs: each step's most likely tokens, most likely first; greedy, the first is the
// token taken, with its log-probability; their texts are the tokens' own.
TEST(Cli, TopLogprobsLeadWithTheGreedyToken) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const Result r = vkllm("run --json -q --temp 0 --logprobs --top-logprobs 5 -n 6 -m " + model("stories260K.gguf") + " -p 'Once upon a time'");
  ASSERT_EQ(r.status, 0) << r.err;
  const json out = json::parse(r.out);
  ASSERT_EQ(out["top_logprobs"].size(), 6u) << r.out;
  std::string text;
  for (size_t i = 0; i < 6; ++i) {
    const json& top = out["top_logprobs"][i];
    ASSERT_EQ(top.size(), 5u);
    EXPECT_EQ(top[0]["token"], out["tokens"][i]);
    EXPECT_EQ(top[0]["logprob"].get<float>(), out["logprobs"][i].get<float>());
    for (size_t k = 1; k < 5; ++k) EXPECT_GE(top[k - 1]["logprob"].get<float>(), top[k]["logprob"].get<float>());
    text += top[0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, out["text"].get<std::string>());
}

// A saved session on a qwen3 model continues exactly where the uninterrupted run goes.
TEST(Cli, Qwen3SessionContinuesExactly) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = testing::TempDir(), gguf = dir + "/qwen3-session.gguf", session = dir + "/qwen3.session";
  const std::string make = std::string(VKLLM_MAKE_MODEL) +
                           " --arch qwen3 --layers 2 --embd 256 --ff 512 --heads 8 --kv-heads 2 --head-dim 64 --type q8_0"
                           " --logit-scale 12 --seed 2 -o " + gguf + " >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  expect_session_continues("run --json -q --temp 0 --ignore-eos -m " + gguf, " -p 'Once upon a time'", 8, session);
  std::filesystem::remove(gguf);
}

// info on a gemma3 with a 16-token window (5 window layers, 1 global): it names the
// architecture and the window, and the KV table is the sum over the layers (the window layers'
// rings of window + one 512-token chunk, the global layer the whole context).
TEST(Cli, InfoSumsGemma3LayersKv) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string gguf = testing::TempDir() + "/gemma3-info.gguf";
  make_gemma3_window_model(gguf);
  if (HasFatalFailure()) return;
  const Result r = vkllm("info --json --ctx 4096 -m " + gguf);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["architecture"], "gemma3");
  EXPECT_EQ(j["sliding_window"]["window"], 16);
  EXPECT_EQ(j["sliding_window"]["window_layers"], 5);
  const json& kv = j["kv_cache"];
  EXPECT_EQ(kv["window_ring_slots"], 16 + 512);
  const uint64_t layer_row = 2 * 2 * 64 * 2;  // K and V, 2 KV heads × head dim 64, f16
  EXPECT_EQ(kv["types"]["f16"]["bytes_per_token"].get<uint64_t>(), 6 * layer_row);
  EXPECT_EQ(kv["types"]["f16"]["bytes_per_seq"].get<uint64_t>(), (5 * 528 + 4096) * layer_row);
  // A CPU driver's 64-token chunks size the rings as `run` allocates them there: --ubatch 64.
  const Result cpu = vkllm("info --json --ctx 600 --ubatch 64 -m " + gguf);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  const json cpu_info = json::parse(cpu.out);
  const json& cpu_kv = cpu_info["kv_cache"];
  EXPECT_EQ(cpu_kv["window_ring_slots"], 16 + 64);
  EXPECT_EQ(cpu_kv["types"]["f16"]["bytes_per_seq"].get<uint64_t>(), (5 * 80 + 600) * layer_row);
  const Result text = vkllm("info -m " + gguf);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("sliding window of 16 tokens on 5 of 6 layers"), std::string::npos) << text.out;
  std::filesystem::remove(gguf);
}

// gemma3 with a 16-token window: perplexity streams through a ring of 64 slots past its capacity;
// a long prompt gives the same tokens and log-probabilities whatever the prefill chunk, with the
// window layers in the global slots or in rings of their own; a saved session continues exactly
// past the window, with rings the prompt wraps.
TEST(Cli, Gemma3WindowStreamsAndResumes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = testing::TempDir(), gguf = dir + "/gemma3-window.gguf", session = dir + "/gemma3.session";
  make_gemma3_window_model(gguf);
  if (HasFatalFailure()) return;
  const std::string text = shared_path("reference/prompts/sy-2.txt");
  // Streamed past a ring of 64 slots, with the window layers in the global slots (--ubatch 512)
  // and in rings of 24 slots (--ubatch 8): the same text, the same perplexity.
  double ppl[2];
  for (int i = 0; i < 2; ++i) {
    const Result r = vkllm("perplexity --json -q --stream --ctx 64 --ubatch " + std::string(i ? "8" : "512") + " -m " + gguf + " -f " + text);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["kv_evicted"].get<int>(), 612);
    ppl[i] = json::parse(r.out)["perplexity"].get<double>();
    EXPECT_TRUE(std::isfinite(ppl[i]));
  }
  EXPECT_NEAR(ppl[1], ppl[0], 1e-4 * ppl[0]);
  // An explicit --keep past what the rings allow (64 − 24 = 40) is refused by every command, as by
  // run (perplexity --stream, the chat and the server shortened it to 40 without a word).
  for (const std::string& cmd : {"perplexity --stream -f " + text, std::string("chat"), std::string("run -p hi -n 1")}) {
    const Result r = vkllm(cmd + " -q --ctx 64 --ubatch 8 --keep 41 -m " + gguf);
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("--keep 41 is too long: this model's sliding-window layers keep 24 slots, so at most 40"), std::string::npos)
        << cmd << ": " << r.err;
  }

  // --ctx 1024: --ubatch 1024 keeps every layer's rows in the global slots (the window layers
  // read a suffix of the list); 512 and 7 give the window layers rings of 528 and 23 slots.
  json chunked[3];
  const char* ubatch[3] = {"1024", "512", "7"};
  for (int i = 0; i < 3; ++i) {
    const Result r = vkllm("run --json -q --temp 0 --ignore-eos --logprobs -n 8 --ctx 1024 --ubatch " + std::string(ubatch[i]) +
                           " -m " + gguf + " -f " + text);
    ASSERT_EQ(r.status, 0) << r.err;
    chunked[i] = json::parse(r.out);
  }
  const std::vector<float> lp0 = chunked[0]["logprobs"].get<std::vector<float>>();
  for (int i = 1; i < 3; ++i) {
    SCOPED_TRACE(std::string("--ubatch ") + ubatch[i]);
    EXPECT_EQ(chunked[i]["tokens"], chunked[0]["tokens"]);
    const std::vector<float> lp = chunked[i]["logprobs"].get<std::vector<float>>();
    ASSERT_EQ(lp.size(), lp0.size());
    for (size_t s = 0; s < lp0.size(); ++s) EXPECT_NEAR(lp[s], lp0[s], 1e-3) << "step " << s;
  }

  // --ubatch 4: rings of 20 slots, which the prompt and the replies wrap; the session file has
  // zeros for the window rows the rings had dropped.
  expect_session_continues("run --json -q --temp 0 --ignore-eos --ubatch 4 -m " + gguf,
                           " -p 'Once upon a time, in a small village by the sea, there lived a girl who loved boats'", 12, session);
  std::filesystem::remove(gguf);
}

// The prompt cache on a gemma3 whose window layers keep rings of 20 slots (--ubatch 4): a whole
// stored prompt is reused and gives the same tokens; a prompt sharing only part of a stored one
// is prefilled afresh, with a warning naming --swa-full; with --swa-full that part is reused.
TEST(Cli, Gemma3PromptCacheWithWindowRings) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = testing::TempDir(), gguf = dir + "/gemma3-pc.gguf", pc = dir + "/gemma3-pc";
  make_gemma3_window_model(gguf);
  if (HasFatalFailure()) return;
  std::filesystem::remove_all(pc);
  const std::string manual = "Once upon a time there was a little boat. The boat liked the sea and the wind and the sun. ";
  auto run = [&](const std::string& question, const std::string& extra) {
    const Result r = vkllm("run --json -q --temp 0 --ignore-eos -n 6 --ubatch 4 " + extra + " -m " + gguf + " -p '" + manual +
                           question + "'");
    EXPECT_EQ(r.status, 0) << r.err;
    return std::pair(json::parse(r.out), r.err);
  };
  const auto fresh = run("Who was happy?", "");
  const auto first = run("Who was happy?", "--prompt-cache " + pc);
  const auto again = run("Who was happy?", "--prompt-cache " + pc);
  EXPECT_EQ(first.first["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(again.first["cached_tokens"].get<int>(), again.first["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(again.first["tokens"], fresh.first["tokens"]);
  EXPECT_EQ(first.first["tokens"], fresh.first["tokens"]);
  // Another question: the manual is shared, but the rings kept only the stored prompt's end.
  const auto other = run("Who was sad?", "--prompt-cache " + pc);
  EXPECT_EQ(other.first["cached_tokens"].get<int>(), 0);
  EXPECT_NE(other.second.find("--swa-full"), std::string::npos) << other.second;
  EXPECT_EQ(other.first["tokens"], run("Who was sad?", "").first["tokens"]);
  // --swa-full: the window layers keep every row, so the shared manual is reused.
  std::filesystem::remove_all(pc);
  run("Who was happy?", "--swa-full --prompt-cache " + pc);
  const auto full = run("Who was sad?", "--swa-full --prompt-cache " + pc);
  EXPECT_GT(full.first["cached_tokens"].get<int>(), 20);
  EXPECT_EQ(full.first["tokens"], other.first["tokens"]);
  // `cache list` cuts a model name longer than its column (make_model's names are) with a mark.
  const Result list = vkllm("cache list --dir " + pc);
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_NE(list.out.find("  make_model gemma3 6x2...  "), std::string::npos) << list.out;
  std::filesystem::remove(gguf);
  std::filesystem::remove_all(pc);
}

// bench counts the K/V a decode step reads per layer: a window layer no more than its window (5
// layers of window 16 and one global layer, 512 bytes of f16 K and V per layer-token, at depths of
// 64 + 1 and 64 + 2).
TEST(Cli, BenchCountsWindowLayersAtTheirWindow) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string gguf = testing::TempDir() + "/gemma3-bench.gguf";
  make_gemma3_window_model(gguf);
  if (HasFatalFailure()) return;
  const Result r = vkllm("bench --json -p 0 -n 2 -r 1 --ctx-fill 0,64 -m " + gguf);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  const double at0 = j["depths"][0]["decode"]["bytes_per_token"].get<double>(), at64 = j["depths"][1]["decode"]["bytes_per_token"].get<double>();
  // (-n 2: the steps read the fill and 1, then 2, tokens; a window layer at most 16.)
  EXPECT_EQ(at64 - at0, (5 * 16 + 65.5) * 512.0 - (6 * 1.5) * 512.0) << r.out;
  std::filesystem::remove(gguf);
}

// A chat with /regen and /undo on a gemma3 whose window layers keep rings of 20 slots says exactly
// what it says with the window layers at full size (--swa-full): rewinds the rings no longer
// cover are prefilled afresh, the others reuse the cache.
TEST(Cli, Gemma3ChatWithWindowRingsMatchesSwaFull) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string gguf = testing::TempDir() + "/gemma3-chat.gguf";
  make_gemma3_window_model(gguf);
  if (HasFatalFailure()) return;
  const std::string script =
      "Tell me about the little boat and the sea\n/regen\n/undo\nWhat did the wind do to the boat today?\nAnd then?\n"
      "/undo\nAnd then what?\n";
  const std::string base = "chat -q --chat-template chatml --ubatch 4 -n 30 --temp 0 -m " + gguf;
  const Result rings = vkllm(base, script), full = vkllm(base + " --swa-full", script);
  ASSERT_EQ(rings.status, 0) << rings.err;
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_GT(rings.out.size(), 60u);
  EXPECT_EQ(rings.out, full.out);
  std::filesystem::remove(gguf);
}

// Sessions move between window-ring settings: one saved with --swa-full and a pin longer than a
// ring cache allows loads into one with rings (the pin is shortened to what it allows) and keeps
// generating past the capacity; a chat whose system prompt is longer than that pins what fits.
TEST(Cli, Gemma3SessionsAcrossWindowRingSettings) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = testing::TempDir(), gguf = dir + "/gemma3-keep.gguf", session = dir + "/gemma3-keep.session";
  make_gemma3_window_model(gguf);
  if (HasFatalFailure()) return;
  std::filesystem::remove(session);
  const std::string text = "Once upon a time there was a little boat. The boat liked the sea and the wind and the sun and the "
                           "fish and the birds and the clouds and the rain.";
  const Result saved = vkllm("run --json -q --temp 0 --ignore-eos -n 4 --ctx 64 --swa-full --keep 50 -m " + gguf + " --session " +
                             session + " -p '" + text + "'");
  ASSERT_EQ(saved.status, 0) << saved.err;
  // --ubatch 4: rings of 20 slots, so at most 44 of the 64 slots can be pinned.
  const Result resumed = vkllm("run --json -q --temp 0 --ignore-eos -n 40 --ctx 64 --ubatch 4 -m " + gguf + " --session " + session);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(json::parse(resumed.out)["tokens"].size(), 40u);
  EXPECT_GT(json::parse(resumed.out)["kv_evicted"].get<int>(), 0);
  const Result chat = vkllm("chat -q --chat-template chatml --ctx 64 --ubatch 4 -n 20 --temp 0 -m " + gguf + " --system '" + text + "'",
                            "Tell me more\nAnd then?\n");
  ASSERT_EQ(chat.status, 0) << chat.err;
  EXPECT_EQ(chat.err.find("error"), std::string::npos) << chat.err;
  std::filesystem::remove(gguf);
  std::filesystem::remove(session);
}

// A chat on qwen3 and on gemma3 (window rings of 20 slots, which the turns wrap) continues exactly
// across processes through --session: two turns in one process say what one turn, then the
// other in a new process, say. The Phi-3 vocabulary, so that random replies are text (a reply of
// stray byte tokens is not valid UTF-8, and the chat keeps replies as text).
TEST(Cli, ChatSessionsContinueOnQwen3AndGemma3) {
  VKLLM_REQUIRE_SHARED("vocab/ggml-vocab-phi-3.gguf");
  const std::string vocab = " --vocab-from " + shared_path("vocab/ggml-vocab-phi-3.gguf");
  const std::string dir = testing::TempDir(), qwen3 = dir + "/qwen3-chat.gguf", gemma3 = dir + "/gemma3-chat-session.gguf";
  const std::string make = std::string(VKLLM_MAKE_MODEL) +
                           " --arch qwen3 --layers 2 --embd 256 --ff 512 --heads 8 --kv-heads 2 --head-dim 64 --type q8_0"
                           " --logit-scale 12 --seed 2" + vocab + " -o " + qwen3 + " >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  make_gemma3_window_model(gemma3, vocab);
  if (HasFatalFailure()) return;
  for (const std::string& gguf : {qwen3, gemma3}) {
    SCOPED_TRACE(gguf);
    const std::string session = dir + "/chat.session";
    std::filesystem::remove(session);
    const std::string base = "chat -q --chat-template chatml --ubatch 4 -n 16 --temp 0 -m " + gguf;
    const std::string turn1 = "Tell me about the little boat and the sea\n", turn2 = "What did the wind do?\n";
    const Result both = vkllm(base, turn1 + turn2);
    const Result first = vkllm(base + " --session " + session, turn1);
    const Result second = vkllm(base + " --session " + session, turn2);
    ASSERT_EQ(both.status, 0) << both.err;
    ASSERT_EQ(first.status, 0) << first.err;
    ASSERT_EQ(second.status, 0) << second.err;
    EXPECT_GT(first.out.size(), 10u);
    EXPECT_EQ(first.out + second.out, both.out);
    std::filesystem::remove(session);
  }
  std::filesystem::remove(qwen3);
  std::filesystem::remove(gemma3);
}

TEST(Cli, StdoutCarriesOnlyTheText) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const Result r = vkllm("run --temp 0 -n 16 -m " + model("stories260K.gguf") + " -p 'Once upon a time'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, ", there was a little girl named Lily. She loved to play");
  EXPECT_NE(r.err.find("TTFT"), std::string::npos);
  // stdin first, then -p: the piped manual stays the static prefix.
  const Result piped = vkllm("run -q --json --temp 0 -n 4 -m " + model("stories260K.gguf") + " -p ' upon a time'", "Once");
  ASSERT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(json::parse(piped.out)["prompt_tokens"], 5);
}

// Acceptance: every value of perplexity.json within 1%.
TEST(Cli, PerplexityMatchesReferences) {
  VKLLM_REQUIRE_SHARED("reference/perplexity.json");
  std::ifstream in(shared_path("reference/perplexity.json"));
  const json ppl = json::parse(in);
  for (const auto& [key, value] : ppl.items()) {
    const std::string file = key.substr(0, key.find('@')), ctx = key.substr(key.find('@') + 1);
    const Result r = vkllm("perplexity --json -q -m " + model(file) + " --ctx " + ctx + " -f " + shared_path("reference/stories.txt"));
    ASSERT_EQ(r.status, 0) << key << ": " << r.err;
    const double got = json::parse(r.out)["perplexity"].get<double>(), want = value.get<double>();
    EXPECT_LE(std::abs(got - want) / want, 0.01) << key << ": " << got << " vs " << want;
    RecordProperty(key, std::to_string(got));
  }
}

// Input that cannot be read and output that cannot be written fail the command, one line each:
// an unreadable -f was taken as an empty prompt, and a full disk under stdout exited 0.
TEST(Cli, ReadAndWriteErrorsFail) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = " -m " + model("stories260K.gguf");
  const Result unreadable = vkllm("tokenize" + m + " -f /proc/self/mem");
  EXPECT_EQ(unreadable.status, 1) << unreadable.out;
  EXPECT_NE(unreadable.err.find("/proc/self/mem: cannot read the input file: "), std::string::npos) << unreadable.err;
  EXPECT_TRUE(unreadable.out.empty()) << unreadable.out;
  const Result missing = vkllm("run" + m + " -f /nonexistent/prompt.txt");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("cannot open the prompt file: No such file or directory"), std::string::npos) << missing.err;
  for (const std::string& args : {"tokenize" + m + " -p hello", "info" + m, "run -q --temp 0 -n 4" + m + " -p Once",
                                 // endless: the failed write stops it
                                 "run -q --temp 0 -n -1" + m + " -p Once",
                                 // CLI11's help goes through std::cout (it exited 0)
                                 std::string("--help"), std::string("run --help"), std::string("--version"),
                                 // its summary line only once the list is out
                                 "cache list --dir " + testing::TempDir()}) {
    const Result full = vkllm(args + " >/dev/full");
    EXPECT_EQ(full.status, 1) << args << ": " << full.err;
    EXPECT_NE(full.err.find("vkllm: error: cannot write to stdout: No space left on device"), std::string::npos) << args << ": " << full.err;
    EXPECT_EQ(full.err.find("entries"), std::string::npos) << args << ": " << full.err;
  }
  // A file-size limit (`ulimit -f`) fails the session's write in one line, status 1 (SIGXFSZ killed
  // it, 153, leaving a temporary file), and the previous session stays.
  const std::string limited = testing::TempDir() + "/vkllm_fsize.vkv";
  std::filesystem::remove(limited);
  ASSERT_EQ(vkllm("run -q --temp 0 -n 1" + m + " -p Once --session " + limited).status, 0);
  const auto before = std::filesystem::file_size(limited);
  const Result fsize = vkllm_shell("ulimit -f 8; " + std::string(VKLLM_BINARY) + " run -q --temp 0 -n 40" + m + " --session " + limited + " </dev/null");
  EXPECT_EQ(fsize.status, 1) << fsize.err;
  EXPECT_NE(fsize.err.find("File too large"), std::string::npos) << fsize.err;
  EXPECT_EQ(std::filesystem::file_size(limited), before);
  for (const auto& e : std::filesystem::directory_iterator(testing::TempDir()))
    EXPECT_EQ(e.path().filename().string().find(".vkllm_fsize.vkv."), std::string::npos) << e.path();
  // Both lost (a full disk takes the answer and the session): both said, the answer first.
  const Result both = vkllm_shell("ulimit -f 8; " + std::string(VKLLM_BINARY) + " run -q --temp 0 -n 40" + m + " --session " + limited +
                                  " </dev/null >/dev/full");
  EXPECT_EQ(both.status, 1) << both.err;
  const size_t lost = both.err.find("cannot write to stdout: No space left on device"), unsaved = both.err.find("File too large");
  EXPECT_NE(lost, std::string::npos) << both.err;
  EXPECT_NE(unsaved, std::string::npos) << both.err;
  EXPECT_LT(lost, unsaved) << both.err;
  std::filesystem::remove(limited);
  // A closed pipe (`| head`) is a failed write too, not death by SIGPIPE: the endless run stops,
  // its session is saved, status 1 (it was 141 and the session lost); without a word, as coreutils
  // (it said "cannot write to stdout: Broken pipe"). The same for output written by printf.
  const std::string session = testing::TempDir() + "/vkllm_pipe.vkv", err = testing::TempDir() + "/vkllm_pipe.err";
  std::filesystem::remove(session);
  const std::string piped = "bash -c 'timeout 120 " + std::string(VKLLM_BINARY) + " run -q --temp 0 -n -1" + m + " -p Once --session " + session +
                            " </dev/null 2>" + err + " | head -c 20 >/dev/null; exit ${PIPESTATUS[0]}'";
  const int st = std::system(piped.c_str());
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 1);
  std::ifstream e(err);
  const std::string err_text{std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>()};
  EXPECT_EQ(err_text, "") << err_text;
  EXPECT_TRUE(std::filesystem::exists(session));
  std::filesystem::remove(session);
  std::string words;
  for (int i = 0; i < 20000; ++i) words += "once upon a time ";
  std::ofstream(testing::TempDir() + "/vkllm_words.txt") << words;
  const std::string tokens = "bash -c '" + std::string(VKLLM_BINARY) + " tokenize" + m + " -f " + testing::TempDir() +
                             "/vkllm_words.txt 2>" + err + " | head -c 20 >/dev/null; exit ${PIPESTATUS[0]}'";
  const int st2 = std::system(tokens.c_str());
  EXPECT_EQ(WIFEXITED(st2) ? WEXITSTATUS(st2) : -1, 1);
  std::ifstream e2(err);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(e2), std::istreambuf_iterator<char>()), "");
}

// Two stop strings that complete on the same token: the text ends where the first to occur begins,
// whatever their order ("named" was found first and cut, leaving the "l " of "l na").
TEST(Cli, TwoStopStringsCutAtTheFirstToOccur) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string base = "run -q --temp 0 -n 20 -m " + model("stories260K.gguf") + " -p 'Once upon a time'";
  const Result one = vkllm(base + " --stop named --stop 'l na'"), other = vkllm(base + " --stop 'l na' --stop named");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(other.status, 0) << other.err;
  EXPECT_EQ(one.out, ", there was a little gir");
  EXPECT_EQ(other.out, one.out);
}

// An option of one value given twice takes the last, as llama.cpp's (a script's defaults, then the
// user's "$@"); CLI11 refused it ("At Most 1"). Repeatable options keep every value.
TEST(Cli, AnOptionGivenTwiceTakesTheLast) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string m = " -m " + model("stories260K.gguf");
  const Result run = vkllm("run -q --json --temp 0 --ignore-eos -n 3 -p x -m /nonexistent.gguf -n 5 -p 'Once upon a time'" + m);
  ASSERT_EQ(run.status, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["tokens"].size(), 5u) << run.out;
  EXPECT_EQ(j["text"], ", there was a little") << run.out;
  const Result tok = vkllm("tokenize --ids -p a -p 'Once upon'" + m);
  const Result want = vkllm("tokenize --ids -p 'Once upon'" + m);
  ASSERT_EQ(tok.status, 0) << tok.err;
  EXPECT_EQ(tok.out, want.out);
}

// A piped stdin that stays open is waited for (it is the prompt's first part), with a note after
// 2 s saying so (a script's inherited stdin, as in `while read q; do vkllm run -p "$q"; done`,
// was waited on without a word); the text then runs as stdin + -p.
TEST(Cli, AnOpenStdinIsSaid) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string cmd = std::string(VKLLM_BINARY) + " run --temp 0 -n 3 -m " + model("stories260K.gguf") + " -p ' upon a'";
  const Result late = vkllm_shell("(sleep 3; printf Once) | " + cmd);
  ASSERT_EQ(late.status, 0) << late.err;
  EXPECT_NE(late.err.find("vkllm: waiting for the prompt on stdin, which is piped and still open"), std::string::npos) << late.err;
  const Result direct = vkllm_shell("printf Once | " + cmd);
  EXPECT_EQ(direct.out, late.out);
  EXPECT_EQ(direct.err.find("waiting for the prompt"), std::string::npos) << direct.err;
}

// Phi-3's LongRoPE takes its long factors past the original context: rows a cache of one side
// computed are another model's on the other side. A prompt-cache entry stored at --ctx 82 (short
// factors, original context 100) is not used at --ctx 256 (it was, and the text went wrong), and a
// session saved at 82 is refused at 256; at the same side both are used.
TEST(Cli, LongRopeFactorSetsDoNotShareCachedRows) {
  VKLLM_REQUIRE_SHARED("vocab/ggml-vocab-phi-3.gguf");
  const std::string dir = testing::TempDir() + "/vkllm_longrope", gguf = dir + "/phi3.gguf";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string make = std::string(VKLLM_MAKE_MODEL) + " --arch phi3 --layers 2 --embd 128 --ff 256 --heads 4 --kv-heads 2"
                           " --attn-factor 1.3 --orig-ctx 100 --type f32 --logit-scale 12 --seed 3 --vocab-from " +
                           shared_path("vocab/ggml-vocab-phi-3.gguf") + " -o " + gguf + " >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const std::string prompt = " -p 'def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)  # 🙂 斐波那契'";
  const std::string run = "run --json -q --temp 0 -n 8 -m " + gguf + prompt;
  const Result plain = vkllm(run + " --ctx 256");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(vkllm(run + " --ctx 82 --prompt-cache " + dir + "/pc").status, 0);
  const Result other_side = vkllm(run + " --ctx 256 --prompt-cache " + dir + "/pc");
  ASSERT_EQ(other_side.status, 0) << other_side.err;
  EXPECT_EQ(json::parse(other_side.out)["cached_tokens"], 0) << other_side.out;
  EXPECT_EQ(json::parse(other_side.out)["text"], json::parse(plain.out)["text"]);
  const Result same_side = vkllm(run + " --ctx 256 --prompt-cache " + dir + "/pc");
  EXPECT_GT(json::parse(same_side.out)["cached_tokens"].get<int>(), 0) << same_side.out;
  ASSERT_EQ(vkllm(run + " --ctx 82 --session " + dir + "/s.vkv").status, 0);
  const Result resumed = vkllm("run -q --temp 0 -n 2 -m " + gguf + " --ctx 256 --session " + dir + "/s.vkv");
  EXPECT_EQ(resumed.status, 1) << resumed.err;
  EXPECT_NE(resumed.err.find("short RoPE factors"), std::string::npos) << resumed.err;
  std::filesystem::remove_all(dir);
}

// llama.cpp's multi-letter short flags: -ctk/-ctv/-ub/-np are vkllm's --cache-type-k/-v, --ubatch and
// --parallel ("-ctk q8_0" read as "--ctx tk", and the error named --ctx); -ngl N is dropped with a
// note (every layer runs on the GPU).
TEST(Cli, LlamaCppShortFlagsAreUnderstood) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const Result r = vkllm("run --json --temp 0 -n 2 -m " + model("stories260K.gguf") + " -p Once -ctk q8_0 -ctv q8_0 -ub 16 -ngl 99");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["kv_cache_type"], "q8_0") << r.out;
  EXPECT_NE(r.err.find("vkllm: note: -ngl 99 ignored: vkllm runs every layer on the GPU\n"), std::string::npos) << r.err;
  // After an option whose value is optional (a bare --prompt-cache) the spelling is still read.
  const Result after_optional = vkllm("run --json -q -n 1 -m " + model("stories260K.gguf") + " -p Once --prompt-cache " +
                                      testing::TempDir() + "/vkllm_spellings_pc -ctk q8_0 -ctv q8_0");
  ASSERT_EQ(after_optional.status, 0) << after_optional.err;
  EXPECT_EQ(json::parse(after_optional.out)["kv_cache_type"], "q8_0");
  // A prompt that is such a word stays the prompt; -ngl -1 (llama.cpp's "all") is dropped whole.
  const Result word = vkllm("run --json -q --temp 0 -n 1 -m " + model("stories260K.gguf") + " -ngl -1 -p -ub");
  ASSERT_EQ(word.status, 0) << word.err;
  EXPECT_EQ(json::parse(word.out)["prompt_tokens"], json::parse(vkllm("run --json -q -n 1 -m " + model("stories260K.gguf") + " --prompt=-ub").out)["prompt_tokens"]);
  // Any other llama.cpp word is refused, named ("-hf" was "-h -f": the help on stdout, status 0;
  // "-cnv" was "--ctx nv"); -fa with llama-bench's 0/1 and the "=" forms are ignored with a note;
  // bench's -ctk/-ctv are its --cache-type.
  for (const std::string word : {"-hf", "-cnv", "-mli", "-no-cnv", "-xyz"}) {
    const Result r = vkllm("run -n 1 -m " + model("stories260K.gguf") + " -p Once " + word + " x");
    EXPECT_EQ(r.status, 2) << word;
    EXPECT_TRUE(r.out.empty()) << word << ": " << r.out;
    EXPECT_EQ(r.err, "vkllm: error: unknown option " + word + " (llama.cpp's? vkllm's options are listed by --help) (see --help)\n");
  }
  // vkllm's own groups and attached values pass as before; a value that is such a word stays a value
  // (after --stop, -p is the stop string, so -ngl is then dropped); renamed words take "=".
  const Result groups = vkllm("run --json --temp 0 -qm " + model("stories260K.gguf") + " -n1 -pOnce --stop -p -ngl all -ctk=q8_0 -ctv=q8_0");
  ASSERT_EQ(groups.status, 0) << groups.err;
  EXPECT_EQ(json::parse(groups.out)["kv_cache_type"], "q8_0") << groups.out;
  EXPECT_EQ(groups.err, "vkllm: note: -ngl all ignored: vkllm runs every layer on the GPU\n");
  const Result ignored = vkllm("run -q -n 1 -m " + model("stories260K.gguf") + " -p Once -fa 1 --n-gpu-layers=99 --flash-attn=on");
  EXPECT_EQ(ignored.status, 0) << ignored.err;
  EXPECT_EQ(ignored.err, "vkllm: note: -fa 1 ignored: vkllm's attention kernels always fuse the softmax\n"
                         "vkllm: note: --n-gpu-layers 99 ignored: vkllm runs every layer on the GPU\n"
                         "vkllm: note: --flash-attn on ignored: vkllm's attention kernels always fuse the softmax\n");
  const Result bench = vkllm("bench --json -p 4 -n 2 -r 1 -m " + model("stories260K.gguf") + " -ctk q8_0 -ctv q8_0");
  EXPECT_EQ(bench.status, 0) << bench.err;
  EXPECT_EQ(json::parse(bench.out)["kv_cache_type"], "q8_0") << bench.out;
  // llama-bench's -ctk alone quantizes K only, which vkllm does not run: refused, not a q4_0 V.
  const Result k_only = vkllm("bench --json -p 4 -n 2 -r 1 -m " + model("stories260K.gguf") + " -ctk q4_0");
  EXPECT_EQ(k_only.status, 2) << k_only.err;
  EXPECT_NE(k_only.err.find("--cache-type-k q4_0 and --cache-type-v f16 differ"), std::string::npos) << k_only.err;
  // llama.cpp's --prompt-cache FILE is a state file: vkllm's is a directory, and a file is refused.
  const std::string state = testing::TempDir() + "/vkllm_state.bin";
  std::ofstream(state) << "state";
  const Result pc = vkllm("run -q -n 1 -m " + model("stories260K.gguf") + " -p Once --prompt-cache " + state);
  EXPECT_EQ(pc.status, 1);
  EXPECT_EQ(pc.err, "vkllm: error: --prompt-cache " + state +
                        " is a file; it names a directory of prompt prefixes (one conversation in one file is run's --session)\n");
  const Result bad = vkllm("run -n 2 -m " + model("stories260K.gguf") + " -p Once -ctk q5_1");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--cache-type-k"), std::string::npos) << bad.err;
}

// llama.cpp's RoPE flags: a plain file run with --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx
// 4096 (Qwen2.5's instructions for long contexts) computes what the file with those keys computes
// (which tests/data/arch checks against llama.cpp); --rope-scaling linear and none on that file give
// the linear and the unscaled model. The flags are part of the fingerprint: a prompt-cache entry or
// a session made without them is another model's, while a flag equal to the file's value changes
// nothing. Bad values are refused.
TEST(Cli, RopeFlagsActAsTheFileKeys) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = testing::TempDir() + "/vkllm_rope_flags", plain = dir + "/plain.gguf", yarn = dir + "/yarn.gguf";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string make = std::string(VKLLM_MAKE_MODEL) +
                           " --arch qwen3 --layers 2 --embd 128 --ff 256 --heads 4 --kv-heads 2 --head-dim 32 --type f32 --logit-scale 12 --seed 1";
  ASSERT_EQ(std::system((make + " -o " + plain + " >/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((make + " --rope-scale 4 --rope-scaling yarn --orig-ctx 4096 -o " + yarn + " >/dev/null").c_str()), 0);
  const std::string prompt = " -f " + shared_path("reference/prompts/sy-2.txt");
  const auto greedy = [&](const std::string& args) {
    const Result r = vkllm("run --json -q --temp 0 --ignore-eos --logprobs -n 8" + prompt + " " + args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
    return r.status == 0 ? json::parse(r.out) : json();
  };
  const auto same = [](const json& a, const json& b) {
    if (a["tokens"] != b["tokens"]) return false;
    for (size_t i = 0; i < a["logprobs"].size(); ++i)
      if (std::abs(a["logprobs"][i].get<double>() - b["logprobs"][i].get<double>()) > 1e-4) return false;
    return true;
  };
  const Result info = vkllm("info -m " + yarn);
  EXPECT_NE(info.out.find("(YaRN from an original context of 4,096)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("; 16,384 with its YaRN scaling)"), std::string::npos) << info.out;
  const json by_flags = greedy("-m " + plain + " --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 4096");
  const json by_keys = greedy("-m " + yarn);
  const json unscaled = greedy("-m " + plain), linear = greedy("-m " + plain + " --rope-freq-scale 0.25");
  EXPECT_TRUE(same(by_flags, by_keys)) << by_flags << "\n" << by_keys;
  EXPECT_FALSE(same(by_keys, unscaled));
  EXPECT_FALSE(same(by_keys, linear));
  EXPECT_FALSE(same(linear, unscaled));
  EXPECT_TRUE(same(greedy("-m " + yarn + " --rope-scaling linear"), linear));
  EXPECT_TRUE(same(greedy("-m " + yarn + " --rope-scaling none"), unscaled));
  // Each flag reaches the table: moved from the value in force it changes the log-probabilities; at
  // that value it changes nothing (--yarn-attn-factor counts only where YaRN is off, as in llama.cpp).
  for (const std::string flag : {"--yarn-beta-fast 8", "--yarn-beta-slow 4", "--yarn-ext-factor 0.5", "--rope-freq-base 20000",
                                  "--yarn-orig-ctx 1024"})
    EXPECT_FALSE(same(greedy("-m " + yarn + " " + flag), by_keys)) << flag;
  EXPECT_TRUE(same(greedy("-m " + yarn + " --yarn-beta-fast 32 --yarn-beta-slow 1 --yarn-ext-factor 1 --yarn-attn-factor 3"), by_keys));
  EXPECT_FALSE(same(greedy("-m " + plain + " --yarn-attn-factor 1.5"), unscaled));

  const std::string run = "run --json -q --temp 0 -n 4 -m " + plain + " -p 'Once upon a time'";
  ASSERT_EQ(vkllm(run + " --prompt-cache " + dir + "/pc").status, 0);
  const Result flagged = vkllm(run + " --rope-scale 4 --prompt-cache " + dir + "/pc");
  ASSERT_EQ(flagged.status, 0) << flagged.err;
  EXPECT_EQ(json::parse(flagged.out)["cached_tokens"], 0) << flagged.out;
  const Result file_base = vkllm(run + " --rope-freq-base 10000 --prompt-cache " + dir + "/pc");
  ASSERT_EQ(file_base.status, 0) << file_base.err;
  EXPECT_GT(json::parse(file_base.out)["cached_tokens"].get<int>(), 0) << file_base.out;
  ASSERT_EQ(vkllm(run + " --rope-scale 4 --session " + dir + "/s.vkv").status, 0);
  const Result resumed = vkllm("run -q --temp 0 -n 2 -m " + plain + " --session " + dir + "/s.vkv");
  EXPECT_EQ(resumed.status, 1) << resumed.err;
  EXPECT_NE(resumed.err.find("(RoPE flags)"), std::string::npos) << resumed.err;
  EXPECT_EQ(vkllm("run -q --temp 0 -n 2 -m " + plain + " --rope-scale 4 --session " + dir + "/s.vkv").status, 0);

  for (const std::string bad : {"--rope-scale 0", "--rope-scale inf", "--rope-freq-base nan", "--yarn-ext-factor -1", "--yarn-ext-factor 2",
                                "--rope-freq-base 1e39", "--rope-freq-scale 1e-50", "--rope-scaling dynamic",
                                "--rope-scale 4 --rope-freq-scale 0.25", "--yarn-orig-ctx 0"}) {
    const Result r = vkllm("run -q -n 1 -m " + plain + " -p hi " + bad);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
  std::filesystem::remove_all(dir);
}

// Input the model cannot take is refused before the weights load: no model or memory line, one
// error naming the count.
TEST(Cli, ShortTextsAndLongPromptsAreRefusedBeforeLoading) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string text = testing::TempDir() + "/short.txt";
  std::ofstream(text) << "Once upon a time";
  const Result chunked = vkllm("perplexity -m " + model("stories260K.gguf") + " --ctx 64 -f " + text);
  EXPECT_EQ(chunked.status, 1);
  EXPECT_NE(chunked.err.find(text + ": the text has 5 tokens, fewer than one chunk of --ctx 64 (a smaller --ctx, or --stream, scores it)"),
            std::string::npos)
      << chunked.err;
  EXPECT_EQ(chunked.err.find("memory:"), std::string::npos) << chunked.err;
  std::ofstream(text, std::ios::trunc) << "";
  const Result streamed = vkllm("perplexity --stream -m " + model("stories260K.gguf") + " --ctx 64 -f " + text);
  EXPECT_EQ(streamed.status, 1);
  EXPECT_NE(streamed.err.find("fewer than 2"), std::string::npos) << streamed.err;
  EXPECT_EQ(streamed.err.find("memory:"), std::string::npos) << streamed.err;
  const Result prompt = vkllm("run --ctx 16 -m " + model("stories260K.gguf") +
                              " -p 'Once upon a time there was a little girl named Lily. She loved to play outside in the park'");
  EXPECT_EQ(prompt.status, 1);
  EXPECT_NE(prompt.err.find("holds no more"), std::string::npos) << prompt.err;
  EXPECT_EQ(prompt.err.find("memory:"), std::string::npos) << prompt.err;
}

// Acceptance: the ring wraps ~35 times with no blow-up: streamed perplexity at --ctx 64 --keep 4
// is no worse than 1.1 × the chunked perplexity at --ctx 64.
TEST(Cli, StreamedPerplexityThroughTheRing) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string args = "perplexity --json -q -m " + model("stories260K.gguf") + " -f " + shared_path("reference/stories.txt") + " --ctx 64";
  const Result chunked = vkllm(args), stream = vkllm(args + " --stream --keep 4");
  ASSERT_EQ(chunked.status, 0) << chunked.err;
  ASSERT_EQ(stream.status, 0) << stream.err;
  const json c = json::parse(chunked.out), s = json::parse(stream.out);
  EXPECT_GE(s["kv_evicted"].get<int>(), 64 * 30);
  EXPECT_EQ(s["tokens_scored"], 2339);
  EXPECT_LE(s["perplexity"].get<double>(), 1.1 * c["perplexity"].get<double>()) << s.dump() << " vs " << c.dump();
}

// Speculative decoding (docs/speculative.md) gives the tokens plain steps give: `run` with drafts
// forced at every step (a one-token key, 3 drafts each) and with the measured choice, against no
// speculation, greedy and seeded with penalties, log-probabilities, a stop string, a grammar, a
// ring that wraps and a pin, on models of four architectures (window rings included).
TEST(Cli, SpeculativeTokensAreThePlainOnes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-qwen2-q4_0.gguf");
  const std::string gemma3 = testing::TempDir() + "/gemma3-spec.gguf";
  make_gemma3_window_model(gemma3);
  if (HasFatalFailure()) return;
  const std::string forced = " --spec-type ngram-simple --spec-ngram-size-n 1 --draft-min 3 --draft-max 3";
  const std::string measured = " --spec-type ngram-simple --spec-ngram-size-n 2";
  const std::string sampled = " --temp 0.9 --seed 7 --repeat-penalty 1.2 --logprobs --top-logprobs 2";
  struct Case {
    std::string model, args;
  };
  const std::string stories = model("stories260K.gguf");
  const std::vector<Case> cases = {
      {stories, "--temp 0 --ctx 250 -n 60 --ignore-eos"},
      {stories, sampled + " --ctx 250 -n 60 --ignore-eos"},
      {stories, "--temp 0 --ctx 250 -n 200 --stop 'the park'"},
      {stories, "--temp 0 --ctx 250 -n 60 --grammar 'root ::= ([a-z]+ \" \")+ [a-z]+ \".\"'"},
      {stories, "--temp 0 --ctx 48 -n 120 --ignore-eos"},
      {stories, "--temp 0 --ctx 48 --keep 20 -n 120 --ignore-eos"},
      {stories, "--temp 0 --ctx 48"},  // until the cache is full
      {model("synth-llama-q4_0.gguf"), "--temp 0 -n 40 --ignore-eos"},
      {model("synth-llama-q4_0.gguf"), sampled + " -n 40 --ignore-eos"},
      {model("synth-qwen2-q4_0.gguf"), "--temp 0 -n 40 --ignore-eos"},
      {model("synth-qwen2-q4_0.gguf"), sampled + " -n 40 --ignore-eos"},
      {gemma3, "--temp 0 --ctx 64 --ubatch 8 -n 100 --ignore-eos"},
      {gemma3, sampled + " --ctx 64 --ubatch 8 -n 100 --ignore-eos"},
  };
  uint64_t drafted = 0, accepted = 0;
  for (const Case& c : cases) {
    const std::string base = "run --json -q -m " + c.model + " " + c.args;
    SCOPED_TRACE(base);
    const Result plain = vkllm(base, "Once upon a time, Lily went to the park. She saw a big dog in the park.");
    ASSERT_EQ(plain.status, 0) << plain.err;
    const json want = json::parse(plain.out);
    EXPECT_FALSE(want.contains("draft_tokens"));
    for (const std::string& spec : {forced, measured}) {
      SCOPED_TRACE(spec);
      const Result r = vkllm(base + spec, "Once upon a time, Lily went to the park. She saw a big dog in the park.");
      ASSERT_EQ(r.status, 0) << r.err;
      const json got = json::parse(r.out);
      for (const char* key : {"tokens", "text", "stop_reason", "logprobs", "top_logprobs", "kv_tokens_used", "kv_evicted"})
        EXPECT_EQ(got.value(key, json()), want.value(key, json())) << key;
      if (spec == forced) {
        drafted += got["draft_tokens"].get<uint64_t>();
        accepted += got["draft_accepted"].get<uint64_t>();
      }
    }
  }
  // The forced drafts ran, and some were taken (the comparison is not of plain steps alone).
  EXPECT_GT(drafted, 300u);
  EXPECT_GT(accepted, 50u);
  std::filesystem::remove(gemma3);
}

// A draft model (-md, docs/speculative.md "Draft models") gives the tokens plain steps give: the
// same weights quantized to q4_0 draft for the q8_0 model, stories260K for a gemma3 with window
// rings (one vocabulary), forced to draft at every step (3 tokens, whatever the draft model's
// probability) and with the measured choice; greedy and seeded with penalties and log-probabilities,
// a stop string, a grammar, a ring that wraps with a pin. Then a chat (the draft's cache follows
// the turns, /undo and /regen), a session continued with and without it, and the refusals.
TEST(Cli, DraftModelTokensAreThePlainOnes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q8_0.gguf");
  const std::string gemma3 = testing::TempDir() + "/gemma3-draft.gguf";
  make_gemma3_window_model(gemma3);
  if (HasFatalFailure()) return;
  const std::string q8 = model("synth-llama-q8_0.gguf"), q4 = model("synth-llama-q4_0.gguf"), stories = model("stories260K.gguf");
  const std::string forced = " --draft-min 3 --draft-max 3 --draft-p-min 0";
  const std::string sampled = " --temp 0.9 --seed 7 --repeat-penalty 1.2 --logprobs --top-logprobs 2";
  struct Case {
    std::string model, draft, args;
  };
  const std::vector<Case> cases = {
      {q8, q4, "--temp 0 -n 60 --ignore-eos"},
      {q8, q4, sampled + " -n 60 --ignore-eos"},
      {q8, q4, "--temp 0 --ctx 48 --keep 10 -n 100 --ignore-eos"},
      {stories, q4, "--temp 0 --ctx 250 -n 200 --stop 'the park'"},
      {stories, q4, "--temp 0 --ctx 250 -n 60 --grammar 'root ::= ([a-z]+ \" \")+ [a-z]+ \".\"'"},
      {gemma3, stories, "--temp 0 --ctx 64 --ubatch 8 -n 100 --ignore-eos"},
      {gemma3, stories, sampled + " --ctx 64 --ubatch 8 -n 100 --ignore-eos"},
  };
  uint64_t drafted = 0, accepted = 0;
  for (const Case& c : cases) {
    const std::string base = "run --json -q -m " + c.model + " " + c.args;
    SCOPED_TRACE(base);
    const std::string prompt = "Once upon a time, Lily went to the park. She saw a big dog in the park.";
    const Result plain = vkllm(base, prompt);
    ASSERT_EQ(plain.status, 0) << plain.err;
    const json want = json::parse(plain.out);
    for (const std::string& spec : {forced, std::string()}) {
      SCOPED_TRACE(spec);
      const Result r = vkllm(base + " -md " + c.draft + spec, prompt);
      ASSERT_EQ(r.status, 0) << r.err;
      const json got = json::parse(r.out);
      for (const char* key : {"tokens", "text", "stop_reason", "logprobs", "top_logprobs", "kv_tokens_used", "kv_evicted"})
        EXPECT_EQ(got.value(key, json()), want.value(key, json())) << key;
      ASSERT_TRUE(got.contains("draft_tokens"));
      if (spec == forced) {
        drafted += got["draft_tokens"].get<uint64_t>();
        accepted += got["draft_accepted"].get<uint64_t>();
      }
    }
  }
  // The forced drafts ran, and the q4_0 copy's were often taken.
  EXPECT_GT(drafted, 300u);
  EXPECT_GT(accepted, 60u);

  // A model drafting for itself, greedily, is always right: every draft is taken only if its cache
  // follows the model's tokens exactly (the catch-up after each pass, a prompt in chunks, a chat's
  // turns, an undone exchange and a regenerated reply).
  // (The --rope-* flags reach the draft model too: under another base it still drafts the model's tokens.)
  for (const std::string chunks : {"", " --ubatch 8", " --rope-freq-base 2000"}) {
    const Result self = vkllm("run --json -q --temp 0 --ctx 250 -n 150 --ignore-eos -m " + stories + " -md " + stories + forced + chunks,
                              "Once upon a time, Lily went to the park. She saw a big dog in the park.");
    ASSERT_EQ(self.status, 0) << self.err;
    const json j = json::parse(self.out);
    EXPECT_GT(j["draft_tokens"].get<int>(), 100) << chunks;
    EXPECT_EQ(j["draft_accepted"], j["draft_tokens"]) << chunks;
  }
  // A draft of a smaller vocabulary (up to 128 tokens fewer passes the check, as in llama.cpp) reads
  // the model's tokens past it as its unknown token: the model's 600-token vocabulary generates ids
  // past stories260K's 512, and the tokens stay the plain ones.
  const std::string wide = testing::TempDir() + "/vocab600.gguf";
  const std::string make = std::string(VKLLM_MAKE_MODEL) + " --arch llama --layers 1 --embd 64 --ff 128 --heads 4 --kv-heads 2 --vocab-from " +
                           stories + " --vocab 600 --logit-scale 4 --seed 5 -o " + wide + " >/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const std::string wide_run = "run --json -q --temp 0 -n 150 --ignore-eos -p 'Once upon' -m " + wide;
  const Result wide_plain = vkllm(wide_run), wide_draft = vkllm(wide_run + " -md " + stories + forced);
  ASSERT_EQ(wide_plain.status, 0) << wide_plain.err;
  ASSERT_EQ(wide_draft.status, 0) << wide_draft.err;
  const json wp = json::parse(wide_plain.out), wd = json::parse(wide_draft.out);
  EXPECT_EQ(wd["tokens"], wp["tokens"]);
  EXPECT_GE(*std::max_element(wp["tokens"].begin(), wp["tokens"].end()), 512) << "no token past the draft's vocabulary";
  EXPECT_GT(wd["draft_tokens"].get<int>(), 100);
  std::filesystem::remove(wide);
  const std::string self_chat = "chat --chat-template chatml --ctx 400 -n 30 --temp 0 -m " + stories + " -md " + stories + forced;
  const Result selfc = vkllm(self_chat, "Tell me about the little boat\nWhat did the boat do?\n/undo\nWhere did it go?\n/regen\nAnd then?\n/stats\n");
  ASSERT_EQ(selfc.status, 0) << selfc.err;
  EXPECT_NE(selfc.err.find(" taken (100%)"), std::string::npos) << selfc.err;

  // A chat: each reply drafts over the whole conversation, after an undone and a regenerated turn.
  const std::string chat = "chat -q --chat-template chatml --ctx 300 -n 24 --temp 0 -m " + q8;
  const std::string turns = "Tell me about the little boat\nWhat did the boat do?\n/undo\nWhere did it go?\n/regen\nAnd then?\n";
  const Result plain_chat = vkllm(chat, turns), draft_chat = vkllm(chat + " -md " + q4 + forced, turns);
  ASSERT_EQ(plain_chat.status, 0) << plain_chat.err;
  ASSERT_EQ(draft_chat.status, 0) << draft_chat.err;
  EXPECT_GT(plain_chat.out.size(), 40u);
  EXPECT_EQ(draft_chat.out, plain_chat.out);

  // A session saved with drafts continues without them and the other way round (the draft's cache
  // is not saved: it catches up with the session's tokens at its first draft).
  const std::string session = testing::TempDir() + "/draft.session";
  const std::string run = "run --json -q --temp 0 --ignore-eos --ctx 96 -m " + q8, prompt = " -p 'Once upon a time, Lily went to the park.'";
  expect_session_continues(run, prompt, 30, session, " -md " + q4 + forced, "");
  expect_session_continues(run, prompt, 30, session, "", " -md " + q4 + forced);
  std::filesystem::remove(gemma3);
}

// A draft model of another vocabulary is refused before anything loads, naming the file and the
// first difference; -md beside --spec-type ngram-simple, or a missing draft file, is a bad command
// line.
TEST(Cli, DraftModelRefusals) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-qwen2-q4_0.gguf");
  const std::string stories = model("stories260K.gguf"), qwen = model("synth-qwen2-q4_0.gguf");
  const Result other = vkllm("run -m " + stories + " -md " + qwen + " -p Once -n 4");
  EXPECT_EQ(other.status, 1);
  EXPECT_NE(other.err.find(qwen + ": cannot draft for " + stories + ": its tokenizer is gpt2, the model's llama"), std::string::npos)
      << other.err;
  EXPECT_EQ(other.err.find("memory:"), std::string::npos) << other.err;
  EXPECT_EQ(std::count(other.err.begin(), other.err.end(), '\n'), 1) << other.err;
  const Result both = vkllm("run -m " + stories + " -md " + stories + " --spec-type ngram-simple -p Once -n 4");
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.err.find("--model-draft and --spec-type ngram-simple are two sources of drafts"), std::string::npos) << both.err;
  // llama.cpp's -ngld (the draft's GPU layers) is dropped with a note, as -ngl is.
  const Result ngld = vkllm("run --json --temp 0 -n 2 -m " + stories + " -md " + stories + " -ngld 99 -p Once");
  EXPECT_EQ(ngld.status, 0) << ngld.err;
  EXPECT_NE(ngld.err.find("vkllm: note: -ngld 99 ignored: vkllm runs every layer on the GPU\n"), std::string::npos) << ngld.err;
  // Draft-tuning flags that the drafts chosen do not read are named in one note.
  const Result idle = vkllm("run -q -n 2 -m " + stories + " --draft-max 4 --draft-min 1 -p Once");
  EXPECT_EQ(idle.status, 0) << idle.err;
  EXPECT_EQ(idle.err, "");  // (-q)
  const Result none = vkllm("run -n 2 -m " + stories + " --draft-max 4 --draft-min 1 -p Once");
  EXPECT_NE(none.err.find("vkllm: note: --draft-max, --draft-min ignored: nothing drafts without --spec-type ngram-simple or -md\n"),
            std::string::npos) << none.err;
  const Result ngram = vkllm("run -n 2 -m " + stories + " --spec-type ngram-simple --draft-p-min 0.5 --draft-max 3 -p Once");
  EXPECT_NE(ngram.err.find("vkllm: note: --draft-p-min ignored: for -md's drafts, and n-grams draft here\n"), std::string::npos) << ngram.err;
  const Result md = vkllm("run -n 2 -m " + stories + " -md " + stories + " --spec-ngram-size-n 3 --draft-p-min 0.5 -p Once");
  EXPECT_NE(md.err.find("vkllm: note: --spec-ngram-size-n ignored: for n-gram drafts (--spec-type ngram-simple), and -md drafts here\n"),
            std::string::npos) << md.err;
  const Result missing = vkllm("run -m " + stories + " -md " + testing::TempDir() + "/no-such-draft.gguf -p Once -n 4");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("no-such-draft.gguf"), std::string::npos) << missing.err;
}

// After a speculative run the cache holds what a plain run's holds: a session saved by one and
// continued without speculation equals one plain run, and the other way round.
TEST(Cli, SpeculativeRunsLeaveThePlainCache) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string session = testing::TempDir() + "/spec.session";
  const std::string base = "run --json -q --temp 0 --ignore-eos --ctx 96 -m " + model("stories260K.gguf");
  const std::string forced = " --spec-type ngram-simple --spec-ngram-size-n 1 --draft-min 4 --draft-max 4";
  const std::string prompt = " -p 'Once upon a time, Lily went to the park.'";
  expect_session_continues(base, prompt, 30, session, forced, "");
  expect_session_continues(base, prompt, 30, session, "", forced);
  // A chat's replies too (each reply speculates over the whole conversation).
  const std::string chat = "chat -q --chat-template chatml --ctx 200 -n 24 --temp 0 -m " + model("stories260K.gguf");
  const std::string turns = "Tell me about the little boat\nWhat did the boat do?\n";
  const Result plain = vkllm(chat, turns), spec = vkllm(chat + forced, turns);
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  EXPECT_GT(plain.out.size(), 20u);
  EXPECT_EQ(spec.out, plain.out);
}

// Verify passes over long lists give every token what a step gives it, so seeded runs keep their
// log-probabilities: stories260K past 256 slots (attention_simd on CPU drivers); the GPUs' tiled
// kernel (`--attention tiled`), whose lists split from 128 slots, on stories260K and a head dim of
// 64; a gemma3 whose 300-slot window takes the decode kernels (window ring, and --swa-full's shared
// list) or the tiles. (The earlier code split a pass's lists by its size: stories260K's tokens
// changed past 256, the tiles' past 128, and the decode kernels grouped a window's entries from
// the pass's first token's window.)
TEST(Cli, SpeculativeTokensOverLongListsAreThePlainOnes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  const std::string gemma3 = testing::TempDir() + "/gemma3-spec300.gguf";
  make_gemma3_window_model(gemma3, "", 300);
  if (HasFatalFailure()) return;
  const std::string stories = model("stories260K.gguf"), llama = model("synth-llama-q4_0.gguf");
  struct Case {
    std::string model, args;
  };
  const std::vector<Case> cases = {
      {stories, "-n 320"},
      {stories, "-n 200 --attention tiled"},
      {llama, "-n 200 --attention tiled"},
      {gemma3, "-n 340"},
      {gemma3, "-n 340 --swa-full"},
      {gemma3, "-n 340 --swa-full --attention tiled"},
  };
  for (const Case& c : cases) {
    const std::string base = "run --json --temp 1 --seed 2 --ignore-eos --logprobs -p Once -m " + c.model + " " + c.args;
    SCOPED_TRACE(base);
    const Result plain = vkllm(base), spec = vkllm(base + " --spec-type ngram-simple --spec-ngram-size-n 1 --draft-min 3 --draft-max 3");
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(spec.status, 0) << spec.err;
    EXPECT_EQ(spec.err.find("--spec-type is off"), std::string::npos) << spec.err;
    const json a = json::parse(plain.out), b = json::parse(spec.out);
    EXPECT_EQ(b["tokens"], a["tokens"]);
    EXPECT_EQ(b["logprobs"], a["logprobs"]);
    EXPECT_GT(b["draft_tokens"].get<int>(), 100);
  }
}

// The one case speculation stays off: a window of 254 slots in the shared list (--swa-full) on a
// CPU driver whose views start on 4-entry boundaries (lavapipe's 16 bytes), where a lone token's
// list holds 254 to 257 entries, on both sides of the lanes kernel's 256. It says so once on
// stderr and runs the plain tokens; with the window's own ring (lists start anywhere) it speculates.
TEST(Cli, SpeculationIsOffWhereAWindowStraddlesTheLanesBound) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");  // make_model's default vocabulary
  const std::string gemma3 = testing::TempDir() + "/gemma3-spec254.gguf";
  make_gemma3_window_model(gemma3, "", 254);
  if (HasFatalFailure()) return;
  const std::string spec = " --spec-type ngram-simple --spec-ngram-size-n 1 --draft-min 3 --draft-max 3";
  for (const std::string& ring : {std::string(" --swa-full"), std::string()}) {
    const std::string base = "run --json --temp 1 --seed 2 --ignore-eos --logprobs -n 280 -p Once -m " + gemma3 + ring;
    SCOPED_TRACE(base);
    const Result plain = vkllm(base), r = vkllm(base + spec);
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(r.status, 0) << r.err;
    const json a = json::parse(plain.out), b = json::parse(r.out);
    EXPECT_EQ(b["tokens"], a["tokens"]);
    EXPECT_EQ(b["logprobs"], a["logprobs"]);
    const bool off = r.err.find("vkllm: note: --spec-type is off for this model on ") != std::string::npos;
    EXPECT_EQ(off, !ring.empty()) << r.err;
    EXPECT_EQ(b["draft_tokens"].get<int>() == 0, off);
  }
}

// Speculation flags are checked before the model loads.
TEST(Cli, SpeculativeFlagErrors) {
  Result r = vkllm("run -m /nonexistent.gguf -p hi --spec-type ngram-simple --draft-min 8 --draft-max 4");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--draft-min 8 is more than --draft-max 4: no draft could run"), std::string::npos) << r.err;
  r = vkllm("run -m /nonexistent.gguf -p hi --spec-type draft");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--spec-type"), std::string::npos) << r.err;
  r = vkllm("run -m /nonexistent.gguf -p hi --draft-max 0");
  EXPECT_EQ(r.status, 2) << r.err;
  r = vkllm("run -m /nonexistent.gguf -p hi --draft-min 3 --spec-ngram-size-m 2");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--draft-min 3 is more than --spec-ngram-size-m 2"), std::string::npos) << r.err;
  r = vkllm("run -m /nonexistent.gguf -p hi --spec-type 1");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--spec-type: 1 not in {none,ngram-simple}"), std::string::npos) << r.err;
}

// A --draft-min past the drafts one verify pass holds (the sampled token and its drafts, at most
// --ubatch tokens, and at most the cache's unpinned slots) is refused, an explicit --ubatch's before
// the model loads: it would silently draft nothing. The message names the bound.
TEST(Cli, DraftMinPastOnePassIsRefused) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string spec = " --spec-type ngram-simple --draft-max 8 -m " + model("stories260K.gguf");
  for (const char* command : {"run -p hi -n 4", "serve --port 0"}) {
    const Result r = vkllm(std::string(command) + spec + " --ubatch 4 --draft-min 4");
    EXPECT_EQ(r.status, 2) << command << ": " << r.err;
    EXPECT_NE(r.err.find("vkllm: error: --draft-min 4 is more than the 3 drafts one verify pass holds here (4 tokens: --ubatch 4): "
                         "no draft could run"),
              std::string::npos) << command << ": " << r.err;
    EXPECT_EQ(r.err.find("vkllm: memory:"), std::string::npos) << command << ": refused after the model loaded: " << r.err;
  }
  const Result one = vkllm("run -p hi -n 4 --ubatch 1 --draft-min 1" + spec);
  EXPECT_EQ(one.status, 2) << one.err;
  EXPECT_NE(one.err.find("more than the 0 drafts one verify pass holds here (1 token: --ubatch 1)"), std::string::npos) << one.err;
  const Result fits = vkllm("run -p hi -n 4 --ubatch 4 --draft-min 3" + spec);
  EXPECT_EQ(fits.status, 0) << fits.err;
  // A tiny --ctx bounds the pass too, and the message names it (-md: the same check).
  const Result ctx = vkllm("run -p a -n 1 --ctx 3 --draft-min 3 -m " + model("stories260K.gguf") + " -md " + model("stories260K.gguf"));
  EXPECT_EQ(ctx.status, 2) << ctx.err;
  EXPECT_NE(ctx.err.find("more than the 2 drafts one verify pass holds here (3 tokens: --ctx 3)"), std::string::npos) << ctx.err;
}

}  // namespace
