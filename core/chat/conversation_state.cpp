// The chat in a session file: Conversation's messages and its account of the cache as the CONV
// section, written and read back, checked against the tokens the file caches before anything
// changes. Format in docs/session-format.md.
#include <algorithm>
#include <optional>

#include "chat/conversation.h"
#include "base/error.h"
#include "base/utf8.h"
#include "chat/prompt.h"

namespace vkllm {
namespace {

constexpr int64_t kChatStateVersion = 1;

// Turn marks in JSON: −1 for unknown.
int64_t mark_out(size_t v) { return v == SIZE_MAX ? -1 : static_cast<int64_t>(v); }

// Strings that are not valid UTF-8 (a reply cut inside a character, a byte token) go into JSON
// with U+FFFD, and exactly as hex in the "raw" object beside them.
std::string to_hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : s) out += {digits[c >> 4], digits[c & 15]};
  return out;
}
// The bytes of `hex`, or nullopt when it is not an even run of hex digits.
std::optional<std::string> from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (const char c : {hex[i], hex[i + 1]}) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return std::nullopt;
      v = v * 16 + d;
    }
    out += char(v);
  }
  return out;
}

[[noreturn]] void conv_error(const std::string& path, const std::string& msg) {
  throw Error(path + ": section 'CONV': " + msg);
}

// Reads the keys of the "chat" object; every error names the key.
class ChatReader {
 public:
  ChatReader(const std::string& path, const nlohmann::json& chat) : path_(path), chat_(chat) {}

  [[noreturn]] void fail(const std::string& msg) const { conv_error(path_, msg); }

  const nlohmann::json& at(const char* key) const {
    const auto it = chat_.find(key);
    if (it == chat_.end()) fail(std::string("'chat' has no '") + key + "'");
    return *it;
  }
  static bool is_count(const nlohmann::json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0); }
  size_t count(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!is_count(v)) fail(std::string("'chat.") + key + "' is not a count: " + v.dump());
    return v.get<size_t>();
  }
  std::string text(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_string()) fail(std::string("'chat.") + key + "' is not a string");
    return v.get<std::string>();
  }

 private:
  const std::string& path_;
  const nlohmann::json& chat_;
};

}  // namespace

