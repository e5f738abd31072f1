// n-gram drafts and the choice of their length.
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

namespace vkllm {

std::vector<int32_t> ngram_draft(std::span<const int32_t> history, uint32_t n, uint32_t max) {
  std::vector<int32_t> draft;
  const size_t len = history.size();
  if (n == 0 || max == 0 || len < size_t{n} + 1) return draft;
  const std::span<const int32_t> key = history.last(n);
  // The most recent occurrence that starts before the key itself does.
  for (size_t i = len - n; i-- > 0;) {
    if (!std::equal(key.begin(), key.end(), history.begin() + ptrdiff_t(i))) continue;
    // What followed it: i + n ≤ len − 1, so past the history's end the draft reads itself.
    for (size_t at = i + n; draft.size() < max; ++at) draft.push_back(at < len ? history[at] : draft[at - len]);
    break;
  }
  return draft;
}

namespace {
constexpr double k_decay = 0.9;        // weight of the earlier acceptance evidence at each pass
constexpr double k_cost_weight = 0.3;  // of a new cost measurement

// Moves the moving average of the passes of n tokens, table[n], toward `ms` (a first measurement
// sets it); a nonsense timing is ignored.
void average_cost(std::vector<double>& table, uint32_t n, double ms) {
  if (n == 0 || !std::isfinite(ms) || ms <= 0) return;
  if (table.size() <= n) table.resize(n + 1, 0.0);
  double& c = table[n];
  c = c > 0 ? (1.0 - k_cost_weight) * c + k_cost_weight * ms : ms;
}
}  // namespace

double DraftLength::relative_cost(uint32_t n) const {
  if (n <= 1) return 1.0;
  const auto measured = [&](uint32_t i) { return i < cost_ms_.size() ? cost_ms_[i] : 0.0; };
  const double one = measured(1);
  if (one > 0 && measured(n) > 0) return measured(n) / one;
  double cost = 1.0 + (n - 1) * prior_rho_;
  if (one > 0)  // a longer pass costs at least what a shorter one measured
    for (uint32_t i = 2; i < n; ++i)
      if (measured(i) > 0) cost = std::max(cost, measured(i) / one);
  return cost;
}

uint32_t DraftLength::choose(uint32_t available, uint32_t draft_min, const RelativeCost& cost) const {
  const double a = acceptance();
  uint32_t best = 0;
  double best_rate = 1.0, expected = 1.0, a_pow = 1.0;
  for (uint32_t k = 1; k <= available; ++k) {
    a_pow *= a;
    expected += a_pow;
    const double rate = expected / (cost ? cost(k + 1) : relative_cost(k + 1));
    if (rate > best_rate * 1.02) {  // a length must beat the shorter ones by more than noise
      best = k;
      best_rate = rate;
    }
  }
  // --draft-min: a draft is at least that long, or not run.
  if (available < draft_min) return 0;
  return std::max(best, draft_min);
}

void DraftLength::observe(uint32_t n, uint32_t accepted, double ms, bool cut_short) {
  if (n == 0) return;
  average_cost(cost_ms_, n, ms);
  if (n == 1 && !cut_short) {
    // A plain step: the acceptance evidence fades toward the prior a little, so a run of refused
    // drafts does not switch drafting off for good.
    hits_ *= 0.98;
    tries_ *= 0.98;
    return;
  }
  const uint32_t drafted = n - 1;
  hits_ = hits_ * k_decay + accepted;
  tries_ = tries_ * k_decay + std::min(accepted + 1, drafted) + (cut_short && accepted == drafted ? 1 : 0);
}

void PassCost::observe(uint32_t n, double ms) { average_cost(ms_, n, ms); }

PassCost::Line PassCost::line() const {
  // Least squares through the measured lengths, each point once.
  double count = 0, sn = 0, sm = 0, snn = 0, snm = 0;
  for (size_t n = 1; n < ms_.size(); ++n) {
    if (ms_[n] <= 0) continue;
    count += 1;
    sn += double(n);
    sm += ms_[n];
    snn += double(n) * double(n);
    snm += double(n) * ms_[n];
  }
  if (count == 0) return {};
  if (count == 1) {
    // One length: a token more costs prior_rho of a one-token pass, fixed + per_token.
    const double n = sn, per_token = sm / ((1.0 - prior_rho_) / prior_rho_ + n);
    return {sm - per_token * n, per_token};
  }
  const double slope = (count * snm - sn * sm) / (count * snn - sn * sn);
  if (slope <= 0) return {sm / count, 0.0};  // (noise): every length alike
  const double fixed = (sm - slope * sn) / count;
  if (fixed < 0) return {0.0, snm / snn};  // a line through 0
  return {fixed, slope};
}

double PassCost::share(uint32_t n, uint32_t sequences) const {
  const Line l = line();
  return l.fixed / std::max<uint32_t>(sequences, 1) + l.per_token * n;
}

RelativeCost PassCost::relative(uint32_t sequences) const {
  const double one = share(1, sequences);
  if (!(one > 0)) return {};
  return [this, sequences, one](uint32_t n) { return share(n, sequences) / one; };
}

}  // namespace vkllm
