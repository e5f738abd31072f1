// Sessions and the prompt cache end to end, through the vkllm binary on stories260K: a split
// continuation equals one run (greedy and seeded sampling), refused loads name the reason and
// leave the file alone, file size tracks tokens used, and two concurrent runs share one
// prompt-cache directory.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "test_support.h"
#include "vk/buffer.h"
#include "vk_test_env.h"

namespace fs = std::filesystem;

namespace {

const char* kModel = "models/stories260K.gguf";

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("vkllm_test_session_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `vkllm <args>` with stdin from /dev/null; stdout and stderr captured.
  Result vkllm(const std::string& args, const std::string& tag = "r") const {
    const std::string out = (dir_ / (tag + ".out")).string(), err = (dir_ / (tag + ".err")).string();
    const std::string cmd = std::string(VKLLM_BINARY) + " " + args + " </dev/null >" + out + " 2>" + err;
    Result r;
    const int status = std::system(cmd.c_str());
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }
  std::string model() const { return "run -m " + vkllm::test::shared_path(kModel) + " --ctx 256"; }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::vector<int32_t> tokens_of(const Result& r) {
    const auto j = nlohmann::json::parse(r.out);
    return j.at("tokens").get<std::vector<int32_t>>();
  }

  fs::path dir_;
};

}  // namespace

// Two calls of 8 tokens through a session equal one call of 16, greedy and with a seeded
// temperature (the RNG state is in the file).
TEST_F(SessionTest, SplitContinuationEqualsOneRun) {
  VKLLM_REQUIRE_SHARED(kModel);
  for (const std::string sampling : {"--temp 0", "--temp 0.9 --seed 42"}) {
    const std::string s = path("split.vkv");
    fs::remove(s);
    const Result whole = vkllm(model() + " " + sampling + " --ignore-eos --json -p 'Once upon a time' -n 16");
    ASSERT_EQ(whole.rc, 0) << whole.err;
    const Result a = vkllm(model() + " " + sampling + " --ignore-eos --json -p 'Once upon a time' -n 8 --session " + s);
    ASSERT_EQ(a.rc, 0) << a.err;
    ASSERT_TRUE(fs::exists(s));
    const Result b = vkllm(model() + " " + sampling + " --ignore-eos --json -p '' -n 8 --session " + s);
    ASSERT_EQ(b.rc, 0) << b.err;
    std::vector<int32_t> joined = tokens_of(a);
    const std::vector<int32_t> second = tokens_of(b);
    joined.insert(joined.end(), second.begin(), second.end());
    EXPECT_EQ(joined, tokens_of(whole)) << sampling;
  }
}

// A --keep longer than what the first call cached pins tokens as they come; the session keeps the
// whole pin, so a continuation that wraps the ring equals one run (it wrapped with a shorter pin).
TEST_F(SessionTest, SplitContinuationKeepsALongPin) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string s = path("keep.vkv");
  const std::string run = "run -m " + vkllm::test::shared_path(kModel) + " --ctx 64 --keep 32 --temp 0 --ignore-eos --json";
  const Result whole = vkllm(run + " -p 'Once upon a time' -n 120");
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const Result a = vkllm(run + " -p 'Once upon a time' -n 10 --session " + s);
  ASSERT_EQ(a.rc, 0) << a.err;
  const Result b = vkllm(run + " -p '' -n 110 --session " + s);
  ASSERT_EQ(b.rc, 0) << b.err;
  std::vector<int32_t> joined = tokens_of(a);
  const std::vector<int32_t> second = tokens_of(b);
  joined.insert(joined.end(), second.begin(), second.end());
  EXPECT_EQ(joined, tokens_of(whole));
  // A --ctx the pin fills is refused, the file untouched (the pin was cut to --ctx − 1, the text
  // degenerated in a one-slot ring, and the file was saved with the cut pin).
  const std::string pinned = path("pinned.vkv");
  ASSERT_EQ(vkllm(run + " -p 'Once upon a time' -n 2 --session " + pinned).rc, 0);
  const std::string before = slurp(pinned);
  const Result small = vkllm("run -m " + vkllm::test::shared_path(kModel) + " --ctx 32 --temp 0 -p '' -n 4 --session " + pinned);
  EXPECT_EQ(small.rc, 1);
  EXPECT_TRUE(small.out.empty()) << small.out;
  EXPECT_NE(small.err.find(pinned + ": the session pins 32 tokens; --ctx 32 leaves no room after them; use --ctx 33 or more"),
            std::string::npos)
      << small.err;
  EXPECT_EQ(slurp(pinned), before);
}

// A prompt-cache entry stored by a run with another --keep does not change this run's pin: after
// the ring wraps, the reused run equals one that prefilled everything.
TEST_F(SessionTest, PromptCacheKeepsThisRunsPin) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string run = "run -m " + vkllm::test::shared_path(kModel) + " --ctx 64 --temp 0 --ignore-eos --json -p " +
                          "'Once upon a time there was a little girl named Lily who'";
  ASSERT_EQ(vkllm(run + " --keep 1 -n 2 --prompt-cache " + path("pc")).rc, 0);
  const Result reused = vkllm(run + " --keep 20 -n 100 --prompt-cache " + path("pc"));
  ASSERT_EQ(reused.rc, 0) << reused.err;
  EXPECT_GT(nlohmann::json::parse(reused.out).at("cached_tokens").get<int>(), 0);
  const Result fresh = vkllm(run + " --keep 20 -n 100");
  ASSERT_EQ(fresh.rc, 0) << fresh.err;
  EXPECT_EQ(tokens_of(reused), tokens_of(fresh));
}

