// The device thread: admission with prefix reuse, round-robin token steps, job hand-back.
#include "serve/scheduler.h"

#include <algorithm>
#include <filesystem>

#include "engine/draft_model.h"

namespace vkllm::serve {
namespace {

// Tokens a free sequence's cache may hold past the prompt's prefix and still count as losing
// nothing when it is taken (the end of a chat's last reply, which the template re-renders).
constexpr uint32_t k_prefix_slack = 32;
// The fewest tokens worth copying from another sequence instead of prefilling.
constexpr uint32_t k_min_prefix_copy = 32;

// Cuts the drafts of a step's passes (each a sampled token and its draft), a token at a time
// from the longest, until the step holds at most `most` tokens (a sequence keeps its token); a
// draft cut below its sequence's `draft_min` is not run (--draft-min: that long, or none).
void fit_drafts(std::vector<std::vector<int32_t>>& passes, size_t most, std::span<const uint32_t> draft_min) {
  size_t total = 0;
  for (const std::vector<int32_t>& p : passes) total += p.size();
  if (total <= most) return;
  while (total > most) {
    auto longest = std::max_element(passes.begin(), passes.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
    if (longest->size() <= 1) return;
    longest->pop_back();
    --total;
  }
  for (size_t i = 0; i < passes.size(); ++i)
    if (passes[i].size() - 1 < draft_min[i]) passes[i].resize(1);
}

}  // namespace

Job::Wait Job::wait_text_for(std::string& out, std::chrono::milliseconds timeout, std::vector<TokenLogprobs>* logprobs) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !text_.empty() || !logprobs_.empty() || done_; })) return Wait::Idle;
  out = std::move(text_);
  text_.clear();
  const bool entries = !logprobs_.empty();
  if (logprobs) logprobs->insert(logprobs->end(), std::make_move_iterator(logprobs_.begin()), std::make_move_iterator(logprobs_.end()));
  logprobs_.clear();
  return !out.empty() || entries ? Wait::Text : Wait::Done;
}

void Job::push_text(const std::string& text, std::vector<TokenLogprobs> logprobs) {
  if (text.empty() && logprobs.empty()) return;
  std::lock_guard lock(mu_);
  text_ += text;
  logprobs_.insert(logprobs_.end(), std::make_move_iterator(logprobs.begin()), std::make_move_iterator(logprobs.end()));
  cv_.notify_all();
}

void Job::finish(const GenerationStats& stats, std::string error, bool request_error) {
  std::lock_guard lock(mu_);
  stats_ = stats;
  error_ = std::move(error);
  request_error_ = request_error;
  done_ = true;
  cv_.notify_all();
}

Scheduler::Scheduler(std::vector<Engine*> engines, const Tokenizer& tok, Metrics& metrics, const SchedulerOptions& o)
    : tok_(tok), metrics_(metrics), opts_(o) {
  VKLLM_CHECK(!engines.empty(), "a scheduler needs at least one engine");
  VKLLM_CHECK(o.drafters.empty() || o.drafters.size() == engines.size(), "a draft model per sequence, or none");
  for (size_t i = 0; i < engines.size(); ++i) {
    seqs_.push_back(Sequence{engines[i], nullptr, nullptr, nullptr, 0, -1, false, 0});
    seqs_.back().draft = o.drafters.empty() ? nullptr : o.drafters[i];
  }
  update_gauges();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    draining_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint32_t Scheduler::context() const { return seqs_[0].engine->cache().capacity(); }

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard lock(mu_);
    drop_cancelled_locked();
    // The queue holds max_queue waiting jobs besides those about to take a free sequence.
    if (draining_ || queue_.size() >= opts_.max_queue + (seqs_.size() - running_)) return false;
    queue_.push_back(job);
  }
  cv_.notify_all();
  return true;
}

