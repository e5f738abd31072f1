// `vkllm serve` end to end: the server is started by the test on an ephemeral port on 127.0.0.1
// and driven over HTTP (cpp-httplib's client, curl, and the official OpenAI client for Node).
// Greedy answers are compared with `vkllm run --temp 0` on the same prompt.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>

#include "test_support.h"

using nlohmann::json;
using vkllm::test::shared_path;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Runs a shell command; returns its stdout (exit status in *status).
std::string shell(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string stories() { return shared_path("models/stories260K.gguf"); }

// `vkllm run --temp 0` on a raw prompt: the generated text.
std::string run_greedy(const std::string& prompt, int n, const std::string& model = stories(), const std::string& more = "") {
  const std::string path = testing::TempDir() + "/vkllm_serve_prompt.txt";
  std::ofstream(path, std::ios::binary) << prompt;
  int status = 0;
  const std::string out = shell(std::string(VKLLM_BINARY) + " run -m " + model + " --temp 0 -n " + std::to_string(n) + " --json -f " +
                                    path + " " + more + " 2>/dev/null",
                                &status);
  EXPECT_EQ(status, 0);
  return json::parse(out)["text"].get<std::string>();
}

// A `vkllm serve` child process on an ephemeral port.
class Server {
 public:
  explicit Server(const std::string& args, const std::string& model = stories()) {
    // A client write to a connection the server closed is an error for the test to report, not
    // death by SIGPIPE (cpp-httplib sends without MSG_NOSIGNAL).
    signal(SIGPIPE, SIG_IGN);
    err_path_ = testing::TempDir() + "/vkllm_serve_" + std::to_string(getpid()) + "_" + std::to_string(counter_++) + ".err";
    const std::string cmd = std::string(VKLLM_BINARY) + " serve -m " + model + " --port 0 " + args + " 2>" + err_path_;
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // The port is on the "serving … on http://127.0.0.1:PORT/v1" line.
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      const std::string err = read_file(err_path_);
      const size_t at = err.find("http://127.0.0.1:");
      if (at != std::string::npos && err.find("/v1", at) != std::string::npos) port_ = std::atoi(err.c_str() + at + 17);
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~Server() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  // SIGTERM, then the exit status (-1: it did not exit within 60 s).
  int terminate() {
    kill(pid_, SIGTERM);
    return wait_exit(600);
  }
  void send_signal(int sig) { kill(pid_, sig); }
  // The exit status within tenths × 0.1 s (a signal's death: 128 + it), -1 if it did not exit.
  int wait_exit(int tenths) {
    for (int i = 0; i < tenths; ++i) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  std::string log() const { return read_file(err_path_); }

 private:
  static inline int counter_ = 0;
  std::string err_path_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
};

// Sends `first` as it is (httplib's client mends what it sends) on one connection, reads for half
// a second, then sends `then` (if any) and reads until the server closes the connection or 30 s
// pass; returns everything that came back. (cpp-httplib 0.11 does not answer requests pipelined
// in one send, so a second request goes after the first's answer.)
std::string raw_http(int port, const std::string& first, const std::string& then = "") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  char buf[4096];
  const auto read_for = [&](long seconds, long micros) {
    const timeval timeout{seconds, micros};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  };
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
      send(fd, first.data(), first.size(), MSG_NOSIGNAL) == ssize_t(first.size())) {
    if (!then.empty()) {
      read_for(0, 500000);
      send(fd, then.data(), then.size(), MSG_NOSIGNAL);
    }
    read_for(30, 0);
  }
  close(fd);
  return got;
}

json post(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  const auto res = c.Post(path, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response to " << path;
    return json();
  }
  if (status) *status = res->status;
  const json j = json::parse(res->body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << res->body;
  return j;
}

// A POST of `body` to /v1/completions whose response arrives through `receive` (which returns
// false to hang up): send it with Client::send.
httplib::Request completion_request(const json& body, httplib::ContentReceiverWithProgress receive) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = std::move(receive);
  return req;
}

// The text of a server-sent event stream of completion chunks; `done` says it ended with [DONE].
std::string stream_text(const std::string& sse, bool chat, bool* done, json* last_usage = nullptr) {
  std::string text;
  *done = false;
  std::istringstream in(sse);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      *done = true;
      continue;
    }
    const json j = json::parse(data);
    if (j.contains("usage") && last_usage) *last_usage = j["usage"];
    if (j["choices"].empty()) continue;
    const json& ch = j["choices"][0];
    if (chat && ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!chat) text += ch["text"].get<std::string>();
  }
  return text;
}

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog", "Tom and Sam went to the park",
                                           "One day, a girl named Lily", "The sun was"};

TEST(Serve, AnswersAsRunDoesWholeAndStreamed) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 2 --temp 0");
  ASSERT_GT(s.port(), 0) << s.log();
  const std::string expected = run_greedy(kPrompts[0], 24);
  httplib::Client c = s.client();

  int status = 0;
  const json whole = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 24}}, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["object"], "text_completion");
  EXPECT_EQ(whole["choices"][0]["text"], expected);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 24);
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 5);

  // The same through curl, streamed: the chunks add up to the same text and end with [DONE].
  const std::string sse = shell("curl -sN " + s.url() + "/v1/completions -H 'Content-Type: application/json' -d '" +
                                json({{"prompt", kPrompts[0]}, {"max_tokens", 24}, {"stream", true}}).dump() + "'");
  bool done = false;
  EXPECT_EQ(stream_text(sse, false, &done), expected) << sse;
  EXPECT_TRUE(done) << sse;

  // The models list, health, and the chat endpoint (whole and streamed give the same reply).
  const auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "stories260K.gguf");
  // OpenAI's models.retrieve: this model, or a 404 naming the one served.
  const auto one = c.Get("/v1/models/stories260K.gguf");
  ASSERT_TRUE(one);
  EXPECT_EQ(json::parse(one->body)["id"], "stories260K.gguf");
  const auto other = c.Get("/v1/models/gpt-4o");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found");
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json msgs = json::array({{{"role", "system"}, {"content", "You tell stories."}}, {{"role", "user"}, {"content", "A story about a cat"}}});
  const json chat = post(c, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 16}}, &status);
  ASSERT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  const auto streamed = c.Post("/v1/chat/completions",
                               json({{"messages", msgs}, {"max_tokens", 16}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}).dump(),
                               "application/json");
  ASSERT_TRUE(streamed);
  json usage;
  EXPECT_EQ(stream_text(streamed->body, true, &done, &usage), chat["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_TRUE(done);
  EXPECT_EQ(usage["completion_tokens"], 16);
  // The second identical chat reused all of its prompt but the last token.
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), usage["prompt_tokens"].get<int>() - 1);

  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("vkllm_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("vkllm_ttft_seconds_count 4"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("vkllm_queue_length 0"), std::string::npos);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// The log-probabilities of every event of a stream (the chat's content entries, or the legacy
// completions' tokens and token_logprobs as pairs), in order.
json streamed_logprobs(const std::string& sse, bool chat) {
  json out = json::array();
  std::istringstream in(sse);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const json j = json::parse(line.substr(6));
    if (j["choices"].empty() || j["choices"][0]["logprobs"].is_null()) continue;
    const json& lp = j["choices"][0]["logprobs"];
    if (chat) {
      for (const json& e : lp["content"]) out.push_back(e);
    } else {
      for (size_t i = 0; i < lp["tokens"].size(); ++i)
        out.push_back({lp["tokens"][i], lp["token_logprobs"][i], lp["top_logprobs"][i], lp["text_offset"][i]});
    }
  }
  return out;
}