// Through ring wraps and the rotated copy's rebases (a CPU driver keeps one), a continuation's
// logits equal the uninterrupted run's bit for bit: the session carries the copy's shifts (they
// differed by up to 4e-4 in log-probability when a restore rebased the copy).
TEST_F(SessionTest, SplitThroughTheRingIsBitIdentical) {
  const char* synth = "models/synth-llama-q8_0.gguf";
  VKLLM_REQUIRE_SHARED(synth);
  const std::string run = "run -m " + vkllm::test::shared_path(synth) + " --ctx 256 --temp 0 --ignore-eos --json --logprobs";
  const Result whole = vkllm(run + " -p Hello -n 560");
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const auto w = nlohmann::json::parse(whole.out);
  for (const int split : {300, 508}) {
    const std::string s = path("ring" + std::to_string(split) + ".vkv");
    const Result a = vkllm(run + " -p Hello -n " + std::to_string(split) + " --session " + s);
    ASSERT_EQ(a.rc, 0) << a.err;
    const Result b = vkllm(run + " -p '' -n " + std::to_string(560 - split) + " --session " + s);
    ASSERT_EQ(b.rc, 0) << b.err;
    const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
    std::vector<double> lp = ja.at("logprobs").get<std::vector<double>>();
    const std::vector<double> second = jb.at("logprobs").get<std::vector<double>>();
    lp.insert(lp.end(), second.begin(), second.end());
    EXPECT_EQ(lp, w.at("logprobs").get<std::vector<double>>()) << "split at " << split;
  }
}

// A call's save appends to the session (the new tokens' rows and the state). A save cut short (the
// file ends inside the last update, as after a kill mid-append) leaves the save before it: the next
// call says so, continues from there exactly as the cut call did, and its save cuts the bytes off.
TEST_F(SessionTest, ASaveCutShortLeavesTheSaveBefore) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string s = path("cut.vkv");
  const std::string run = model() + " --temp 0 --ignore-eos --json --session " + s;
  const Result a = vkllm(run + " -p 'Once upon a time' -n 8");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.err.find("appended"), std::string::npos) << a.err;  // the first save writes it whole
  const uint64_t first = fs::file_size(s);
  const Result b = vkllm(run + " -p '' -n 8");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_NE(b.err.find("appended) in"), std::string::npos) << b.err;
  const uint64_t second = fs::file_size(s);
  ASSERT_GT(second, first);
  fs::resize_file(s, second - 5);
  const Result c = vkllm(run + " -p '' -n 8");
  ASSERT_EQ(c.rc, 0) << c.err;
  std::string cut_bytes = std::to_string(second - 5 - first);  // with thousands separators, as said
  for (int at = int(cut_bytes.size()) - 3; at > 0; at -= 3) cut_bytes.insert(size_t(at), ",");
  EXPECT_NE(c.err.find("its last save did not finish: " + cut_bytes + " bytes after offset " + std::to_string(first) + " ignored"),
            std::string::npos)
      << c.err;
  EXPECT_EQ(tokens_of(c), tokens_of(b));
  EXPECT_EQ(fs::file_size(s), second);  // the same update, written again after the cut
  const Result d = vkllm(run + " -p '' -n 8");
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_EQ(d.err.find("did not finish"), std::string::npos) << d.err;
}

// Ctrl+C while an endless run (-n -1) generates stops it: the session is saved (that run has no
// other way to end and keep what it made), the stats say "interrupted", the status is 130. SIGTERM
// (`timeout`) and SIGHUP (a closed terminal) do the same, status 143 and 129 (they killed the run and
// lost the session).
TEST_F(SessionTest, CtrlCStopsAnEndlessRunAndSaves) {
  VKLLM_REQUIRE_SHARED(kModel);
  for (const auto& [sig, expected] : {std::pair{"INT", 130}, std::pair{"TERM", 143}, std::pair{"HUP", 129}}) {
    SCOPED_TRACE(sig);
    // Files of this signal's own: the loop below read the previous run's output as this one's first
    // tokens and signalled the run while it loaded (it died of the signal; flaky under load).
    const std::string s = path(std::string("endless-") + sig + ".vkv"), out = path(std::string("endless-") + sig + ".out"),
                      err = path(std::string("endless-") + sig + ".err");
    // The signal once the first tokens are out (not during the load or the prefill, where it ends the
    // process at once), then the run's status. With job control (set -m): a script's background job
    // would otherwise start with SIGINT ignored, which vkllm leaves ignored.
    const std::string script = "set -m; " + std::string(VKLLM_BINARY) + " " + model() + " -p 'Once upon a time' -n -1 --session " + s +
                               " </dev/null >" + out + " 2>" + err + " & pid=$!; for i in $(seq 600); do [ -s " + out +
                               " ] && break; sleep 0.1; done; kill -" + sig + " $pid; wait $pid; exit $?";
    const std::string file = path("endless.sh");
    std::ofstream(file) << script << "\n";
    const int status = std::system(("bash " + file).c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), expected) << slurp(err);
    EXPECT_NE(slurp(err).find("(interrupted)"), std::string::npos) << slurp(err);
    ASSERT_TRUE(fs::exists(s)) << slurp(err);
    const Result next = vkllm(model() + " --temp 0 --json -p '' -n 2 --session " + s);
    ASSERT_EQ(next.rc, 0) << next.err;
    EXPECT_GT(nlohmann::json::parse(next.out).at("cached_tokens").get<int>(), 5);
  }
  // A continued chat session (run --chat's second turn, which goes through the chat's
  // Conversation) stops the same way: its tokens are read for the signal, the turn is saved.
  const std::string c = path("endless-chat.vkv"), out = path("endless.out"), err = path("endless.err");
  ASSERT_EQ(vkllm(model() + " --temp 0 --chat -p hi -n 2 -q --session " + c).rc, 0);
  const std::string script = "set -m; " + std::string(VKLLM_BINARY) + " " + model() + " --chat -p 'Tell me more' -n -1 --ignore-eos --session " +
                             c + " </dev/null >" + out + " 2>" + err + " & pid=$!; for i in $(seq 600); do [ -s " + out +
                             " ] && break; sleep 0.1; done; kill -TERM $pid; wait $pid; exit $?";
  std::ofstream(path("endless.sh")) << script << "\n";
  const int status = std::system(("bash " + path("endless.sh")).c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 143) << slurp(err);
  EXPECT_NE(slurp(err).find("(interrupted)"), std::string::npos) << slurp(err);
  EXPECT_NE(slurp(c).find(R"({"content":"Tell me more","role":"user"})"), std::string::npos) << "the turn was not saved";
}

