// Prefix reuse, the sampling loop, stop strings.
#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "engine/draft_model.h"

namespace vkllm {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that
// must be held back until we know whether a stop string completes.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

// The log of a softmax's denominator, as the largest logit and the log of the sum of exp(l − max),
// in double (a vocabulary of 150k logits): of(logit) is log softmax(logits) at that logit.
struct LogNorm {
  float max = -INFINITY;
  double log_sum = 0.0;
  float of(float logit) const { return static_cast<float>(double(logit) - max - log_sum); }
};

LogNorm log_norm(const std::vector<float>& logits) {
  LogNorm n;
  for (float l : logits) n.max = std::max(n.max, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l) - n.max);
  n.log_sum = std::log(sum);
  return n;
}

// The k most likely tokens, most likely first (equal logits: the lower id first).
std::vector<TokenLogprob> most_likely(const std::vector<float>& logits, uint32_t k, const LogNorm& norm) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  k = std::min<uint32_t>(k, uint32_t(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  });
  std::vector<TokenLogprob> out(k);
  for (uint32_t i = 0; i < k; ++i) out[i] = {ids[i], norm.of(logits[size_t(ids[i])])};
  return out;
}

}  // namespace

PrefixMatch match_prefix(const KvCache& cache, std::span<const int32_t> tokens) {
  PrefixMatch m;
  m.usable = cache.evicted() == 0;
  if (!m.usable) return m;
  const std::vector<int32_t>& cached = cache.tokens();
  while (m.matched < cached.size() && m.matched < tokens.size() && cached[m.matched] == tokens[m.matched]) ++m.matched;
  return m;
}

uint32_t reusable_prefix(const KvCache& cache, std::span<const int32_t> prompt) {
  const PrefixMatch m = match_prefix(cache, prompt);
  return prompt.empty() || !m.usable ? 0 : cache.reusable(std::min<uint32_t>(m.matched, uint32_t(prompt.size()) - 1));
}

uint32_t generation_budget(const KvCache& cache, uint32_t turn_tokens) {
  if (cache.used() < cache.capacity()) return cache.capacity() - cache.used();
  const uint64_t taken = uint64_t{cache.keep()} + turn_tokens;
  return taken < cache.capacity() ? cache.capacity() - uint32_t(taken) : 0;
}

uint32_t Generator::prefill(std::span<const int32_t> prompt, const ProgressFn& progress) {
  prefill_begin(prompt);
  prefill_step(UINT32_MAX, progress);  // all of it (Engine::decode chunks it)
  return stats_.cached_tokens;
}

uint32_t Generator::prefill_begin(std::span<const int32_t> prompt) {
  // An empty prompt continues from what is cached: its last token's logits are kept from before.
  if (prompt.empty()) {
    stats_ = {};
    to_run_.clear();
    return 0;
  }
  KvCache& cache = engine_.cache();
  const uint32_t reuse = reusable_prefix(cache, prompt);
  cache.truncate(reuse);
  // The reused tokens still count for the penalties; extend_begin() accepts the rest.
  for (int32_t t : prompt.first(reuse)) sampler_.accept(t);
  return extend_begin(prompt.subspan(reuse));
}

uint32_t Generator::extend(std::span<const int32_t> tokens, const ProgressFn& progress) {
  extend_begin(tokens);
  prefill_step(UINT32_MAX, progress);  // all of it (Engine::decode chunks it)
  return stats_.cached_tokens;
}

void Generator::account_turn(uint32_t prompt, uint32_t cached, uint32_t ran_before, double ran_before_ms) {
  const uint32_t ran = stats_.prefilled() + ran_before;
  VKLLM_CHECK(uint64_t{cached} + ran <= prompt, "a turn ran more tokens than its prompt holds");
  stats_.prompt_tokens = prompt;
  stats_.cached_tokens = cached;
  stats_.skipped_tokens = prompt - cached - ran;
  stats_.prefill_ms += ran_before_ms;
}

uint32_t Generator::extend_begin(std::span<const int32_t> tokens) {
  stats_ = {};
  const KvCache& cache = engine_.cache();
  stats_.cached_tokens = cache.used();
  stats_.prompt_tokens = cache.used() + static_cast<uint32_t>(tokens.size());
  for (int32_t t : tokens) sampler_.accept(t);
  to_run_.assign(tokens.begin(), tokens.end());
  run_done_ = 0;
  return stats_.cached_tokens;
}