void Scheduler::drain() {
  std::unique_lock lock(mu_);
  draining_ = true;
  idle_cv_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::pair<Sequence*, std::shared_ptr<Job>>> admitted;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || running_ > 0 || !queue_.empty() || !actions_.empty(); });
      if (stop_ && running_ == 0 && queue_.empty()) {
        for (auto& [a, done] : actions_) done.set_value({503, "the server is shutting down"});
        return;
      }
      while (!queue_.empty() && running_ < seqs_.size()) {
        std::shared_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        // The free sequence to take: first one that loses (almost) nothing — empty, or whose cache
        // begins the prompt but for at most k_prefix_slack tokens (a chat's last reply re-rendered
        // by the template ends differently) — the longest such match first; then the longest match
        // that reuses at least half of what that cache holds (a shared BOS or system prompt alone
        // does not evict another conversation); then the one idle longest. admit() copies in a
        // longer prefix that another sequence holds, so a sequence holding this prompt's prefix and
        // more (an earlier question about the same manual) keeps its conversation where a free one
        // is empty.
        Sequence* best = nullptr;
        bool best_lossless = false;
        uint32_t best_match = 0;
        for (Sequence& s : seqs_) {
          if (s.job) continue;
          const PrefixMatch m = match_prefix(s.engine->cache(), job->prompt);
          const uint32_t used = s.engine->cache().used();
          const bool lossless = used == 0 || (m.usable && used - m.matched <= k_prefix_slack);
          // Ranked by what a prefill would reuse (a window ring may hold its match's rows in part).
          const uint32_t reuse = reusable_prefix(s.engine->cache(), job->prompt);
          const uint32_t matched = lossless || 2 * uint64_t{reuse} >= used ? reuse : 0;
          if (!best || lossless > best_lossless || (lossless == best_lossless && matched > best_match) ||
              (lossless == best_lossless && matched == best_match && s.last_used < best->last_used)) {
            best = &s;
            best_lossless = lossless;
            best_match = matched;
          }
        }
        best->job = job;
        ++running_;
        admitted.emplace_back(best, std::move(job));
      }
    }
    run_actions();
    update_gauges();
    for (auto& [s, job] : admitted) admit(*s, job);
    prefill_round();
    step_all();
    update_gauges();
  }
}

void Scheduler::admit(Sequence& s, const std::shared_ptr<Job>& job) {
  s.gen.reset();
  s.ttft_s = -1;
  s.released = 0;
  s.reported = 0;
  if (job->cancelled()) {
    complete(s, "");
    return;
  }
  try {
    s.sampler = std::make_unique<Sampler>(job->sampling);
    s.gen = std::make_unique<Generator>(*s.engine, tok_, *s.sampler);
    // DRY's sequence breakers, found in the vocabulary once for the requests that share a list (a
    // pass over every token's text, on the thread every sequence's step waits for).
    if (job->sampling.dry_multiplier != 0.0f) {
      if (!dry_breakers_ || dry_breaker_list_ != job->sampling.dry_sequence_breakers) {
        dry_breakers_ = std::make_shared<const DryBreakers>(dry_breakers(tok_, job->sampling.dry_sequence_breakers));
        dry_breaker_list_ = job->sampling.dry_sequence_breakers;
      }
      s.sampler->share_dry_breakers(dry_breakers_);
    }
    if (job->generate.grammar) {  // the vocabulary as grammars read it: decoded once, for every request
      if (!grammar_vocab_) grammar_vocab_ = std::make_shared<const GrammarVocab>(tok_);
      s.gen->share_grammar_vocab(grammar_vocab_);
    }
    try {
      copy_longer_prefix(s, job->prompt);
    } catch (const std::exception& e) {  // an optimisation: the prompt is prefilled instead
      s.engine->cache().clear();  // a failed restore may have left tokens without their K/V
      if (opts_.log) opts_.log(std::string("prefix copy failed, prefilling instead: ") + e.what());
    }
    if (PromptCache* pc = opts_.prompt_cache) {
      // A longer prefix on disk than in this sequence's cache replaces it.
      pc->restore(job->prompt, *s.engine);
    }
    s.gen->prefill_begin(job->prompt);
    s.prefilling = true;
    s.admitted = ++admissions_;
  } catch (const std::exception& e) {
    s.engine->cache().clear();  // a failed load may have left tokens without their K/V
    complete(s, e.what());
  }
}