// Appending raw text to a session continues the token history; the stats count the restored
// tokens as cached.
TEST_F(SessionTest, AppendedPromptReusesTheSession) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string s = path("append.vkv");
  ASSERT_EQ(vkllm(model() + " --temp 0 --json -p 'Once upon a time' -n 4 --session " + s).rc, 0);
  const Result b = vkllm(model() + " --temp 0 --json -p ' there was a cat' -n 4 --session " + s);
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto j = nlohmann::json::parse(b.out);
  EXPECT_GE(j.at("cached_tokens").get<int>(), 5);
  EXPECT_GT(j.at("prompt_tokens").get<int>(), j.at("cached_tokens").get<int>());
}

// --chat sessions keep the messages: the second turn re-renders the conversation and reuses
// the restored cache up to the new user message. Raw and chat sessions do not mix.
TEST_F(SessionTest, ChatSessionKeepsTheConversation) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string s = path("chat.vkv");
  const Result a = vkllm(model() + " --temp 0 --json --chat --system 'Be brief.' -p 'Hi there' -n 4 --session " + s);
  ASSERT_EQ(a.rc, 0) << a.err;
  const int first = nlohmann::json::parse(a.out).at("prompt_tokens");
  const Result b = vkllm(model() + " --temp 0 --json --chat -p 'And then?' -n 4 --session " + s);
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_GE(nlohmann::json::parse(b.out).at("cached_tokens").get<int>(), first);
  const std::string file = slurp(s);
  EXPECT_NE(file.find(R"({"content":"Be brief.","role":"system"})"), std::string::npos);
  EXPECT_NE(file.find(R"({"content":"And then?","role":"user"})"), std::string::npos);
  const Result raw = vkllm(model() + " -p 'x' -n 1 -q --session " + s);
  EXPECT_EQ(raw.rc, 1);
  EXPECT_NE(raw.err.find("holds a chat session; continue it with --chat"), std::string::npos) << raw.err;
}

// A session saved with a quantized cache resumes in its type when the command line names none (it
// was refused after the weights loaded: "rerun with --cache-type q8_0"), in run and chat.
TEST_F(SessionTest, AResumedSessionKeepsItsCacheType) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string s = path("q8.vkv");
  ASSERT_EQ(vkllm(model() + " --temp 0 --cache-type q8_0 -p 'Once upon a time there was' -n 4 -q --session " + s).rc, 0);
  const Result run = vkllm(model() + " --temp 0 -p ' a' -n 2 --session " + s);
  EXPECT_EQ(run.rc, 0) << run.err;
  EXPECT_NE(run.err.find("KV q8_0/q8_0"), std::string::npos) << run.err;
  const std::string c = path("chat.vkv");
  ASSERT_EQ(vkllm(model() + " --chat --temp 0 --cache-type q4_0 -p Hello -n 2 -q --session " + c).rc, 0);
  const Result chat = vkllm("chat -m " + vkllm::test::shared_path(kModel) + " --ctx 256 -n 2 --session " + c, "chat");
  EXPECT_EQ(chat.rc, 0) << chat.err;
  EXPECT_NE(chat.err.find("KV q4_0/q4_0"), std::string::npos) << chat.err;
  // The adopted type does not come first: on another model the model is the reason (it was "--cache-type
  // q8_0 needs a KV row width …", a flag never typed, or a q4_0 warning before the refusal) …
  VKLLM_REQUIRE_SHARED("models/synth-llama-q8_0.gguf");
  const Result other = vkllm("run -m " + vkllm::test::shared_path("models/synth-llama-q8_0.gguf") + " -p '' -n 1 --session " + c);
  EXPECT_EQ(other.rc, 1);
  EXPECT_TRUE(other.err.starts_with("vkllm: error: " + c + ": saved with ")) << other.err;
  EXPECT_EQ(std::count(other.err.begin(), other.err.end(), '\n'), 1) << other.err;
  // … and a bad command line is named before a damaged session (status 2, as without a session).
  std::ofstream(path("damaged.vkv")) << "VKLLMSES";
  const Result flags = vkllm(model() + " --top-p 5 -p '' -n 1 --session " + path("damaged.vkv"));
  EXPECT_EQ(flags.rc, 2) << flags.err;
  EXPECT_NE(flags.err.find("top_p"), std::string::npos) << flags.err;
}

