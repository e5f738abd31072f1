// Routes of the OpenAI-compatible server.
#include "serve/server.h"

#include <httplib.h>
#include <netdb.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>

#include "base/error.h"
#include "base/utf8.h"

namespace vkllm::serve {
namespace {

using nlohmann::json;

// A stream with nothing to send for this long writes an SSE comment (see the provider below). A
// response that is not streamed and not ready by then goes out chunked and writes a space (JSON
// allows leading whitespace) this often until its body: the write to a client that has gone
// fails, so the request is dropped instead of running on for nobody.
constexpr std::chrono::milliseconds k_keep_alive{1000};
constexpr char k_keep_alive_line[] = ": keep-alive\n\n";
constexpr char k_keep_alive_space[] = " ";
// The 413's message, naming the limit.
std::string body_too_large(size_t max_body) {
  return "the request body is larger than the " + std::to_string(max_body) + " bytes the server accepts (--max-body)";
}
// Bytes of a chunked body past --max-body read and dropped before its 413 (see post(), below).
constexpr size_t k_drain_bytes = size_t{16} << 20;
constexpr int k_listen_backlog = 128;
constexpr size_t k_keep_alive_requests = 100;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type, const std::string& param = "",
                const std::string& code = "") {
  res.status = status;
  res.set_content(dump(error_body(message, type, param, code)), "application/json");
}

// A job's error: the request's own (its grammar could not go on) is a 400, anything else a 500.
ApiError job_error(const Job& job) {
  return job.request_error() ? ApiError(400, job.error(), "grammar") : ApiError(500, job.error(), "", "server_error");
}
json job_error_body(const Job& job) {
  const ApiError e = job_error(job);
  return error_body(e.what(), e.type, e.param, e.code);
}

// An error after which the connection must end: its request's framing is unknown (a Content-Length
// that is not a count, two that differ), so what follows the headers must not be read as the next
// request. cpp-httplib 0.11 keeps a connection open whatever the response's Connection header says;
// a content provider that reports failure once it has written the body makes it close the socket.
void send_error_and_close(httplib::Response& res, int status, const std::string& message, const std::string& type = "invalid_request_error") {
  res.status = status;
  res.set_header("Connection", "close");
  const std::string body = dump(error_body(message, type, ""));
  res.set_content_provider(body.size(), "application/json", [body](size_t offset, size_t length, httplib::DataSink& sink) {
    sink.write(body.data() + offset, length);
    return false;
  });
}

// /slots/{id}: a sequence's save, restore or erase (llama-server's).
bool is_slot_path(const std::string& path) {
  constexpr std::string_view prefix = "/slots/";
  return path.size() > prefix.size() && path.starts_with(prefix) &&
         path.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

// A slot file's name: one portable file name in --slot-save-path, not a path (the characters
// llama-server's check refuses too, and a leading '.', which the atomic writes' temporary files
// start with). Returns why it is refused, or "".
std::string bad_slot_filename(const std::string& name) {
  if (name.empty()) return "is empty";
  // NAME_MAX (255) less what the atomic write's temporary ".NAME.PID.XXXXXX" adds.
  if (name.size() > 239) return "is longer than 239 bytes";
  if (!utf8::valid(name)) return "is not UTF-8";
  if (name.front() == '.') return "starts with '.' (hidden files and the atomic writes' temporary files are not slot files)";
  if (name.front() == ' ' || name.back() == ' ' || name.back() == '.') return "starts or ends with a space, or ends with '.'";
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool c1 = c == 0xC2 && i + 1 < name.size() && static_cast<unsigned char>(name[i + 1]) <= 0x9F;  // U+0080 … U+009F
    if (c < 0x20 || c == 0x7F || c1) return "holds a control character";
    if (std::string_view("/\\:*?\"<>|").find(char(c)) != std::string_view::npos)
      return "holds '" + std::string(1, char(c)) + "': give a plain file name, not a path";
  }
  return "";
}

// The methods a route answers (its Allow header), by path; "" for a path the server has not.
const char* allowed_methods(const std::string& path) {
  if (is_slot_path(path)) return "POST, OPTIONS";
  if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/tokenize" || path == "/detokenize") return "POST, OPTIONS";
  if (path == "/health" || path == "/metrics" || path == "/v1/models" || path == "/props" || path == "/slots") return "GET, HEAD, OPTIONS";
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return "GET, HEAD, OPTIONS";
  return "";
}

// The label /metrics counts a request under: its route, or "other" (bounded cardinality).
std::string route_label(const std::string& path) {
  if (is_slot_path(path)) return "/slots/{id}";
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return "/v1/models/{id}";
  return *allowed_methods(path) != '\0' ? path : "other";
}

// llama-server's sampling `params` (/props' defaults, /slots' running requests); n_predict −1:
// no limit (a negative count here).
json sampling_params(const SamplerParams& d, int64_t n_predict) {
  return {{"temperature", d.temp},
          {"top_k", d.top_k},
          {"top_p", d.top_p},
          {"min_p", d.min_p},
          {"repeat_penalty", d.repeat_penalty},
          {"repeat_last_n", d.repeat_last_n},
          {"presence_penalty", d.presence_penalty},
          {"frequency_penalty", d.frequency_penalty},
          {"seed", d.seed},  // 4294967295: a random seed per request, as llama-server shows it
          {"typical_p", d.typical_p},
          {"top_n_sigma", d.top_n_sigma},
          {"xtc_probability", d.xtc_probability},
          {"xtc_threshold", d.xtc_threshold},
          {"dry_multiplier", d.dry_multiplier},
          {"dry_base", d.dry_base},
          {"dry_allowed_length", d.dry_allowed_length},
          {"dry_penalty_last_n", d.dry_penalty_last_n},
          {"dry_sequence_breakers", d.dry_sequence_breakers},
          {"mirostat", d.mirostat},
          {"mirostat_tau", d.mirostat_tau},
          {"mirostat_eta", d.mirostat_eta},
          {"n_predict", n_predict >= 0 ? n_predict : -1}};
}

std::atomic<uint64_t> next_id{1};
// Response ids: a random tag of this process, then a count, so ids do not repeat across restarts.
const std::string& id_tag() {
  static const std::string tag = [] {
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    return std::string(buf);
  }();
  return tag;
}

// cpp-httplib's task queue with a thread per connection, started when a connection finds none
// idle, up to `max` (then connections wait for one): httplib's fixed pool left the connections
// past it unaccepted behind the busy ones, so they skipped the scheduler's queue limit (no 503)
// and /health waited for a whole generation. Threads stay for later connections.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max) : max_(max) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock lock(mu_);
    jobs_.push_back(std::move(fn));
    // Every idle thread may already be promised to an earlier connection.
    if (jobs_.size() > idle_ && threads_.size() < max_) {
      try {
        threads_.emplace_back([this] { work(); });
        return;
      } catch (const std::system_error&) {
        // No thread to be had (a process or memory limit): the connection waits for a running
        // one, or, with none at all, is served here on the listening thread.
        if (threads_.empty()) {
          std::function<void()> job = std::move(jobs_.back());
          jobs_.pop_back();
          lock.unlock();
          job();
          return;
        }
      }
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        ++idle_;
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // stopping, and every accepted connection served
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), origin) != allowed.end() || std::find(allowed.begin(), allowed.end(), "*") != allowed.end())
    return true;
  // This machine's own pages: http(s)://localhost, 127.0.0.1 or [::1], with any port.
  const std::optional<OriginParts> o = parse_origin(origin);
  return o && (o->scheme == "http" || o->scheme == "https") && (o->host == "localhost" || o->host == "127.0.0.1" || o->host == "[::1]");
}

