// The chat's turns: incremental rendering, the account of what the cache holds, and the ring.
#include "chat/conversation.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "chat/prompt.h"

namespace vkllm {
namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace

Conversation::Conversation(Engine& engine, const Tokenizer& tok, Sampler& sampler, ChatTemplate tmpl, std::string system,
                           int32_t keep)
    : engine_(engine),
      tok_(tok),
      sampler_(sampler),
      gen_(engine, tok, sampler),
      tmpl_(std::move(tmpl)),
      system_(std::move(system)),
      keep_(keep) {}

nlohmann::json Conversation::messages() const {
  nlohmann::json all = nlohmann::json::array();
  if (!system_.empty()) all.push_back({{"role", "system"}, {"content", system_}});
  for (const auto& m : messages_) all.push_back(m);
  return all;
}

std::string Conversation::render(bool add_generation_prompt) const {
  return tmpl_.render(messages(), render_options(tok_, add_generation_prompt));
}

uint64_t Conversation::evicted() const {
  // The cache holds cached_[0, pinned) and cached_[pinned + gap, end); the conversation is the
  // first n_tokens_ of cached_ (shorter after an /undo that could not truncate the cache yet).
  const size_t gap = cached_.size() - engine_.cache().used();
  if (n_tokens_ <= pinned_) return 0;
  return std::min(n_tokens_, size_t{pinned_} + gap) - pinned_;
}

uint64_t Conversation::stale() const {
  const size_t gap = cached_.size() - engine_.cache().used();
  const size_t first_held = std::max(n_tokens_, size_t{pinned_} + gap);  // of cached_ past the conversation
  return cached_.size() > first_held ? cached_.size() - first_held : 0;
}

size_t Conversation::delta_start(const std::string& rendered) const {
  if (text_.empty()) return kUnknown;
  if (rendered.starts_with(text_)) return text_.size();
  // Templates that trim message content (Llama 3, Gemma, Llama 2) render the last reply without
  // the whitespace the model generated around it. The cache keeps the reply as generated; what
  // follows it in the rendering is the new part.
  if (reply_at_ == 0 || rendered.compare(0, reply_at_, text_, 0, reply_at_) != 0) return kUnknown;
  const std::string_view held = std::string_view(text_).substr(reply_at_);
  size_t lead = 0;
  while (lead < held.size() && is_space(held[lead])) ++lead;
  size_t at = reply_at_;
  while (at < rendered.size() && is_space(rendered[at])) ++at;
  // The rendering goes on with what the cache holds, trailing whitespace included: a reply the
  // cache holds only part of (cut at a stop string) continues there.
  if (rendered.compare(at, held.size() - lead, held.substr(lead)) == 0) return at + held.size() - lead;
  const std::string reply = trimmed(std::string(held));
  if (rendered.compare(at, reply.size(), reply) != 0) return kUnknown;
  return at + reply.size();
}

std::vector<int32_t> Conversation::plan_turn(const std::string& rendered, const nlohmann::json& all) {
  const size_t at = delta_start(rendered);
  if (at != kUnknown) {
    // Incremental: the tokens so far stay as they are (including the reply exactly as sampled);
    // only the new text is tokenized, its user content as plain text.
    const std::string delta = rendered.substr(at);
    const nlohmann::json fresh = nlohmann::json::array({all.back()});
    std::vector<TextPiece> pieces;
    size_t pos = 0;
    for (const auto& [b, e] : find_content_spans(delta, fresh)) {
      if (b > pos) pieces.push_back({std::string_view(delta).substr(pos, b - pos), true});
      pieces.push_back({std::string_view(delta).substr(b, e - b), false});
      pos = e;
    }
    if (pos < delta.size()) pieces.push_back({std::string_view(delta).substr(pos), true});
    std::vector<int32_t> target(cached_.begin(), cached_.begin() + static_cast<long>(n_tokens_));
    // A continuation: SPM's space prefix only where the whole rendering would have one.
    const std::vector<int32_t> added = tok_.tokenize(pieces, false, n_tokens_ > 0 ? cached_[n_tokens_ - 1] : -1);
    target.insert(target.end(), added.begin(), added.end());
    return target;
  }
  // The template rewrote earlier text: tokenize all of it; sync() still reuses the longest
  // common token prefix. Turn marks past the point of divergence are no longer known.
  std::vector<int32_t> target = tokenize_rendered(tok_, rendered, all);
  const size_t same = common_prefix(tokens(), target);
  for (Turn& t : turns_) {
    if (t.tokens_at_user != kUnknown && t.tokens_at_user > same) t.tokens_at_user = kUnknown;
    if (t.tokens_at_reply != kUnknown && t.tokens_at_reply > same) t.tokens_at_reply = kUnknown;
    if (rendered.compare(0, t.text_at_user, text_, 0, t.text_at_user) != 0) t.text_at_user = 0;
    if (rendered.compare(0, t.text_at_reply, text_, 0, t.text_at_reply) != 0) t.text_at_reply = 0;
  }
  return target;
}

uint32_t Conversation::pin_count(const std::vector<int32_t>& target) {
  pinned_text_.clear();
  const uint32_t most = engine_.cache().max_keep();
  if (keep_ >= 0) {
    pin_wanted_ = uint32_t(keep_);
    return std::min(pin_wanted_, most);
  }
  uint32_t n = (!target.empty() && target[0] == tok_.bos()) ? 1 : 0;
  if (!system_.empty()) {
    // What the system prompt alone renders to, as far as its tokens begin the conversation's.
    const nlohmann::json sys = nlohmann::json::array({{{"role", "system"}, {"content", system_}}});
    std::string text;
    try {
      text = tmpl_.render(sys, render_options(tok_, false));
    } catch (const Error&) {
      // Some templates refuse a conversation without a user message: pin BOS only.
    }
    const std::vector<int32_t> sys_tokens = tokenize_rendered(tok_, text, sys);
    n = std::max<uint32_t>(n, uint32_t(common_prefix(sys_tokens, target)));
    if (n == sys_tokens.size() && !text.empty() && text_.starts_with(text) && n <= most) pinned_text_ = text;
  }
  pin_wanted_ = n;
  return std::min(n, most);
}

void Conversation::reset_cache() {
  // The pin goes too: a save before the next turn must not pin what the cache no longer holds
  // (its HEAD would disagree with the conversation's pin of 0, and the file would be refused).
  engine_.cache().truncate(0);
  engine_.cache().set_keep(0);
  cached_.clear();
  n_tokens_ = 0;
  pinned_ = pin_wanted_ = 0;
  pinned_text_.clear();
  forget_past(0);
}

void Conversation::forget_past(size_t n) {
  text_.clear();  // the next turn tokenizes the whole rendering and reuses what matches
  reply_at_ = 0;
  n_tokens_ = std::min(n_tokens_, n);
  for (Turn& t : turns_) {
    if (t.tokens_at_user != kUnknown && t.tokens_at_user > n) t.tokens_at_user = kUnknown, t.text_at_user = 0;
    if (t.tokens_at_reply != kUnknown && t.tokens_at_reply > n) t.tokens_at_reply = kUnknown, t.text_at_reply = 0;
  }
}

void Conversation::sync(const std::vector<int32_t>& target, const ProgressFn& progress) {
  KvCache& cache = engine_.cache();
  VKLLM_CHECK(!target.empty(), "a chat turn renders to no tokens");
  const size_t gap = cached_.size() - cache.used();  // tokens of cached_ the ring dropped
  // Keep at least one token to run, so its logits are fresh.
  const size_t same = std::min(common_prefix(cached_, target), target.size() - 1);
  size_t from = 0;  // first token of target to run
  uint32_t kept = 0;
  // A pin longer than what the cache holds yet (a large --keep) has not wrapped the ring: every
  // token is in its own slot, so any prefix of it can stay.
  const bool pin_pending = pinned_ > cache.used() && gap == 0;
  bool fresh = cached_.empty() || (!pin_pending && same < pinned_);
  if (!fresh && (gap == 0 || same >= pinned_ + gap)) {
    // The usual case: drop what differs from the newest cached tokens, run the rest.
    kept = uint32_t(same - gap);
    from = same;
  } else if (!fresh) {
    // The conversation changed inside what the ring already dropped (/undo or /regen past the
    // window, or a template that rewrites old text): keep the pinned tokens and refill the window.
    kept = pinned_;
    from = pinned_;
  }
  // A sliding-window model's rings may no longer hold what the kept tokens' window reads.
  fresh = fresh || cache.reusable(kept) != kept;
  // Whether this turn runs earlier turns again (a refill, or a fresh start of a conversation).
  reran_ = fresh ? turns_.size() > 1 : from < same;
  const uint32_t reused = fresh ? 0 : kept;
  if (fresh) {
    // A fresh start, or the pinned prefix itself changed: pin again while the ring is empty.
    cache.truncate(0);
    cached_.clear();
    pinned_ = pin_count(target);
    cache.set_keep(pinned_);
    from = 0;
  } else {
    cache.truncate(kept);
    if (cache.keep() != pinned_) cache.set_keep(pinned_);  // a cut into the pending pin shrank it
  }
  // Tokens the ring would drop again at once are not run: past the pinned ones, only the newest
  // window's worth. (Nothing drops while the conversation fits the cache, however long the pin.)
  const size_t window = cache.capacity() - pinned_;
  const size_t dropped_end = target.size() > cache.capacity() ? target.size() - window : 0;
  size_t tail = from;
  uint32_t pin_ran = 0;
  double pin_ms = 0;
  if (dropped_end > std::max<size_t>(from, pinned_)) {
    if (from < pinned_) {
      const auto t0 = std::chrono::steady_clock::now();
      engine_.decode(std::span(target).subspan(from, pinned_ - from), LogitsMode::Last);
      pin_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      pin_ran = uint32_t(pinned_ - from);
    }
    tail = dropped_end;
  }
  cached_ = target;
  try {
    gen_.extend(std::span(target).subspan(tail), progress);
  } catch (const PrefillInterrupted&) {
    // Stopped between chunks: where the cache held a plain prefix of the target before this turn,
    // that prefix stays (the next turn reuses it), else the cache starts afresh.
    if (gap == 0 && tail == from && kept == from && cache.reusable(kept) == kept) {
      cache.truncate(kept);
      cached_.resize(from);
      forget_past(from);
    } else {
      reset_cache();
    }
    throw;
  } catch (...) {
    reset_cache();
    throw;
  }
  // What the skipped tokens would have left: the ring holds pinned + the newest window.
  n_tokens_ = target.size();
  // The turn's prompt is the whole conversation, as a run's is its whole prompt.
  gen_.account_turn(uint32_t(target.size()), reused, pin_ran, pin_ms);
  VKLLM_CHECK(cached_.size() >= cache.used(), "the cache holds more tokens than the conversation");
}

void Conversation::trim_cache(size_t n) {
  KvCache& cache = engine_.cache();
  if (n >= cached_.size()) return;
  const size_t gap = cached_.size() - cache.used();
  if (n >= pinned_ + gap || (n == pinned_ && cache.used() >= pinned_)) {
    const uint32_t kept = uint32_t(n >= pinned_ + gap ? n - gap : n);
    if (cache.reusable(kept) == kept) {
      cache.truncate(kept);
      cached_.resize(n);
    }
  }
  // Otherwise n lies inside what the ring dropped, or a window ring no longer holds what its
  // window reads there: the next turn's sync() rebuilds the cache.
}

const GenerationStats& Conversation::reply(const std::vector<int32_t>& target, const GenerateOptions& o,
                                           const TextFn& on_text, const ProgressFn& progress, const ReplyHooks& hooks,
                                           const std::vector<int32_t>* history) {
  sync(target, progress);
  Turn& t = turns_.back();
  if (history) sampler_.set_history(*history);
  t.history_at_reply = sampler_.history();
  t.tokens_at_reply = n_tokens_;
  t.text_at_reply = text_.size();
  std::string reply;
  // A refilled ring ran earlier turns again: the reply's room counts this turn's tokens only.
  GenerateOptions go = o;
  if (go.n_predict == GenerateOptions::kUntilFull && reran_) go.turn_tokens = own_tokens(target);
  try {
    if (hooks.on_reply) hooks.on_reply();
    gen_.generate(
        go,
        [&](const std::string& piece) {
          reply += piece;
          return on_text(piece);
        },
        hooks.stop);
  } catch (...) {
    reset_cache();
    throw;
  }
  // Every sampled token except an end-of-generation one was run, so it is in the cache. The
  // conversation is the reply as released: a stop string's tokens (and what an interrupt held
  // back) are rows past it, cut now where the ring allows, else replaced by the next turn.
  const std::vector<int32_t>& sampled = gen_.stats().tokens;
  const ReplyCut cut = cut_reply(sampled, reply);
  cached_.insert(cached_.end(), sampled.begin(), sampled.end());
  n_tokens_ += cut.tokens;
  reply_at_ = text_.empty() ? 0 : text_.size();
  if (!text_.empty()) text_.append(reply, 0, cut.bytes);
  messages_.push_back({{"role", "assistant"}, {"content", reply}});
  trim_cache(n_tokens_);
  return gen_.stats();
}

Conversation::ReplyCut Conversation::cut_reply(std::span<const int32_t> sampled, const std::string& text) const {
  StreamDecoder decoder(tok_);
  size_t done = 0;  // bytes of `text` the tokens so far decoded to, checked as they came
  ReplyCut cut;
  for (size_t i = 0; i < sampled.size(); ++i) {
    const std::string piece = decoder.push(sampled[i]);
    if (text.compare(done, piece.size(), piece) != 0) break;
    done += piece.size();
    StreamDecoder rest = decoder;  // the bytes of an unfinished character count as the token's
    const std::string held = rest.flush();
    if (text.compare(done, held.size(), held) != 0) break;
    cut = {i + 1, done + held.size()};
  }
  return cut;
}

uint32_t Conversation::own_tokens(const std::vector<int32_t>& target) const {
  nlohmann::json before = messages();
  if (before.empty() || before.back()["role"] != "user") return uint32_t(target.size());
  before.erase(before.size() - 1);
  if (before.empty()) return uint32_t(target.size());
  std::string text;
  try {
    text = tmpl_.render(before, render_options(tok_, false));
  } catch (const Error&) {
    return uint32_t(target.size());  // a template that refuses a conversation ending in a reply
  }
  return uint32_t(target.size() - common_prefix(tokenize_rendered(tok_, text, before), target));
}

const GenerationStats& Conversation::say(const std::string& user, const GenerateOptions& o, const TextFn& on_text,
                                         const ProgressFn& progress, const ReplyHooks& hooks) {
  nlohmann::json all = messages();
  all.push_back({{"role", "user"}, {"content", user}});
  const std::string rendered = tmpl_.render(all, render_options(tok_, true));
  Turn t;
  t.history_at_user = sampler_.history();
  const bool first = turns_.empty();
  if (!first) {
    t.tokens_at_user = n_tokens_;
    t.text_at_user = text_.size();
  }
  const std::vector<int32_t> target = plan_turn(rendered, all);
  text_ = rendered;
  reply_at_ = 0;
  messages_.push_back(all.back());
  turns_.push_back(t);
  try {
    const GenerationStats& st = reply(target, o, on_text, progress, hooks);
    if (first) {
      // The first exchange starts right after the pinned tokens, so undoing it equals /clear.
      turns_.front().tokens_at_user = pinned_;
      turns_.front().text_at_user = pinned_text_.size();
    }
    return st;
  } catch (...) {
    // The message is dropped, and the penalty history goes back to before it (the cache holds
    // none of its tokens: a stopped prefill keeps only what the conversation held).
    messages_.erase(messages_.size() - 1);
    turns_.pop_back();
    sampler_.set_history(*t.history_at_user);
    throw;
  }
}

const GenerationStats& Conversation::regen(const GenerateOptions& o, const TextFn& on_text, const ProgressFn& progress,
                                           const ReplyHooks& hooks) {
  if (turns_.empty() || messages_.back()["role"] != "assistant") throw Error("/regen: there is no reply to generate again");
  const nlohmann::json old_reply = messages_.back();
  messages_.erase(messages_.size() - 1);
  const Turn t = turns_.back();
  std::vector<int32_t> target;
  if (t.tokens_at_reply != kUnknown) {
    target.assign(cached_.begin(), cached_.begin() + static_cast<long>(t.tokens_at_reply));
    text_ = t.text_at_reply ? text_.substr(0, t.text_at_reply) : "";
  } else {
    text_ = render(true);
    target = tokenize_rendered(tok_, text_, messages());
  }
  reply_at_ = 0;
  try {
    return reply(target, o, on_text, progress, hooks, t.history_at_reply ? &*t.history_at_reply : nullptr);
  } catch (...) {
    messages_.push_back(old_reply);  // not regenerated: the reply stays (the cache was cut before it)
    forget_past(cached_.size());
    // The next turn runs the reply's tokens again, after the history they first came after.
    if (t.history_at_reply) sampler_.set_history(*t.history_at_reply);
    throw;
  }
}

void Conversation::undo() {
  if (turns_.empty()) throw Error("/undo: there is no exchange to undo");
  if (messages_.back()["role"] == "assistant") messages_.erase(messages_.size() - 1);
  messages_.erase(messages_.size() - 1);
  const Turn t = turns_.back();
  turns_.pop_back();
  reply_at_ = 0;
  if (t.history_at_user) rewind_history(*t.history_at_user, turns_.empty());
  if (t.tokens_at_user == kUnknown) {
    text_.clear();  // the next turn tokenizes the whole rendering and reuses what matches
    return;
  }
  n_tokens_ = std::min(t.tokens_at_user, n_tokens_);
  text_ = t.text_at_user ? text_.substr(0, t.text_at_user) : "";
  trim_cache(n_tokens_);
}

void Conversation::rewind_history(const std::vector<int32_t>& h, bool from_start) {
  sampler_.set_history(h);
  if (from_start)
    for (size_t i = 0; i < std::min<size_t>(pinned_, cached_.size()); ++i) sampler_.accept(cached_[i]);
}

void Conversation::clear() {
  if (!turns_.empty() && turns_.front().history_at_user) rewind_history(*turns_.front().history_at_user, true);
  messages_ = nlohmann::json::array();
  turns_.clear();
  reply_at_ = 0;
  n_tokens_ = std::min<size_t>(pinned_, cached_.size());
  text_ = n_tokens_ == pinned_ ? pinned_text_ : "";
  trim_cache(n_tokens_);
}

void Conversation::set_system(std::string system) {
  system_ = std::move(system);
  reset_cache();
  for (Turn& t : turns_) t = Turn{};
}

}  // namespace vkllm
