// `vkllm serve`: the OpenAI-compatible HTTP server (core/serve, docs/server.md). Requests run on
// --parallel sequences that share the weights; stdout stays empty, the log goes to stderr.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "atomic_file.h"
#include "base/ascii.h"
#include "chat/template.h"
#include "commands.h"
#include "common.h"
#include "format.h"
#include "persistence.h"
#include "serve/server.h"

namespace vkllm::cli {
namespace {

constexpr size_t k_spare_connections = 256;

struct ServeCommand {
  std::vector<CLI::Option*> draft_flags;  // add_speculative_options' (note_idle_draft_flags)
  RunOptions opts;
  serve::ServerOptions server;
  uint32_t parallel = 1;
  size_t queue = 64;
  std::string max_body = "4MiB";
  std::string chat_template;
  SpeculativeOptions speculative;
  PersistenceOptions persist;
};

void serve_forever(const ServeCommand& c) {
  // SIGINT and SIGTERM are blocked in every thread (the HTTP pool and the device thread inherit
  // the mask); one thread waits for them and drains. A client gone mid-write is not a signal.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // The thread that waits for them runs from the start: during the load (and until the server is
  // up) there is nothing to drain, so a signal ends the process at once, status 0; afterwards a
  // second thread drains the requests and stops the server, and a second signal during that drain
  // ends the process at once (as llama-server's second Ctrl+C; one within 250 ms of the first is
  // taken as the same, as timeout(1) repeats it to the process group), status 128 + the signal: a drain
  // waits for every running and queued request, minutes with a large model. (Files the server
  // writes are written atomically: an exit leaves none half-written.)
  std::atomic<serve::Scheduler*> live_sched{nullptr};
  std::atomic<serve::HttpServer*> live_http{nullptr};
  std::atomic<bool> run_returned{false};
  std::thread drainer;
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (run_returned) return;
    const auto what = [](int signal) { return signal == SIGINT ? "interrupt" : "terminate"; };
    serve::HttpServer* http = live_http.load();
    if (!http) {
      std::fprintf(stderr, "vkllm: %s before the server was up: exiting\n", what(sig));
      std::fflush(stderr);
      std::_Exit(0);  // nothing to drain or save; the kernels being made are not waited for
    }
    std::fprintf(stderr, "vkllm: %s: finishing the running and queued requests, then exiting (another signal stops at once)\n",
                 what(sig));
    drainer = std::thread([&, http] {
      live_sched.load()->drain();
      // A signal right after start may come before the server listens, when stop() does nothing.
      while (!http->running() && !run_returned) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      http->stop();
    });
    // GNU timeout(1) sends its signal to the server and then to the server's process group: a
    // second signal within k_same_signal of the first is that same request, not a second one.
    const auto first = std::chrono::steady_clock::now();
    constexpr auto k_same_signal = std::chrono::milliseconds(250);
    do {
      sigwait(&stop_signals, &sig);
      if (run_returned) return;
    } while (std::chrono::steady_clock::now() - first < k_same_signal);
    std::fprintf(stderr, "vkllm: second %s: exiting now, dropping the running and queued requests\n", what(sig));
    std::fflush(stderr);
    std::_Exit(128 + sig);
  });
  // Wakes the waiting thread (run() returned, or an error left this function) and joins it, then
  // the draining one (which stopped the server, so it has returned or is about to).
  const auto end_stopper = [&] {
    if (!stopper.joinable()) return;
    run_returned = true;
    pthread_kill(stopper.native_handle(), SIGTERM);
    stopper.join();
    if (drainer.joinable()) drainer.join();
  };
  struct Finally {
    std::function<void()> fn;
    ~Finally() { fn(); }
  } finally{end_stopper};

  serve::ServerOptions so = c.server;
  so.max_body = parse_size("--max-body", c.max_body);
  if (so.max_body < 1024) throw CLI::ValidationError("--max-body " + c.max_body + " is under 1KiB: no request would fit");
  SpeculativeOptions speculative = c.speculative;
  check_speculative_options(speculative, c.opts.ubatch, c.opts.model_draft);
  note_idle_draft_flags(c.draft_flags, speculative, c.opts.quiet);
  const uint64_t prompt_cache_bytes = c.persist.prompt_cache() ? parse_size("--prompt-cache-size", c.persist.prompt_cache_size) : 0;
  const std::string pc_dir = c.persist.prompt_cache() ? prompt_cache_dir(c.persist) : "";
  if (!pc_dir.empty()) check_prompt_cache_dir(pc_dir);
  // --slot-save-path: made now (a folder that cannot be is refused before the weights load).
  if (!so.slot_save_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(so.slot_save_path, ec);
    if (!std::filesystem::is_directory(so.slot_save_path))
      throw Error("--slot-save-path " + so.slot_save_path + ": " + (ec ? ec.message() : std::string("not a directory")));
    try {
      gguf::check_writable((std::filesystem::path(so.slot_save_path) / "slot").string());
    } catch (const std::exception& e) {
      throw Error(std::string("--slot-save-path: ") + e.what());
    }
  }
  RunOptions o = c.opts;
  o.sequences = c.parallel;
  // The template is resolved before the weights load: a wrong --chat-template is refused at once.
  std::optional<ChatTemplate> resolved;
  Session s = open_session(o, [&](const gguf::File& file, const Tokenizer&, uint32_t) {
    resolved.emplace(ChatTemplate::resolve(&file, c.chat_template));
  });
  const Tokenizer& tok = *s.tokenizer;
  check_speculation(speculative, *s.engine, c.opts.quiet);
  std::vector<Engine*> engines{s.engine.get()};
  for (const auto& e : s.more_engines) engines.push_back(e.get());