std::optional<OriginParts> parse_origin(const std::string& origin) {
  const size_t scheme_end = origin.find("://");
  if (scheme_end == std::string::npos || scheme_end == 0) return std::nullopt;
  const std::string rest = origin.substr(scheme_end + 3);
  // host, or [v6], then an optional :port of digits and nothing else
  const size_t host_end = rest.starts_with("[") ? rest.find(']') + 1 : rest.find(':');
  if (host_end == 0) return std::nullopt;  // "[" without "]"
  OriginParts o{origin.substr(0, scheme_end), rest.substr(0, host_end), ""};
  const std::string tail = host_end >= rest.size() ? "" : rest.substr(host_end);
  if (o.host.empty() || o.host.find_first_of("/?#@ \t\\") != std::string::npos) return std::nullopt;
  if (!tail.empty()) {
    if (tail[0] != ':' || tail.size() < 2 || tail.size() > 6 || tail.find_first_not_of("0123456789", 1) != std::string::npos ||
        std::stoul(tail.substr(1)) > 65535)
      return std::nullopt;
    o.port = tail.substr(1);
  }
  return o;
}

HttpServer::HttpServer(const ServerOptions& o, Scheduler& scheduler, Metrics& metrics, const ApiContext& api)
    : opts_(o), sched_(scheduler), metrics_(metrics), api_(api), svr_(std::make_unique<httplib::Server>()) {
  const size_t threads = o.threads;
  svr_->new_task_queue = [threads] { return new ConnectionThreads(threads); };
  // A client's connection carries up to 100 requests (httplib's default is 5).
  svr_->set_keep_alive_max_count(k_keep_alive_requests);
  // A Content-Length past --max-body gets httplib's own 413 (it skips the body, so the connection
  // stays in step); a chunked body is counted in post(), below.
  svr_->set_payload_max_length(o.max_body);
  // httplib's default also sets SO_REUSEPORT, with which a second server bound the port another
  // one held and the kernel split the connections between them: "address in use" instead. The
  // socket is kept to widen its backlog after httplib's listen() (below).
  svr_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
    listen_sock_ = sock;
  });
  routes();
}