void Scheduler::copy_longer_prefix(Sequence& s, std::span<const int32_t> prompt) {
  KvCache& to = s.engine->cache();
  // The longest prefix of the prompt another sequence holds (one token of the prompt always runs),
  // against what this one would reuse (a window ring's match may be reusable only in part).
  const KvCache* from = nullptr;
  const uint32_t mine = reusable_prefix(to, prompt);
  uint32_t n = mine;
  for (const Sequence& o : seqs_) {
    if (&o == &s) continue;
    const KvCache& c = o.engine->cache();
    const uint32_t m = std::min<uint32_t>(match_prefix(c, prompt).matched, uint32_t(prompt.size()) - 1);
    // Only a true prefix whose window rings still hold what a restore needs (as the prompt cache stores).
    if (m > n && c.evicted() == 0 && c.reusable(m) == m && c.reusable(m - 1) == m - 1) {
      from = &c;
      n = m;
    }
  }
  // A few tokens are prefilled sooner than copied (the copy reads every layer's rows).
  if (!from || n < mine + k_min_prefix_copy) return;
  // The rows go through the host in the session layout; the pin stays this sequence's.
  const uint32_t keep = to.keep();
  if (!to.restore(std::span(from->tokens()).first(n), std::min(keep, n), 0, from->read_rows(n))) return;
  to.set_keep(std::min(keep, to.max_keep()));
  metrics_.prefix_copied(n);
}

void Scheduler::prefill_round() {
  Sequence* next = nullptr;
  for (Sequence& s : seqs_)
    if (s.job && s.prefilling && (!next || s.admitted < next->admitted)) next = &s;
  if (!next) return;
  Sequence& s = *next;
  if (s.job->cancelled()) {
    complete(s);
    return;
  }
  try {
    // The prompt, then the draft model's catch-up with it (a chunk per round too, so a long prompt
    // does not stall the other sequences' steps at its first draft).
    bool more = s.gen->prefill_step(s.engine->ubatch());
    if (!more && s.draft && drafts_with_model(s.job->generate.speculative, *s.engine))
      more = s.draft->catch_up_step(s.engine->cache().tokens(), s.draft->engine().ubatch());
    if (!more) finish_prefill(s);
  } catch (const GrammarError& e) {  // the request's grammar, at its start: the cache is whole
    complete(s, e.what(), true);
  } catch (const std::exception& e) {
    s.engine->cache().clear();  // a failed prefill may have left tokens without their K/V
    complete(s, e.what());
  }
}

void Scheduler::finish_prefill(Sequence& s) {
  s.prefilling = false;
  const uint32_t n_prompt = uint32_t(s.job->prompt.size());
  if (PromptCache* pc = opts_.prompt_cache) {
    if (s.gen->stats().cached_tokens + 1 < n_prompt) pc->store(*s.engine, n_prompt);
    if (opts_.log)
      for (const std::string& w : pc->take_warnings()) opts_.log("warning: " + w);  // each names the prompt cache
  }
  // A request never runs through the ring: max_tokens stops where the context is full.
  GenerateOptions go = s.job->generate;
  const KvCache& cache = s.engine->cache();
  if (go.n_predict >= 0) go.n_predict = std::min<int32_t>(go.n_predict, int32_t(cache.capacity() - cache.used()));
  // A draft model drafts with the sequence's own draft cache (which follows this sequence's tokens).
  if (go.speculative.type == SpecType::DraftModel) {
    go.speculative.draft_model = s.draft;
    if (!s.draft) go.speculative.type = SpecType::None;
  }
  s.gen->start(go);
}