// Refused loads: another model, another cache type, too small a --ctx, a truncated file. Each
// is one line naming the file, and the file is left as it was.
TEST_F(SessionTest, RefusedLoadsNameTheReason) {
  VKLLM_REQUIRE_SHARED(kModel);
  VKLLM_REQUIRE_SHARED("models/synth-llama-q8_0.gguf");
  const std::string s = path("refuse.vkv");
  ASSERT_EQ(vkllm(model() + " --temp 0 -p 'Once upon a time there was' -n 8 -q --session " + s).rc, 0);
  const std::string before = slurp(s);

  const Result other = vkllm("run -m " + vkllm::test::shared_path("models/synth-llama-q8_0.gguf") + " -p '' -n 2 -q --session " + s);
  EXPECT_EQ(other.rc, 1);
  EXPECT_NE(other.err.find("refuse.vkv: saved with"), std::string::npos) << other.err;
  EXPECT_NE(other.err.find(", this is "), std::string::npos) << other.err;
  // Refused before the weights load (the load's lines never come), by run and by chat.
  for (const std::string cmd : {"run -p '' -n 2", "chat"}) {
    const Result early = vkllm(cmd + " -m " + vkllm::test::shared_path("models/synth-llama-q8_0.gguf") + " --session " + s);
    EXPECT_EQ(early.rc, 1) << cmd;
    EXPECT_EQ(early.err.rfind("vkllm: error: " + s + ": saved with", 0), 0u) << cmd << ": " << early.err;
    EXPECT_EQ(std::count(early.err.begin(), early.err.end(), '\n'), 1) << cmd << ": " << early.err;
  }

  // Another cache type is refused before the load too (without -q: no model or memory line).
  const Result type = vkllm(model() + " --cache-type q8_0 -p '' -n 2 --session " + s);
  EXPECT_EQ(type.rc, 1);
  EXPECT_EQ(type.err, "vkllm: error: " + s + ": saved with KV cache type f16/f16, this cache is q8_0/q8_0; rerun with --cache-type f16\n");

  const Result ctx = vkllm("run -m " + vkllm::test::shared_path(kModel) + " --ctx 8 -p '' -n 2 -q --session " + s);
  EXPECT_EQ(ctx.rc, 1);
  EXPECT_NE(ctx.err.find("more than --ctx 8 can hold; use --ctx"), std::string::npos) << ctx.err;
  EXPECT_EQ(slurp(s), before);

  {
    std::ofstream f(s, std::ios::binary | std::ios::trunc);
    f.write(before.data(), std::streamsize(before.size() - 100));
  }
  const Result cut = vkllm(model() + " -p '' -n 2 -q --session " + s);
  EXPECT_EQ(cut.rc, 1);
  EXPECT_NE(cut.err.find("truncated: section 'KVDT'"), std::string::npos) << cut.err;
  EXPECT_EQ(std::count(cut.err.begin(), cut.err.end(), '\n'), 1) << cut.err;
}

// The file holds the occupied slots only: tokens used × bytes per token + a small header.
TEST_F(SessionTest, FileSizeTracksTokensUsed) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string s = path("size.vkv");
  const Result r = vkllm(model() + " --temp 0 --ignore-eos --json -p 'Once upon a time' -n 20 --session " + s);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const uint64_t used = j.at("kv_tokens_used"), per_token = j.at("kv_bytes_per_token");
  const uint64_t size = fs::file_size(s);
  EXPECT_GE(size, used * per_token);
  // Plus the token ids (4 bytes each) and a fixed part: the header and the sampler state (the
  // mt19937 state as text, ~7 KiB, and a penalty history of ≤ 64 tokens).
  EXPECT_LE(size, used * per_token + used * 4 + 12 * 1024) << "used " << used << " × " << per_token;
}

