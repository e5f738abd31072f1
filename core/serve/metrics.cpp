// Prometheus text exposition (version 0.0.4) of the server's metrics.
#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>

namespace vkllm::serve {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string header(const std::string& name, const char* type, const char* help) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

Metrics::Metrics()
    : ttft_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      decode_rate_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation(uint32_t prompt_tokens, uint32_t cached_tokens, uint32_t generated, double ttft_s, double decode_tok_s) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
  generated_tokens_ += generated;
  if (generated > 0) ttft_.observe(ttft_s);
  if (generated > 1) decode_rate_.observe(decode_tok_s);
}

void Metrics::decode_step(uint32_t sequences, uint32_t drafts, uint32_t accepted) {
  std::lock_guard lock(mu_);
  ++decode_steps_;
  decode_step_sequences_ += sequences;
  draft_tokens_ += drafts;
  draft_accepted_ += accepted;
  if (sequences > 1) batched_draft_tokens_ += drafts;
}

void Metrics::cancelled() {
  std::lock_guard lock(mu_);
  ++cancelled_;
}

void Metrics::prefix_copied(uint32_t tokens) {
  std::lock_guard lock(mu_);
  ++prefix_copies_;
  prefix_copied_tokens_ += tokens;
}

void Metrics::set_gauges(uint64_t kv_slots_used, uint64_t kv_slots_total, uint64_t queue_length, uint64_t running) {
  std::lock_guard lock(mu_);
  kv_used_ = kv_slots_used;
  kv_total_ = kv_slots_total;
  queue_ = queue_length;
  running_ = running;
}

std::string Metrics::render() const {
  std::lock_guard lock(mu_);
  std::string out = header("vkllm_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_)
    out += "vkllm_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  // A metric with one unlabelled value.
  const auto single = [&out](const std::string& name, const char* type, const char* help, uint64_t value) {
    out += header(name, type, help) + name + " " + std::to_string(value) + "\n";
  };
  single("vkllm_prompt_tokens_total", "counter", "Prompt tokens of generations that finished their prefill.", prompt_tokens_);
  single("vkllm_cached_tokens_total", "counter", "Prompt tokens reused from a sequence's cache or the prompt cache.", cached_tokens_);
  single("vkllm_generated_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  single("vkllm_decode_steps_total", "counter",
         "Decode steps (forward passes that advance the running sequences, each by its sampled token and any speculative draft).",
         decode_steps_);
  single("vkllm_draft_tokens_total", "counter", "Speculative draft tokens run through the model (--spec-type).", draft_tokens_);
  single("vkllm_draft_accepted_total", "counter", "Of the draft tokens, those the sampling took.", draft_accepted_);
  single("vkllm_batched_draft_tokens_total", "counter", "Of the draft tokens, those run in decode steps of several sequences.",
         batched_draft_tokens_);
  single("vkllm_decode_step_sequences_total", "counter",
         "Sequences advanced, summed over decode steps (divided by the steps: the mean batch).", decode_step_sequences_);
  single("vkllm_requests_cancelled_total", "counter", "Requests dropped because their client went away.", cancelled_);
  single("vkllm_prefix_copies_total", "counter", "Prompt prefixes copied into a sequence from another sequence's cache.", prefix_copies_);
  single("vkllm_prefix_copied_tokens_total", "counter", "Tokens of the prefixes copied between sequences.", prefix_copied_tokens_);
  out += header("vkllm_ttft_seconds", "histogram", "Time from a request's arrival to its first token.");
  out += ttft_.render("vkllm_ttft_seconds");
  out += header("vkllm_decode_tokens_per_second", "histogram", "Decode rate of each generation after its first token.");
  out += decode_rate_.render("vkllm_decode_tokens_per_second");
  single("vkllm_kv_slots_used", "gauge", "KV cache slots holding tokens, over all sequences.", kv_used_);
  single("vkllm_kv_slots_total", "gauge", "KV cache slots, over all sequences.", kv_total_);
  single("vkllm_queue_length", "gauge", "Requests waiting for a sequence.", queue_);
  single("vkllm_sequences_running", "gauge", "Sequences generating.", running_);
  return out;
}

}  // namespace vkllm::serve