void Scheduler::step_all() {
  // Sample every running sequence's next token; those that go on run through the model together.
  std::vector<Sequence*> stepping;
  std::vector<Engine*> engines;
  std::vector<int32_t> tokens;
  for (Sequence& s : seqs_) {
    if (!s.job || !s.gen || s.prefilling) continue;
    Job& job = *s.job;
    try {
      const int32_t tok = job.cancelled() ? (s.gen->interrupt(), -1) : s.gen->sample(sink(s));
      if (s.ttft_s < 0 && (s.gen->stats().generated > 0 || tok < 0))
        s.ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.enqueued).count();
      if (tok < 0) {
        complete(s);
        continue;
      }
      stepping.push_back(&s);
      engines.push_back(s.engine);
      tokens.push_back(tok);
    } catch (const GrammarError& e) {
      complete(s, e.what(), true);
    } catch (const std::exception& e) {
      complete(s, e.what());
    }
  }
  if (stepping.empty()) return;
  try {
    // A speculating sequence runs its token and a draft after it (none where none pays), the
    // others their token: all in one pass where the device takes it (each token's logits what a
    // step of its sequence alone gives it, so the drafts change no reply).
    // Beside others, a draft's length is chosen from what its tokens would cost the step (the
    // server's PassCost line); alone, from what the sequence's own passes measured.
    std::vector<std::vector<int32_t>> passes(stepping.size());
    std::vector<bool> speculating(stepping.size());
    std::vector<uint32_t> draft_min(stepping.size());
    const RelativeCost cost = stepping.size() > 1 ? pass_cost_.relative(uint32_t(stepping.size())) : RelativeCost{};
    for (size_t i = 0; i < stepping.size(); ++i) {
      speculating[i] = stepping[i]->gen->speculating();
      if (speculating[i]) {
        // A draft model that fails costs its sequence this draft, not the step of every sequence:
        // its cache, which the failed pass may have left part-written, starts again at the next.
        try {
          passes[i] = stepping[i]->gen->draft(tokens[i], cost);
        } catch (const std::exception& e) {
          if (!stepping[i]->draft) throw;
          stepping[i]->draft->engine().cache().clear();
          if (opts_.log) opts_.log(std::string("warning: the draft model failed, this step runs without a draft: ") + e.what());
        }
      }
      passes[i].insert(passes[i].begin(), tokens[i]);
      draft_min[i] = stepping[i]->job->generate.speculative.draft_min;
    }
    fit_drafts(passes, engines[0]->max_batch_tokens(), draft_min);
    std::vector<int32_t> flat;
    std::vector<uint32_t> counts;
    for (const std::vector<int32_t>& p : passes) {
      flat.insert(flat.end(), p.begin(), p.end());
      counts.push_back(uint32_t(p.size()));
    }
    const auto since = [](std::chrono::steady_clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    // A sequence takes its rows with what its pass cost (a pass of its own: its time; in a step of
    // several, 0: the sequence's own cost table is for its passes alone, and its choice beside
    // others takes PassCost); a request's own error (its grammar could not go on) ends that
    // request alone. Returns the drafts the sampling took.
    const auto take = [&](size_t i, std::span<const float> rows, double ms) -> uint32_t {
      Sequence& s = *stepping[i];
      const uint32_t before = s.gen->stats().draft_accepted;
      try {
        const bool go_on = speculating[i] ? s.gen->take_pass(passes[i], rows, ms, sink(s)) : s.gen->advance(rows, sink(s));
        const uint32_t accepted = s.gen->stats().draft_accepted - before;
        if (!go_on) complete(s);
        return accepted;
      } catch (const GrammarError& e) {  // (take_pass leaves the cache holding what was taken)
        const uint32_t accepted = s.gen->stats().draft_accepted - before;
        complete(s, e.what(), true);
        return accepted;
      }
    };
    if (engines[0]->can_decode_batch(engines, counts)) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<float>& logits = engines[0]->decode_batch(engines, flat, counts);
      const double ms = since(t0);
      const uint32_t k = uint32_t(stepping.size());
      pass_cost_.observe(uint32_t(flat.size()), ms);
      const size_t n_vocab = logits.size() / flat.size();
      uint32_t accepted = 0;
      for (size_t i = 0, row = 0; i < k; row += passes[i].size(), ++i) {
        const uint32_t n = uint32_t(passes[i].size());
        accepted += take(i, std::span(logits).subspan(row * n_vocab, n * n_vocab), k == 1 ? ms : 0.0);
      }
      metrics_.decode_step(k, uint32_t(flat.size()) - k, accepted);
    } else {
      // A device or shape decode_batch cannot take: a pass per sequence.
      for (size_t i = 0; i < stepping.size(); ++i) {
        Engine& e = *stepping[i]->engine;
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<float>& logits = speculating[i] ? e.decode_columns(passes[i]) : e.decode(passes[i], LogitsMode::Last);
        const double ms = since(t0);
        pass_cost_.observe(counts[i], ms);
        const uint32_t accepted = take(i, logits, ms);
        metrics_.decode_step(1, counts[i] - 1, accepted);
      }
    }
  } catch (const std::exception& e) {
    // A failed step may have appended tokens whose K/V were never computed: nothing of these
    // caches is reused.
    for (Sequence* s : stepping) {
      s->engine->cache().clear();
      if (s->job) complete(*s, e.what());
    }
  }
}