// logprobs: the legacy completions' match `vkllm run --json --logprobs` on the same prompt, their
// tokens spell the text at their offsets, the alternatives are sorted and, greedy, led by the token
// taken; the chat's entries spell the reply in bytes, streamed as whole; a stop string's tokens are
// not reported.
TEST(Serve, ReportsLogProbabilitiesAsRunDoes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string path = testing::TempDir() + "/vkllm_serve_logprobs.txt";
  std::ofstream(path, std::ios::binary) << kPrompts[0];
  int status = 0;
  const json run = json::parse(shell(std::string(VKLLM_BINARY) + " run -m " + stories() + " --temp 0 -n 12 --json --logprobs -f " + path + " 2>/dev/null", &status));
  ASSERT_EQ(status, 0);
  Server s("--parallel 2 --temp 0");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();

  const json whole = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 12}, {"logprobs", 3}}, &status);
  ASSERT_EQ(status, 200) << whole.dump();
  const std::string text = whole["choices"][0]["text"];
  const json& lp = whole["choices"][0]["logprobs"];
  EXPECT_EQ(text, run["text"].get<std::string>());
  ASSERT_EQ(lp["tokens"].size(), 12u) << lp.dump();
  std::string spelled;
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), run["logprobs"][i].get<float>()) << i;
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), spelled.size()) << i;
    spelled += lp["tokens"][i].get<std::string>();
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u) << top.dump();
    float best = -INFINITY;
    for (const auto& [token, l] : top.items()) best = std::max(best, l.get<float>());
    EXPECT_FLOAT_EQ(best, lp["token_logprobs"][i].get<float>()) << "greedy takes the most likely token: " << top.dump();
    EXPECT_FLOAT_EQ(top[lp["tokens"][i].get<std::string>()].get<float>(), best) << top.dump();
  }
  EXPECT_EQ(spelled, text);
  // Streamed, the same entries, spread over the chunks that carry their text.
  const auto streamed = c.Post("/v1/completions", json({{"prompt", kPrompts[0]}, {"max_tokens", 12}, {"logprobs", 3}, {"stream", true}}).dump(),
                               "application/json");
  ASSERT_TRUE(streamed);
  const json chunks = streamed_logprobs(streamed->body, false);
  ASSERT_EQ(chunks.size(), 12u) << streamed->body;
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(chunks[i][0], lp["tokens"][i]) << i;

  // The chat: bytes spell the reply; each entry's alternatives sorted, most likely first. (A first
  // request caches the prompt, so that the two compared both reuse all of it but its last token: a
  // token prefilled alone or in a chunk of the prompt differs in the last bits of its logits.)
  const json msgs = json::array({{{"role", "user"}, {"content", "A story about a cat"}}});
  post(c, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 1}}, &status);
  const json chat = post(c, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 10}, {"logprobs", true}, {"top_logprobs", 4}}, &status);
  ASSERT_EQ(status, 200) << chat.dump();
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 10u) << chat.dump();
  std::string bytes;
  for (const json& e : content) {
    for (const json& b : e["bytes"]) bytes += char(b.get<int>());
    EXPECT_LE(e["logprob"].get<float>(), 0.0f);
    ASSERT_EQ(e["top_logprobs"].size(), 4u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    for (size_t k = 1; k < 4; ++k) EXPECT_GE(e["top_logprobs"][k - 1]["logprob"].get<float>(), e["top_logprobs"][k]["logprob"].get<float>());
  }
  EXPECT_EQ(bytes, chat["choices"][0]["message"]["content"].get<std::string>());
  const auto chat_streamed = c.Post("/v1/chat/completions",
                                    json({{"messages", msgs}, {"max_tokens", 10}, {"logprobs", true}, {"top_logprobs", 4}, {"stream", true}}).dump(),
                                    "application/json");
  ASSERT_TRUE(chat_streamed);
  EXPECT_EQ(streamed_logprobs(chat_streamed->body, true), content) << chat_streamed->body;
  // Without logprobs asked for, a choice's logprobs is null.
  const json plain = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 2}}, &status);
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null()) << plain.dump();

  // A stop string: the text ends before it, and the tokens reported are those whose text shows.
  const std::string word = text.substr(text.find(' ', 3), 4);  // a piece of the greedy text past its first word
  for (const bool stream : {false, true}) {
    const json req = {{"prompt", kPrompts[0]}, {"max_tokens", 12}, {"logprobs", 0}, {"stop", word}, {"stream", stream}};
    const auto r = c.Post("/v1/completions", req.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200);
    bool done = false;
    const std::string cut = stream ? stream_text(r->body, false, &done) : json::parse(r->body)["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(cut, text.substr(0, text.find(word))) << word;
    const json got = stream ? streamed_logprobs(r->body, false) : json();
    const json& tokens = stream ? json() : json::parse(r->body)["choices"][0]["logprobs"]["tokens"];
    std::string shown;
    for (size_t i = 0; i < (stream ? got.size() : tokens.size()); ++i) shown += (stream ? got[i][0] : tokens[i]).get<std::string>();
    EXPECT_GE(shown.size(), cut.size()) << "stream " << stream << ": " << r->body;
    EXPECT_EQ(shown.substr(0, cut.size()), cut) << "stream " << stream;
    EXPECT_LT(shown.size(), text.find(word) + word.size()) << "a token wholly inside the stop string was reported: " << r->body;
  }
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// `clients` concurrent clients × `requests` each against --parallel 4: every request answered,
// every greedy answer identical to `vkllm run --temp 0` on the same prompt (the decode steps of
// 2–4 sequences run as one batch).
// The value of a counter or gauge `name` in /metrics' text, −1 when absent.
double metric(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1.0 : std::atof(body.c_str() + at + name.size() + 2);
}

void expect_concurrent_answers_match_run(const std::string& model, int clients, int requests) {
  std::map<std::string, std::string> expected;
  for (const std::string& p : kPrompts) expected[p] = run_greedy(p, 20, model);
  Server s("--parallel 4 --temp 0", model);
  ASSERT_GT(s.port(), 0) << s.log();
  std::mutex mu;
  std::vector<std::string> failures;
  int answered = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t)
    threads.emplace_back([&, t] {
      httplib::Client c = s.client();
      for (int i = 0; i < requests; ++i) {
        const std::string& p = kPrompts[(t + i) % kPrompts.size()];
        const bool stream = (t + i) % 3 == 0;
        const auto res = c.Post("/v1/completions", json({{"prompt", p}, {"max_tokens", 20}, {"stream", stream}}).dump(), "application/json");
        std::lock_guard lock(mu);
        if (!res || res->status != 200) {
          failures.push_back("client " + std::to_string(t) + " request " + std::to_string(i) + ": " + (res ? res->body : "no response"));
          continue;
        }
        bool done = true;
        const std::string text = stream ? stream_text(res->body, false, &done) : json::parse(res->body)["choices"][0]["text"].get<std::string>();
        if (text != expected[p] || !done) failures.push_back("'" + p + "' → '" + text + "', expected '" + expected[p] + "'");
        ++answered;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(answered, clients * requests);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  // The steps did run several sequences at once.
  httplib::Client c = s.client();
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const double steps = metric(metrics->body, "vkllm_decode_steps_total"),
               advanced = metric(metrics->body, "vkllm_decode_step_sequences_total");
  EXPECT_GT(steps, 0);
  EXPECT_GT(advanced / steps, 1.5) << "mean decode batch";
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

TEST(Serve, EightClientsOnFourSequencesGetRunsAnswers) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  expect_concurrent_answers_match_run(stories(), 8, 10);
}

// The same on a model whose rows take the CPU drivers' matvec_simd (rows of 256 and 768): its
// 4-column dispatches must give each sequence what one column alone gives.
TEST(Serve, BatchedDecodeIsBatchInvariantOnQ4_0) {
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  expect_concurrent_answers_match_run(shared_path("models/synth-llama-q4_0.gguf"), 6, 4);
}

// A server with speculative decoding (drafts forced at every step) answers what `vkllm run`
// answers, a request at a time (verify passes of one sequence) and four at once (steps of four
// sequences, each with its draft), greedy and seeded, on stories260K and on a Q4_0 model's
// 4-column kernels; /metrics counts the drafts, and those that ran beside other sequences.
TEST(Serve, SpeculativeRepliesAreRunsReplies) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  for (const std::string& model : {stories(), shared_path("models/synth-llama-q4_0.gguf")}) {
    SCOPED_TRACE(model);
    // Prompt i: greedy where i is even, else sampled at temperature 1.5 with seed 20 + i.
    const auto seeded = [](size_t i) { return i % 2 == 1; };
    std::vector<std::string> expected;
    for (size_t i = 0; i < kPrompts.size(); ++i)
      expected.push_back(run_greedy(kPrompts[i], 40, model, seeded(i) ? "--temp 1.5 --seed " + std::to_string(20 + i) : ""));
    Server s("--parallel 4 --temp 0 --spec-type ngram-simple --spec-ngram-size-n 1 --draft-min 3 --draft-max 3", model);
    ASSERT_GT(s.port(), 0) << s.log();
    const auto ask = [&](size_t i, bool stream) {
      httplib::Client c = s.client();
      json body = {{"prompt", kPrompts[i]}, {"max_tokens", 40}, {"stream", stream}};
      if (seeded(i)) {
        body["temperature"] = 1.5;
        body["seed"] = 20 + i;
      }
      const auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (!res || res->status != 200) return std::string("no answer: ") + (res ? res->body : "");
      bool done = true;
      const std::string text = stream ? stream_text(res->body, false, &done) : json::parse(res->body)["choices"][0]["text"].get<std::string>();
      return done ? text : "no [DONE] after: " + text;
    };
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(ask(i, i % 3 == 0), expected[i]) << kPrompts[i];
    std::vector<std::future<std::string>> got;
    for (size_t i = 0; i < kPrompts.size(); ++i) got.push_back(std::async(std::launch::async, ask, i, i % 3 == 1));
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i].get(), expected[i]) << kPrompts[i];
    httplib::Client c = s.client();
    const auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_GT(metric(metrics->body, "vkllm_draft_tokens_total"), 30) << metrics->body;
    EXPECT_GT(metric(metrics->body, "vkllm_draft_accepted_total"), 0) << metrics->body;
    EXPECT_GT(metric(metrics->body, "vkllm_batched_draft_tokens_total"), 30) << metrics->body;
    EXPECT_EQ(s.terminate(), 0) << s.log();
  }
}

// A draft model (-md) in the server: every sequence drafts with its own draft cache, in the steps
// it shares with the others, and the replies are `vkllm run`'s, one at a time and four at once:
// stories260K drafting for itself (greedy replies take every draft) and a q4_0 copy drafting for
// the q8_0 synthetic model. A request's speculative.p_min must be a probability.
TEST(Serve, DraftModelRepliesAreRunsReplies) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q4_0.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q8_0.gguf");
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {stories(), stories()}, {shared_path("models/synth-llama-q8_0.gguf"), shared_path("models/synth-llama-q4_0.gguf")}};
  for (const auto& [model, draft] : pairs) {
    SCOPED_TRACE(model);
    const auto seeded = [](size_t i) { return i % 2 == 1; };
    std::vector<std::string> expected;
    for (size_t i = 0; i < kPrompts.size(); ++i)
      expected.push_back(run_greedy(kPrompts[i], 40, model, seeded(i) ? "--temp 1.5 --seed " + std::to_string(20 + i) : ""));
    Server s("--parallel 4 --temp 0 -md " + draft + " --draft-min 3 --draft-max 3 --draft-p-min 0", model);
    ASSERT_GT(s.port(), 0) << s.log();
    const auto ask = [&](size_t i) {
      httplib::Client c = s.client();
      json body = {{"prompt", kPrompts[i]}, {"max_tokens", 40}};
      if (seeded(i)) {
        body["temperature"] = 1.5;
        body["seed"] = 20 + i;
      }
      const auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (!res || res->status != 200) return std::string("no answer: ") + (res ? res->body : "");
      return json::parse(res->body)["choices"][0]["text"].get<std::string>();
    };
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(ask(i), expected[i]) << kPrompts[i];
    std::vector<std::future<std::string>> got;
    for (size_t i = 0; i < kPrompts.size(); ++i) got.push_back(std::async(std::launch::async, ask, i));
    for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i].get(), expected[i]) << kPrompts[i];
    httplib::Client c = s.client();
    const auto metrics = c.Get("/metrics");
    ASSERT_TRUE(metrics);
    const double drafted = metric(metrics->body, "vkllm_draft_tokens_total"), taken = metric(metrics->body, "vkllm_draft_accepted_total");
    EXPECT_GT(drafted, 100) << metrics->body;
    EXPECT_GT(taken, model == draft ? drafted / 2 : 10.0) << metrics->body;
    EXPECT_GT(metric(metrics->body, "vkllm_batched_draft_tokens_total"), 30) << metrics->body;
    int status = 0;
    const json bad = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"speculative.p_min", 2}}, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(bad["error"]["param"], "speculative.p_min") << bad.dump();
    EXPECT_EQ(s.terminate(), 0) << s.log();
  }
}

// llama-server's per-request speculation fields: "speculative.n_max" 0 turns a request's drafts
// off, "speculative.n_min"/"n_max" set its draft lengths (2 and 2: every draft is 2 tokens), the
// replies stay `vkllm run`'s; lengths no pass could draft, and wrong types, are 400s naming the
// field; without --spec-type the fields change nothing.
TEST(Serve, PerRequestSpeculationSettings) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string prompt = kPrompts[0], expected = run_greedy(prompt, 40);
  const auto drafted = [](Server& s) {
    httplib::Client c = s.client();
    const auto m = c.Get("/metrics");
    return m ? metric(m->body, "vkllm_draft_tokens_total") : -1.0;
  };
  Server s("--parallel 2 --temp 0 --ubatch 8 --spec-type ngram-simple --spec-ngram-size-n 1 --draft-min 3 --draft-max 3");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  json body = {{"prompt", prompt}, {"max_tokens", 40}, {"speculative.n_max", 0}};
  EXPECT_EQ(post(c, "/v1/completions", body)["choices"][0]["text"], expected);
  EXPECT_EQ(drafted(s), 0.0);
  body = {{"prompt", prompt}, {"max_tokens", 40}, {"speculative.n_max", 2}, {"speculative.n_min", 2}};
  EXPECT_EQ(post(c, "/v1/completions", body)["choices"][0]["text"], expected);
  const double two = drafted(s);
  EXPECT_GT(two, 0.0);
  EXPECT_EQ(std::fmod(two, 2.0), 0.0) << two << " draft tokens: drafts of 2 only";
  for (const auto& [bad, param] : std::vector<std::pair<json, std::string>>{{{{"speculative.n_min", 4}, {"speculative.n_max", 3}}, "speculative.n_min"},
                                                                             {{{"speculative.n_min", 8}}, "speculative.n_min"},  // --ubatch 8: 7 drafts
                                                                             {{{"speculative.n_max", -1}}, "speculative.n_max"},
                                                                             {{{"speculative.n_max", "x"}}, "speculative.n_max"}}) {
    json b = bad;
    b["prompt"] = prompt;
    int status = 0;
    const json r = post(c, "/v1/completions", b, &status);
    EXPECT_EQ(status, 400) << b.dump();
    EXPECT_EQ(r["error"]["param"], param) << r.dump();
  }
  EXPECT_EQ(post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 40}})["choices"][0]["text"], expected);  // still serving
  EXPECT_EQ(s.terminate(), 0) << s.log();
  Server plain("--parallel 1 --temp 0");
  ASSERT_GT(plain.port(), 0) << plain.log();
  httplib::Client p = plain.client();
  body = {{"prompt", prompt}, {"max_tokens", 40}, {"speculative.n_max", 4}, {"speculative.n_min", 2}};
  EXPECT_EQ(post(p, "/v1/completions", body)["choices"][0]["text"], expected);
  EXPECT_EQ(drafted(plain), 0.0);
  EXPECT_EQ(plain.terminate(), 0) << plain.log();
}