std::string Conversation::state_json() const {
  nlohmann::json turns = nlohmann::json::array();
  for (const Turn& t : turns_) turns.push_back({mark_out(t.tokens_at_user), t.text_at_user, mark_out(t.tokens_at_reply), t.text_at_reply});
  const nlohmann::json all = messages();
  nlohmann::json raw = nlohmann::json::object(), raw_messages = nlohmann::json::object();
  for (size_t i = 0; i < all.size(); ++i)
    if (const std::string& c = all[i]["content"].get_ref<const std::string&>(); !utf8::valid(c)) raw_messages[std::to_string(i)] = to_hex(c);
  if (!raw_messages.empty()) raw["messages"] = raw_messages;
  if (!utf8::valid(text_)) raw["text"] = to_hex(text_);
  if (!utf8::valid(pinned_text_)) raw["pinned_text"] = to_hex(pinned_text_);
  nlohmann::json chat = {{"version", kChatStateVersion}, {"tokens", cached_},  {"n_tokens", n_tokens_},        {"pinned", pinned_},
                         {"text", text_},                {"reply_at", reply_at_}, {"pinned_text", pinned_text_}, {"turns", turns}};
  if (!raw.empty()) chat["raw"] = raw;
  return nlohmann::json{{"messages", all}, {"chat", chat}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

uint64_t Conversation::save(const std::string& path, const ModelFingerprint& model) const {
  return save_session(path, engine_, model, &sampler_, state_json(), -1, &journal_);
}

Conversation::Saved Conversation::parse_state(const std::string& path, const SessionInfo& info) const {
  const std::string raw = path + ": holds a raw-text session (vkllm run without --chat), not a chat";
  if (info.conversation.empty()) throw Error(raw);
  const nlohmann::json conv = nlohmann::json::parse(info.conversation, nullptr, false);
  if (conv.is_discarded() || !conv.is_object()) conv_error(path, "not a JSON object");
  const auto msgs = conv.find("messages");
  if (msgs == conv.end()) throw Error(raw);
  if (!msgs->is_array()) conv_error(path, "'messages' is not an array");

  // The messages: an optional system prompt, then user and assistant in turn.
  Saved s;
  size_t n_user = 0;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const nlohmann::json& m = (*msgs)[i];
    const std::string at = "message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string())
      conv_error(path, at + " is not an object with a string 'role' and 'content'");
    const std::string role = m["role"];
    if (role == "system" && i == 0) {
      s.system = m["content"];
      continue;
    }
    const std::string want = s.messages.size() % 2 == 0 ? "user" : "assistant";
    if (role != want) conv_error(path, at + " has role '" + role + "', expected '" + want + "' (user and assistant take turns)");
    s.messages.push_back(m);
    n_user += role == "user";
  }

  const auto chat = conv.find("chat");
  if (chat == conv.end() || !chat->is_object() || !chat->contains("version") || (*chat)["version"] != kChatStateVersion) {
    // No account of the cache (vkllm run --chat), or a newer vkllm's: the messages are the contract.
    rebuild_state(s, info);
    return s;
  }
  const ChatReader r(path, *chat);
  s.chat_state = true;
  // Strings stored with U+FFFD: their bytes.
  const auto raw_of = [&](const nlohmann::json& v, const std::string& key) {
    const std::optional<std::string> bytes = v.is_string() ? from_hex(v.get<std::string>()) : std::nullopt;
    if (!bytes) r.fail("'chat.raw." + key + "' is not a string of hex digits");
    return *bytes;
  };
  const auto exact = chat->find("raw");
  if (exact != chat->end() && exact->is_object()) {
    if (const auto rm = exact->find("messages"); rm != exact->end() && rm->is_object())
      for (const auto& [key, v] : rm->items()) {
        const bool sys = !s.system.empty() || (msgs->size() > 0 && (*msgs)[0]["role"] == "system");
        size_t i = 0;
        if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos || (i = std::stoul(key)) >= msgs->size())
          r.fail("'chat.raw.messages' names no message: '" + key + "'");
        const std::string bytes = raw_of(v, "messages." + key);
        if (sys && i == 0) s.system = bytes;
        else s.messages[i - (sys ? 1 : 0)]["content"] = bytes;
      }
  }
  const auto raw_text = [&](const char* key) {
    if (exact == chat->end() || !exact->is_object() || !exact->contains(key)) return r.text(key);
    return raw_of((*exact)[key], key);
  };
  const uint32_t n_vocab = engine_.config().n_vocab;
  const nlohmann::json& toks = r.at("tokens");
  if (!toks.is_array()) r.fail("'chat.tokens' is not an array");
  s.cached.reserve(toks.size());
  for (size_t i = 0; i < toks.size(); ++i) {
    if (!ChatReader::is_count(toks[i]) || toks[i].get<uint64_t>() >= n_vocab)
      r.fail("'chat.tokens' [" + std::to_string(i) + "] = " + toks[i].dump() + " is not a token of this vocabulary of " +
             std::to_string(n_vocab));
    s.cached.push_back(toks[i].get<int32_t>());
  }
  s.n_tokens = r.count("n_tokens");
  if (s.n_tokens > s.cached.size())
    r.fail("'chat.n_tokens' " + std::to_string(s.n_tokens) + " exceeds the " + std::to_string(s.cached.size()) + " of 'chat.tokens'");
  const size_t pinned = r.count("pinned");
  const uint32_t capacity = engine_.cache().capacity();
  if (pinned >= capacity)
    r.fail("the chat pins " + std::to_string(pinned) + " tokens; --ctx " + std::to_string(capacity) + " leaves no room after them");
  // (With sliding-window rings fewer may be pinned: checked here, before the load commits.)
  if (pinned > engine_.cache().max_keep())
    r.fail("the chat pins " + std::to_string(pinned) + " tokens; with this model's sliding-window rings --ctx " + std::to_string(capacity) +
           " pins at most " + std::to_string(engine_.cache().max_keep()) + "; use a larger --ctx");
  s.pinned = static_cast<uint32_t>(pinned);
  s.text = raw_text("text");
  s.pinned_text = raw_text("pinned_text");
  s.reply_at = r.count("reply_at");
  if (s.reply_at > s.text.size()) r.fail("'chat.reply_at' " + std::to_string(s.reply_at) + " is beyond the text");

  // The cache holds the first pinned tokens of the sequence and its newest used − pinned.
  const std::vector<int32_t>& held = info.tokens;
  const size_t used = held.size(), keep = std::min<size_t>(s.pinned, used);
  // HEAD pins the chat's whole pin (files before 2026-12-05: only as much of it as is cached).
  if (info.n_keep != s.pinned && info.n_keep != keep)
    r.fail("the chat pins " + std::to_string(s.pinned) + " tokens, section 'HEAD' pins " + std::to_string(info.n_keep));
  if (s.cached.size() < used)
    r.fail("'chat.tokens' holds " + std::to_string(s.cached.size()) + " tokens, fewer than the " + std::to_string(used) + " cached");
  const size_t gap = s.cached.size() - used;
  for (size_t i = 0; i < used; ++i)
    if (held[i] != s.cached[i < keep ? i : i + gap])
      r.fail("'chat.tokens' does not match the cached tokens (section 'TOKS') at cached token " + std::to_string(i));

  // Turn marks: one per user message. A mark beyond the tokens or the text reads as unknown.
  const nlohmann::json& turns = r.at("turns");
  if (!turns.is_array() || turns.size() != n_user)
    r.fail("'chat.turns' is not an array of " + std::to_string(n_user) + " turns (one per user message)");
  for (const nlohmann::json& t : turns) {
    const auto ok = [](const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() >= -1; };
    if (!t.is_array() || t.size() != 4 || !std::all_of(t.begin(), t.end(), ok))
      r.fail("a turn in 'chat.turns' is not 4 marks (tokens and text at the user message and at the reply)");
    const auto tokens_mark = [&](const nlohmann::json& v) {
      const int64_t m = v.get<int64_t>();
      return m < 0 || static_cast<size_t>(m) > s.n_tokens ? kUnknown : static_cast<size_t>(m);
    };
    const auto text_mark = [&](const nlohmann::json& v) {
      const int64_t m = v.get<int64_t>();
      return m < 0 || static_cast<size_t>(m) > s.text.size() ? 0 : static_cast<size_t>(m);
    };
    s.turns.push_back({tokens_mark(t[0]), text_mark(t[1]), tokens_mark(t[2]), text_mark(t[3])});
  }
  return s;
}

