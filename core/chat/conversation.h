// Conversation: the state of an interactive chat (messages, system prompt, template) and its
// account of what the KV cache holds, so each turn prefills only its new tokens, also after the
// ring has evicted. Nothing is printed here; replies leave through a callback. Design in
// docs/chat.md.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chat/template.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "store/session_file.h"
#include "text/tokenizer.h"

namespace vkllm {

class Conversation {
 public:
  // Receives reply text as it becomes final; returns false to stop the reply there.
  using TextFn = std::function<bool(const std::string&)>;

  // `keep` pins that many leading tokens in the cache; -1 pins BOS plus the system prompt.
  // The engine's cache is taken over: whatever it holds is dropped on the first turn.
  Conversation(Engine& engine, const Tokenizer& tok, Sampler& sampler, ChatTemplate tmpl, std::string system = "",
               int32_t keep = -1);

  // What a caller runs around a reply: `on_reply` once the turn's prompt is in the cache, before
  // the first token is sampled (vkllm run installs its signal handlers there); `stop`, read before
  // every token, ends the reply as an interrupt when it returns true (tokens of no text included).
  struct ReplyHooks {
    std::function<void()> on_reply;
    std::function<bool()> stop;
  };
  // Adds a user message and generates the reply. An interrupted reply (on_text returned false,
  // or hooks.stop true) stays in the conversation and the cache as far as it got.
  const GenerationStats& say(const std::string& user, const GenerateOptions& o, const TextFn& on_text,
                             const ProgressFn& progress = {}, const ReplyHooks& hooks = {});
  // Drops the last reply (from the messages and the cache) and generates it again.
  // Error when there is no reply.
  const GenerationStats& regen(const GenerateOptions& o, const TextFn& on_text, const ProgressFn& progress = {},
                               const ReplyHooks& hooks = {});
  // Drops the last exchange (user message and reply). Error when there is none.
  void undo();
  // A new conversation; the pinned tokens (BOS + system prompt) stay cached.
  void clear();
  // A new system prompt. The messages are kept; the next turn prefills them again after it.
  void set_system(std::string system);

  // The messages as the template sees them: the system prompt (if any), then the exchanges.
  nlohmann::json messages() const;
  const std::string& system() const { return system_; }
  std::string render(bool add_generation_prompt) const;
  size_t n_exchanges() const { return turns_.size(); }

  // The conversation's tokens so far (also those the ring has evicted).
  std::span<const int32_t> tokens() const { return std::span(cached_).first(n_tokens_); }
  // The token sequence the cache stands for: its first pinned() tokens and its last
  // cache.used() − pinned() are what the cache holds.
  const std::vector<int32_t>& cached_sequence() const { return cached_; }
  uint32_t pinned() const { return pinned_; }
  // The pin asked for (BOS plus the system prompt, or --keep): more than pinned() when it did not
  // fit (at most --ctx − 1, or what a window model's rings leave), and then the rest of the system
  // prompt is evicted like any token once the ring wraps.
  uint32_t pin_wanted() const { return pin_wanted_; }
  // Rows the cache holds past the conversation: an /undo's exchange that could not be cut from the
  // cache yet (the next turn replaces them).
  uint64_t stale() const;
  // Tokens of the conversation (after the pinned ones) that are no longer in the cache.
  uint64_t evicted() const;
  const GenerationStats& last_stats() const { return gen_.stats(); }

  // Sessions (docs/chat.md): the cache, its tokens, the sampler and this conversation in one
  // session file (core/store/session_file.h), written atomically. Returns the file's size.
  uint64_t save(const std::string& path, const ModelFingerprint& model) const;
  struct Restored {
    SessionInfo info;         // what the file held: tokens, evicted, size
    bool chat_state = false;  // false: messages only (vkllm run --chat), the turn marks rebuilt
  };
  // Replaces the conversation, the cache and the sampler with the session in `path`, after
  // checking all of it: the file (load_session), then its conversation against the tokens it
  // caches. Throws Error naming the file and changes nothing when anything is wrong.
  Restored load(const std::string& path, const ModelFingerprint& model);
  // The CONV section: {"messages": [...]} as `vkllm run --chat` reads and writes it, and "chat",
  // this account of the cache, so that a restored chat prefills only new tokens
  // (docs/session-format.md lists the keys).
  std::string state_json() const;
  // What the session file last saved or loaded holds (save() appends to it where it can).
  const SessionJournal& journal() const { return journal_; }
  SessionJournal& journal() { return journal_; }

