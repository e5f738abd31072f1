// Request checking and response objects of the OpenAI API.
#include "serve/api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/utf8.h"
#include "chat/prompt.h"
#include "text/json_schema.h"

namespace vkllm::serve {
namespace {

using nlohmann::json;

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* name, double lo, double hi, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) throw ApiError(400, std::string("'") + name + "' must be a number", name);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw ApiError(400, std::string("'") + name + "' must be between " + json(lo).dump() + " and " + json(hi).dump() + ", got " + v->dump(), name);
  return x;
}

int64_t integer(const json& body, const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  // A float with no fraction (2.0, as a client computing a count may send) is that integer.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) throw ApiError(400, std::string("'") + name + "' must be an integer, got " + v->dump(), name);
    if (d < double(lo) || d > double(hi))
      throw ApiError(400, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v->dump(), name);
    return int64_t(d);
  }
  if (!v->is_number_integer()) throw ApiError(400, std::string("'") + name + "' must be an integer", name);
  // Stored as a signed or unsigned 64-bit value; a value above INT64_MAX is out of range too.
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi))
    throw ApiError(400, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v->dump(), name);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw ApiError(400, std::string("'") + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v->dump(), name);
  return x;
}

// A token id in the request's field `param` (an integer already): one of the vocabulary's, else a 400.
int32_t token_id(const json& t, int32_t n_vocab, const std::string& param) {
  const bool in_vocab = t.is_number_unsigned() ? t.get<uint64_t>() < uint64_t(n_vocab) : t.get<int64_t>() >= 0 && t.get<int64_t>() < n_vocab;
  if (!in_vocab)
    throw ApiError(400, "'" + param + "': token " + t.dump() + " is outside the vocabulary (0 … " + std::to_string(n_vocab - 1) + ")", param);
  return t.get<int32_t>();
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) throw ApiError(400, std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

// A message's content: a string, or a list of {"type": "text", "text": …} parts, joined by "\n"
// (as llama.cpp's server joins them: two parts never run into one word). As in OpenAI's API it is
// required, and may be null only in an assistant message (read as empty).
std::string content_text(const json& m, size_t i, const std::string& role) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  const json* c = field(m, "content");
  if (!c && role == "assistant" && m.contains("content")) return "";
  if (!c) throw ApiError(400, "'" + where + "' is required (a string or a list of text parts)", where);
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) throw ApiError(400, "'" + where + "' must be a string or a list of text parts", where);
  std::string text;
  for (const json& part : *c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      throw ApiError(400, "'" + where + "': only parts of type \"text\" with a string \"text\" are supported", where);
    if (&part != &c->front()) text += '\n';
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<int32_t> chat_tokens(const json& body, const ApiContext& ctx) {
  const json* msgs = field(body, "messages");
  if (!msgs) throw ApiError(400, "'messages' is required", "messages");
  if (!msgs->is_array() || msgs->empty()) throw ApiError(400, "'messages' must be a non-empty list", "messages");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw ApiError(400, "'" + where + "' must be an object", where);
    const json* role = field(m, "role");
    if (!role || !role->is_string()) throw ApiError(400, "'" + where + ".role' must be a string", where + ".role");
    const std::string r = role->get<std::string>();
    // Tool results and calls belong to tool calling, which this server refuses (refuse_unsupported).
    if (r == "tool" || r == "function")
      throw ApiError(400, "'" + where + ".role': " + r + " messages (tool calling) are not supported by this server", where + ".role",
                     "invalid_request_error", "unsupported_parameter");
    if (const json* calls = field(m, "tool_calls"); calls && !(calls->is_array() && calls->empty()))
      throw ApiError(400, "'" + where + ".tool_calls': tool calling is not supported by this server", where + ".tool_calls",
                     "invalid_request_error", "unsupported_parameter");
    if (r != "system" && r != "user" && r != "assistant" && r != "developer")
      throw ApiError(400, "'" + where + ".role': unknown role '" + r + "' (system, developer, user or assistant)", where + ".role");
    // OpenAI's "developer" is the system prompt of newer models; templates know "system".
    messages.push_back({{"role", r == "developer" ? "system" : r}, {"content", content_text(m, i, r)}});
  }
  // A last assistant message is the start of the reply (a prefill, as llama.cpp's server takes it):
  // the conversation before it opens the assistant's turn, its text follows, and the model goes on.
  std::string prefill;
  if (messages.size() > 1 && messages.back()["role"] == "assistant") {
    prefill = messages.back()["content"].get<std::string>();
    messages.erase(messages.size() - 1);
  }
  try {
    RenderedPrompt rendered = ctx.chat_template->render_with_spans(messages, render_options(*ctx.tok, true));
    if (!prefill.empty()) {
      rendered.content_spans.emplace_back(rendered.text.size(), rendered.text.size() + prefill.size());
      rendered.text += prefill;
    }
    return tokenize_rendered(*ctx.tok, rendered);
  } catch (const Error& e) {
    throw ApiError(400, std::string("the chat template refused the messages: ") + e.what(), "messages");
  }
}

