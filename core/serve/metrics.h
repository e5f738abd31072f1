// Metrics: the server's counters, histograms and gauges, rendered as Prometheus text for
// GET /metrics. Every member is safe to call from any thread.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace vkllm::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // The `name_bucket`, `name_sum` and `name_count` lines.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // An answered request, by endpoint path and HTTP status.
  void request(const std::string& endpoint, int status);
  // A finished generation: its token counts, time to first token (from arrival, queue included)
  // and decode rate (tokens after the first per second; not observed below two tokens).
  void generation(uint32_t prompt_tokens, uint32_t cached_tokens, uint32_t generated, double ttft_s, double decode_tok_s);
  // A decode step that advanced `sequences` sequences, running `drafts` speculative draft tokens
  // after their sampled ones, of which the sampling took `accepted`.
  void decode_step(uint32_t sequences, uint32_t drafts = 0, uint32_t accepted = 0);
  // A request dropped because its client went away (while queued, prefilled or generating).
  void cancelled();
  // A prefix of `tokens` copied into a sequence from another one's cache.
  void prefix_copied(uint32_t tokens);
  void set_gauges(uint64_t kv_slots_used, uint64_t kv_slots_total, uint64_t queue_length, uint64_t running);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0;
  uint64_t draft_tokens_ = 0, draft_accepted_ = 0;
  uint64_t decode_steps_ = 0, decode_step_sequences_ = 0, batched_draft_tokens_ = 0, cancelled_ = 0, prefix_copies_ = 0,
           prefix_copied_tokens_ = 0;
  Histogram ttft_, decode_rate_;
  uint64_t kv_used_ = 0, kv_total_ = 0, queue_ = 0, running_ = 0;
};

}  // namespace vkllm::serve