// Replies under a grammar: a GBNF 'grammar', response_format json_object and json_schema give what
// `vkllm run --grammar`/`-j` gives on the same prompt, while another sequence generates free text
// beside them (each sequence keeps its own grammar state); a bad grammar, a schema keyword the
// grammar cannot hold, or two grammars at once are 400s naming the field.
TEST(Serve, GrammarsConstrainRepliesAsRunDoes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string words = "root ::= (\" \" [a-z]+){3,8} \".\"", gbnf = testing::TempDir() + "/serve-words.gbnf",
                    json_gbnf = std::string(VKLLM_TEST_DATA) + "/grammar/json-object.gbnf";
  std::ofstream(gbnf) << words;
  const std::string want_words = run_greedy(kPrompts[1], 40, stories(), "--grammar-file " + gbnf);
  const std::string want_json = run_greedy(kPrompts[0], 30, stories(), "--grammar-file " + json_gbnf);
  const std::string want_free = run_greedy(kPrompts[2], 30);
  const std::string schema = R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2]}}, "required": ["ok", "n"]})";
  const std::string want_schema = run_greedy(kPrompts[3], 40, stories(), "-j '" + schema + "'");
  ASSERT_TRUE(json::parse(want_schema)["ok"].is_boolean()) << want_schema;  // the grammar ended the reply: whole JSON
  ASSERT_EQ(want_json.substr(0, 1), "{");
  Server s("--parallel 4 --temp 0");
  ASSERT_GT(s.port(), 0) << s.log();
  json got_words, got_json, got_free, got_schema;
  {
    std::vector<std::thread> clients;
    clients.emplace_back([&] {
      httplib::Client c = s.client();
      got_words = post(c, "/v1/completions", {{"prompt", kPrompts[1]}, {"max_tokens", 40}, {"grammar", words}});
    });
    clients.emplace_back([&] {
      httplib::Client c = s.client();
      got_json = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 30}, {"response_format", {{"type", "json_object"}}}});
    });
    clients.emplace_back([&] {
      httplib::Client c = s.client();
      got_free = post(c, "/v1/completions", {{"prompt", kPrompts[2]}, {"max_tokens", 30}});
    });
    clients.emplace_back([&] {
      httplib::Client c = s.client();
      // Sent as text: the schema's property order ("ok", then "n") is the reply's.
      const auto res = c.Post("/v1/completions",
                              R"({"prompt": ")" + kPrompts[3] + R"(", "max_tokens": 40, "response_format": {"type": "json_schema", )" +
                                  R"("json_schema": {"name": "answer", "schema": )" + schema + "}}}",
                              "application/json");
      if (res) got_schema = json::parse(res->body, nullptr, false);
    });
    for (std::thread& t : clients) t.join();
  }
  EXPECT_EQ(got_words["choices"][0]["text"], want_words) << got_words.dump();
  EXPECT_EQ(got_words["choices"][0]["finish_reason"], "stop");  // the grammar ended at its "."
  EXPECT_EQ(got_json["choices"][0]["text"], want_json) << got_json.dump();
  EXPECT_EQ(got_free["choices"][0]["text"], want_free) << got_free.dump();
  EXPECT_EQ(got_schema["choices"][0]["text"], want_schema) << got_schema.dump();
  EXPECT_EQ(got_schema["choices"][0]["finish_reason"], "stop");

  httplib::Client c = s.client();
  int status = 0;
  // json_object with a schema (llama-server's) is held to the schema.
  const auto object_schema = c.Post("/v1/completions",
                                    R"({"prompt": ")" + kPrompts[3] + R"(", "max_tokens": 40, "response_format": {"type": "json_object", )" +
                                        R"("schema": )" + schema + "}}",
                                    "application/json");
  ASSERT_TRUE(object_schema);
  EXPECT_EQ(json::parse(object_schema->body)["choices"][0]["text"], want_schema) << object_schema->body;
  json e = post(c, "/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= foo"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "grammar");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("rule 'foo' is used but never defined"), std::string::npos) << e.dump();
  e = post(c, "/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"response_format", {{"type", "json_schema"}, {"json_schema", "x"}}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "response_format");
  e = post(c, "/v1/completions", {{"prompt", "x"}, {"grammar", words}, {"response_format", {{"type", "json_object"}}}}, &status);
  EXPECT_EQ(status, 400);
  e = post(c, "/v1/completions", {{"prompt", "x"}, {"grammar", 3}}, &status);
  EXPECT_EQ(status, 400);
  e = post(c, "/v1/completions",
           {{"prompt", "x"}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "integer"}, {"minimum", 0}}}}}}}},
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "response_format");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("'minimum' is not supported"), std::string::npos) << e.dump();
  e = post(c, "/v1/completions", {{"prompt", "x"}, {"json_schema", {{"type", "string"}}}, {"grammar", words}}, &status);
  EXPECT_EQ(status, 400);
  // A grammar no token can go on with (a NUL after "a"): the request's error, a 400, whole or
  // streamed (after its first chunk, an error event); the server goes on.
  e = post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 5}, {"grammar", "root ::= \"a\" \"\\x00\""}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("no token of the vocabulary continues the text after 1 generated token"),
            std::string::npos) << e.dump();
  const auto streamed = c.Post("/v1/completions", json({{"prompt", "Once"}, {"max_tokens", 5}, {"stream", true}, {"grammar", "root ::= \"a\" \"\\x00\""}}).dump(),
                               "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_NE(streamed->body.find("\"type\":\"invalid_request_error\""), std::string::npos) << streamed->body;
  EXPECT_NE(streamed->body.find("data: [DONE]"), std::string::npos) << streamed->body;
  e = post(c, "/v1/completions", {{"prompt", kPrompts[1]}, {"max_tokens", 40}, {"grammar", words}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(e["choices"][0]["text"], want_words);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// logit_bias, OpenAI's object and llama.cpp's pairs, gives what `vkllm run -l` gives; a key that is
// no token id, a bias past ±100 or an id outside the vocabulary is a 400.
TEST(Serve, LogitBiasAsRunDoes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string plain = run_greedy(kPrompts[0], 12);
  const std::string lowered = run_greedy(kPrompts[0], 12, stories(), "-l 432-100 -l 383+2.5");  // 432 is ',' (greedy's first token)
  const std::string banned = run_greedy(kPrompts[0], 12, stories(), "-l 432-inf");
  ASSERT_NE(plain, lowered);
  Server s("--parallel 2 --temp 0");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  int status = 0;
  json r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 12}, {"logit_bias", {{"432", -100}, {"383", 2.5}}}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r["choices"][0]["text"], lowered) << r.dump();
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 12}, {"logit_bias", json::array({json::array({432, false})})}}, &status);
  EXPECT_EQ(r["choices"][0]["text"], banned) << r.dump();
  for (const json& bad : {json{{"x", 1}}, json{{"432", 101}}, json{{"512", 1}}, json{{"-1", 1}}, json("432"), json::array({432})}) {
    r = post(c, "/v1/completions", {{"prompt", "x"}, {"logit_bias", bad}}, &status);
    EXPECT_EQ(status, 400) << bad.dump();
    EXPECT_EQ(r["error"]["param"], "logit_bias") << bad.dump();
  }
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 12}}, &status);
  EXPECT_EQ(r["choices"][0]["text"], plain);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// llama-server's sampler fields (DRY, XTC, typical, top-n-sigma, mirostat) give what `vkllm run`'s