// Two runs started together on one prompt-cache directory both succeed; a third run reuses
// the stored prefix and says where its prompt diverged.
TEST_F(SessionTest, ConcurrentRunsShareThePromptCache) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string dir = path("pc");
  const std::string manual = "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. ";
  const std::string common = model() + " --temp 0 -n 4 --prompt-cache " + dir + " --prompt-cache-size 1MiB";
  std::vector<pid_t> kids;
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const Result r = vkllm(common + " -p '" + manual + (i ? "Where did Lily play?" : "What was the dog called?") + "'",
                             "kid" + std::to_string(i));
      ::_exit(r.rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(path("kid0.err")) << slurp(path("kid1.err"));
  }
  const Result third = vkllm(common + " -p '" + manual + "Who was happy?'");
  ASSERT_EQ(third.rc, 0) << third.err;
  EXPECT_NE(third.err.find("the prompt differs from the cached one at token"), std::string::npos) << third.err;
  EXPECT_NE(third.err.find("· cached "), std::string::npos) << third.err;
  EXPECT_EQ(third.err.find("cached 0 "), std::string::npos) << third.err;
  const Result list = vkllm("cache list --dir " + dir);
  EXPECT_EQ(list.rc, 0) << list.err;
  EXPECT_NE(list.out.find(".vkv"), std::string::npos) << list.out;

  // A small cap evicts least recently used entries: only the newest (~20 KiB) stays. Files that
  // are not entries stay however old (a session someone keeps there, notes).
  const std::vector<std::string> foreign = {dir + "/my-story.vkv", dir + "/notes.vkv"};
  for (const std::string& f : foreign) {
    std::ofstream(f) << "not an entry";
    fs::last_write_time(f, fs::last_write_time(f) - std::chrono::hours(24 * 365));
  }
  auto entries = [&] {
    std::vector<fs::path> v;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".vkv" && std::find(foreign.begin(), foreign.end(), e.path().string()) == foreign.end())
        v.push_back(e.path());
    return v;
  };
  ASSERT_EQ(entries().size(), 3u);
  const std::string small_cap = model() + " --temp 0 -n 4 --prompt-cache " + dir + " --prompt-cache-size 30KiB -p '" + manual;
  const Result small = vkllm(small_cap + "Who was sad?'");
  ASSERT_EQ(small.rc, 0) << small.err;
  ASSERT_EQ(entries().size(), 1u);
  // The entry stored last stays, though this run's lookup touched the older one within the same
  // second (last use is read to the nanosecond).
  const fs::path older = entries()[0];
  ASSERT_EQ(vkllm(small_cap + "Who was glad?'").rc, 0);
  ASSERT_EQ(entries().size(), 1u);
  EXPECT_NE(entries()[0], older);
  // An entry longer than this run's --ctx is passed over with a warning, and kept: it is valid.
  std::string short_cmd = small_cap + "Who was glad?'";
  short_cmd.replace(short_cmd.find("--ctx 256"), 9, "--ctx 16");
  const Result short_ctx = vkllm(short_cmd);
  EXPECT_EQ(short_ctx.rc, 0) << short_ctx.err;
  EXPECT_NE(short_ctx.err.find("more than --ctx 16"), std::string::npos) << short_ctx.err;
  EXPECT_EQ(short_ctx.err.find("removing"), std::string::npos) << short_ctx.err;
  ASSERT_EQ(entries().size(), 1u);

  // Only regular files are entries: a FIFO and a directory with an entry's name are left alone (a
  // lookup removed them, or warned on every run). The temporary of a writer killed mid-write goes
  // once its process is gone; a live writer's stays.
  const std::string kept_name = entries()[0].filename().string();
  const auto named = [&](char last) { return dir + "/" + kept_name.substr(0, kept_name.size() - 20) + "000000000000000" + last + ".vkv"; };
  ASSERT_EQ(::mkfifo(named('0').c_str(), 0644), 0);
  fs::create_directory(named('1'));
  std::ofstream(named('1') + "/inside") << "x";
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const std::string dead = dir + "/." + kept_name + "." + std::to_string(gone) + ".AbCdEf";
  const std::string live = dir + "/." + kept_name + "." + std::to_string(::getpid()) + ".AbCdEf";
  // (One an hour old goes; a fresh one may be a live writer's in another PID namespace.)
  const std::string fresh_dead = dir + "/." + kept_name + "." + std::to_string(gone) + ".GhIjKl";
  std::ofstream(dead) << "half";
  std::ofstream(live) << "half";
  std::ofstream(fresh_dead) << "half";
  for (const std::string& t : {dead, live}) fs::last_write_time(t, fs::last_write_time(t) - std::chrono::hours(2));
  const Result odd = vkllm(small_cap + "Who was kind?'");
  EXPECT_EQ(odd.rc, 0) << odd.err;
  EXPECT_EQ(odd.err.find("removing"), std::string::npos) << odd.err;
  EXPECT_TRUE(fs::is_fifo(named('0')));
  EXPECT_TRUE(fs::is_directory(named('1')));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(fresh_dead));
  fs::remove(fresh_dead);
  fs::remove(named('0'));
  fs::remove_all(named('1'));
  fs::remove(live);

  // A corrupt entry is skipped with a warning and removed.
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".vkv") fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
  const Result after = vkllm(common + " -p '" + manual + "Who was happy?'");
  EXPECT_EQ(after.rc, 0) << after.err;
  EXPECT_NE(after.err.find("skipping and removing"), std::string::npos) << after.err;
  // An entry larger than the whole --prompt-cache-size is not stored, and said (one whose file
  // tipped it over the size was written and evicted at once, without a word).
  std::string tiny_cap = small_cap + "Who was tiny?'";
  tiny_cap.replace(tiny_cap.find("--prompt-cache-size 30KiB"), 25, "--prompt-cache-size 2KiB");
  const size_t before = entries().size();
  const Result tiny = vkllm(tiny_cap);
  EXPECT_EQ(tiny.rc, 0) << tiny.err;
  EXPECT_NE(tiny.err.find("prompt cache: not stored: the entry for these"), std::string::npos) << tiny.err;
  EXPECT_LE(entries().size(), before);
  // cache clear removes a killed writer's temporary (by eviction's rule) and leaves a running
  // writer's, whose entry would be lost (it removed every one).
  std::ofstream(dead) << "half";
  std::ofstream(live) << "half";
  for (const std::string& t : {dead, live}) fs::last_write_time(t, fs::last_write_time(t) - std::chrono::hours(2));
  ASSERT_EQ(vkllm("cache clear --dir " + dir).rc, 0);
  EXPECT_EQ(entries().size(), 0u);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live)) << "a running writer's temporary was cleared";
  fs::remove(live);
  for (const std::string& f : foreign) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_EQ(vkllm("cache list --dir " + dir).out.find(".vkv"), std::string::npos);
}