bool Generator::prefill_step(uint32_t max_tokens, const ProgressFn& progress) {
  if (run_done_ >= to_run_.size()) return false;
  const size_t n = std::min<size_t>(std::max<uint32_t>(max_tokens, 1), to_run_.size() - run_done_);
  const auto t0 = std::chrono::steady_clock::now();
  logits_ = engine_.decode(std::span(to_run_).subspan(run_done_, n), LogitsMode::Last, progress);
  stats_.prefill_ms += ms_since(t0);
  run_done_ += n;
  if (run_done_ < to_run_.size()) return true;
  to_run_.clear();
  run_done_ = 0;
  return false;
}

void Generator::drop_newest(uint32_t count) {
  KvCache& cache = engine_.cache();
  const uint32_t keep = cache.keep();
  // Truncating into the pinned prefix shrinks the pin; it is put back (the ring head is at 0
  // whenever the pin was cut), and tokens appended again are pinned as they were.
  cache.truncate(cache.used() - count);
  if (cache.keep() != keep) cache.set_keep(keep);
}

void Generator::resume() {
  KvCache& cache = engine_.cache();
  logits_.clear();
  if (cache.used() == 0) return;
  const int32_t last = cache.tokens().back();
  drop_newest(1);
  const auto t0 = std::chrono::steady_clock::now();
  logits_ = engine_.decode(std::span(&last, 1), LogitsMode::Last);
  stats_.prefill_ms += ms_since(t0);
}

void Generator::generate(const GenerateOptions& o, const TextSink& on_text, const std::function<bool()>& stop) {
  const auto stopped = [&] { return stop && stop(); };
  start(o);
  while (!stopped() && step(on_text)) {
  }
  if (stopped()) interrupt();
}

Generator::Generator(Engine& engine, const Tokenizer& tok, Sampler& sampler) : engine_(engine), tok_(tok), sampler_(sampler) {
  sampler_.bind(tok_);
}

void Generator::start(const GenerateOptions& o) {
  if (logits_.empty()) throw Error("nothing to continue from: the prompt is empty and the cache holds no tokens");
  run_.emplace(Run{o, StreamDecoder(tok_), {}, o.n_predict, 0, -1, -1, 0, {}, std::chrono::steady_clock::now(), {}});
  if (o.speculative.on() && !draft_length_)
    draft_length_.emplace(0.3, o.speculative.type == SpecType::DraftModel ? std::max(0.5, double(o.speculative.p_min)) : 0.5);
  if (o.grammar) {
    if (!grammar_vocab_) grammar_vocab_ = std::make_shared<const GrammarVocab>(tok_);
    run_->grammar.emplace(o.grammar, grammar_vocab_);
  }
  // An empty stop string matches nowhere (it would stop before the first token), as the server reads it.
  std::erase_if(run_->opts.stop, [](const std::string& s) { return s.empty(); });
  // Reaching the limit is the stop reason unless another one (eos, stop string, interrupt) comes first.
  stats_.stop_reason = "length";
  if (o.n_predict == GenerateOptions::kUntilFull) {
    const uint32_t ran = stats_.prefilled();
    run_->limit = generation_budget(engine_.cache(), o.turn_tokens >= 0 ? std::min<uint32_t>(ran, uint32_t(o.turn_tokens)) : ran);
    stats_.stop_reason = "context full";  // one more token would evict this turn's
  } else {
    VKLLM_CHECK(o.n_predict >= GenerateOptions::kEndless, "n_predict below -1 is refused by the front end");
  }
}

bool Generator::step(const TextSink& on_text) {
  for (;;) {
    const int32_t tok = sample(on_text);
    if (tok < 0) return false;
    if (!speculating()) return advance(engine_.decode(std::span(&tok, 1), LogitsMode::Last), on_text);
    if (!speculate(tok, on_text)) return false;
    if (run_->next < 0) return true;
  }
}

bool Generator::speculate(int32_t tok, const TextSink& on_text) {
  // A verify pass of the token and its draft (none where none pays): each token's logits are the
  // ones a plain step gives it (Engine::verify_exact).
  std::vector<int32_t> pass = draft(tok);
  pass.insert(pass.begin(), tok);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>& logits = engine_.decode_columns(pass);
  return take_pass(pass, logits, ms_since(t0), on_text);
}