std::vector<int32_t> completion_tokens(const json& body, const ApiContext& ctx) {
  const json* p = field(body, "prompt");
  if (!p) throw ApiError(400, "'prompt' is required", "prompt");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p->is_string()) return raw_prompt(*ctx.tok, p->get<std::string>()).tokens;
  if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& t) { return t.is_number_integer(); })) {
    std::vector<int32_t> tokens;
    for (const json& t : *p) tokens.push_back(token_id(t, ctx.tok->n_vocab(), "prompt"));
    return tokens;
  }
  throw ApiError(400, "'prompt' must be a string, a list of one string, or a list of token ids", "prompt");
}

std::vector<std::string> stop_strings(const json& body) {
  const json* s = field(body, "stop");
  if (!s) return {};
  if (s->is_string()) return s->get<std::string>().empty() ? std::vector<std::string>{} : std::vector<std::string>{s->get<std::string>()};
  if (!s->is_array() || s->size() > 16) throw ApiError(400, "'stop' must be a string or a list of at most 16 strings", "stop");
  std::vector<std::string> out;
  for (const json& x : *s) {
    if (!x.is_string()) throw ApiError(400, "'stop' must be a string or a list of at most 16 strings", "stop");
    if (!x.get<std::string>().empty()) out.push_back(x.get<std::string>());
  }
  return out;
}

// Fields of OpenAI's API this server does not implement: refused where they ask for something,
// so a client never takes an answer without what it asked for (a logprobs of null, text where it
// wanted JSON or a tool call); their "off" values (false, 0, empty, "text", "none", "auto") pass,
// as clients send them by default.
void refuse_unsupported(const json& body, Endpoint e) {
  const auto refuse = [](const char* name, const std::string& what) {
    throw ApiError(400, std::string("'") + name + "': " + what + " is not supported by this server", name, "invalid_request_error",
                   "unsupported_parameter");
  };
  const auto on = [](const json* v) {
    return v && !(v->is_boolean() && !v->get<bool>()) && !(v->is_number() && v->get<double>() == 0) &&
           !((v->is_array() || v->is_object()) && v->empty()) && !(v->is_string() && v->get_ref<const std::string&>().empty());
  };
  // The legacy completions take their count of alternatives as `logprobs` (log_probabilities()).
  if (const json* v = field(body, "top_logprobs"); e == Endpoint::Completion && on(v))
    refuse("top_logprobs", "top_logprobs on /v1/completions (its 'logprobs' is the count)");
  // Tools are asked for unless the choice says none.
  const json* choice = field(body, "tool_choice");
  const bool no_tools = choice && choice->is_string() && *choice == "none";
  if (const json* v = field(body, "tools"); on(v) && !no_tools) refuse("tools", "tool calling");
  if (choice && !(choice->is_string() && (*choice == "none" || *choice == "auto"))) refuse("tool_choice", "tool calling");
  const json* call = field(body, "function_call");
  const bool no_functions = call && call->is_string() && *call == "none";
  if (const json* v = field(body, "functions"); on(v) && !no_functions) refuse("functions", "function calling");
  if (call && !(call->is_string() && (*call == "none" || *call == "auto"))) refuse("function_call", "function calling");
  if (const json* v = field(body, "echo"); on(v)) refuse("echo", "echoing the prompt");
  if (const json* v = field(body, "best_of"); v && !(v->is_number() && v->get<double>() == 1)) refuse("best_of", "best_of other than 1");
  if (const json* v = field(body, "suffix"); on(v)) refuse("suffix", "a suffix (fill in the middle)");
}

