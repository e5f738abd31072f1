// Speculative decoding's CPU side: n-gram drafts and the choice of their length. (That the tokens
// are the ones plain steps give is checked end to end in test_cli, Cli.Speculative*.)
#include <gtest/gtest.h>

#include <vector>

#include "engine/speculative.h"

namespace vkllm {
namespace {

using Tokens = std::vector<int32_t>;

TEST(NgramDraft, ContinuesTheMostRecentEarlierOccurrence) {
  // The key [1 2] occurs at 0 (followed by 3 4) and at 5 (followed by 9 8): the later one drafts.
  const Tokens h{1, 2, 3, 4, 0, 1, 2, 9, 8, 7, 1, 2};
  EXPECT_EQ(ngram_draft(h, 2, 3), (Tokens{9, 8, 7}));
  EXPECT_EQ(ngram_draft(h, 2, 1), (Tokens{9}));
  // A longer key tells the occurrences apart: [0 1 2] only at 4.
  const Tokens h2{5, 1, 2, 6, 0, 1, 2, 3, 7, 5, 1, 2};
  EXPECT_EQ(ngram_draft(h2, 3, 2), (Tokens{6, 0}));  // key [5 1 2] at 0
  EXPECT_EQ(ngram_draft(h2, 2, 2), (Tokens{3, 7}));  // key [1 2]: the most recent is at 5
}

TEST(NgramDraft, NothingWithoutAnEarlierOccurrence) {
  EXPECT_TRUE(ngram_draft(Tokens{1, 2, 3, 4}, 1, 4).empty());
  EXPECT_TRUE(ngram_draft(Tokens{1, 2, 3, 1, 2}, 3, 4).empty());  // [3 1 2] never before
  EXPECT_TRUE(ngram_draft(Tokens{7}, 1, 4).empty());              // shorter than n + 1
  EXPECT_TRUE(ngram_draft(Tokens{}, 1, 4).empty());
  EXPECT_TRUE(ngram_draft(Tokens{1, 1, 1}, 1, 0).empty());        // max 0
  EXPECT_TRUE(ngram_draft(Tokens{1, 1, 1}, 0, 4).empty());        // n 0
}

TEST(NgramDraft, ACycleDraftsItsNextPeriods) {
  // Period 3: the continuation runs into the history's end and goes on with the draft itself.
  EXPECT_EQ(ngram_draft(Tokens{4, 5, 6, 4, 5, 6, 4}, 1, 7), (Tokens{5, 6, 4, 5, 6, 4, 5}));
  EXPECT_EQ(ngram_draft(Tokens{9, 9}, 1, 5), (Tokens{9, 9, 9, 9, 9}));
  // The key may overlap the occurrence: [9 9] in 9 9 9 at 0.
  EXPECT_EQ(ngram_draft(Tokens{9, 9, 9}, 2, 3), (Tokens{9, 9, 9}));
}

TEST(DraftLength, LongDraftsWhereTheyAreTakenAndCheap) {
  DraftLength d(0.05);  // a GPU's prior: a token more per pass costs 5% of a step
  EXPECT_EQ(d.choose(0, 0), 0u);
  for (int i = 0; i < 20; ++i) d.observe(9, 8, 10.0);  // every draft taken
  EXPECT_GT(d.acceptance(), 0.9);
  EXPECT_GE(d.choose(16, 0), 12u);
  EXPECT_EQ(d.choose(3, 0), 3u);
}

TEST(DraftLength, NoDraftsWhereTheyAreRefused) {
  DraftLength d(0.3);
  EXPECT_GT(d.choose(4, 0), 0u) << "the prior (half taken) pays at a 0.3 step per token";
  for (int i = 0; i < 20; ++i) d.observe(2, 0, 13.0);  // every draft refused
  EXPECT_LT(d.acceptance(), 0.1);
  EXPECT_EQ(d.choose(16, 0), 0u);
  // --draft-min runs drafts anyway, when that many are there.
  EXPECT_EQ(d.choose(16, 3), 3u);
  EXPECT_EQ(d.choose(2, 3), 0u);
  // Plain steps let the evidence fade: drafting is tried again some time later (a pass of 2
  // measured at 1.3 steps pays once a third of the drafts would be taken).
  int steps = 0;
  while (d.choose(16, 0) == 0 && steps < 1000) d.observe(1, 0, 10.0), ++steps;
  EXPECT_GT(steps, 10);
  EXPECT_LT(steps, 1000);
}

// A draft model's drafts: the prior acceptance is --draft-p-min's, and a draft cut short by it
// (none at all, or fewer tokens than chosen, all taken) counts one refused position, so a draft
// model that is never sure enough stops being asked; plain steps bring it back some time later.
TEST(DraftLength, DraftsCutShortCountAsRefusals) {
  DraftLength d(0.3, 0.8);
  EXPECT_DOUBLE_EQ(d.acceptance(), 0.8);
  const RelativeCost with_drafting = [&](uint32_t n) { return d.relative_cost(n) + 0.1 * (n - 1); };
  EXPECT_GT(d.choose(16, 0, with_drafting), 0u);
  // Empty drafts (the draft model under p_min at once): one-token passes cut short.
  for (int i = 0; i < 6; ++i) d.observe(1, 0, 10.0, true);
  EXPECT_LT(d.acceptance(), 0.3);
  EXPECT_EQ(d.choose(16, 0, with_drafting), 0u);
  int steps = 0;
  while (d.choose(16, 0, with_drafting) == 0 && steps < 1000) d.observe(1, 0, 10.0), ++steps;
  EXPECT_GT(steps, 10);
  EXPECT_LT(steps, 1000);
  // Two drafts, both taken, then the draft model stopped: 2 of 3 positions.
  DraftLength e(0.3, 0.5);
  for (int i = 0; i < 40; ++i) e.observe(3, 2, 13.0, true);
  EXPECT_NEAR(e.acceptance(), 2.0 / 3.0, 0.02);
  // Cut short after a refusal: the position past the refusal was never tried, nothing more counts.
  DraftLength f(0.3, 0.5);
  for (int i = 0; i < 40; ++i) f.observe(3, 1, 13.0, true);
  EXPECT_NEAR(f.acceptance(), 0.5, 0.02);
}

TEST(DraftLength, MeasuredCostsOverrideThePrior) {
  DraftLength d(0.3);
  EXPECT_DOUBLE_EQ(d.relative_cost(1), 1.0);
  EXPECT_DOUBLE_EQ(d.relative_cost(3), 1.6);
  d.observe(1, 0, 10.0);
  d.observe(2, 1, 20.0);  // two tokens cost two steps (columns in fours: 2 costs what 4 does)
  EXPECT_DOUBLE_EQ(d.relative_cost(2), 2.0);
  // Not measured: the prior, but never below a shorter pass measured.
  EXPECT_DOUBLE_EQ(d.relative_cost(3), 2.0);
  EXPECT_DOUBLE_EQ(d.relative_cost(5), 2.2);
  // Moving averages: a new measurement moves the estimate part of the way.
  d.observe(2, 1, 10.0);
  EXPECT_NEAR(d.relative_cost(2), 1.7, 1e-9);
  // Passes without a cost of their own (and nonsense timings) leave the costs, and count for the
  // acceptance.
  const double a = d.acceptance();
  d.observe(4, 3, -1.0);
  d.observe(4, 3, 0.0);
  EXPECT_DOUBLE_EQ(d.relative_cost(4), 1.9);
  EXPECT_GT(d.acceptance(), a);
}

TEST(DraftLength, PicksTheLengthWithTheMostTokensPerStep) {
  // Columns in fours: 2, 3 and 4 tokens cost 2 steps, 5 to 8 cost 3.
  DraftLength d(0.3);
  d.observe(1, 0, 10.0);
  for (uint32_t n = 2; n <= 8; ++n) d.observe(n, n - 1, n <= 4 ? 20.0 : 30.0);
  // Acceptance near 0.96: 4 tokens (3 drafts) give ≈ 3.8 for 2 steps, 8 give ≈ 7 for 3.
  EXPECT_EQ(d.choose(7, 0), 7u);
  EXPECT_EQ(d.choose(5, 0), 3u) << "5 or 6 tokens cost what 8 do";
  EXPECT_EQ(d.choose(2, 0), 2u);
  EXPECT_EQ(d.choose(1, 0), 0u) << "2 tokens for 2 steps: no gain";
}

// A cost from the caller (the server's step of several sequences) replaces the measured one.
TEST(DraftLength, ACallersCostReplacesTheMeasuredOne) {
  DraftLength d(0.3);
  for (int i = 0; i < 20; ++i) d.observe(4, 3, 10.0);  // every draft taken, passes as cheap as steps
  d.observe(1, 0, 10.0);
  EXPECT_EQ(d.choose(3, 0), 3u);
  EXPECT_EQ(d.choose(3, 0, [](uint32_t n) { return double(n); }), 0u) << "a token more costs a step: no draft pays";
  EXPECT_EQ(d.choose(3, 2, [](uint32_t n) { return double(n); }), 2u) << "--draft-min still holds";
  EXPECT_EQ(d.choose(8, 0, [](uint32_t) { return 1.0; }), 8u);
}

// A server step's pass: a line through the lengths measured, each sequence's share an even part
// of the fixed cost and its own tokens' part.
void expect_line(const PassCost& c, double fixed, double per_token) {
  EXPECT_NEAR(c.line().fixed, fixed, 1e-9);
  EXPECT_NEAR(c.line().per_token, per_token, 1e-9);
}

TEST(PassCost, ALineThroughTheMeasuredLengths) {
  PassCost c(0.3);
  EXPECT_DOUBLE_EQ(c.share(4, 2), 0.0);  // nothing measured
  EXPECT_FALSE(c.relative(4)) << "nothing measured: the caller's own";
  // One length: a token more costs 0.3 of a one-token pass (10 ms = 7 fixed + 3 per token).
  c.observe(1, 10.0);
  expect_line(c, 7.0, 3.0);
  // Two lengths of 20 + 2n (a GPU-like step: the weights' read dominates): the line through them.
  PassCost gpu;
  gpu.observe(4, 28.0);
  gpu.observe(16, 52.0);
  expect_line(gpu, 20.0, 2.0);
  EXPECT_NEAR(gpu.share(1, 4), 7.0, 1e-9);
  EXPECT_NEAR(gpu.share(4, 4), 13.0, 1e-9);
  EXPECT_NEAR(gpu.relative(4)(4), 13.0 / 7.0, 1e-9);
  // A falling line (noise) is flat; one that would start below 0 goes through 0.
  PassCost flat;
  flat.observe(2, 30.0);
  flat.observe(8, 20.0);
  expect_line(flat, 25.0, 0.0);
  PassCost through0;
  through0.observe(1, 1.0);
  through0.observe(4, 10.0);
  expect_line(through0, 0.0, 41.0 / 17.0);
}

// The share makes a sequence's choice the step's: beside k − 1 plain sequences, a draft whose
// tokens per share beat a plain step's raise the step's tokens per ms, and one whose do not lower
// them (a CPU-driver-like step, where tokens cost most, and a GPU-like one).
TEST(PassCost, AShareThatPaysRaisesTheStepsRate) {
  for (const auto& [fixed, per_token] : {std::pair{2.0, 10.0}, std::pair{40.0, 0.5}}) {
    PassCost c;
    c.observe(4, fixed + per_token * 4);
    c.observe(12, fixed + per_token * 12);
    const uint32_t k = 4;
    for (uint32_t d = 1; d <= 8; ++d) {
      for (const double expected : {1.2, 2.0, 3.5, 6.0}) {  // tokens the pass of 1 + d yields on average
        if (expected > d + 1) continue;
        const bool pays = expected / c.share(1 + d, k) > 1.0 / c.share(1, k);
        const double step_rate = (k - 1 + expected) / (fixed + per_token * (k + d)), plain_rate = k / (fixed + per_token * k);
        EXPECT_EQ(pays, step_rate > plain_rate) << fixed << " + " << per_token << "·n, draft " << d << ", " << expected;
      }
    }
  }
}

}  // namespace
}  // namespace vkllm