bool Generator::speculating() const {
  return run_ && run_->opts.speculative.on() && engine_.verify_exact();
}

std::vector<int32_t> Generator::draft(int32_t tok, const RelativeCost& cost) {
  VKLLM_CHECK(run_.has_value() && draft_length_, "Generator::draft without a speculative start()");
  Run& r = *run_;
  r.draft_cut = false;
  const SpeculativeOptions& so = r.opts.speculative;
  const KvCache& cache = engine_.cache();
  // Drafts never make the ring evict (a refused one would have taken tokens a plain step keeps),
  // never go past the tokens left to sample, and fit one pass.
  const bool model = so.type == SpecType::DraftModel;
  int64_t room = std::min<int64_t>({int64_t{cache.capacity()} - cache.used() - 1, int64_t{engine_.max_chunk(true)} - 1,
                                    int64_t{so.draft_max}});
  if (!model) room = std::min<int64_t>(room, so.ngram_m);
  if (r.limit >= 0) room = std::min(room, r.limit - r.sampled);
  if (room <= 0) return {};
  std::vector<int32_t> history = cache.tokens();
  history.push_back(tok);
  if (!model) {
    std::vector<int32_t> d = ngram_draft(history, so.ngram_n, uint32_t(room));
    d.resize(draft_length_->choose(uint32_t(d.size()), so.draft_min, cost));
    return d;
  }
  // A draft model's tokens cost its steps as well as the pass: the length is chosen before they are
  // drafted, with each drafted token at what the draft model measured against a target step.
  VKLLM_CHECK(so.draft_model != nullptr, "SpecType::DraftModel without a draft model");
  DraftModel& dm = *so.draft_model;
  const double ratio = dm.cost_ratio(draft_length_->step_ms());
  const RelativeCost with_drafting = [&](uint32_t n) {
    return (cost ? cost(n) : draft_length_->relative_cost(n)) + double(n - 1) * ratio;
  };
  const uint32_t k = draft_length_->choose(uint32_t(room), so.draft_min, with_drafting);
  if (k == 0) {
    dm.fade();
    return {};
  }
  std::vector<int32_t> d = dm.propose(history, k, so.p_min);
  r.draft_cut = d.size() < k;
  if (d.size() < so.draft_min) d.clear();  // as llama.cpp: a draft shorter than --draft-min is not run
  return d;
}

// The pass's rows in order, as plain steps would take them: each next token is sampled from the
// row before it, and a draft equal to it is already in the cache with its logits computed.
bool Generator::take_pass(std::span<const int32_t> pass, std::span<const float> logits, double ms, const TextSink& on_text) {
  VKLLM_CHECK(!pass.empty() && logits.size() % pass.size() == 0, "take_pass: a row of logits per token of the pass");
  const size_t n = pass.size(), n_vocab = logits.size() / n;
  stats_.drafted += uint32_t(n - 1);
  uint32_t accepted = 0;
  bool go_on = true;
  size_t i = 0;  // the row taken: the pass's tokens up to it stay in the cache, the drafts after it leave
  const auto cut = [&] {
    if (i + 1 < n) drop_newest(uint32_t(n - 1 - i));
  };
  try {
    for (;; ++i) {
      if (!advance(logits.subspan(i * n_vocab, n_vocab), on_text)) {
        go_on = false;
      } else if (i + 1 < n) {
        const int32_t next = sample(on_text);
        if (next < 0) {
          go_on = false;
        } else if (next == pass[i + 1]) {
          ++accepted;
          continue;
        } else {
          run_->next = next;
        }
      }
      break;
    }
  } catch (...) {  // (a grammar that cannot go on): the cache holds what was taken, as after plain steps
    cut();
    throw;
  }
  cut();
  stats_.draft_accepted += accepted;
  draft_length_->observe(uint32_t(n), accepted, ms, std::exchange(run_->draft_cut, false));
  return go_on;
}