// The grammar the reply must follow: `response_format` {"type": "json_object"} (one JSON object, by
// the built-in grammar) or {"type": "json_schema", "json_schema": {"schema": …}} (JSON the schema
// accepts), or llama.cpp's `grammar` (GBNF text) or `json_schema` (a schema) fields; one of them.
// {"type": "text"} and an empty `grammar` are free text. A schema is read from the body again as
// an ordered JSON (`body` sorts keys), so that properties come in the order it lists them.
std::shared_ptr<const Grammar> response_grammar(const json& body, const std::string& body_text) {
  const json* format = field(body, "response_format");
  const json* type = format && format->is_object() ? field(*format, "type") : nullptr;
  if (format && (!type || !type->is_string()))
    throw ApiError(400, "'response_format' must be an object with a string 'type'", "response_format");
  if (type && *type != "text" && *type != "json_object" && *type != "json_schema") {
    throw ApiError(400, "'response_format': type " + type->dump() + " is not supported by this server (\"text\", \"json_object\" and "
                   "\"json_schema\" are; a GBNF 'grammar' constrains the reply to any format)", "response_format", "invalid_request_error",
                   "unsupported_parameter");
  }
  const json* gbnf = field(body, "grammar");
  if (gbnf && !gbnf->is_string()) throw ApiError(400, "'grammar' must be a string (GBNF)", "grammar");
  if (gbnf && gbnf->get_ref<const std::string&>().empty()) gbnf = nullptr;
  const json* schema_field = field(body, "json_schema");
  const bool wants_format = type && *type != "text";
  if (int(wants_format) + int(gbnf != nullptr) + int(schema_field != nullptr) > 1)
    throw ApiError(400, "give one of 'grammar', 'json_schema' and a JSON 'response_format'", gbnf ? "grammar" : "json_schema");
  if (gbnf) {
    try {
      return Grammar::parse(gbnf->get_ref<const std::string&>(), "(the request's field)");
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "grammar");
    }
  }
  // json_object with a `schema` (llama-server takes one there too) is held to the schema.
  const bool object_schema = type && *type == "json_object" && format->contains("schema") && !format->at("schema").is_null();
  if (type && *type == "json_object" && !object_schema) {
    static const std::shared_ptr<const Grammar> json_object = Grammar::parse(json_object_gbnf(), "json_object");
    return json_object;
  }
  if (!schema_field && !object_schema && !(type && *type == "json_schema")) return nullptr;
  const char* param = schema_field ? "json_schema" : "response_format";
  nlohmann::ordered_json schema = true;  // OpenAI's json_schema without a schema: any JSON value
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body_text);
  if (schema_field) {
    schema = ordered.at("json_schema");
  } else {
    // (`field` found response_format and its type above; the rest may be absent: any JSON value.)
    const nlohmann::ordered_json& format_obj = ordered.at("response_format");
    const auto spec = format_obj.find(object_schema ? "schema" : "json_schema");
    if (object_schema) schema = *spec;
    if (!object_schema && spec != format_obj.end() && !spec->is_null()) {
      if (!spec->is_object()) throw ApiError(400, "'response_format.json_schema' must be an object ({\"name\", \"schema\"})", param);
      if (const auto inner = spec->find("schema"); inner != spec->end() && !inner->is_null()) schema = *inner;
    }
  }
  try {
    return json_schema_grammar(schema);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), param);
  }
}