// flags give, greedy and seeded, while another request runs beside them; out-of-range ones are 400s.
TEST(Serve, LlamaCppSamplersAsRunDoes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string plain = run_greedy(kPrompts[0], 80);
  const std::string dry = run_greedy(kPrompts[0], 80, stories(), "--dry-multiplier 0.8 --dry-allowed-length 1 --dry-sequence-breaker .");
  const std::string xtc = run_greedy(kPrompts[0], 40, stories(), "--xtc-probability 1 --xtc-threshold 0.05");
  const std::string miro =
      run_greedy(kPrompts[0], 40, stories(), "--temp 1 --seed 5 --mirostat 2 --mirostat-ent 3 --typical 0.9 --top-nsigma 2");
  ASSERT_NE(plain, dry);
  ASSERT_NE(plain.substr(0, xtc.size()), xtc);
  Server s("--parallel 2 --temp 0");
  ASSERT_GT(s.port(), 0) << s.log();
  std::thread other([&] {
    httplib::Client c = s.client();
    post(c, "/v1/completions", {{"prompt", kPrompts[1]}, {"max_tokens", 60}, {"temperature", 0.9}, {"dry_multiplier", 2}});
  });
  httplib::Client c = s.client();
  int status = 0;
  json r = post(c, "/v1/completions",
                {{"prompt", kPrompts[0]}, {"max_tokens", 80}, {"dry_multiplier", 0.8}, {"dry_allowed_length", 1},
                 {"dry_sequence_breakers", {"."}}},
                &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r["choices"][0]["text"], dry) << r.dump();
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 40}, {"xtc_probability", 1}, {"xtc_threshold", 0.05}}, &status);
  EXPECT_EQ(r["choices"][0]["text"], xtc) << r.dump();
  r = post(c, "/v1/completions",
           {{"prompt", kPrompts[0]}, {"max_tokens", 40}, {"temperature", 1}, {"seed", 5}, {"mirostat", 2}, {"mirostat_tau", 3},
            {"typical_p", 0.9}, {"top_n_sigma", 2}},
           &status);
  EXPECT_EQ(r["choices"][0]["text"], miro) << r.dump();
  other.join();
  for (const auto& [name, bad] : std::vector<std::pair<std::string, json>>{{"mirostat", 3},
                                                                            {"dry_base", 0.5},
                                                                            {"dry_penalty_last_n", -1},
                                                                            {"xtc_threshold", 1.5},
                                                                            {"typical_p", "high"},
                                                                            {"dry_sequence_breakers", "\n"},
                                                                            {"dry_sequence_breakers", {1}}}) {
    r = post(c, "/v1/completions", {{"prompt", "x"}, {name, bad}}, &status);
    EXPECT_EQ(status, 400) << name << " " << bad.dump();
    EXPECT_EQ(r["error"]["param"], name) << bad.dump();
  }
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 80}}, &status);
  EXPECT_EQ(r["choices"][0]["text"], plain);
  // llama-server's n_predict (where no max_tokens is given) and ignore_eos.
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"n_predict", 5}}, &status);
  EXPECT_EQ(r["usage"]["completion_tokens"], 5) << r.dump();
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"n_predict", 5}, {"max_tokens", 7}}, &status);
  EXPECT_EQ(r["usage"]["completion_tokens"], 7) << r.dump();
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"n_predict", 0}}, &status);
  EXPECT_EQ(status, 400);
  r = post(c, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 200}, {"ignore_eos", true}}, &status);
  EXPECT_EQ(r["usage"]["completion_tokens"], 200) << "ignore_eos runs past the end of the story";
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// Each bad request gets a 4xx with an OpenAI error object, and the server keeps serving.
TEST(Serve, RefusesBadRequestsAndKeepsServing) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--ctx 128 --temp 0 --api-key sekrit --max-body 4KiB");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};
  const auto good = [&] {
    const auto r = c.Post("/v1/completions", auth, R"({"prompt":"Once upon a time","max_tokens":4})", "application/json");
    return r && r->status == 200 && json::parse(r->body)["usage"]["completion_tokens"] == 4;
  };
  struct Case {
    std::string name, path, body;
    int status;
    httplib::Headers headers;
  };
  const std::string long_prompt(2000, 'a');
  const std::vector<Case> cases = {
      {"malformed JSON", "/v1/completions", "{\"prompt\": ", 400, auth},
      {"not an object", "/v1/completions", "[1,2]", 400, auth},
      {"wrong type", "/v1/completions", R"({"prompt":"x","temperature":"hot"})", 400, auth},
      {"negative max_tokens", "/v1/completions", R"({"prompt":"x","max_tokens":-1})", 400, auth},
      {"huge max_tokens", "/v1/completions", R"({"prompt":"x","max_tokens":99999999999})", 400, auth},
      {"prompt longer than the context", "/v1/completions", json({{"prompt", std::string(400, 'z') + " the end"}}).dump(), 400, auth},
      {"unknown role", "/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"hi"}]})", 400, auth},
      {"no messages", "/v1/chat/completions", R"({"messages":[]})", 400, auth},
      {"a message without content", "/v1/chat/completions", R"({"messages":[{"role":"user"}]})", 400, auth},
      {"a user message with null content", "/v1/chat/completions", R"({"messages":[{"role":"user","content":null}]})", 400, auth},
      {"token outside the vocabulary", "/v1/completions", R"({"prompt":[1, 999999]})", 400, auth},
      {"no API key", "/v1/completions", R"({"prompt":"x"})", 401, {}},
      {"wrong API key", "/v1/completions", R"({"prompt":"x"})", 401, {{"Authorization", "Bearer nope"}}},
      {"body too large", "/v1/completions", json({{"prompt", long_prompt + long_prompt + long_prompt}}).dump(), 413, auth},
      {"unknown endpoint", "/v1/embeddings", R"({"input":"x"})", 404, auth},
      {"a negative seed other than -1", "/v1/completions", R"({"prompt":"x","seed":-2})", 400, auth},
      {"top_logprobs without logprobs", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":2})", 400, auth},
      {"top_logprobs past 20", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21})", 400, auth},
      {"a chat logprobs that is no flag", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"logprobs":3})", 400, auth},
      {"tools given", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]})", 400, auth},
      {"a response format of an unknown type", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"yaml"}})", 400, auth},
      {"a response format without a type", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"response_format":{}})", 400, auth},
      {"a grammar that is not GBNF", "/v1/completions", R"({"prompt":"x","grammar":"root := \"a\""})", 400, auth},
      {"echo", "/v1/completions", R"({"prompt":"x","echo":true})", 400, auth},
      {"legacy logprobs past 20", "/v1/completions", R"({"prompt":"x","logprobs":21})", 400, auth},
      {"legacy logprobs true (a count is wanted)", "/v1/completions", R"({"prompt":"x","logprobs":true})", 400, auth},
      {"top_logprobs on the legacy completions", "/v1/completions", R"({"prompt":"x","logprobs":1,"top_logprobs":2})", 400, auth},
      {"a count with a fraction", "/v1/completions", R"({"prompt":"x","max_tokens":2.5})", 400, auth},
      {"two choices", "/v1/completions", R"({"prompt":"x","n":2})", 400, auth},
      {"a number past a double", "/v1/completions", R"({"prompt":"x","max_tokens":1e999})", 400, auth},
      {"a tool message", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"42"}]})", 400, auth},
      {"an assistant's tool calls", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]}]})", 400, auth},
  };
  for (const Case& k : cases) {
    const auto r = c.Post(k.path, k.headers, k.body, "application/json");
    ASSERT_TRUE(r) << k.name;
    EXPECT_EQ(r->status, k.status) << k.name << ": " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(!j.is_discarded() && j.contains("error") && j["error"]["message"].is_string()) << k.name << ": " << r->body;
    EXPECT_TRUE(good()) << "after " << k.name;
  }
  // Two Content-Lengths that differ: 400, and the connection ends there, so a request hidden after
  // the headers is never answered (httplib kept the connection open whatever the response said).
  const std::string get_models = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string smuggled = raw_http(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                                                  "Content-Length: 14\r\nContent-Length: 99\r\n\r\n", get_models);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0) << "not closed";
  EXPECT_EQ(smuggled.rfind("HTTP/1.1 400", 0), 0u) << smuggled;
  EXPECT_NE(smuggled.find("Content-Length headers that differ"), std::string::npos) << smuggled;
  EXPECT_EQ(smuggled.find("HTTP/1.1", 1), std::string::npos) << "a second response: " << smuggled;
  EXPECT_TRUE(good()) << "after two Content-Lengths";
  // A chunked body past --max-body is read and dropped before the 413, so the connection stays in
  // step for its next request (its rest was read as requests: 414, then 400).
  std::string chunks;
  for (int i = 0; i < 6; ++i) chunks += "3e8\r\n" + std::string(1000, 'x') + "\r\n";
  const std::string drained = raw_http(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                                                 "Transfer-Encoding: chunked\r\n\r\n" + chunks + "0\r\n\r\n",
                                       "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(drained.rfind("HTTP/1.1 413", 0), 0u) << drained;
  EXPECT_NE(drained.find("HTTP/1.1 200"), std::string::npos) << drained;
  EXPECT_EQ(drained.find("HTTP/1.1 4", 1), std::string::npos) << "the body's rest read as requests: " << drained;
  // A POST refused for its key has its body read first: the connection stays in step, and the
  // next request on it is answered.
  const std::string body = R"({"prompt":"x"})";
  const std::string kept = raw_http(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body,
                                    "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(kept.rfind("HTTP/1.1 401", 0), 0u) << kept;
  EXPECT_NE(kept.find("HTTP/1.1 200"), std::string::npos) << kept;
  // A POST with neither Content-Length nor Transfer-Encoding has no body (RFC 9112): it is answered
  // at once, 404 on an unknown path and the endpoint's own 400 on a known one, and the connection
  // goes on (httplib read such a body until the client closed, then answered an empty 400).
  for (const auto& [path, status] : {std::pair{"/no-such-endpoint", "HTTP/1.1 404"}, std::pair{"/v1/completions", "HTTP/1.1 400"}}) {
    const auto t1 = std::chrono::steady_clock::now();
    const std::string bodiless = raw_http(s.port(), "POST " + std::string(path) + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n\r\n",
                                          "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\nConnection: close\r\n\r\n");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 3.0) << path;
    EXPECT_EQ(bodiless.rfind(status, 0), 0u) << bodiless;
    EXPECT_NE(bodiless.find("\"error\""), std::string::npos) << bodiless;
    EXPECT_NE(bodiless.find("HTTP/1.1 200"), std::string::npos) << bodiless;
  }
  // Refused fields of OpenAI's API say so in their code (the clients show it).
  for (const std::string body : {R"({"prompt":"x","n":2})", R"({"prompt":"x","echo":true})"}) {
    const auto r = c.Post("/v1/completions", auth, body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "unsupported_parameter") << body << ": " << r->body;
  }
  // OpenAI's error layout: the class of error in type, the case's name in code (or null).
  const auto too_long = c.Post("/v1/completions", auth, json({{"prompt", std::string(400, 'z') + " the end"}}).dump(), "application/json");
  ASSERT_TRUE(too_long);
  const json too_long_error = json::parse(too_long->body)["error"];
  EXPECT_EQ(too_long_error["type"], "invalid_request_error") << too_long->body;
  EXPECT_EQ(too_long_error["code"], "context_length_exceeded") << too_long->body;
  EXPECT_EQ(too_long_error["param"], "prompt") << too_long->body;
  // What clients send by default passes: the unsupported fields' "off" values, a seed of -1
  // (random) or up to 2^64 - 1, the Bearer scheme in any case; counts as floats without a
  // fraction, top_k -1 (off, as vLLM's clients send it).
  for (const std::string extra : {R"("n":1.0,"max_tokens":1.0,"top_k":-1)", R"("logprobs":false,"tools":[],"tool_choice":"auto","response_format":{"type":"text"})",
                                  R"("logit_bias":{},"echo":false,"best_of":1,"suffix":"","seed":-1)", R"("seed":18446744073709551615)",
                                  R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none")",
                                  R"("best_of":1.0,"logit_bias":{"5":0},"logprobs":false)"}) {
    const auto r = c.Post("/v1/completions", auth, R"({"prompt":"Once upon a time","max_tokens":1,)" + extra + "}", "application/json");
    ASSERT_TRUE(r) << extra;
    EXPECT_EQ(r->status, 200) << extra << ": " << r->body;
  }
  const auto lower = c.Post("/v1/completions", {{"Authorization", "bearer sekrit"}}, R"({"prompt":"Once","max_tokens":1})", "application/json");
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->status, 200) << lower->body;
  // An assistant message may have null content (OpenAI's API allows it there).
  const auto null_assistant = c.Post("/v1/chat/completions", auth,
                                     R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null},)"
                                     R"({"role":"user","content":"Once upon a time"}],"max_tokens":2})",
                                     "application/json");
  ASSERT_TRUE(null_assistant);
  EXPECT_EQ(null_assistant->status, 200) << null_assistant->body;
  // A body is read whatever its Content-Type (curl -d sends form-urlencoded), up to --max-body:
  // 3.5 KiB here (JSON may end in white space), and 5 KiB is refused.
  const std::string small_request = R"({"prompt":"Once upon a time","max_tokens":2})";
  const auto form = c.Post("/v1/completions", auth, small_request + std::string(3500, ' '), "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200) << form->body;
  const auto big_form = c.Post("/v1/completions", auth, small_request + std::string(5000, ' '), "application/x-www-form-urlencoded");
  ASSERT_TRUE(big_form);
  EXPECT_EQ(big_form->status, 413) << big_form->body;
  EXPECT_TRUE(good()) << "after the form-typed bodies";
  // A chunked body (no Content-Length, which httplib checks alone) is held to --max-body too: it
  // was read whole, 50 MB as well as 5 KiB.
  const auto chunked = [&](const std::string& body) {
    return c.Post("/v1/completions", auth,
                  [body](size_t, httplib::DataSink& sink) {
                    for (size_t at = 0; at < body.size(); at += 1000) sink.write(body.data() + at, std::min<size_t>(1000, body.size() - at));
                    sink.done();
                    return true;
                  },
                  "application/json");
  };
  const auto small_chunked = chunked(small_request + std::string(3000, ' '));
  ASSERT_TRUE(small_chunked);
  EXPECT_EQ(small_chunked->status, 200) << small_chunked->body;
  const auto big_chunked = chunked(small_request + std::string(5000, ' '));
  ASSERT_TRUE(big_chunked);
  EXPECT_EQ(big_chunked->status, 413) << big_chunked->body;
  EXPECT_TRUE(good()) << "after the chunked bodies";
  // A second server on this one's port is refused (httplib's SO_REUSEPORT let it share the port).
  const std::string second = "timeout 120 " + std::string(VKLLM_BINARY) + " serve -q -m " + stories() + " --port " +
                             std::to_string(s.port()) + " >/dev/null 2>" + testing::TempDir() + "/vkllm_serve_second.err";
  const int st = std::system(second.c_str());
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << read_file(testing::TempDir() + "/vkllm_serve_second.err");
  EXPECT_NE(read_file(testing::TempDir() + "/vkllm_serve_second.err").find("cannot listen"), std::string::npos);
  // max_tokens up to the context is accepted, but generation stops where the context is full
  // rather than running through the ring.
  const auto full = c.Post("/v1/completions", auth, R"({"prompt":"Once upon a time","max_tokens":128})", "application/json");
  ASSERT_TRUE(full);
  ASSERT_EQ(full->status, 200) << full->body;
  const json u = json::parse(full->body)["usage"];
  EXPECT_LE(u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>(), 128) << full->body;
  if (json::parse(full->body)["choices"][0]["finish_reason"] == "length") {
    EXPECT_EQ(u["total_tokens"], 128) << full->body;
  }
  // /health needs no key.
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// Browser pages (CORS): this machine's origins and --allow-origin ones get the Access-Control
// headers and their preflights (which carry no key) answered; other origins 403. A known path
// asked with another method answers 405 with its Allow header; httplib's own refusals say why.
TEST(Serve, BrowserOriginsMethodsAndHttpRefusals) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  // Taken as a browser writes an origin: lower case, no trailing "/", no default port.
  Server s("--ctx 128 --temp 0 --api-key sekrit --allow-origin HTTPS://UI.example/ --allow-origin http://def.example:80");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  const httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};
  const std::string request = R"({"prompt":"Once upon a time","max_tokens":2})";
  for (const std::string origin : {"http://localhost:3000", "http://127.0.0.1", "https://[::1]:8443", "http://[::1]", "https://ui.example", "http://def.example"}) {
    const auto pre = c.Options("/v1/chat/completions", {{"Origin", origin}, {"Access-Control-Request-Method", "POST"},
                                                        {"Access-Control-Request-Headers", "authorization,content-type"}});
    ASSERT_TRUE(pre) << origin;
    EXPECT_EQ(pre->status, 204) << origin << ": " << pre->body;
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), origin);
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Methods"), "POST, OPTIONS");
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization,content-type");
    httplib::Headers h = auth;
    h.emplace("Origin", origin);
    const auto r = c.Post("/v1/completions", h, request, "application/json");
    ASSERT_TRUE(r) << origin;
    EXPECT_EQ(r->status, 200) << origin << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), origin);
  }
  for (const std::string origin : {"https://evil.example", "null", "http://localhost.evil.example", "http://127.0.0.1:99999x",
                                   "http://[::1", "http://[::1]x", "http://127.0.0.1:"}) {
    httplib::Headers h = auth;
    h.emplace("Origin", origin);
    const auto r = c.Post("/v1/completions", h, request, "application/json");
    ASSERT_TRUE(r) << origin;
    EXPECT_EQ(r->status, 403) << origin << ": " << r->body;
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin")) << origin;
    EXPECT_NE(r->body.find("--allow-origin"), std::string::npos) << r->body;
    const auto pre = c.Options("/v1/completions", {{"Origin", origin}, {"Access-Control-Request-Method", "POST"}});
    ASSERT_TRUE(pre) << origin;
    EXPECT_EQ(pre->status, 403) << origin;
  }
  const auto expect_405 = [&](const httplib::Result& r, const std::string& allow) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405) << r->body;
    EXPECT_EQ(r->get_header_value("Allow"), allow);
    EXPECT_NE(r->body.find("is not allowed on"), std::string::npos) << r->body;
  };
  expect_405(c.Get("/v1/chat/completions", auth), "POST, OPTIONS");
  expect_405(c.Delete("/v1/completions", auth), "POST, OPTIONS");
  expect_405(c.Post("/v1/models", auth, "{}", "application/json"), "GET, HEAD, OPTIONS");
  const auto no_key = c.Get("/v1/chat/completions");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  const auto url = c.Get("/v1/models?" + std::string(9000, 'a'), auth);
  ASSERT_TRUE(url);
  EXPECT_EQ(url->status, 414);
  EXPECT_NE(url->body.find("URL is longer than 8 KiB"), std::string::npos) << url->body;
  const auto header = c.Get("/v1/models", {{"Authorization", "Bearer sekrit"}, {"X-Long", std::string(9000, 'a')}});
  ASSERT_TRUE(header);
  EXPECT_EQ(header->status, 400);
  EXPECT_NE(header->body.find("header line longer than 8 KiB"), std::string::npos) << header->body;
  const auto multipart = c.Post("/v1/completions", auth, request, "multipart/form-data; boundary=xx");
  ASSERT_TRUE(multipart);
  EXPECT_EQ(multipart->status, 415) << multipart->body;
  const auto after = c.Post("/v1/completions", auth, request, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// Messages as clients send them: text parts joined by a newline; a system message on a template
// that has no system role (Gemma 2's raises) begins the user's message; a last assistant message
// is the start of the reply, which goes on from it.
TEST(Serve, TakesMessagesAsLlamaCppDoes) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("templates/unrendered/google-gemma-2-2b-it.jinja");
  Server s("--ctx 256 --temp 0 --chat-template " + shared_path("templates/unrendered/google-gemma-2-2b-it.jinja"));
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  const auto chat = [&](const json& messages) {
    int status = 0;
    const json r = post(c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 6}}, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return std::make_pair(r["choices"][0]["message"]["content"].get<std::string>(), r["usage"]["prompt_tokens"].get<int>());
  };
  const json parts = {{"type", "text"}, {"text", "Lily had a ball"}};
  const json parts2 = {{"type", "text"}, {"text", "The ball was red"}};
  EXPECT_EQ(chat({{{"role", "user"}, {"content", {parts, parts2}}}}), chat({{{"role", "user"}, {"content", "Lily had a ball\nThe ball was red"}}}));
  EXPECT_EQ(chat({{{"role", "system"}, {"content", "Tell a story"}}, {{"role", "user"}, {"content", "Once upon a time"}}}),
            chat({{{"role", "user"}, {"content", "Tell a story\nOnce upon a time"}}}));
  EXPECT_EQ(chat({{{"role", "developer"}, {"content", "Tell a story"}}, {{"role", "user"}, {"content", "Once upon a time"}}}),
            chat({{{"role", "user"}, {"content", "Tell a story\nOnce upon a time"}}}));
  // The prefill: the reply goes on from "Lily", as the whole prompt given as text (after the BOS the
  // completions add) does.
  const auto [text, prompt_tokens] = chat({{{"role", "user"}, {"content", "Tell a story"}}, {{"role", "assistant"}, {"content", "Lily"}}});
  int status = 0;
  const json raw = post(c, "/v1/completions",
                        {{"prompt", "<start_of_turn>user\nTell a story<end_of_turn>\n<start_of_turn>model\nLily"}, {"max_tokens", 6}}, &status);
  ASSERT_EQ(status, 200) << raw.dump();
  EXPECT_EQ(text, raw["choices"][0]["text"]);
  EXPECT_EQ(prompt_tokens, raw["usage"]["prompt_tokens"]);
  // An empty last assistant message is no prefill: the conversation before it.
  EXPECT_EQ(chat({{{"role", "user"}, {"content", "Tell a story"}}, {{"role", "assistant"}, {"content", nullptr}}}),
            chat({{{"role", "user"}, {"content", "Tell a story"}}}));
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// Connections that hold a thread without a request (idle keep-alive, a stalled upload) do not
// stall the others: cpp-httplib's fixed pool (--parallel + --queue + 4 threads) left every later
// connection unaccepted until their 5 s read timeouts, /health included.
TEST(Serve, SilentConnectionsDoNotStallOthers) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 1 --queue 1");
  ASSERT_GT(s.port(), 0) << s.log();
  std::vector<int> silent;
  for (int i = 0; i < 12; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(s.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server accepts them
  const auto t0 = std::chrono::steady_clock::now();
  httplib::Client c = s.client();
  const auto health = c.Get("/health");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_LT(waited, 2.0) << "/health waited behind silent connections";
  int status = 0;
  const json answer = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 200) << answer.dump();
  for (int fd : silent) close(fd);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// A full queue answers 503; a client that disconnects mid-stream frees its sequence; SIGTERM
// lets a running stream finish, then the server exits 0.
TEST(Serve, QueueLimitDisconnectAndDrain) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 1 --queue 0 --temp 0 --ctx 2048");
  ASSERT_GT(s.port(), 0) << s.log();
  // A long stream, dropped by its client after the first chunk.
  {
    httplib::Client c = s.client();
    int chunks = 0;
    int busy_status = 0;
    const auto receive = [&](const char*, size_t, uint64_t, uint64_t) {
      if (++chunks == 1) {
        // The only sequence is busy and the queue holds none: 503.
        httplib::Client c2 = s.client();
        const auto busy = c2.Post("/v1/completions", R"({"prompt":"x","max_tokens":2})", "application/json");
        busy_status = busy ? busy->status : -1;
        if (busy) {
          EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
        }
      }
      return chunks < 3;  // then hang up
    };
    httplib::Request req = completion_request(json({{"prompt", "Once"}, {"max_tokens", 2000}, {"stream", true}}), receive);
    c.send(req);
    EXPECT_EQ(busy_status, 503);
    EXPECT_EQ(chunks, 3);
  }
  // The dropped stream's sequence is freed at its next step: a new request is served at once
  // rather than after ~2,000 more tokens.
  httplib::Client c = s.client();
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  for (int i = 0; i < 50 && status != 200; ++i) {
    const auto r = c.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":4})", "application/json");
    status = r ? r->status : -1;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(status, 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);

  // SIGTERM during a stream: the stream completes with [DONE], then the server exits 0.
  std::string sse;
  std::thread streamer([&] {
    httplib::Client c3 = s.client();
    const auto r = c3.Post("/v1/completions", json({{"prompt", "The sun was"}, {"max_tokens", 300}, {"stream", true}}).dump(), "application/json");
    if (r) sse = r->body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(s.terminate(), 0) << s.log();
  streamer.join();
  bool done = false;
  const std::string text = stream_text(sse, false, &done);
  EXPECT_TRUE(done) << sse.substr(0, 500);
  EXPECT_FALSE(text.empty());
}

// A second SIGTERM (or Ctrl+C) during the drain ends the server at once, status 128 + the signal,
// as llama-server's second Ctrl+C: the drain waits for every running and queued request (it was
// ignored, and only SIGKILL ended a long drain).
TEST(Serve, ASecondSignalStopsTheDrain) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 1 --temp 0 --ctx 2048");
  ASSERT_GT(s.port(), 0) << s.log();
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i)
    clients.emplace_back([&] {
      httplib::Client c = s.client();
      c.Post("/v1/completions", json({{"prompt", "Once"}, {"max_tokens", 2000}}).dump(), "application/json");
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  s.send_signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(s.wait_exit(1), -1) << "the first signal drains: " << s.log();
  const auto t0 = std::chrono::steady_clock::now();
  s.send_signal(SIGINT);
  EXPECT_EQ(s.wait_exit(50), 128 + SIGINT) << s.log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(s.log().find("vkllm: second interrupt: exiting now"), std::string::npos) << s.log();
  for (std::thread& t : clients) t.join();
  // timeout(1) sends its signal to the server, then again to its process group at once: one
  // request to drain, which finishes the running request.
  Server t("--parallel 1 --temp 0");
  ASSERT_GT(t.port(), 0) << t.log();
  json answer;
  std::thread client([&] {
    httplib::Client c = t.client();
    const auto r = c.Post("/v1/completions", json({{"prompt", "Once"}, {"max_tokens", 120}, {"ignore_eos", true}}).dump(), "application/json");
    if (r) answer = json::parse(r->body, nullptr, false);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  t.send_signal(SIGTERM);
  t.send_signal(SIGTERM);
  EXPECT_EQ(t.wait_exit(60), 0) << t.log();
  client.join();
  EXPECT_EQ(answer["usage"]["completion_tokens"], 120) << answer.dump() << t.log();
}

// A streaming client that gives up while its request waits in the queue is noticed (the waiting
// stream writes SSE keep-alive comments, and a write to the closed connection fails): its request
// is dropped when it reaches a sequence instead of generating for nobody.
TEST(Serve, QueuedStreamWhoseClientLeftIsDropped) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 1 --queue 1 --temp 0 --ctx 2048");
  ASSERT_GT(s.port(), 0) << s.log();
  {
    httplib::Client c = s.client();
    const auto t0 = std::chrono::steady_clock::now();
    bool waiter_gone = false;
    const auto receive = [&](const char*, size_t, uint64_t, uint64_t) {
      if (!waiter_gone) {
        // A second stream waits in the queue; its client stops reading after 0.5 s and hangs up.
        httplib::Client waiter = s.client();
        waiter.set_read_timeout(0, 500000);
        const auto r = waiter.Post("/v1/completions", json({{"prompt", "x"}, {"max_tokens", 2000}, {"stream", true}}).dump(),
                                   "application/json");
        EXPECT_FALSE(r && r->body.find("data: {") != std::string::npos) << "the queued stream should not have started";
        waiter_gone = true;
      }
      // Keep the first stream going long enough for the keep-alives to find the closed connection.
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 4.0;
    };
    httplib::Request req = completion_request(json({{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"stream", true}}), receive);
    c.send(req);
    ASSERT_TRUE(waiter_gone);
  }
  // Both clients are gone: a new request is served at once, not after the queued one's 2,000
  // tokens.
  httplib::Client c = s.client();
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  json answer;
  for (int i = 0; i < 50 && status != 200; ++i) {
    answer = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}}, &status);
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(status, 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // Both were dropped for their clients: the first while generating, the queued one before it
  // started, so only the first and the last request's prompts ran.
  const std::string metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("\nvkllm_requests_cancelled_total 2\n"), std::string::npos) << metrics;
  const int prompt = answer["usage"]["prompt_tokens"].get<int>();
  EXPECT_NE(metrics.find("\nvkllm_prompt_tokens_total " + std::to_string(2 * prompt) + "\n"), std::string::npos)
      << "the queued request ran; prompt tokens of the other two: " << 2 * prompt << "\n" << metrics;
}

// A queued request whose client left gives its queue place back at once (it kept it until a
// sequence took it: a client retrying after its own timeout got 503 because of its first try).
TEST(Serve, AQueuedRequestWhoseClientLeftFreesItsPlace) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 1 --queue 1 --temp 0 --ctx 2048");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  const auto t0 = std::chrono::steady_clock::now();
  bool checked = false;
  std::string metrics;
  int retry_status = 0;
  std::thread retry;
  const auto receive = [&](const char*, size_t, uint64_t, uint64_t) {
    if (!checked) {
      checked = true;
      httplib::Client waiter = s.client();
      waiter.set_read_timeout(0, 500000);
      waiter.Post("/v1/completions", json({{"prompt", "x"}, {"max_tokens", 2000}, {"stream", true}}).dump(), "application/json");
      // Its keep-alive, a second later, finds the connection closed (waited for up to 5 s).
      httplib::Client probe = s.client();
      for (int i = 0; i < 50 && metrics.find("\nvkllm_requests_cancelled_total 1\n") == std::string::npos; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        metrics = probe.Get("/metrics")->body;
      }
      retry = std::thread([&] {
        httplib::Client again = s.client();
        post(again, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}}, &retry_status);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 7.0;
  };
  c.send(completion_request(json({{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"stream", true}}), receive));
  ASSERT_TRUE(checked);
  retry.join();
  EXPECT_NE(metrics.find("\nvkllm_queue_length 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nvkllm_requests_cancelled_total 1\n"), std::string::npos) << metrics;
  EXPECT_EQ(retry_status, 200) << "the place the gone client held was not given back";
}

// A response that is not streamed and not ready within a second goes out chunked, with a space
// (leading JSON whitespace) every second until its body: it still parses as the same answer, and
// when its client gives up, the failed write drops the request instead of generating for nobody.
TEST(Serve, UnstreamedRequestWhoseClientLeftIsDropped) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 1 --temp 0 --ctx 4096");
  ASSERT_GT(s.port(), 0) << s.log();
  {
    httplib::Client c = s.client();
    const auto t0 = std::chrono::steady_clock::now();
    const auto receive = [&](const char* data, size_t n, uint64_t, uint64_t) {
      EXPECT_EQ(std::string(data, n).find_first_not_of(' '), std::string::npos) << "only spaces before the answer";
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.5;  // then hang up
    };
    httplib::Request req = completion_request(json({{"prompt", "Once upon a time"}, {"max_tokens", 4000}}), receive);
    // As OpenAI's clients send it: a compressed body would hold the spaces back until the end, and
    // the server would not learn that the client left.
    req.set_header("Accept-Encoding", "gzip, deflate");
    c.send(req);
  }
  // 4,000 tokens would take many seconds more; the sequence is free again within a few.
  httplib::Client c = s.client();
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  const json quick = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}}, &status);
  ASSERT_EQ(status, 200) << quick.dump();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  const std::string metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("\nvkllm_requests_cancelled_total 1\n"), std::string::npos) << metrics;
  // A long answer that a client waits for: spaces, then the same answer as `vkllm run`.
  const auto r = c.Post("/v1/completions", json({{"prompt", "Once upon a time"}, {"max_tokens", 1500}}).dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->body.substr(0, 1), " ") << "answered within a second: the chunked path was not taken";
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r->body.substr(0, 200);
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), run_greedy("Once upon a time", 1500));
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 1500);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// A long prompt runs one prefill chunk per round between the decode steps of the sequences that
// are generating: a stream keeps getting tokens while another request's prompt is prefilled.
TEST(Serve, LongPromptIsPrefilledBetweenOtherStreamsTokens) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 2 --temp 0 --ctx 2048 --ubatch 4");
  ASSERT_GT(s.port(), 0) << s.log();
  std::string manual;
  for (int i = 0; i < 40; ++i) manual += "Lily and Tom played in the park with a red ball. ";
  std::atomic<int> streamed{0};   // events of the running stream
  std::atomic<bool> long_done{false};
  int during = -1, prompt_tokens = 0, status = 0;
  std::thread long_request;
  httplib::Client c = s.client();
  const auto receive = [&](const char* data, size_t n, uint64_t, uint64_t) {
    for (std::string_view v(data, n); v.find("data: {") != std::string_view::npos; v.remove_prefix(v.find("data: {") + 7)) ++streamed;
    if (streamed >= 5 && !long_request.joinable())
      long_request = std::thread([&] {
        // ≈ 450 prompt tokens in chunks of 4: ≈ 110 rounds, each advancing the stream by a token.
        httplib::Client other = s.client();
        const int before = streamed;
        const json r = post(other, "/v1/completions", {{"prompt", manual}, {"max_tokens", 1}}, &status);
        during = streamed - before;
        if (r.contains("usage")) prompt_tokens = r["usage"]["prompt_tokens"].get<int>();
        long_done = true;
      });
    return !long_done;
  };
  httplib::Request req = completion_request(json({{"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"stream", true}}), receive);
  c.send(req);
  ASSERT_TRUE(long_request.joinable()) << "the stream ended before the long request was sent";
  long_request.join();
  ASSERT_EQ(status, 200);
  ASSERT_GT(prompt_tokens, 400);
  // Prefilled whole, the stream would have stood still for the entire prompt (a token or two).
  EXPECT_GE(during, prompt_tokens / 4 / 2) << "tokens streamed while " << prompt_tokens << " prompt tokens were prefilled";
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// A request sharing a long prefix with an earlier one reports it as cached.
TEST(Serve, ReportsReusedPrefix) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 2 --temp 0");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  std::string manual;
  for (int i = 0; i < 40; ++i) manual += "Lily and Tom played in the park with a red ball. ";
  int status = 0;
  // (The first question is long: more than a sequence may lose and still count as free, 32 tokens.)
  const std::string one = "Question one: what did Lily and Tom do in the park with the red ball when the sun went down and it was time to go home?";
  const json first = post(c, "/v1/completions", {{"prompt", manual + one}, {"max_tokens", 4}}, &status);
  ASSERT_EQ(status, 200) << first.dump();
  const int n_prompt = first["usage"]["prompt_tokens"];
  EXPECT_GT(n_prompt, 440);
  const json second = post(c, "/v1/completions", {{"prompt", manual + "Question two:"}, {"max_tokens", 4}}, &status);
  ASSERT_EQ(status, 200) << second.dump();
  EXPECT_GE(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), n_prompt - 60) << second.dump();  // the manual and "Question"
  // The second question took the empty sequence, with the manual copied from the first one's cache
  // (it did not take the first sequence over): the first question, asked again, finds its whole
  // prompt still cached.
  const json again = post(c, "/v1/completions", {{"prompt", manual + one}, {"max_tokens", 4}}, &status);
  ASSERT_EQ(status, 200) << again.dump();
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), n_prompt - 1) << again.dump();
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("vkllm_prefix_copies_total 1\n"), std::string::npos) << metrics->body;
  // curl -d's form-urlencoded type over 8 KiB (httplib's own reading refuses such a body with a 413
  // whatever --max-body is; JSON may end in white space).
  const auto form = c.Post("/v1/completions", json({{"prompt", manual + "Question three:"}, {"max_tokens", 2}}).dump() + std::string(9000, ' '),
                           "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200) << form->body;
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// llama-server's /tokenize, /detokenize, /props and /slots: the tokens `vkllm tokenize` gives, the
// text back, the server's settings, every sequence's state; bad bodies are 400s naming the field,
// and the API key holds on them as on every route.
TEST(Serve, TokenizerPropsAndSlotsEndpoints) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  Server s("--parallel 2 --ctx 256 --temp 0.5 --top-k 7 --api-key sesame");
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  ASSERT_EQ(c.Post("/tokenize", R"({"content":"Hello"})", "application/json")->status, 401);
  ASSERT_EQ(c.Get("/props")->status, 401);
  c.set_bearer_token_auth("sesame");
  const std::string text = "Once upon a time, <|im_end|> 2 dogs ran.";
  const auto cli_ids = [&](const std::string& flags) {
    std::vector<int> ids;
    std::istringstream in(shell(std::string(VKLLM_BINARY) + " tokenize -m " + stories() + " " + flags + " -p '" + text + "' 2>/dev/null"));
    for (int id; in >> id;) ids.push_back(id);
    return ids;
  };
  int status = 0;
  const json plain = post(c, "/tokenize", {{"content", text}}, &status);
  ASSERT_EQ(status, 200) << plain.dump();
  EXPECT_EQ(plain["tokens"].get<std::vector<int>>(), cli_ids("--no-bos --special"));
  const json with_bos = post(c, "/tokenize", {{"content", text}, {"add_special", true}, {"parse_special", false}}, &status);
  EXPECT_EQ(with_bos["tokens"].get<std::vector<int>>(), cli_ids(""));
  // With pieces: each token's text, which put together is the text (SPM's space prefix first).
  const json pieces = post(c, "/tokenize", {{"content", text}, {"with_pieces", true}}, &status);
  ASSERT_EQ(status, 200) << pieces.dump();
  std::string joined;
  std::vector<int> piece_ids;
  for (const json& p : pieces["tokens"]) {
    piece_ids.push_back(p["id"]);
    joined += p["piece"].get<std::string>();
  }
  EXPECT_EQ(piece_ids, plain["tokens"].get<std::vector<int>>());
  EXPECT_EQ(joined, " " + text);
  // A list of strings and ids (llama-server's mixed content): each string's tokens, the ids as given.
  const json mixed = post(c, "/tokenize", {{"content", {"Once upon", 5, 9, " a time"}}, {"add_special", true}}, &status);
  ASSERT_EQ(status, 200) << mixed.dump();
  std::vector<int> want = {1};
  for (const json& part : {post(c, "/tokenize", {{"content", "Once upon"}}), post(c, "/tokenize", {{"content", " a time"}})}) {
    if (want.size() > 1) want.push_back(5), want.push_back(9);
    for (const json& id : part["tokens"]) want.push_back(id);
  }
  EXPECT_EQ(mixed["tokens"].get<std::vector<int>>(), want);
  const json back = post(c, "/detokenize", {{"tokens", plain["tokens"]}}, &status);
  ASSERT_EQ(status, 200) << back.dump();
  EXPECT_EQ(back["content"], " " + text);
  EXPECT_EQ(post(c, "/detokenize", {{"tokens", json::array({1})}})["content"], "<s>");  // control tokens shown, as llama-server's
  // Bad bodies.
  for (const auto& [path, body, param] : std::vector<std::tuple<std::string, json, std::string>>{
           {"/tokenize", json::object(), "content"},
           {"/tokenize", {{"content", 5}}, "content"},
           {"/tokenize", {{"content", "a"}, {"with_pieces", "yes"}}, "with_pieces"},
           {"/tokenize", {{"content", {"a", 512}}}, "content"},
           {"/tokenize", {{"content", {"a", 1.5}}}, "content"},
           {"/tokenize", {{"content", {"a", {{"x", 1}}}}}, "content"},
           {"/detokenize", {{"tokens", "1 2"}}, "tokens"},
           {"/detokenize", {{"tokens", {1, 512}}}, "tokens"},
           {"/detokenize", {{"tokens", {-1}}}, "tokens"},
           {"/detokenize", {{"tokens", {1.5}}}, "tokens"}}) {
    const json err = post(c, path, body, &status);
    EXPECT_EQ(status, 400) << path << " " << body.dump();
    EXPECT_EQ(err["error"]["param"], param) << err.dump();
  }
  EXPECT_EQ(c.Post("/tokenize", "{", "application/json")->status, 400);
  EXPECT_EQ(c.Get("/tokenize")->status, 405);
  // Slot files are off without --slot-save-path.
  EXPECT_EQ(c.Post("/slots/0?action=save", R"({"filename":"a.bin"})", "application/json")->status, 501);
  // /props: the flags and the model.
  const auto props_res = c.Get("/props");
  ASSERT_TRUE(props_res);
  ASSERT_EQ(props_res->status, 200);
  const json props = json::parse(props_res->body);
  EXPECT_EQ(props["total_slots"], 2);
  EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 256);
  EXPECT_FLOAT_EQ(props["default_generation_settings"]["params"]["temperature"].get<float>(), 0.5f);
  EXPECT_EQ(props["default_generation_settings"]["params"]["top_k"], 7);
  EXPECT_EQ(props["model_path"], stories());
  EXPECT_NE(props["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);  // stories260K has none: ChatML
  EXPECT_EQ(props["bos_token"], "<s>");
  EXPECT_EQ(props["default_generation_settings"]["params"]["seed"], 4294967295u);  // random, as llama-server shows it
  // /slots: idle, then a finished request's tokens still cached in one of them.
  const auto slots_of = [&] {
    const auto r = c.Get("/slots");
    EXPECT_TRUE(r && r->status == 200);
    return r ? json::parse(r->body) : json();
  };
  json slots = slots_of();
  ASSERT_EQ(slots.size(), 2u) << slots.dump();
  for (const json& sl : slots) {
    EXPECT_EQ(sl["n_ctx"], 256);
    EXPECT_EQ(sl["is_processing"], false);
    EXPECT_EQ(sl["n_cached_tokens"], 0);
  }
  const json done = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}}, &status);
  ASSERT_EQ(status, 200) << done.dump();
  const int held = done["usage"]["prompt_tokens"].get<int>() + done["usage"]["completion_tokens"].get<int>();
  slots = slots_of();
  // Every token sampled was run (the step that samples one runs it), but an end of generation.
  const int expect = held - (done["choices"][0]["finish_reason"] == "stop" ? 1 : 0);
  EXPECT_EQ(slots[0]["n_cached_tokens"].get<int>() + slots[1]["n_cached_tokens"].get<int>(), expect) << slots.dump();
  EXPECT_TRUE(slots[0]["n_cached_tokens"] == 0 || slots[1]["n_cached_tokens"] == 0) << slots.dump();
  for (const json& sl : slots_of()) EXPECT_FALSE(sl.contains("params")) << sl.dump();  // no request: no params
  // While a request runs (its end of text banned, so it runs its 200 tokens), a slot says so, with
  // llama-server's params (the request's own, the server's defaults for the rest) and next_token.
  auto running = std::async(std::launch::async, [&] {
    httplib::Client c2 = s.client();
    c2.set_bearer_token_auth("sesame");
    return post(c2, "/v1/completions",
                {{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"logit_bias", {{"2", -100}}}, {"top_p", 0.5}, {"stop", {"zzz"}}});
  });
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    for (const json& sl : slots_of()) {
      if (!sl["is_processing"].get<bool>() || sl["is_prefilling"].get<bool>()) continue;
      seen = true;
      EXPECT_EQ(sl["speculative"], false);
      const json& p = sl["params"];
      EXPECT_EQ(p["n_predict"], 200) << sl.dump();
      EXPECT_FLOAT_EQ(p["temperature"].get<float>(), 0.5f) << sl.dump();
      EXPECT_EQ(p["top_k"], 7) << sl.dump();
      EXPECT_FLOAT_EQ(p["top_p"].get<float>(), 0.5f) << sl.dump();
      EXPECT_EQ(p["stop"], json({"zzz"})) << sl.dump();
      const int decoded = sl["next_token"]["n_decoded"].get<int>();
      EXPECT_GE(decoded, 0);
      EXPECT_LE(decoded, 200);
      EXPECT_EQ(sl["next_token"]["n_remain"].get<int>(), 200 - decoded) << sl.dump();
    }
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(seen);
  EXPECT_EQ(running.get()["usage"]["completion_tokens"], 200);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