HttpServer::~HttpServer() = default;

// --api-key: every route but /health wants "Authorization: Bearer KEY" (the scheme's name in any
// case, RFC 9110; the key exactly).
bool HttpServer::authorized(const httplib::Request& req) const {
  if (opts_.api_key.empty() || req.path == "/health") return true;
  const std::string auth = req.get_header_value("Authorization");
  return auth.size() > 7 && strncasecmp(auth.c_str(), "Bearer ", 7) == 0 && auth.substr(7) == opts_.api_key;
}

void HttpServer::refuse_unauthorized(httplib::Response& res) {
  send_error(res, 401, "missing or wrong API key (send \"Authorization: Bearer KEY\")", "authentication_error");
}

bool HttpServer::cross_origin(const httplib::Request& req, httplib::Response& res) const {
  if (!req.has_header("Origin")) return false;  // not a browser page (curl, the SDKs)
  const std::string origin = req.get_header_value("Origin");
  if (!origin_allowed(origin, opts_.allow_origins)) {
    const std::string what = "pages from origin '" + origin + "' may not call this server (start it with --allow-origin " + origin + ")";
    if (req.method == "POST") send_error_and_close(res, 403, what, "permission_error");  // its body is left unread
    else send_error(res, 403, what, "permission_error");
    return true;
  }
  res.set_header("Access-Control-Allow-Origin", origin);
  res.set_header("Vary", "Origin");
  if (req.method != "OPTIONS") return false;
  // A preflight: no API key comes with it (the request it asks about carries one).
  if (*allowed_methods(req.path) == '\0') return false;  // 404
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", allowed_methods(req.path));
  const std::string asked = req.get_header_value("Access-Control-Request-Headers");
  res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
  res.set_header("Access-Control-Max-Age", "600");
  return true;
}