// logit_bias: OpenAI's {"TOKEN_ID": bias} (−100 … 100; ±100 bans or all but forces a token), or
// llama.cpp's [[TOKEN_ID, bias], …]; a bias of false (llama.cpp) bans the token.
std::vector<std::pair<int32_t, float>> logit_biases(const json& body, int32_t n_vocab) {
  std::vector<std::pair<int32_t, float>> out;
  const json* v = field(body, "logit_bias");
  if (!v) return out;
  const auto add = [&](const json& id, const json& bias) {
    int64_t t = -1;
    if (id.is_number_integer()) t = id.get<int64_t>();
    else if (id.is_string() && !id.get_ref<const std::string&>().empty() &&
             id.get_ref<const std::string&>().find_first_not_of("0123456789") == std::string::npos && id.get_ref<const std::string&>().size() < 10)
      t = std::stoll(id.get<std::string>());
    if (t < 0 || t >= n_vocab)
      throw ApiError(400, "'logit_bias': " + id.dump() + " is not a token id of this model (0 to " + std::to_string(n_vocab - 1) + ")", "logit_bias");
    if (bias.is_boolean() && !bias.get<bool>()) {
      out.emplace_back(int32_t(t), -std::numeric_limits<float>::infinity());
    } else if (bias.is_number() && bias.get<double>() >= -100 && bias.get<double>() <= 100) {
      out.emplace_back(int32_t(t), float(bias.get<double>()));
    } else {
      throw ApiError(400, "'logit_bias': the bias of token " + id.dump() + " must be a number from -100 to 100 (or false), got " + bias.dump(),
                     "logit_bias");
    }
  };
  if (v->is_object()) {
    for (const auto& [id, bias] : v->items()) add(json(id), bias);
  } else if (v->is_array()) {
    for (const json& pair : *v) {
      if (!pair.is_array() || pair.size() != 2) throw ApiError(400, "'logit_bias' as an array holds [token_id, bias] pairs", "logit_bias");
      add(pair[0], pair[1]);
    }
  } else {
    throw ApiError(400, "'logit_bias' must be an object of token ids and biases", "logit_bias");
  }
  return out;
}

// logprobs and top_logprobs: the chat's `logprobs` is a flag and `top_logprobs` (0 … 20) the
// alternatives per token, which need the flag; the legacy completions' `logprobs` is the count of
// alternatives (0 … 20: 0 reports the sampled tokens' own).
void log_probabilities(const json& body, Endpoint e, GenerateOptions& g) {
  constexpr int64_t k_max_top = 20;
  if (e == Endpoint::Chat) {
    g.logprobs = boolean(body, "logprobs", false);
    g.top_logprobs = uint32_t(integer(body, "top_logprobs", 0, k_max_top, 0));
    if (g.top_logprobs > 0 && !g.logprobs)
      throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    return;
  }
  const json* v = field(body, "logprobs");
  if (!v || (v->is_boolean() && !v->get<bool>())) return;
  if (!v->is_number()) throw ApiError(400, "'logprobs' must be an integer (the alternatives per token, 0 to 20)", "logprobs");
  g.logprobs = true;
  g.top_logprobs = uint32_t(integer(body, "logprobs", 0, k_max_top, 0));
}