int32_t Generator::sample(const TextSink& on_text) {
  VKLLM_CHECK(run_.has_value(), "Generator::sample without start()");
  Run& r = *run_;
  if (r.next >= 0) {  // sampled already, against a refused draft
    r.token = std::exchange(r.next, -1);
    return r.token;
  }
  if (r.limit >= 0 && r.sampled >= r.limit) {
    finish(on_text);
    return -1;
  }
  if (r.opts.logprobs) raw_ = logits_;
  for (const auto& [id, bias] : r.opts.logit_bias)
    if (size_t(id) < logits_.size()) logits_[size_t(id)] += bias;
  const int32_t tok = r.grammar ? sample_in_grammar(*r.grammar) : sampler_.sample(logits_);
  sampler_.accept(tok);
  if (r.sampled++ == 0) {
    stats_.ttft_ms = stats_.prefill_ms + ms_since(r.t_start);
    r.t_first = std::chrono::steady_clock::now();
  }
  // Under a grammar, which allows an end-of-generation token only where the text may end, it ends
  // the text even with ignore_eos (else a complete grammar would take nothing but them).
  if ((!r.opts.ignore_eos || r.grammar) && tok_.is_eog(tok)) {
    stats_.stop_reason = "eos";
    finish(on_text);
    return -1;
  }
  ++stats_.generated;
  stats_.tokens.push_back(tok);
  if (r.opts.logprobs) {
    const LogNorm norm = log_norm(raw_);
    stats_.logprobs.push_back(norm.of(raw_[size_t(tok)]));
    if (r.opts.top_logprobs > 0) stats_.top_logprobs.push_back(most_likely(raw_, r.opts.top_logprobs, norm));
  }
  r.token = tok;
  return tok;
}

// As llama.cpp's common_sampler_sample: the chain draws from the model's logits; a token the
// grammar refuses is drawn again, by the whole chain (another random number), from the logits
// with every token the grammar refuses at −inf. Most steps of a model that follows the grammar
// cost one walk of the token (its check is its acceptance) instead of a pass over the vocabulary.
int32_t Generator::sample_in_grammar(GrammarMatcher& grammar) {
  unmasked_ = logits_;
  const int32_t first = sampler_.sample(logits_);
  if (grammar.try_accept(first)) return first;
  logits_ = unmasked_;
  if (grammar.mask(logits_) == 0) {
    throw GrammarError("grammar: no token of the vocabulary continues the text after " + std::to_string(stats_.generated) +
                       (stats_.generated == 1 ? " generated token" : " generated tokens"));
  }
  const int32_t tok = sampler_.sample(logits_);
  grammar.accept(tok);
  return tok;
}

bool Generator::advance(std::span<const float> logits, const TextSink& on_text) {
  VKLLM_CHECK(run_.has_value(), "Generator::advance without sample()");
  Run& r = *run_;
  // The token joined the cache at once, so the cache always holds the whole conversation and
  // the logits to continue from are ready (a saved session resumes here).
  logits_.assign(logits.begin(), logits.end());
  const std::string text = r.decoder.push(r.token);
  if (r.opts.logprobs) stats_.text_start.push_back(r.decoded);
  r.decoded += uint32_t(text.size());
  r.pending += text;
  // The text ends where the first stop string to occur begins (two may complete on one token).
  size_t cut = std::string::npos;
  for (const std::string& s : r.opts.stop) cut = std::min(cut, r.pending.find(s));
  bool stopped = cut != std::string::npos;
  if (stopped) {
    r.pending.resize(cut);
    stats_.stop_reason = "stop string";
  }
  const size_t hold = stopped ? 0 : held_back(r.pending, r.opts.stop);
  if (r.pending.size() > hold) {
    const bool go_on = on_text(r.pending.substr(0, r.pending.size() - hold));
    r.pending.erase(0, r.pending.size() - hold);
    if (!go_on) {
      stats_.stop_reason = "interrupted";
      stopped = true;
    }
  }
  if (stopped) {
    r.pending.clear();
    finish(on_text);
    return false;
  }
  return true;
}

void Generator::interrupt() {
  if (!run_) return;
  stats_.stop_reason = "interrupted";
  if (stats_.generated > 0) stats_.decode_ms = ms_since(run_->t_first);
  run_.reset();
}

void Generator::finish(const TextSink& on_text) {
  Run& r = *run_;
  if (stats_.stop_reason != "stop string" && stats_.stop_reason != "interrupted") r.pending += r.decoder.flush();
  if (!r.pending.empty()) on_text(r.pending);
  if (stats_.generated > 0) stats_.decode_ms = ms_since(r.t_first);
  run_.reset();
}

}  // namespace vkllm