 private:
  static constexpr size_t kUnknown = SIZE_MAX;
  // Where a turn starts in the token sequence and in the rendered text (text 0: unknown).
  struct Turn {
    size_t tokens_at_user = kUnknown, text_at_user = 0;    // before the user message
    size_t tokens_at_reply = kUnknown, text_at_reply = 0;  // after the generation prompt
    // The sampler's penalty history before the user message and when the reply began, which /undo
    // and /regen rewind to (this process's turns only: a loaded session's have none, and then
    // the history goes on as it is).
    std::optional<std::vector<int32_t>> history_at_user, history_at_reply;
  };

  // Tokens of the conversation plus `user` and the generation prompt, rendered as `rendered`.
  std::vector<int32_t> plan_turn(const std::string& rendered, const nlohmann::json& all);
  // Byte offset in `rendered` where what text_ stands for ends, or kUnknown.
  size_t delta_start(const std::string& rendered) const;
  // Makes the cache hold `target` (as far as the ring allows) with its last token's logits ready.
  void sync(const std::vector<int32_t>& target, const ProgressFn& progress);
  // Leading tokens of `target` to pin; sets pinned_text_.
  uint32_t pin_count(const std::vector<int32_t>& target);
  // Tokens of `target` (the conversation up to this turn's user message, the reply's turn opened)
  // past what the conversation before that message renders to: the turn's own.
  uint32_t own_tokens(const std::vector<int32_t>& target) const;
  // Drops cached tokens after the first n when the cache can do so now.
  void trim_cache(size_t n);
  // Forgets the cache entirely (after an error, or a new system prompt).
  void reset_cache();
  // Forgets the turn marks past token n (and the rendering text_ stands for): the cache no longer
  // holds what they point at.
  void forget_past(size_t n);
  // `history`, when given, is the penalty history the reply starts from (a /regen's: the first
  // reply's), set once the prompt is in the cache.
  const GenerationStats& reply(const std::vector<int32_t>& target, const GenerateOptions& o, const TextFn& on_text,
                               const ProgressFn& progress, const ReplyHooks& hooks = {},
                               const std::vector<int32_t>* history = nullptr);
  // The penalty history back to `h`, then the pinned tokens where the conversation starts again
  // after them (its first turn ran them, and the next one will not).
  void rewind_history(const std::vector<int32_t>& h, bool from_start);

  // A session's conversation read back and checked, not yet in use (conversation_state.cpp).
  struct Saved {
    nlohmann::json messages = nlohmann::json::array();
    std::string system;
    std::vector<Turn> turns;
    std::vector<int32_t> cached;
    size_t n_tokens = 0, reply_at = 0;
    std::string text, pinned_text;
    uint32_t pinned = 0;
    bool chat_state = false;
  };
  // Parses `info.conversation` and checks it against the tokens the session caches.
  Saved parse_state(const std::string& path, const SessionInfo& info) const;
  // The account of the cache for a session written without one (vkllm run --chat).
  void rebuild_state(Saved& s, const SessionInfo& info) const;
  // Of a reply's tokens as the cache holds them, the leading ones whose text lies wholly within
  // `text`, the reply as released (cut where a stop string begins, or short of what an interrupt
  // held back), and the bytes of `text` they decode to. The conversation keeps those tokens; the
  // rest of `text` is tokenized with the next turn, so that the cache stands for the messages.
  struct ReplyCut {
    size_t tokens = 0, bytes = 0;
  };
  ReplyCut cut_reply(std::span<const int32_t> sampled, const std::string& text) const;

  Engine& engine_;
  const Tokenizer& tok_;
  Sampler& sampler_;
  Generator gen_;
  ChatTemplate tmpl_;
  std::string system_;
  int32_t keep_;
  nlohmann::json messages_ = nlohmann::json::array();  // user/assistant messages
  std::vector<Turn> turns_;                               // one per user message

  std::vector<int32_t> cached_;  // the token sequence the cache stands for (see cached_sequence)
  size_t n_tokens_ = 0;          // of which the conversation is the first n_tokens_
  std::string text_;             // the rendered text of those tokens; "" when not known
  size_t reply_at_ = 0;          // when text_ ends with a reply: where it starts (0: it does not)
  uint32_t pinned_ = 0, pin_wanted_ = 0;
  bool reran_ = false;  // the last sync ran earlier turns again (the reply's budget counts its own tokens)
  std::string pinned_text_;      // the rendered text of the pinned tokens; "" when not known
  mutable SessionJournal journal_;  // the session file's rows, so that a save appends (save() is const)
};

}  // namespace vkllm