void Conversation::rebuild_state(Saved& s, const SessionInfo& info) const {
  const auto n_user = static_cast<size_t>(
      std::count_if(s.messages.begin(), s.messages.end(), [](const nlohmann::json& m) { return m["role"] == "user"; }));
  s.turns.assign(n_user, Turn{});
  // After the ring evicted, the cached tokens are not the conversation's prefix: the next turn
  // runs the conversation again (load() empties the cache).
  if (info.n_evicted > 0 || info.tokens.empty()) return;
  s.cached = info.tokens;
  s.n_tokens = s.cached.size();
  s.pinned = std::min<uint32_t>(info.n_keep, engine_.cache().max_keep());
  if (n_user > 0) s.turns.front().tokens_at_user = std::min<size_t>(s.pinned, s.n_tokens);
  // vkllm run --chat caches the rendering up to its last reply's generation prompt, then the
  // reply as sampled. Where that holds, the rendered text is known again and the next turn
  // tokenizes only its own text, as in a chat that never stopped.
  if (s.messages.empty() || s.messages.back()["role"] != "assistant") return;
  nlohmann::json before = nlohmann::json::array();
  if (!s.system.empty()) before.push_back({{"role", "system"}, {"content", s.system}});
  for (size_t i = 0; i + 1 < s.messages.size(); ++i) before.push_back(s.messages[i]);
  std::string rendered;
  try {
    rendered = tmpl_.render(before, render_options(tok_, true));
  } catch (const Error&) {
    return;  // the next turn tokenizes the whole rendering and reuses the common prefix
  }
  const std::vector<int32_t> prompt = tokenize_rendered(tok_, rendered, before);
  if (prompt.size() > s.cached.size() || !std::equal(prompt.begin(), prompt.end(), s.cached.begin())) return;
  // A reply cut at a stop string: the conversation keeps its tokens up to the cut (as a chat does).
  const std::string reply = s.messages.back()["content"].get<std::string>();
  const ReplyCut cut = cut_reply(std::span(s.cached).subspan(prompt.size()), reply);
  s.n_tokens = prompt.size() + cut.tokens;
  s.text = rendered + reply.substr(0, cut.bytes);
  s.reply_at = rendered.size();
  s.turns.back().tokens_at_reply = prompt.size();
  s.turns.back().text_at_reply = rendered.size();
}

Conversation::Restored Conversation::load(const std::string& path, const ModelFingerprint& model) {
  Saved s;
  Restored r;
  r.info = load_session(path, engine_, model, &sampler_, -1, [&](const SessionInfo& info) { s = parse_state(path, info); }, &journal_);
  // The cache and the sampler are the file's now; nothing below throws.
  messages_ = std::move(s.messages);
  system_ = std::move(s.system);
  turns_ = std::move(s.turns);
  cached_ = std::move(s.cached);
  n_tokens_ = s.n_tokens;
  text_ = std::move(s.text);
  reply_at_ = s.reply_at;
  pinned_ = pin_wanted_ = s.pinned;
  pinned_text_ = std::move(s.pinned_text);
  KvCache& cache = engine_.cache();
  if (cached_.empty()) cache.truncate(0);
  // restore() pinned what the file holds of the pinned prefix; a --keep longer than the
  // conversation pins more (the ring head is at slot 0 after a restore).
  else if (cache.keep() != pinned_) cache.set_keep(pinned_);
  gen_.stats() = {};
  r.chat_state = s.chat_state;
  return r;
}

}  // namespace vkllm