// llama-server's slot files: a sequence's cache saved to --slot-save-path, erased, restored into
// another sequence and into a new server process; each time a request with the saved prompt reuses
// all of it and replies as before. Bad names, missing, corrupt and other models' files, a busy
// sequence and an unknown sequence or action are refused and change nothing.
TEST(Serve, SlotFilesSaveRestoreAndErase) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q8_0.gguf");
  const std::string dir = testing::TempDir() + "/vkllm_slots_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string prompt = "Once upon a time there was a dog named Max who liked to run in the park";
  int status = 0;
  std::string first_text;
  int n_prompt = 0, n_saved = 0;
  const auto slots_of = [](httplib::Client& c) {
    const auto r = c.Get("/slots");
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  const auto cached_in = [&](httplib::Client& c, int id) { return slots_of(c)[id]["n_cached_tokens"].get<int>(); };
  const auto action = [&](httplib::Client& c, int id, const std::string& what, const json& body, int* st) {
    const auto r = c.Post("/slots/" + std::to_string(id) + "?action=" + what, body.dump(), "application/json");
    if (!r) return json();
    *st = r->status;
    return json::parse(r->body, nullptr, false);
  };
  {
    Server s("--parallel 2 --ctx 256 --temp 0 --slot-save-path " + dir);
    ASSERT_GT(s.port(), 0) << s.log();
    httplib::Client c = s.client();
    const json first = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}}, &status);
    ASSERT_EQ(status, 200) << first.dump();
    first_text = first["choices"][0]["text"];
    n_prompt = first["usage"]["prompt_tokens"];
    const int held = n_prompt + 8;
    const int id = cached_in(c, 0) == held ? 0 : 1;
    ASSERT_EQ(cached_in(c, id), held) << slots_of(c).dump();
    const json saved = action(c, id, "save", {{"filename", "max.bin"}}, &status);
    ASSERT_EQ(status, 200) << saved.dump();
    n_saved = saved["n_saved"];
    EXPECT_EQ(n_saved, held);
    EXPECT_EQ(saved["n_written"].get<uint64_t>(), std::filesystem::file_size(dir + "/max.bin"));
    // Erased, the sequence holds nothing; restored into the other one, it holds the tokens again.
    EXPECT_EQ(action(c, id, "erase", json::object(), &status)["n_erased"], held);
    EXPECT_EQ(cached_in(c, id), 0);
    const json restored = action(c, 1 - id, "restore", {{"filename", "max.bin"}}, &status);
    ASSERT_EQ(status, 200) << restored.dump();
    EXPECT_EQ(restored["n_restored"], held);
    EXPECT_EQ(cached_in(c, 1 - id), held);
    const json again = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}}, &status);
    ASSERT_EQ(status, 200) << again.dump();
    EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], n_prompt - 1) << again.dump();
    EXPECT_EQ(again["choices"][0]["text"], first_text);
    // That sequence saves again to the file it restored: it appends the rows of the tokens it ran
    // again (the prompt's last and the reply's), not the whole cache.
    const uint64_t restored_size = std::filesystem::file_size(dir + "/max.bin");
    const json resaved = action(c, 1 - id, "save", {{"filename", "max.bin"}}, &status);
    ASSERT_EQ(status, 200) << resaved.dump();
    EXPECT_EQ(resaved["n_saved"], held);
    const uint64_t appended_size = std::filesystem::file_size(dir + "/max.bin");
    EXPECT_EQ(resaved["n_written"].get<uint64_t>(), appended_size - restored_size);  // the bytes this save wrote
    EXPECT_GT(appended_size, restored_size);
    EXPECT_LT(appended_size - restored_size, restored_size / 2);
    // A copy of it cut inside that update restores as the save before, and says what it ignored.
    {
      std::ifstream in(dir + "/max.bin", std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(dir + "/cut.bin", std::ios::binary).write(bytes.data(), std::streamsize(appended_size - 3));
    }
    const json cut = action(c, id, "restore", {{"filename", "cut.bin"}}, &status);
    EXPECT_EQ(status, 200) << cut.dump();
    EXPECT_EQ(cut["n_restored"], held);
    EXPECT_EQ(cut["n_unfinished"].get<uint64_t>(), appended_size - 3 - restored_size) << cut.dump();
    EXPECT_FALSE(resaved.contains("n_unfinished"));
    std::filesystem::remove(dir + "/cut.bin");
    action(c, id, "erase", json::object(), &status);
    // Refusals, none of which changes a sequence or a file.
    const uint64_t size = std::filesystem::file_size(dir + "/max.bin");
    std::ofstream(dir + "/bad.bin", std::ios::binary) << "not a session";
    // A session of another model (made by `vkllm run --session`).
    ASSERT_EQ(std::system((std::string(VKLLM_BINARY) + " run -m " + shared_path("models/synth-llama-q8_0.gguf") + " -p Hello -n 2 -q --session " + dir +
                           "/other.bin >/dev/null 2>&1").c_str()), 0);
    const int before = cached_in(c, 1 - id);
    for (const auto& [what, body, want] : std::vector<std::tuple<std::string, json, int>>{
             {"restore", {{"filename", "../max.bin"}}, 400},
             {"restore", {{"filename", "sub/max.bin"}}, 400},
             {"save", {{"filename", "a:b.bin"}}, 400},
             {"save", {{"filename", " max.bin"}}, 400},
             {"save", {{"filename", "max."}}, 400},
             {"save", {{"filename", "tab\there"}}, 400},
             {"save", {{"filename", "c1\u0085.bin"}}, 400},
             {"save", {{"filename", std::string(240, 'n')}}, 400},
             {"restore", {{"filename", ""}}, 400},
             {"restore", {{"filename", 7}}, 400},
             {"save", json::object(), 400},
             {"restore", {{"filename", "missing.bin"}}, 404},
             {"restore", {{"filename", "bad.bin"}}, 400},
             {"restore", {{"filename", "other.bin"}}, 400},
             {"compact", {{"filename", "max.bin"}}, 400}}) {
      const json err = action(c, 1 - id, what, body, &status);
      EXPECT_EQ(status, want) << what << " " << body.dump() << ": " << err.dump();
      EXPECT_TRUE(err.contains("error")) << err.dump();
    }
    EXPECT_EQ(cached_in(c, 1 - id), before);
    EXPECT_EQ(std::filesystem::file_size(dir + "/max.bin"), size);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 3);  // max, bad, other
    // The longest name the atomic write's temporary leaves room for saves.
    const std::string longest(239, 'n');
    EXPECT_EQ(action(c, 1 - id, "save", {{"filename", longest}}, &status)["n_saved"], before);
    EXPECT_EQ(status, 200);
    EXPECT_NE(action(c, 1 - id, "restore", {{"filename", "missing.bin"}}, &status)["error"]["message"].get<std::string>().find("missing.bin"),
              std::string::npos);
    EXPECT_EQ(action(c, 2, "save", {{"filename", "x.bin"}}, &status)["error"]["param"], "id_slot");
    EXPECT_EQ(status, 400);
    // A sequence running a request is busy (its end of text banned, so it runs 200 tokens).
    auto running = std::async(std::launch::async, [&] {
      httplib::Client c2 = s.client();
      return post(c2, "/v1/completions", {{"prompt", "The cat"}, {"max_tokens", 200}, {"logit_bias", {{"2", -100}}}});
    });
    int busy = -1;
    for (int i = 0; i < 500 && busy < 0; ++i) {
      const json sl = slots_of(c);
      for (const json& one : sl)
        if (one["is_processing"].get<bool>()) busy = one["id"];
      if (busy < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GE(busy, 0);
    const json refused = action(c, busy, "save", {{"filename", "busy.bin"}}, &status);
    EXPECT_EQ(status, 503) << refused.dump();
    EXPECT_FALSE(std::filesystem::exists(dir + "/busy.bin"));
    EXPECT_EQ(running.get()["usage"]["completion_tokens"], 200);
    EXPECT_EQ(s.terminate(), 0) << s.log();
  }
  // An empty --slot-save-path, and one that is a file, are refused before the model loads.
  int st = 0;
  const std::string empty_flag = shell(std::string(VKLLM_BINARY) + " serve -m " + stories() + " --port 0 --slot-save-path '' 2>&1", &st);
  EXPECT_EQ(st, 2) << empty_flag;
  EXPECT_NE(empty_flag.find("slot files off"), std::string::npos) << empty_flag;
  const std::string file_flag = shell(std::string(VKLLM_BINARY) + " serve -m " + stories() + " --port 0 --slot-save-path " + dir + "/max.bin 2>&1", &st);
  EXPECT_EQ(st, 1) << file_flag;
  EXPECT_EQ(std::count(file_flag.begin(), file_flag.end(), '\n'), 1) << file_flag;
  // Another server process, one sequence: the file restores, and the prompt is reused.
  Server s("--parallel 1 --ctx 128 --temp 0 --slot-save-path " + dir);
  ASSERT_GT(s.port(), 0) << s.log();
  httplib::Client c = s.client();
  const json restored = action(c, 0, "restore", {{"filename", "max.bin"}}, &status);
  ASSERT_EQ(status, 200) << restored.dump();
  EXPECT_EQ(restored["n_restored"], n_saved);
  const json again = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}}, &status);
  ASSERT_EQ(status, 200) << again.dump();
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], n_prompt - 1) << again.dump();
  EXPECT_EQ(again["choices"][0]["text"], first_text);
  EXPECT_EQ(s.terminate(), 0) << s.log();
  std::filesystem::remove_all(dir);
}