TextSink Scheduler::sink(Sequence& s) {
  return [this, &s](const std::string& text) {
    s.released += text.size();
    s.job->push_text(text, released_logprobs(s, false));
    return !s.job->cancelled();
  };
}

std::vector<TokenLogprobs> Scheduler::released_logprobs(Sequence& s, bool all) {
  std::vector<TokenLogprobs> out;
  if (!s.job->generate.logprobs || !s.gen) return out;
  // A token's text is released once its first byte is; a token whose text a stop string cut off
  // whole is never reported (nor is the end-of-generation token, which has none).
  const GenerationStats& st = s.gen->stats();
  for (; s.reported < st.text_start.size() && (all || st.text_start[s.reported] < s.released); ++s.reported) {
    const size_t i = s.reported;
    TokenLogprobs e{tok_.token_to_piece(st.tokens[i], false), st.logprobs[i], st.text_start[i], {}};
    if (i < st.top_logprobs.size())
      for (const TokenLogprob& t : st.top_logprobs[i]) e.top.emplace_back(tok_.token_to_piece(t.token, false), t.logprob);
    out.push_back(std::move(e));
  }
  return out;
}

void Scheduler::complete(Sequence& s, const std::string& error, bool request_error) {
  // The last tokens' log-probabilities: all of them unless a stop string cut the text (then only
  // those whose text was released) or the client went away.
  if (error.empty() && s.gen && s.gen->stats().stop_reason != "stop string" && s.gen->stats().stop_reason != "interrupted")
    s.job->push_text("", released_logprobs(s, true));
  const std::shared_ptr<Job> job = std::move(s.job);
  if (job->cancelled()) metrics_.cancelled();
  const GenerationStats st = s.gen ? s.gen->stats() : GenerationStats{};
  // A request dropped during its prefill counts nothing (its prompt did not all run).
  if (error.empty() && s.gen && !(job->cancelled() && s.prefilling))
    metrics_.generation(st.prompt_tokens, st.cached_tokens, st.generated, s.ttft_s,
                        st.generated > 1 ? (st.generated - 1) * 1000.0 / std::max(st.decode_ms, 1e-3) : 0.0);
  s.gen.reset();
  s.sampler.reset();
  s.prefilling = false;
  {
    std::lock_guard lock(mu_);
    --running_;
    s.last_used = ++round_;
  }
  job->finish(st, error, request_error);
  idle_cv_.notify_all();
}

