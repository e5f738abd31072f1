// The OpenAI API as the server speaks it: request bodies checked and turned into a prompt and
// generation settings, and the response objects (whole and streamed). Nothing here touches the
// device. Field by field in docs/server.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/template.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "serve/logprobs.h"
#include "text/tokenizer.h"

namespace vkllm::serve {

// A request the server refuses: the HTTP status and an OpenAI error object's fields.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "", std::string type = "invalid_request_error", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string param, type, code;
};
// {"error": {"message", "type", "param", "code"}}, as OpenAI's: `type` the class of error, `param`
// the field or null, `code` a name for the case (context_length_exceeded, server_busy) or null.
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& param, const std::string& code = "");

// A request body that must be one JSON object; throws ApiError (400) saying what is wrong.
nlohmann::json parse_json_object(const std::string& body);

enum class Endpoint { Chat, Completion };

// What a request asks for, checked.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::vector<int32_t> prompt;  // tokens to run
  SamplerParams sampling;
  GenerateOptions generate;     // n_predict, stop
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage: a last chunk with usage
};

// What the request parser needs besides the body.
struct ApiContext {
  const Tokenizer* tok = nullptr;
  const ChatTemplate* chat_template = nullptr;
  SamplerParams defaults;       // the server's sampling flags
  uint32_t context = 0;         // tokens a sequence holds (--ctx)
  int32_t default_max_tokens = GenerateOptions::kUntilFull;
  SpeculativeOptions speculative;  // the server's --spec-type … flags, each request's defaults
  uint32_t max_draft = 0;          // the most drafts one of a sequence's passes holds
};

// Parses and checks a body; throws ApiError (400) naming the field that is wrong.
ApiRequest parse_request(Endpoint e, const std::string& body, const ApiContext& ctx);

// llama-server's POST /tokenize: {"content": string, "add_special": false, "parse_special": true,
// "with_pieces": false} → {"tokens": [id, …]}, or with pieces [{"id", "piece"}, …] (a piece that is
// not whole UTF-8 as its list of bytes). Throws ApiError (400) naming the field that is wrong.
std::string tokenize_body(const std::string& body, const Tokenizer& tok);  // the JSON text
// POST /detokenize: {"tokens": [id, …]} → {"content": the tokens' text, control tokens shown}.
nlohmann::json detokenize_body(const std::string& body, const Tokenizer& tok);

// How a generation ended, in the API's words: "stop" (end of generation or a stop string) or
// "length" (max_tokens or the context).
std::string finish_reason(const std::string& stop_reason);

// Token counts for `usage`.
struct Usage {
  uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);

// A choice's `logprobs` for these tokens: the chat's {"content": [{token, logprob, bytes,
// top_logprobs}], "refusal": null}, the legacy completions' {tokens, token_logprobs, top_logprobs,
// text_offset}.
nlohmann::json logprobs_body(Endpoint e, std::span<const TokenLogprobs> entries);
// The response of a whole (not streamed) request; `logprobs` the choice's (null: not asked for).
nlohmann::json completion_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                               const std::string& text, const std::string& finish, const Usage& u,
                               const nlohmann::json& logprobs = nullptr);
// One streamed chunk: text (with the assistant role on a chat's first chunk) and its tokens'
// `logprobs`, or the last one with its finish reason (text empty).
nlohmann::json chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                          const std::string& text, bool first, const std::optional<std::string>& finish,
                          const nlohmann::json& logprobs = nullptr);
// stream_options.include_usage: the chunk after the last, with no choices and the usage.
nlohmann::json usage_chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model, const Usage& u);

}  // namespace vkllm::serve