// On a model with sliding-window layers a sequence that generated past its window holds the
// prompt's tokens but not the window rows a prefill would resume from: what it can reuse, not its
// match, decides. The same long prompt asked again is served from the other sequence (--parallel
// 2), or from its prompt-cache entry (--parallel 1); both cached the prompt but for its last token
// (they prefilled it whole when the match decided).
TEST(Serve, WindowRingsReuseWhatTheyHold) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string model = testing::TempDir() + "/vkllm_serve_gemma3_window.gguf";
  const std::string make = std::string(VKLLM_MAKE_MODEL) + " --arch gemma3 --window 32 --layers 6 --embd 64 --heads 2 --kv-heads 1 --ff 128 --vocab-from " +
                           stories() + " --ctx 2048 -o " + model + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  std::string manual;
  for (int i = 0; i < 30; ++i) manual += "Lily and Tom played in the park with a red ball. ";
  const auto ask = [&](httplib::Client& c, const std::string& question, int max_tokens) {
    int status = 0;
    const json r = post(c, "/v1/completions", {{"prompt", manual + question}, {"max_tokens", max_tokens}, {"temperature", 0}}, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return r;
  };
  const auto cached = [](const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); };
  const std::string pc = testing::TempDir() + "/vkllm_serve_window_pc";
  std::filesystem::remove_all(pc);
  // (--ubatch 16: rings of 32 + 16 slots on any device; a GPU's 512 would hold the whole reply.)
  for (const std::string& args : {std::string("--parallel 2 --ubatch 16"), "--parallel 1 --ubatch 16 --prompt-cache " + pc}) {
    Server s(args, model);
    ASSERT_GT(s.port(), 0) << s.log();
    httplib::Client c = s.client();
    // (A reply of up to 100 tokens runs past the 32-token window.)
    const json first = ask(c, "Question: Who", 100);
    ASSERT_GT(first["usage"]["completion_tokens"].get<int>(), 48) << first.dump();  // past the rings: the case
    // (A short reply: that sequence's rings still hold the window before the shared prefix's end.)
    if (args.starts_with("--parallel 2")) ask(c, "Question: Who is she?", 8);
    const json again = ask(c, "Question: Who", 30);
    const int n_prompt = first["usage"]["prompt_tokens"];
    EXPECT_EQ(cached(again), n_prompt - 1) << args << "\n" << s.log();
    EXPECT_EQ(s.terminate(), 0) << s.log();
  }
  std::filesystem::remove_all(pc);
  std::filesystem::remove(model);
}