// A stored prompt that extends an entry at least half its length supersedes it (a chat that
// resends its conversation stored one entry per turn, each a copy of the last and more); the
// longer entry then serves what the shorter did. A much longer extension keeps the shorter one.
TEST_F(SessionTest, PromptCacheDropsTheEntriesANewOneSupersedes) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string dir = path("sup");
  const std::string common = model() + " --temp 0 -n 2 --json --prompt-cache " + dir + " -p ";
  const auto entries = [&] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".vkv";
    return n;
  };
  const std::string a = "Once upon a time there was a little girl named Lily. She loved to play outside.";
  ASSERT_EQ(vkllm(common + "'" + a + "'").rc, 0);
  ASSERT_EQ(entries(), 1u);
  const Result longer = vkllm(common + "'" + a + " One day she saw a big red ball.'");
  ASSERT_EQ(longer.rc, 0) << longer.err;
  EXPECT_EQ(entries(), 1u) << "the shorter entry was kept beside the one that extends it";
  // Another continuation of the first prompt still reuses it, from the longer entry.
  const Result other = vkllm(common + "'" + a + " Her friend Tom came too.'");
  ASSERT_EQ(other.rc, 0) << other.err;
  const nlohmann::json j = nlohmann::json::parse(other.out);
  const nlohmann::json first = nlohmann::json::parse(vkllm("tokenize --count -m " + vkllm::test::shared_path(kModel) + " -p '" + a + "'").out);
  EXPECT_GE(j["cached_tokens"].get<int>(), first.get<int>() - 1) << other.err;
  EXPECT_EQ(entries(), 2u);  // the two continuations (neither begins the other)
  // The best entry for that prompt (the newest) found corrupt at load time: it is removed and the
  // next best serves the shared prefix; the tokens are a cold run's.
  fs::path newest;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".vkv" && (newest.empty() || fs::last_write_time(e.path()) > fs::last_write_time(newest))) newest = e.path();
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(newest) - 100));
    f.put('\x5a');
  }
  const Result again = vkllm(common + "'" + a + " Her friend Tom came too.'");
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_NE(again.err.find("skipping and removing"), std::string::npos) << again.err;
  const nlohmann::json k = nlohmann::json::parse(again.out);
  EXPECT_GE(k["cached_tokens"].get<int>(), first.get<int>() - 1) << again.err;
  EXPECT_EQ(k["tokens"], j["tokens"]);
  EXPECT_EQ(entries(), 2u);
  // Far longer than the entry it extends (more than twice): both stay.
  std::string story = a + " Her friend Tom came too.";
  for (int i = 0; i < 4; ++i) story += " Lily and Tom went to the park to play with a big red ball.";
  ASSERT_EQ(vkllm(common + "'" + story + "'").rc, 0);
  EXPECT_EQ(entries(), 3u) << "an entry less than half the new one's length was removed";
}