void Scheduler::update_gauges() {
  uint64_t used = 0, total = 0;
  std::vector<SlotState> slots;
  for (const Sequence& s : seqs_) {
    const KvCache& kv = s.engine->cache();
    used += kv.used();
    total += kv.capacity();
    slots.push_back({slots.size(), kv.capacity(), s.job != nullptr, s.job && s.prefilling, kv.used(), s.job,
                     s.job && s.gen && !s.prefilling ? s.gen->stats().generated : 0});
  }
  std::lock_guard lock(mu_);
  drop_cancelled_locked();
  metrics_.set_gauges(used, total, queue_.size(), running_);
  slots_ = std::move(slots);
}

std::future<SlotResult> Scheduler::slot_action(const SlotAction& a) {
  std::promise<SlotResult> done;
  std::future<SlotResult> result = done.get_future();
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      done.set_value({503, "the server is shutting down"});
      return result;
    }
    actions_.emplace_back(a, std::move(done));
  }
  cv_.notify_all();
  return result;
}

void Scheduler::run_actions() {
  for (;;) {
    std::pair<SlotAction, std::promise<SlotResult>> next;
    {
      std::lock_guard lock(mu_);
      if (actions_.empty()) return;
      next = std::move(actions_.front());
      actions_.pop_front();
    }
    next.second.set_value(run_action(next.first));
  }
}

SlotResult Scheduler::run_action(const SlotAction& a) {
  Sequence& s = seqs_[a.slot];
  // A sequence admitted in this round holds its job already: it is busy too.
  if (s.job) return {503, "sequence " + std::to_string(a.slot) + " is running a request; try again when it is idle"};
  KvCache& cache = s.engine->cache();
  SlotResult r;
  const auto t0 = std::chrono::steady_clock::now();
  // A file that is refused is the request's error (400); a save or a read that fails is the
  // server's (500). Either way nothing changed: load_session checks the whole file first, and a
  // failed save leaves the previous file as it was (written atomically, or an append cut off). A
  // sequence's later save to the file it saved or restored appends what the file lacks.
  try {
    switch (a.kind) {
      case SlotAction::Kind::Save:
        r.tokens = cache.used();
        try {
          const uint64_t size = save_session(a.path, *s.engine, *opts_.fingerprint, nullptr, "", -1, &s.journal);
          r.bytes = s.journal.appended ? s.journal.appended : size;  // what this save wrote
        } catch (const std::exception& e) {
          return {500, e.what()};
        }
        break;
      case SlotAction::Kind::Restore: {
        std::error_code ec;
        if (!std::filesystem::exists(a.path, ec)) return {404, a.path + ": no such slot file"};
        // The pin stays this sequence's (a chat's file pins its system prompt).
        const uint32_t keep = cache.keep();
        const SessionInfo info = load_session(a.path, *s.engine, *opts_.fingerprint, nullptr, -1, {}, &s.journal);
        cache.set_keep(std::min(keep, cache.max_keep()));
        r.tokens = uint32_t(info.tokens.size());
        r.bytes = info.file_bytes;
        r.unfinished = info.unfinished_bytes;
        break;
      }
      case SlotAction::Kind::Erase:
        r.tokens = cache.used();
        cache.clear();
        break;
    }
  } catch (const CannotOpenSession& e) {
    return {500, e.what()};
  } catch (const std::exception& e) {
    return {400, e.what()};
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.last_used = ++round_;  // a restored cache is as fresh as a finished request's
  return r;
}

std::vector<SlotState> Scheduler::slots() {
  std::lock_guard lock(mu_);
  return slots_;
}

void Scheduler::drop_cancelled_locked() {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (!(*it)->cancelled()) {
      ++it;
      continue;
    }
    metrics_.cancelled();
    (*it)->finish(GenerationStats{}, "");
    it = queue_.erase(it);
  }
  if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
}

}  // namespace vkllm::serve