// The official OpenAI client for Node, installed into a cache folder on first use.
TEST(Serve, OpenAiNodeClient) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  if (shell("command -v node npm").empty()) GTEST_SKIP() << "node and npm not found (needed for the OpenAI client test)";
  const char* home = std::getenv("HOME");
  const std::string cache = std::getenv("XDG_CACHE_HOME") ? std::string(std::getenv("XDG_CACHE_HOME")) + "/vkllm/npm"
                                                          : std::string(home ? home : "/tmp") + "/.cache/vkllm/npm";
  if (!std::filesystem::exists(cache + "/node_modules/openai/package.json")) {
    int status = 0;
    const std::string out = shell("mkdir -p " + cache + " && npm install --prefix " + cache + " --no-audit --no-fund --silent openai@4 2>&1", &status);
    // The npm registry is the one thing here that is not on this machine: a failed download
    // skips, naming it, rather than failing the build's tests.
    if (status != 0) GTEST_SKIP() << "npm install openai@4 into " << cache << " failed: " << out;
  }
  Server s("--parallel 2 --temp 0 --api-key k1");
  ASSERT_GT(s.port(), 0) << s.log();
  const std::string script = testing::TempDir() + "/vkllm_openai_client.cjs";
  std::ofstream(script) << R"JS(