int HttpServer::bind() {
  // A name that does not resolve says so (httplib's bind only fails).
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (const int rc = getaddrinfo(opts_.host.c_str(), nullptr, &hints, &found); rc != 0)
    throw Error("cannot listen on " + opts_.host + ": " + gai_strerror(rc));
  freeaddrinfo(found);
  const int port = opts_.port == 0 ? svr_->bind_to_any_port(opts_.host) : (svr_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (port <= 0)
    throw Error("cannot listen on " + opts_.host + ":" + std::to_string(opts_.port) + ": the address is in use, not local, or not allowed");
  // libcpp-httplib listens with a backlog of 5 (compiled in): a burst of connections then waited
  // about a second for the kernel's retries. listen() again on the bound socket sets a wider one.
  if (listen_sock_ >= 0) ::listen(listen_sock_, k_listen_backlog);
  return port;
}

void HttpServer::run() { svr_->listen_after_bind(); }
void HttpServer::stop() { svr_->stop(); }
bool HttpServer::running() const { return svr_->is_running(); }

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A Content-Length that is not a byte count (httplib reads "-5" as huge and answers 413).
    if (const std::string n = req.get_header_value("Content-Length");
        req.has_header("Content-Length") && (n.empty() || n.find_first_not_of("0123456789") != std::string::npos)) {
      send_error_and_close(res, 400, "Content-Length '" + n + "' is not a byte count");
      return httplib::Server::HandlerResponse::Handled;
    }
    // Two Content-Lengths that differ (a smuggling pattern; httplib reads the first).
    for (size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i)
      if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length")) {
        send_error_and_close(res, 400, "the request has Content-Length headers that differ");
        return httplib::Server::HandlerResponse::Handled;
      }
    // A request with neither Content-Length nor Transfer-Encoding has no body (RFC 9112, 6.3), but
    // httplib reads a POST's body until the client closes: such a POST hung until the read timed
    // out and got an empty 400, also on an unknown path. It reads as Content-Length 0 (httplib hands
    // the handlers its own Request, not a copy), so it is routed like any other: 404 where no
    // endpoint is, or the endpoint's own answer to an empty body.
    if (req.method == "POST" && !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding"))
      const_cast<httplib::Request&>(req).headers.emplace("Content-Length", "0");
    if (cross_origin(req, res)) return httplib::Server::HandlerResponse::Handled;
    // A POST's key is checked once its body is read (post(), below), so the connection stays in step.
    if (req.method == "POST" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    refuse_unauthorized(res);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib answers itself (404, 413, 400 on a malformed request line) get an error object.
  // A 400 of httplib's (a request it could not parse) or a 413 (the body left unread) ends the
  // connection: what follows is not a request.
  s.set_error_handler(httplib::Server::HandlerWithResponse([max_body = opts_.max_body](const httplib::Request& req, httplib::Response& res) {
    // Ours already (a body, or send_error_and_close's provider: httplib's public content_length_).
    if (!res.body.empty() || res.content_length_ > 0) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 400 || res.status == 413) {
      send_error_and_close(res, res.status,
                           res.status == 413 ? body_too_large(max_body)
                                             : "the request could not be parsed: a malformed request line or header, or a header line longer than " +
                                                   std::to_string(CPPHTTPLIB_HEADER_MAX_LENGTH / 1024) + " KiB");
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string what = res.status == 404   ? "no such endpoint: " + req.method + " " + req.path
                             : res.status == 414 ? "the request's URL is longer than " + std::to_string(CPPHTTPLIB_REQUEST_URI_MAX_LENGTH / 1024) + " KiB"
                                                 : "request refused";
    send_error(res, res.status, what, res.status == 404 ? "not_found_error" : "invalid_request_error");
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.type, e.param, e.code);
      if (e.code == "server_busy") res.set_header("Retry-After", "1");  // a place frees within a request's time
    } catch (const std::exception& e) {
      send_error(res, 500, e.what(), "server_error");
    } catch (...) {
      send_error(res, 500, "unknown error", "server_error");
    }
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) { metrics_.request(route_label(req.path), res.status); });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (sched_.draining()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  const auto model_object = [this] {
    return json{{"id", opts_.model_name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))}, {"owned_by", "vkllm"},
                {"meta", {{"n_ctx", api_.context}, {"parallel", sched_.sequences()}}}};
  };
  s.Get("/v1/models", [this, model_object](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
  });
  // OpenAI's models.retrieve: the one model by its id, else a 404.
  s.Get(R"(/v1/models/(.+))", [this, model_object](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != opts_.model_name)
      return send_error(res, 404, "the model '" + id + "' does not exist (this server serves '" + opts_.model_name + "')",
                        "invalid_request_error", "model", "model_not_found");
    res.set_content(dump(model_object()), "application/json");
  });

  // llama-server's: the server's settings, for clients that size prompts and show defaults.
  s.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
    const json params = sampling_params(api_.defaults, api_.default_max_tokens);
    const Tokenizer& tok = *api_.tok;
    const auto token_text = [&](int32_t id) { return id >= 0 ? utf8::sanitize(tok.token_to_piece(id, true)) : std::string(); };
    const json props = {{"default_generation_settings", {{"n_ctx", api_.context}, {"params", params}}},
                        {"total_slots", sched_.sequences()},
                        {"model_path", opts_.model_path},
                        {"chat_template", api_.chat_template->source()},
                        {"bos_token", token_text(tok.bos())},
                        {"eos_token", token_text(tok.eos())},
                        {"modalities", {{"vision", false}, {"audio", false}}},
                        {"build_info", opts_.build_info}};
    res.set_content(dump(props), "application/json");
  });
  // Every sequence's state (llama-server's /slots, its fields that apply here).
  s.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
    json slots = json::array();
    for (const SlotState& st : sched_.slots()) {
      json slot = {{"id", st.id},
                   {"n_ctx", st.n_ctx},
                   {"speculative", api_.speculative.on()},
                   {"is_processing", st.processing},
                   {"is_prefilling", st.prefilling},
                   {"n_cached_tokens", st.n_cached}};
      // llama-server's params and next_token of the request running on the slot (its sampling as
      // the request set it, or the server's defaults where it did not).
      if (st.job) {
        const GenerateOptions& g = st.job->generate;
        json params = sampling_params(st.job->sampling, g.n_predict);
        params.update({{"stop", g.stop},
                       {"ignore_eos", g.ignore_eos},
                       {"n_probs", g.logprobs ? g.top_logprobs : 0},
                       {"speculative.n_max", g.speculative.on() ? g.speculative.draft_max : 0},
                       {"speculative.n_min", g.speculative.draft_min},
                       {"speculative.p_min", g.speculative.p_min}});
        slot["params"] = std::move(params);
        slot["next_token"] = {{"n_decoded", st.n_decoded},
                              {"n_remain", g.n_predict < 0 ? -1 : std::max<int64_t>(int64_t{g.n_predict} - st.n_decoded, 0)}};
      }
      slots.push_back(std::move(slot));
    }
    res.set_content(dump(slots), "application/json");
  });

  const auto generate = [this](Endpoint e, const std::string& request_body, httplib::Response& res) {
    const ApiRequest r = parse_request(e, request_body, api_);
    auto job = std::make_shared<Job>(r.prompt, r.sampling, r.generate);
    if (!sched_.submit(job))
      throw ApiError(503, sched_.draining() ? "the server is shutting down" : "every sequence is busy and the queue is full; try again later",
                     "", "server_error", "server_busy");
    const std::string id = (e == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + id_tag() + "-" + std::to_string(next_id++);
    const int64_t created = int64_t(std::time(nullptr));
    const std::string model = opts_.model_name;
    const auto usage = [](const Job& j) {
      return Usage{j.stats().prompt_tokens, j.stats().generated, j.stats().cached_tokens};
    };
    const bool logprobs = r.generate.logprobs;
    if (!r.stream) {
      // The text and, when asked for, its tokens' log-probabilities, as they are released.
      auto text = std::make_shared<std::string>();
      auto entries = std::make_shared<std::vector<TokenLogprobs>>();
      const auto body = [=](const std::string& text) {
        return dump(completion_body(e, id, created, model, text, finish_reason(job->stats().stop_reason), usage(*job),
                                    logprobs ? logprobs_body(e, *entries) : json(nullptr)));
      };
      // Finished within k_keep_alive: a plain response, whose status says how it went.
      std::string piece;
      const auto deadline = std::chrono::steady_clock::now() + k_keep_alive;
      const auto left = [&] {
        using std::chrono::milliseconds;
        return std::max(std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()), milliseconds(0));
      };
      for (Job::Wait w; (w = job->wait_text_for(piece, left(), entries.get())) != Job::Wait::Idle;) {
        if (w == Job::Wait::Text) {
          *text += piece;
          continue;
        }
        if (!job->error().empty()) throw job_error(*job);
        res.set_content(body(*text), "application/json");
        return;
      }
      // Otherwise 200 now, then a space every k_keep_alive until the body. An error that comes
      // later is the body (an OpenAI error object) under that 200. The type names its charset:
      // cpp-httplib compresses a body typed exactly "application/json" for a client that accepts
      // gzip (OpenAI's clients do), which held the spaces back until the end, so a client that
      // left was never noticed and its request ran on.
      res.set_chunked_content_provider(
          "application/json; charset=utf-8",
          [=](size_t, httplib::DataSink& sink) {
            std::string piece;
            auto last_write = std::chrono::steady_clock::now();
            for (Job::Wait w; (w = job->wait_text_for(piece, k_keep_alive, entries.get())) != Job::Wait::Done;) {
              if (w == Job::Wait::Text) *text += piece;
              if (std::chrono::steady_clock::now() - last_write < k_keep_alive) continue;
              if (!sink.write(k_keep_alive_space, sizeof(k_keep_alive_space) - 1)) {
                job->cancel();
                return false;
              }
              last_write = std::chrono::steady_clock::now();
            }
            const std::string out = job->error().empty() ? body(*text) : dump(job_error_body(*job));
            sink.write(out.data(), out.size());
            sink.done();
            return true;
          },
          [job](bool success) {
            if (!success) job->cancel();
          });
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    const bool include_usage = r.include_usage;
    res.set_chunked_content_provider(
        "text/event-stream",
        [=](size_t, httplib::DataSink& sink) {
          const auto event = [&](const std::string& data) {
            const std::string line = "data: " + data + "\n\n";
            return sink.write(line.data(), line.size());
          };
          bool first = true;
          std::string piece;
          std::vector<TokenLogprobs> entries;
          for (Job::Wait w; (w = job->wait_text_for(piece, k_keep_alive, &entries)) != Job::Wait::Done;) {
            // Nothing for a while (queued, or a long prefill): an SSE comment, which clients skip;
            // writing to a client that has gone fails, and the job is dropped. A chunk carries its
            // tokens' log-probabilities when they were asked for.
            const bool ok = w == Job::Wait::Idle ? sink.write(k_keep_alive_line, sizeof(k_keep_alive_line) - 1)
                                                 : event(dump(chunk_body(e, id, created, model, piece, first, std::nullopt,
                                                                         logprobs ? logprobs_body(e, entries) : json(nullptr))));
            entries.clear();
            if (!ok) {
              job->cancel();
              return false;
            }
            if (w == Job::Wait::Text) first = false;
          }
          if (!job->error().empty()) {
            event(dump(job_error_body(*job)));
          } else {
            if (first) event(dump(chunk_body(e, id, created, model, "", true, std::nullopt)));
            event(dump(chunk_body(e, id, created, model, "", false, finish_reason(job->stats().stop_reason))));
            if (include_usage) event(dump(usage_chunk_body(e, id, created, model, usage(*job))));
          }
          event("[DONE]");
          sink.done();
          return true;
        },
        [job](bool success) {
          if (!success) job->cancel();
        });
  };
  // The body is read through a content reader, whatever its Content-Type (but multipart/form-data,
  // refused with a 415): httplib's own reading
  // refuses a form-urlencoded body (curl -d's default type) over 8 KiB with a 413, whatever
  // --max-body says. The reader stops at --max-body (413): httplib checks a Content-Length against
  // it, the count here a chunked body, which httplib reads whole otherwise.
  using BodyHandler = std::function<void(const httplib::Request& req, const std::string& body, httplib::Response& res)>;
  const auto post = [this, max_body = opts_.max_body](BodyHandler handle) {
    return [this, handle, max_body](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      // A chunked body past --max-body is read on and dropped, up to k_drain_bytes more, so that the
      // 413 is answered on a connection whose framing holds (its rest was read as requests: 414s and
      // 400s, and a client still sending got EPIPE); past that the connection is closed.
      if (req.is_multipart_form_data()) {  // httplib would split it into parts; its body is left unread
        send_error_and_close(res, 415, "a multipart/form-data body is not read: send the JSON request itself as the body");
        return;
      }
      std::string body;
      bool too_large = false;
      size_t dropped = 0;  // bytes past --max-body
      // A POST without a body (curl -X POST, an erase) has nothing to read (httplib's reader fails).
      const bool has_body = req.has_header("Content-Length") ? req.get_header_value("Content-Length") != "0"
                                                              : req.has_header("Transfer-Encoding");
      const bool whole = !has_body || read([&](const char* data, size_t n) {
        const size_t room = too_large ? 0 : max_body - body.size();
        if (n <= room) {
          body.append(data, n);
          return true;
        }
        too_large = true;
        dropped += n - room;
        return dropped <= k_drain_bytes;
      });
      if (too_large && !whole) {  // more than the drain: what follows is not a request
        send_error_and_close(res, 413, body_too_large(max_body));
        return;
      }
      if (too_large || (!whole && res.status == 413)) throw ApiError(413, body_too_large(max_body));
      if (!whole) throw ApiError(400, "the request body could not be read");
      if (!authorized(req)) return refuse_unauthorized(res);
      handle(req, body, res);
    };
  };
  s.Post("/v1/chat/completions", post([generate](const httplib::Request&, const std::string& body, httplib::Response& res) { generate(Endpoint::Chat, body, res); }));
  s.Post("/v1/completions", post([generate](const httplib::Request&, const std::string& body, httplib::Response& res) { generate(Endpoint::Completion, body, res); }));
  // llama-server's tokenizer endpoints: the model's vocabulary, no sequence needed.
  s.Post("/tokenize", post([this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    res.set_content(tokenize_body(body, *api_.tok), "application/json");
  }));
  s.Post("/detokenize", post([this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    res.set_content(dump(detokenize_body(body, *api_.tok)), "application/json");
  }));
  // llama-server's slot files: POST /slots/{id}?action=save|restore {"filename": NAME}, or
  // ?action=erase; NAME is a file in --slot-save-path.
  s.Post(R"(/slots/(\d+))", post([this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    if (opts_.slot_save_path.empty())
      throw ApiError(501, "slot files are off: start the server with --slot-save-path DIR", "", "not_supported_error");
    const std::string action = req.get_param_value("action");
    SlotAction a;
    if (action == "save") a.kind = SlotAction::Kind::Save;
    else if (action == "restore") a.kind = SlotAction::Kind::Restore;
    else if (action == "erase") a.kind = SlotAction::Kind::Erase;
    else throw ApiError(400, "'action' must be save, restore or erase, got '" + action + "'", "action");
    const std::string id_text = req.matches[1].str();
    if (id_text.size() > 6 || std::stoul(id_text) >= sched_.sequences())
      throw ApiError(400, "no sequence " + id_text + ": the server has " + std::to_string(sched_.sequences()) + " (--parallel), 0 … " +
                              std::to_string(sched_.sequences() - 1), "id_slot");
    a.slot = std::stoul(id_text);
    std::string filename;
    if (a.kind != SlotAction::Kind::Erase) {
      const json j = parse_json_object(body);
      const auto f = j.find("filename");
      if (f == j.end() || !f->is_string()) throw ApiError(400, "'filename' must be a string: the slot file's name in --slot-save-path", "filename");
      filename = f->get<std::string>();
      if (const std::string why = bad_slot_filename(filename); !why.empty()) throw ApiError(400, "'filename' " + why, "filename");
      a.path = (std::filesystem::path(opts_.slot_save_path) / filename).string();
    }
    const SlotResult r = sched_.slot_action(a).get();
    if (!r.error.empty())
      throw ApiError(r.status, r.error, "", r.status == 503 ? "unavailable_error" : r.status == 404 ? "not_found_error" : r.status == 500 ? "server_error" : "invalid_request_error");
    json out = {{"id_slot", a.slot}};
    if (a.kind == SlotAction::Kind::Save) {
      out.update({{"filename", filename}, {"n_saved", r.tokens}, {"n_written", r.bytes}, {"timings", {{"save_ms", r.ms}}}});
    } else if (a.kind == SlotAction::Kind::Restore) {
      out.update({{"filename", filename}, {"n_restored", r.tokens}, {"n_read", r.bytes}, {"timings", {{"restore_ms", r.ms}}}});
      if (r.unfinished) out["n_unfinished"] = r.unfinished;  // the file's last save was cut short: what was ignored
    } else {
      out["n_erased"] = r.tokens;
    }
    res.set_content(dump(out), "application/json");
  }));

  // A known path asked with a method it does not answer: 405 with the ones it does (after the
  // key, as every route); OPTIONS without an Origin (no preflight) just lists them.
  const auto not_allowed = [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req)) return refuse_unauthorized(res);
    res.set_header("Allow", allowed_methods(req.path));
    if (req.method == "OPTIONS") {
      res.status = 204;
      return;
    }
    send_error(res, 405, req.method + " is not allowed on " + req.path + " (" + allowed_methods(req.path) + ")", "invalid_request_error");
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", R"(/slots/\d+)"}) {
    s.Get(path, not_allowed);
    s.Put(path, not_allowed);
    s.Patch(path, not_allowed);
    s.Delete(path, not_allowed);
    s.Options(path, not_allowed);
  }
  for (const char* path : {"/health", "/metrics", "/v1/models", "/props", "/slots"}) {
    s.Post(path, not_allowed);
    s.Put(path, not_allowed);
    s.Patch(path, not_allowed);
    s.Delete(path, not_allowed);
    s.Options(path, not_allowed);
  }
}

}  // namespace vkllm::serve