// What the prompt cache does not do: load an entry that shares only a few tokens with the prompt
// (every prompt shares its BOS; the load read the whole entry and marked it used, so the smallest
// entry never aged out), write through a link named like an entry, or lose a prompt because the
// generation wrapped the ring (it is stored once prefilled). And the paths that name nothing: an
// empty `cache --dir` is not the default directory, a --dir that does not exist is an error, clearing a directory with no entry leaves no lock file there; an empty --session
// file starts a new session (as llama.cpp's).
TEST_F(SessionTest, PromptCacheLoadsOnlyRealPrefixesAndWritesOnlyItsFiles) {
  VKLLM_REQUIRE_SHARED(kModel);
  const std::string dir = path("pc");
  const std::string common = model() + " --temp 0 -n 4 --prompt-cache " + dir;
  ASSERT_EQ(vkllm(common + " -p 'Once upon a time there was a cat named Tom. He liked fish.'").rc, 0);
  std::vector<fs::path> stored;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".vkv") stored.push_back(e.path());
  ASSERT_EQ(stored.size(), 1u);
  const auto old_time = fs::last_write_time(stored[0]) - std::chrono::hours(1);
  fs::last_write_time(stored[0], old_time);
  const Result other = vkllm(common + " -p 'The sky is blue and the grass is green today.'");
  ASSERT_EQ(other.rc, 0) << other.err;
  EXPECT_NE(other.err.find("(not loaded: too little of it is shared to be worth reading)"), std::string::npos) << other.err;
  EXPECT_NE(other.err.find("· cached 0 ·"), std::string::npos) << other.err;
  EXPECT_EQ(fs::last_write_time(stored[0]), old_time) << "an entry sharing one token was marked used";
  const Result same = vkllm(common + " -p 'Once upon a time there was a cat named Tom. He liked milk.'");
  EXPECT_EQ(same.err.find("cached 0"), std::string::npos) << same.err;

  // A dangling link with the name the next entry takes: not written through, said.
  const std::string prompt = "Once upon a time there was a dog.";
  const std::string probe = path("probe");
  ASSERT_EQ(vkllm(model() + " --temp 0 -n 2 --prompt-cache " + probe + " -p '" + prompt + "'").rc, 0);
  std::string entry_name;
  for (const auto& e : fs::directory_iterator(probe))
    if (e.path().extension() == ".vkv") entry_name = e.path().filename().string();
  ASSERT_FALSE(entry_name.empty());
  const std::string target = path("outside.bin");
  fs::create_symlink(target, dir + "/" + entry_name);
  const Result linked = vkllm(common + " -p '" + prompt + "'");
  EXPECT_EQ(linked.rc, 0) << linked.err;
  EXPECT_NE(linked.err.find("exists and is not a regular file"), std::string::npos) << linked.err;
  EXPECT_FALSE(fs::exists(target)) << "the entry was written through the link";

  // A prompt whose generation wraps the ring (-n past the free slots) is stored once prefilled.
  std::string story;
  for (int i = 0; i < 10; ++i) story += "Lily and Tom went to the park to play with a big red ball. ";
  const std::string wrap = model() + " --temp 0 -n 100 --ignore-eos --json --prompt-cache " + path("wrap") + " -p '" + story + "'";
  const Result first = vkllm(wrap);
  ASSERT_EQ(first.rc, 0) << first.err;
  const nlohmann::json one = nlohmann::json::parse(first.out);
  ASSERT_GT(one["kv_evicted"].get<int>(), 0) << "the generation did not wrap the ring: " << first.out;
  const Result again = vkllm(wrap);
  ASSERT_EQ(again.rc, 0) << again.err;
  const nlohmann::json two = nlohmann::json::parse(again.out);
  EXPECT_EQ(two["cached_tokens"].get<int>(), two["prompt_tokens"].get<int>() - 1) << again.err;
  // A prompt longer than --ctx (-n runs it through the ring) is neither stored nor resumed from a
  // stored beginning (its prefill wraps the ring, and what each chunk sees depends on where the
  // chunks start): said, not silent, and its tokens are a cold run's.
  const std::string small = model() + " --temp 0 --ctx 32 --json --prompt-cache " + path("over");
  ASSERT_EQ(vkllm(small + " -n 1 -p 'Lily and Tom went to the park'").rc, 0);
  const auto entries = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(path("over"))) n += e.path().extension() == ".vkv";
    return n;
  };
  ASSERT_EQ(entries(), 1);
  const Result over = vkllm(small + " -n 8 -p '" + story + "'"), cold = vkllm(model() + " --temp 0 --ctx 32 --json -n 8 -p '" + story + "'");
  ASSERT_EQ(over.rc, 0) << over.err;
  ASSERT_EQ(cold.rc, 0) << cold.err;
  EXPECT_NE(over.err.find("prompt cache: not used (neither read nor written): the prompt's "), std::string::npos) << over.err;
  EXPECT_EQ(nlohmann::json::parse(over.out)["cached_tokens"].get<int>(), 0) << over.out;
  EXPECT_EQ(tokens_of(over), tokens_of(cold));
  EXPECT_EQ(entries(), 1);
  // An entry that cannot be opened (no descriptor left: ulimit -n 4, the session taking the last) is
  // skipped and kept, not removed as damaged.
  const std::string fd_dir = path("fds");
  ASSERT_EQ(vkllm(model() + " --temp 0 -n 2 --prompt-cache " + fd_dir + " -p 'Once upon a time there was a dog'").rc, 0);
  // (A child of its own: the descriptors the test inherited, as ctest's, closed before the limit;
  // everything it needs made before the fork.)
  const std::string starved_cmd = "exec " + std::string(VKLLM_BINARY) + " " + model() + " --temp 0 -n 2 --prompt-cache " + fd_dir +
                                  " --session " + path("fds.vkv") + " -p 'The sun was shining on the hill'";
  const std::string starved_out = path("starved.out"), starved_err = path("starved.err");
  Result starved;
  if (const pid_t pid = ::fork(); pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY), out = ::open(starved_out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644),
              err = ::open(starved_err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::close_range(3, ~0u, 0);
    const rlimit four{4, 4};
    ::setrlimit(RLIMIT_NOFILE, &four);
    ::execl("/bin/sh", "sh", "-c", starved_cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  } else {
    int status = 0;
    ::waitpid(pid, &status, 0);
    starved.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    starved.err = slurp(starved_err);
  }
  ASSERT_EQ(starved.rc, 0) << starved.err;
  EXPECT_NE(starved.err.find("prompt cache: skipping " + fd_dir + "/"), std::string::npos) << starved.err;
  EXPECT_NE(starved.err.find("Too many open files"), std::string::npos) << starved.err;
  EXPECT_EQ(starved.err.find("removing"), std::string::npos) << starved.err;
  int kept = 0;
  for (const auto& e : fs::directory_iterator(fd_dir)) kept += e.path().extension() == ".vkv";
  EXPECT_EQ(kept, 2);  // the first entry and the starved run's own

  // A directory that cannot be made says why (it said the directory does not exist).
  std::ofstream(path("a_file")) << "x";
  const Result blocked = vkllm(model() + " --temp 0 -n 2 --prompt-cache " + path("a_file/pc") + " -p 'Once upon a time there was a dog'");
  ASSERT_EQ(blocked.rc, 0) << blocked.err;
  EXPECT_NE(blocked.err.find("prompt cache: not stored: cannot create " + path("a_file/pc") + ": Not a directory"), std::string::npos)
      << blocked.err;

  // A bare --prompt-cache (its value optional) is the default directory; so is `--prompt-cache ""`,
  // which the parser does not tell apart from it. (Mesa's shader cache stays where it was.)
  {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const std::string old_xdg = xdg ? xdg : "";
    const char* home = std::getenv("HOME");
    if (!std::getenv("MESA_SHADER_CACHE_DIR") && (xdg || home)) {
      const std::string mesa = (xdg ? old_xdg : std::string(home) + "/.cache") + "/mesa_shader_cache";
      ::setenv("MESA_SHADER_CACHE_DIR", mesa.c_str(), 1);
    }
    ::setenv("XDG_CACHE_HOME", path("xdg").c_str(), 1);
    const Result bare = vkllm(model() + " -n 1 -p 'Once upon a time' --prompt-cache --temp 0");
    if (xdg) ::setenv("XDG_CACHE_HOME", old_xdg.c_str(), 1);
    else ::unsetenv("XDG_CACHE_HOME");
    EXPECT_EQ(bare.rc, 0) << bare.err;
    EXPECT_TRUE(fs::is_directory(path("xdg") + "/vkllm/prompt-cache")) << bare.err;
  }
  // Paths that name nothing.
  for (const char* sub : {"list", "clear"}) {
    const Result empty_dir = vkllm(std::string("cache ") + sub + " --dir ''");
    EXPECT_EQ(empty_dir.rc, 1) << sub;
    EXPECT_NE(empty_dir.err.find("--dir: an empty directory name"), std::string::npos) << empty_dir.err;
    const Result missing = vkllm(std::string("cache ") + sub + " --dir " + path("typo"));
    EXPECT_EQ(missing.rc, 1) << sub;
    EXPECT_EQ(missing.err, "vkllm: error: " + path("typo") + ": no such directory\n");
  }
  const std::string plain = path("plain");
  fs::create_directories(plain);
  EXPECT_EQ(vkllm("cache clear --dir " + plain).rc, 0);
  EXPECT_TRUE(fs::is_empty(plain)) << "clearing a directory without entries left a file there";
  for (const char* size : {"0x10", "1e3", " 5", "0", "0.5", "."})
    EXPECT_EQ(vkllm(model() + " -n 1 -p hi --prompt-cache " + dir + " --prompt-cache-size '" + size + "'").rc, 2) << size;
  for (const char* size : {"1TiB", ".5G", "1.5m", "100"})
    EXPECT_EQ(vkllm(model() + " -n 1 -p hi --prompt-cache " + dir + " --prompt-cache-size " + size).rc, 0) << size;

  // An empty --session file (mktemp's) is a new session, saved into it.
  const std::string session = path("new.vkv");
  std::ofstream(session).close();
  const Result fresh = vkllm(model() + " --temp 0 -n 3 -p 'Hello there' --session " + session);
  ASSERT_EQ(fresh.rc, 0) << fresh.err;
  EXPECT_NE(fresh.err.find("session " + session + " is empty: starting a new session"), std::string::npos) << fresh.err;
  EXPECT_GT(fs::file_size(session), 16u);
}