const OpenAI = require(process.argv[2]);
const client = new OpenAI({ baseURL: process.argv[3], apiKey: 'k1' });
(async () => {
  const messages = [{ role: 'user', content: 'Tell me about a dog' }];
  const whole = await client.chat.completions.create({ model: 'stories260K.gguf', messages, max_tokens: 12, temperature: 0,
                                                       logprobs: true, top_logprobs: 2 });
  const stream = await client.chat.completions.create({ model: 'stories260K.gguf', messages, max_tokens: 12, temperature: 0, stream: true });
  let text = '', finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content || '';
    finish = chunk.choices[0]?.finish_reason || finish;
  }
  const models = await client.models.list();
  // Structured output as OpenAI's strict schemas are written.
  const structured = await client.chat.completions.create({ model: 'stories260K.gguf', messages, max_tokens: 200, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'mood', strict: true, schema: { type: 'object',
      properties: { mood: { type: 'string', enum: ['happy', 'sad'] }, why: { type: 'string', maxLength: 20 } },
      required: ['mood', 'why'], additionalProperties: false } } } });
  console.log(JSON.stringify({ structured: JSON.parse(structured.choices[0].message.content), finish_structured: structured.choices[0].finish_reason,
                               whole: whole.choices[0].message.content, finish_whole: whole.choices[0].finish_reason,
                               usage: whole.usage, streamed: text, finish, model: models.data[0].id,
                               logprob_tokens: whole.choices[0].logprobs.content.map((e) => e.token),
                               alternatives: whole.choices[0].logprobs.content.map((e) => e.top_logprobs.length) }));
})().catch((e) => { console.error(String(e)); process.exit(1); });
)JS";
  int status = 0;
  const std::string out = shell("node " + script + " " + cache + "/node_modules/openai " + s.url() + "/v1 2>&1", &status);
  ASSERT_EQ(status, 0) << out;
  const json j = json::parse(out);
  EXPECT_FALSE(j["whole"].get<std::string>().empty());
  EXPECT_EQ(j["whole"], j["streamed"]);
  EXPECT_EQ(j["finish_whole"], "length");
  EXPECT_EQ(j["finish"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["model"], "stories260K.gguf");
  EXPECT_EQ(j["finish_structured"], "stop") << out;
  EXPECT_TRUE(j["structured"]["mood"] == "happy" || j["structured"]["mood"] == "sad") << out;
  EXPECT_LE(j["structured"]["why"].get<std::string>().size(), 20u) << out;
  // logprobs through the client: a token entry each, with two alternatives, spelling the reply.
  ASSERT_EQ(j["logprob_tokens"].size(), 12u) << out;
  std::string spelled;
  for (const json& t : j["logprob_tokens"]) spelled += t.get<std::string>();
  EXPECT_EQ(spelled, j["whole"].get<std::string>());
  for (const json& n : j["alternatives"]) EXPECT_EQ(n, 2);
  EXPECT_EQ(s.terminate(), 0) << s.log();
}

}  // namespace