// speculative.n_max, speculative.n_min and speculative.p_min (llama-server's per-request names,
// flat keys): this request's --draft-max, --draft-min and --draft-p-min; n_max 0: it does not
// speculate. Without --spec-type or -md they change nothing (as llama-server's without a draft).
// A n_min no pass could draft is a 400.
void speculation(const json& body, const ApiContext& ctx, GenerateOptions& g) {
  SpeculativeOptions& s = g.speculative = ctx.speculative;
  const bool model = s.type == SpecType::DraftModel;
  const int64_t n_max = integer(body, "speculative.n_max", 0, 1024, s.draft_max);
  int64_t most = std::min<int64_t>(n_max, ctx.max_draft);
  if (!model) most = std::min<int64_t>(most, s.ngram_m);  // (n-gram drafts only)
  const int64_t n_min = integer(body, "speculative.n_min", 0, 1024, std::min<int64_t>(s.draft_min, n_max));
  if (n_min > most)
    throw ApiError(400, "'speculative.n_min' " + std::to_string(n_min) + " is more than the " + std::to_string(most) +
                            " drafts this request's passes could hold ('speculative.n_max', the server's --ubatch" +
                            (model ? std::string(")") : std::string(" and --spec-ngram-size-m)")),
                   "speculative.n_min");
  s.p_min = float(number(body, "speculative.p_min", 0.0, 1.0, s.p_min));
  if (n_max == 0) s.type = SpecType::None;
  s.draft_max = uint32_t(std::max<int64_t>(n_max, 1));
  s.draft_min = uint32_t(n_min);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

json logprobs_body(Endpoint e, std::span<const TokenLogprobs> entries) {
  // A token's text as JSON carries it: valid UTF-8, each byte that is not becoming U+FFFD (a
  // token may hold part of a character); `bytes` has it exactly.
  const auto text = [](const std::string& token) { return utf8::sanitize(token); };
  if (e == Endpoint::Chat) {
    json content = json::array();
    for (const TokenLogprobs& t : entries) {
      json top = json::array();
      for (const auto& [token, lp] : t.top) top.push_back({{"token", text(token)}, {"logprob", lp}, {"bytes", bytes_of(token)}});
      content.push_back({{"token", text(t.token)}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : entries) {
    tokens.push_back(text(t.token));
    token_logprobs.push_back(t.logprob);
    offsets.push_back(t.text_offset);
    // A dictionary by token text: of two alternatives with the same text (as sent), the more likely one.
    json top = json::object();
    for (const auto& [token, lp] : t.top) top.emplace(text(token), lp);
    top_logprobs.push_back(top);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

std::string tokenize_body(const std::string& body_text, const Tokenizer& tok) {
  const json body = parse_json_object(body_text);
  const json* content = field(body, "content");
  const bool add_special = boolean(body, "add_special", false);
  const bool parse_special = boolean(body, "parse_special", true);
  const bool with_pieces = boolean(body, "with_pieces", false);
  // A string, or (as llama-server's tokenize_mixed) a list of strings and token ids, the ids
  // taken as they are and add_special applying to a first string only.
  std::vector<int32_t> ids;
  const auto bad = [&] { return ApiError(400, "'content' must be a string, or a list of strings and token ids", "content"); };
  if (!content) throw bad();
  if (content->is_string()) {
    ids = tok.tokenize(content->get<std::string>(), add_special, parse_special);
  } else if (content->is_array()) {
    for (size_t i = 0; i < content->size(); ++i) {
      const json& part = (*content)[i];
      if (part.is_string()) {
        const std::vector<int32_t> more = tok.tokenize(part.get<std::string>(), add_special && i == 0, parse_special);
        ids.insert(ids.end(), more.begin(), more.end());
      } else if (part.is_number_integer()) {
        ids.push_back(token_id(part, tok.n_vocab(), "content"));
      } else {
        throw bad();
      }
    }
  } else {
    throw bad();
  }
  // Written as text: a body near --max-body is a million tokens, which as JSON values (an object
  // per piece) took half a GiB.
  std::string out = "{\"tokens\":[";
  bool first = true;
  for (const int32_t id : ids) {
    if (!first) out += ',';
    first = false;
    if (!with_pieces) {
      out += std::to_string(id);
      continue;
    }
    const std::string piece = tok.token_to_piece(id, true);
    out += "{\"id\":" + std::to_string(id) + ",\"piece\":" + (utf8::valid(piece) ? json(piece) : bytes_of(piece)).dump() + "}";
  }
  return out + "]}";
}

json detokenize_body(const std::string& body_text, const Tokenizer& tok) {
  const json body = parse_json_object(body_text);
  const json* ids = field(body, "tokens");
  if (!ids || !ids->is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
  std::string text;
  for (const json& t : *ids) {
    if (!t.is_number_integer()) throw ApiError(400, "'tokens' must be a list of token ids, got " + t.dump(), "tokens");
    text += tok.token_to_piece(token_id(t, tok.n_vocab(), "tokens"), true);
  }
  // Ids that end inside a character: its bytes as U+FFFD, so the answer is JSON.
  return {{"content", utf8::sanitize(text)}};
}

json parse_json_object(const std::string& body_text) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw ApiError(400, "the request body is not valid JSON: " + json_error_text(e));
  } catch (const json::out_of_range&) {  // a number past a double ("max_tokens": 1e999)
    throw ApiError(400, "the request body has a number too large to read (past ±1.8e308)");
  }
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return body;
}

json error_body(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  const auto or_null = [](const std::string& v) { return v.empty() ? json(nullptr) : json(v); };
  return {{"error", {{"message", message}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
}

ApiRequest parse_request(Endpoint e, const std::string& body_text, const ApiContext& ctx) {
  const json body = parse_json_object(body_text);
  ApiRequest r;
  r.endpoint = e;
  if (const json* n = field(body, "n"); n && !(n->is_number() && n->get<double>() == 1))
    throw ApiError(400, "'n' must be 1: one choice per request is supported, got " + n->dump(), "n", "invalid_request_error",
                   "unsupported_parameter");
  if (const json* m = field(body, "model"); m && !m->is_string()) throw ApiError(400, "'model' must be a string", "model");
  refuse_unsupported(body, e);

  SamplerParams& s = r.sampling;
  s = ctx.defaults;
  s.temp = float(number(body, "temperature", 0.0, 100.0, s.temp));
  s.top_p = float(number(body, "top_p", 0.0, 1.0, s.top_p));
  s.top_k = int32_t(integer(body, "top_k", -(1 << 30), 1 << 30, s.top_k));  // ≤ 0: off (-1 in vLLM's clients)
  s.min_p = float(number(body, "min_p", 0.0, 1.0, s.min_p));
  s.frequency_penalty = float(number(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  s.presence_penalty = float(number(body, "presence_penalty", -2.0, 2.0, s.presence_penalty));
  s.repeat_penalty = float(number(body, "repeat_penalty", 1e-3, 100.0, s.repeat_penalty));
  s.repeat_last_n = int32_t(integer(body, "repeat_last_n", -1, 1 << 30, s.repeat_last_n));
  // llama-server's other samplers (docs/sampling.md), with its names.
  s.typical_p = float(number(body, "typical_p", 0.0, 1.0, s.typical_p));
  s.top_n_sigma = float(number(body, "top_n_sigma", -1e6, 1e6, s.top_n_sigma));
  s.xtc_probability = float(number(body, "xtc_probability", 0.0, 1.0, s.xtc_probability));
  s.xtc_threshold = float(number(body, "xtc_threshold", 0.0, 1.0, s.xtc_threshold));
  s.dry_multiplier = float(number(body, "dry_multiplier", 0.0, 1e6, s.dry_multiplier));
  s.dry_base = float(number(body, "dry_base", 1.0, 1e6, s.dry_base));
  s.dry_allowed_length = int32_t(integer(body, "dry_allowed_length", 0, 1 << 30, s.dry_allowed_length));
  s.dry_penalty_last_n = int32_t(integer(body, "dry_penalty_last_n", 0, 1 << 30, s.dry_penalty_last_n));
  if (const json* v = field(body, "dry_sequence_breakers")) {
    const auto bad = [](const std::string& why) { return ApiError(400, "'dry_sequence_breakers' " + why, "dry_sequence_breakers"); };
    if (!v->is_array() || v->size() > 64) throw bad("must be a list of at most 64 strings");
    s.dry_sequence_breakers.clear();
    for (const json& b : *v) {
      if (!b.is_string()) throw bad("must be a list of strings, got " + b.dump());
      if (b.get_ref<const std::string&>().size() > 4096) throw bad("holds a string of " + std::to_string(b.get_ref<const std::string&>().size()) + " bytes (at most 4096)");
      s.dry_sequence_breakers.push_back(b.get<std::string>());
    }
  }
  s.mirostat = int32_t(integer(body, "mirostat", 0, 2, s.mirostat));
  s.mirostat_tau = float(number(body, "mirostat_tau", 0.0, 1e6, s.mirostat_tau));
  s.mirostat_eta = float(number(body, "mirostat_eta", 0.0, 1e6, s.mirostat_eta));
  // seed: 0 … 2^64 − 1, or −1 for a random one (as llama.cpp and `--seed`); 4294967295 is
  // llama.cpp's "random" too (Sampler::kRandomSeed).
  if (const json* v = field(body, "seed")) {
    if (v->is_number_unsigned()) s.seed = v->get<uint64_t>();
    else if (v->is_number_float() && v->get<double>() >= 0 && v->get<double>() <= 9007199254740992.0 &&
             v->get<double>() == std::floor(v->get<double>()))
      s.seed = uint64_t(v->get<double>());  // 5.0 (exact up to 2^53)
    else if (v->is_number_integer() && v->get<int64_t>() == -1) s.seed = Sampler::kRandomSeed;
    else throw ApiError(400, "'seed' must be an integer from 0 to 2^64 - 1, or -1 (random), got " + v->dump(), "seed");
  }

  // max_tokens (max_completion_tokens in newer clients): 1 … the context; unset runs until the
  // end of generation or the context is full.
  const char* max_name = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.generate.n_predict = int32_t(integer(body, max_name, 1, ctx.context, ctx.default_max_tokens));
  // llama-server's n_predict where no OpenAI count is given: −1 (or unset) runs on as without one.
  if (!field(body, "max_completion_tokens") && !field(body, "max_tokens") && field(body, "n_predict")) {
    const int64_t n = integer(body, "n_predict", -1, ctx.context, -1);
    if (n == 0) throw ApiError(400, "'n_predict' must be -1 (no limit) or from 1 to the context, got 0", "n_predict");
    if (n > 0) r.generate.n_predict = int32_t(n);
  }
  r.generate.ignore_eos = boolean(body, "ignore_eos", false);
  r.generate.stop = stop_strings(body);
  r.generate.grammar = response_grammar(body, body_text);
  r.generate.logit_bias = logit_biases(body, ctx.tok->n_vocab());
  log_probabilities(body, e, r.generate);
  speculation(body, ctx, r.generate);
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    r.include_usage = boolean(*so, "include_usage", false);
  }

  r.prompt = e == Endpoint::Chat ? chat_tokens(body, ctx) : completion_tokens(body, ctx);
  if (r.prompt.empty()) throw ApiError(400, "the prompt is empty", e == Endpoint::Chat ? "messages" : "prompt");
  if (r.prompt.size() >= ctx.context)
    throw ApiError(400, "the prompt is " + std::to_string(r.prompt.size()) + " tokens; a sequence holds " + std::to_string(ctx.context) +
                            " (--ctx), which leaves no room for a reply", e == Endpoint::Chat ? "messages" : "prompt",
                   "invalid_request_error", "context_length_exceeded");
  return r;
}

std::string finish_reason(const std::string& stop_reason) {
  return stop_reason == "eos" || stop_reason == "stop string" ? "stop" : "length";
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json completion_body(Endpoint e, const std::string& id, int64_t created, const std::string& model, const std::string& text,
                     const std::string& finish, const Usage& u, const json& logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", logprobs}};
  if (e == Endpoint::Chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  return {{"id", id},
          {"object", e == Endpoint::Chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage_json(u)}};
}

json chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model, const std::string& text, bool first,
                const std::optional<std::string>& finish, const json& logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(*finish) : json(nullptr)}, {"logprobs", logprobs}};
  if (e == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", e == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

json usage_chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model, const Usage& u) {
  return {{"id", id},
          {"object", e == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_json(u)}};
}

}  // namespace vkllm::serve