// read_rows walks a wrapped ring in logical order; restore puts the rows at slots 0…n−1 of a
// cache of another capacity, and reading them back gives the same bytes and tokens.
TEST(KvCacheRows, WrappedRingRoundTripsThroughRestore) {
  vkllm::ModelConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_embd = 64;
  using vkllm::CacheType;
  vkllm::KvCache ring(vkllm::test::vk(), c, {8, CacheType::F16, CacheType::Q8_0});
  ring.set_keep(2);
  std::vector<int32_t> pos, toks;
  for (int32_t t = 100; t < 112; ++t) toks.push_back(t);
  ring.append(toks, pos);  // 12 tokens into 8 slots: 4 evicted, the window wraps
  ASSERT_EQ(ring.evicted(), 4u);
  // Fill every slot's rows with a pattern naming the slot, layer and K/V.
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t slot = 0; slot < 8; ++slot) {
      std::vector<uint8_t> k(ring.row_bytes_k(), uint8_t(slot * 16 + l * 2)), v(ring.row_bytes_v(), uint8_t(slot * 16 + l * 2 + 1));
      vkllm::upload(vkllm::test::vk(), ring.k(l), slot * ring.row_bytes_k(), k.data(), k.size());
      vkllm::upload(vkllm::test::vk(), ring.v(l), slot * ring.row_bytes_v(), v.data(), v.size());
    }
  const std::vector<uint8_t> rows = ring.read_rows(ring.used());
  const uint64_t layer = uint64_t{ring.used()} * (ring.row_bytes_k() + ring.row_bytes_v());
  ASSERT_EQ(rows.size(), 2 * layer);
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t i = 0; i < ring.used(); ++i) {
      const uint8_t slot = uint8_t(ring.slot_of(i));
      EXPECT_EQ(rows[l * layer + i * ring.row_bytes_k()], uint8_t(slot * 16 + l * 2)) << "layer " << l << " token " << i;
      EXPECT_EQ(rows[l * layer + ring.used() * ring.row_bytes_k() + i * ring.row_bytes_v()], uint8_t(slot * 16 + l * 2 + 1));
    }
  vkllm::KvCache copy(vkllm::test::vk(), c, {16, CacheType::F16, CacheType::Q8_0});
  copy.restore(ring.tokens(), ring.keep(), ring.evicted(), rows);
  EXPECT_EQ(copy.tokens(), ring.tokens());
  EXPECT_EQ(copy.keep(), 2u);
  EXPECT_EQ(copy.evicted(), 4u);
  for (uint32_t i = 0; i < copy.used(); ++i) EXPECT_EQ(copy.slot_of(i), int32_t(i));
  EXPECT_EQ(copy.read_rows(copy.used()), rows);
  vkllm::test::expect_no_validation_messages();
}