  // The files the server writes (prompt-cache entries, slot files) carry the model's fingerprint.
  std::optional<ModelFingerprint> fp;
  if (c.persist.prompt_cache() || !so.slot_save_path.empty()) fp = model_fingerprint(s.file, s.engine->cache().capacity(), c.opts.rope);
  std::optional<PromptCache> pc;
  if (c.persist.prompt_cache()) pc.emplace(pc_dir, prompt_cache_bytes, *fp, s.engine->cache().type_k(), s.engine->cache().type_v());
  serve::Metrics metrics;
  serve::SchedulerOptions sched_opts;
  sched_opts.max_queue = c.queue;
  sched_opts.prompt_cache = pc ? &*pc : nullptr;
  sched_opts.fingerprint = fp ? &*fp : nullptr;
  sched_opts.log = [](const std::string& line) { std::fprintf(stderr, "vkllm: %s\n", line.c_str()); };
  for (const auto& d : s.drafters) sched_opts.drafters.push_back(d.get());
  serve::Scheduler sched(engines, tok, metrics, sched_opts);

  const ChatTemplate& tmpl = *resolved;
  serve::ApiContext api;
  api.tok = &tok;
  api.chat_template = &tmpl;
  api.defaults = o.sampling;
  api.context = s.engine->cache().capacity();
  api.speculative = speculative;
  api.max_draft = s.engine->max_chunk(true) - 1;
  so.model_name = std::filesystem::path(o.model).filename().string();
  so.model_path = o.model;
  so.build_info = k_version;
  // A connection thread for each request that may be waiting (running, queued), and room for many
  // more connections, which get their 503 (queue full), /health or /metrics at once.
  so.threads = c.parallel + c.queue + k_spare_connections;
  serve::HttpServer http(so, sched, metrics, api);
  // Whatever leaves from here on (an exception too), the waiting threads end before http and sched go.
  Finally stop_threads{[&] {
    live_http = nullptr;
    end_stopper();
  }};
  const int port = http.bind();
  // An IPv6 address goes in brackets in a URL (http://[::1]:8080/v1).
  const std::string url_host = so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host;
  std::fprintf(stderr, "vkllm: serving %s on http://%s:%d/v1 (%u sequence%s of %s tokens, queue %zu)\n", so.model_name.c_str(),
               url_host.c_str(), port, c.parallel, c.parallel == 1 ? "" : "s", with_commas(api.context).c_str(), c.queue);
  std::fflush(stderr);

  live_sched = &sched;
  live_http = &http;
  http.run();
  // run() returns after stop(), or when listening failed: wake the stopper if it still waits.
  end_stopper();
  if (pc) print_cache_warnings(*pc);
  if (o.profile) {  // every sequence's prefills and the batched decode steps (on the first engine)
    std::vector<DispatchTiming> all;
    for (const Engine* e : engines) all.insert(all.end(), e->timings().begin(), e->timings().end());
    print_profile(all);
  }
  std::fprintf(stderr, "vkllm: server stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto c = std::make_shared<ServeCommand>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API (docs/server.md)");
  add_model_options(cmd, c->opts);
  add_sampling_options(cmd, c->opts.sampling);
  cmd->add_option("--host", c->server.host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--allow-origin", c->server.allow_origins,
                  "Also let browser pages from this origin (scheme://host[:port]) call the API; \"*\": any (this machine's own always may)")
      ->allow_extra_args(false)
      ->transform(CLI::Validator(
          [](std::string& v) {
            // As a browser writes an Origin: lower case, no path (a trailing "/" dropped), no default port.
            const std::string given = v;
            v = ascii_lower(v);
            if (v.size() > 1 && v.ends_with('/')) v.pop_back();
            if (v == "*" || v == "null") return std::string();
            const std::optional<serve::OriginParts> o = serve::parse_origin(v);
            if (!o) return "'" + given + "' is not an origin: scheme://host[:port], null or *";
            if ((o->scheme == "http" && o->port == "80") || (o->scheme == "https" && o->port == "443")) v = o->scheme + "://" + o->host;
            return std::string();
          },
          "ORIGIN"));
  cmd->add_option("--port", c->server.port, "Port (0: any free one, printed on stderr)")->check(CLI::Range(0, 65535));
  cmd->add_option("--parallel", c->parallel, "Sequences generating at once, each with its own KV cache of --ctx tokens")
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--queue", c->queue, "Requests that may wait for a sequence; more are answered 503")->check(CLI::Range(size_t{0}, size_t{4096}));
  cmd->add_option("--api-key", c->server.api_key, "Require \"Authorization: Bearer KEY\" on every endpoint but /health")
      ->check([](const std::string& key) { return key.empty() ? std::string("an empty key would turn authentication off") : std::string(); });
  cmd->add_option("--max-body", c->max_body, "Largest request body (e.g. 4MiB); larger ones are answered 413");
  cmd->add_option("--chat-template", c->chat_template, "Chat template: a built-in name or a Jinja file");
  cmd->add_option("--slot-save-path", c->server.slot_save_path,
                  "Folder of the files POST /slots/{id}?action=save|restore writes and reads (made if missing; without it they are refused)")
      ->check([](const std::string& dir) { return dir.empty() ? std::string("an empty folder name would turn slot files off") : std::string(); });
  c->draft_flags = add_speculative_options(cmd, c->speculative, c->opts.model_draft);
  add_prompt_cache_options(cmd, c->persist);
  cmd->callback([c] { serve_forever(*c); });
}

}  // namespace vkllm::cli
