// HttpServer: the OpenAI-compatible HTTP front of the scheduler (cpp-httplib): routes, API key,
// body limit, server-sent events, errors as OpenAI error objects. Endpoints in docs/server.md.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace vkllm::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (bind() says which)
  std::string api_key;              // "": no authentication
  size_t max_body = 1 << 20;        // bytes of a request body
  std::string model_name;           // what /v1/models lists and responses echo
  std::string model_path;           // the -m path (/props)
  std::string build_info;           // the program and its version (/props)
  std::string slot_save_path;       // --slot-save-path: the folder of /slots/{id} save and restore ("": refused)
  size_t threads = 8;               // most HTTP connection threads at once (each serves one connection)
  // Browser origins (scheme://host[:port]) whose pages may call the API, besides this machine's
  // own (localhost, 127.0.0.1, [::1], any port); "*" lets every origin in (docs/server.md, "CORS").
  std::vector<std::string> allow_origins;
};

// An origin's parts, "scheme://host[:port]" (host may be "[v6]"); nullopt when it is not one (a
// path, a port that is not 1–5 digits up to 65535, characters no host has).
struct OriginParts {
  std::string scheme, host, port;  // port "" when absent
};
std::optional<OriginParts> parse_origin(const std::string& origin);
// Whether a browser page from `origin` (the Origin header) may call the server: one of this
// machine's own origins, or one of `allowed` ("*": any).
bool origin_allowed(const std::string& origin, const std::vector<std::string>& allowed);

class HttpServer {
 public:
  HttpServer(const ServerOptions& o, Scheduler& scheduler, Metrics& metrics, const ApiContext& api);
  ~HttpServer();
  // Binds the listening socket; returns the port. Throws Error when it cannot.
  int bind();
  // Serves until stop() (from another thread).
  void run();
  void stop();
  bool running() const;

 private:
  void routes();
  // Whether a request may use its route (--api-key); the 401 for one that may not.
  bool authorized(const httplib::Request& req) const;
  // CORS: a request from a browser page whose origin may not call the server is refused (403);
  // one that may gets the Access-Control headers, and a preflight its answer. True when handled.
  bool cross_origin(const httplib::Request& req, httplib::Response& res) const;
  static void refuse_unauthorized(httplib::Response& res);

  ServerOptions opts_;
  Scheduler& sched_;
  Metrics& metrics_;
  ApiContext api_;
  std::unique_ptr<httplib::Server> svr_;
  int listen_sock_ = -1;  // the listening socket, as httplib's socket-options hook saw it
};

}  // namespace vkllm::serve
