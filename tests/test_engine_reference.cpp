// End to end: the engine's logits and greedy tokens against llama.cpp / llama2.c reference
// outputs (../shared/reference), for every case in index.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/perplexity.h"
#include "test_support.h"
#include "vk_test_env.h"

using namespace vkllm;
using nlohmann::json;

namespace {

int argmax(const float* x, size_t n) { return int(std::max_element(x, x + n) - x); }

// Token ids drawn uniformly from a vocabulary, from a seeded generator.
class RandomTokens {
 public:
  RandomTokens(uint32_t seed, uint32_t n_vocab) : rng_(seed), n_vocab_(n_vocab) {}
  std::vector<int32_t> operator()(size_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = int32_t(rng_() % n_vocab_);
    return t;
  }

 private:
  std::mt19937 rng_;
  uint32_t n_vocab_;
};

class EngineReference : public test::VulkanTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(EngineReference, LogitsAndGreedyMatch) {
  const std::string id = GetParam();
  const std::string ref_rel = "reference/" + id + ".json";
  VKLLM_REQUIRE_SHARED(ref_rel);
  std::ifstream in(test::shared_path(ref_rel));
  const json ref = json::parse(in);
  std::ifstream idx_in(test::shared_path("reference/index.json"));
  const json index = json::parse(idx_in)[id];
  const std::string model_rel = "models/" + ref["model_file"].get<std::string>();
  VKLLM_REQUIRE_SHARED(model_rel);

  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  const Model model(test::vk(), file);
  const uint32_t n_vocab = model.config().n_vocab;
  const std::vector<int32_t> prompt = ref["prompt_tokens"].get<std::vector<int32_t>>();
  EngineOptions o;
  o.cache.capacity = uint32_t(prompt.size() + 80);
  o.n_ubatch = 64;  // exercise chunked prefill on the longer prompts
  Engine engine(test::vk(), test::pipelines(), model, o);
  // The memory plan printed before loading is what the engine then allocates.
  const MemoryPlan plan = plan_memory(test::vk(), model.config(), model.weight_bytes(), o);
  EXPECT_EQ(plan.kv_cache, engine.cache().device_bytes());
  EXPECT_EQ(plan.activations, engine.activation_bytes());

  // Prompt logits: top-1 agreement over the prompt positions, and the last position's logits.
  const std::vector<float> logits = engine.decode(prompt, LogitsMode::All);
  ASSERT_EQ(logits.size(), prompt.size() * n_vocab);
  const json& topk = ref["prompt_topk"];
  int agree = 0;
  for (size_t i = 0; i < prompt.size(); ++i) agree += argmax(&logits[i * n_vocab], n_vocab) == topk[i][0][0].get<int>();
  const double agreement = double(agree) / double(prompt.size());
  EXPECT_GE(agreement, index["ideal_top1_agreement"].get<double>() - 0.05);
  const std::vector<float> last = ref["last_logits"].get<std::vector<float>>();
  const std::vector<float> ideal = ref["ideal_last_logits"].get<std::vector<float>>();
  double max_d = 0, max_d_ideal = 0;
  for (uint32_t v = 0; v < n_vocab; ++v) {
    max_d = std::max(max_d, double(std::abs(logits[(prompt.size() - 1) * n_vocab + v] - last[v])));
    max_d_ideal = std::max(max_d_ideal, double(std::abs(logits[(prompt.size() - 1) * n_vocab + v] - ideal[v])));
  }
  EXPECT_LE(max_d, 1.5 * index["ideal_max_dlogit_last"].get<double>() + 0.05) << "vs ideal: " << max_d_ideal;
  RecordProperty("max_dlogit_last", std::to_string(max_d));
  RecordProperty("max_dlogit_ideal", std::to_string(max_d_ideal));

  // Greedy decode, one token per step, up to the decided prefix.
  const std::vector<int32_t> greedy = ref["greedy"].get<std::vector<int32_t>>();
  const int decided = index["decided_prefix"].get<int>();
  int next = argmax(&logits[(prompt.size() - 1) * n_vocab], n_vocab);
  for (int s = 0; s < decided; ++s) {
    ASSERT_EQ(next, greedy[s]) << "greedy step " << s << " of " << decided << " decided";
    const int32_t tok = next;
    const std::vector<float>& l = engine.decode(std::span(&tok, 1), LogitsMode::Last);
    next = argmax(l.data(), n_vocab);
  }
}

// The rotated copy of K (CPU drivers, f16 K; docs/kv-cache.md): an engine that keeps it gives the
// logits of one that rotates K as it reads it, through a prefill over ≥ 256 slots, a ring that
// wraps (evictions shift the window's positions, pinned tokens keep theirs), a rebase of the copy
// (its shift reaching the capacity) and a restore of the rows (the copy rebuilt from the cache).
using EngineRotatedK = test::VulkanTest;

TEST_F(EngineRotatedK, RotatedCopyOfKGivesTheLogitsOfRopeOnRead) {
  const std::string model_rel = "models/synth-llama-f16.gguf";
  VKLLM_REQUIRE_SHARED(model_rel);
  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  const Model model(test::vk(), file);
  const ModelConfig& c = model.config();
  if (!decode_kernels_fit(test::vk(), AttentionShape{c.n_head, c.n_head_kv, c.head_dim}, 300))
    GTEST_SKIP() << test::vk().info().name << " runs no attention_decode.comp for this model";
  EngineOptions o;
  o.cache.capacity = 300;
  o.n_ubatch = 64;
  Engine with(test::vk(), test::pipelines(), model, o);
  o.rotated_k = false;
  Engine without(test::vk(), test::pipelines(), model, o);
  ASSERT_NE(with.cache().k_rotated(0), nullptr);
  ASSERT_EQ(without.cache().k_rotated(0), nullptr);
  for (Engine* e : {&with, &without}) e->cache().set_keep(4);
  RandomTokens random_tokens(7, c.n_vocab);
  double worst = 0;
  auto compare = [&](std::span<const int32_t> tokens, const char* what, int step) {
    const std::vector<float> a = with.decode(tokens, LogitsMode::Last);
    const std::vector<float> b = without.decode(tokens, LogitsMode::Last);
    ASSERT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
    worst = std::max(worst, d);
    EXPECT_LE(d, 0.02) << what << " step " << step;
    EXPECT_EQ(argmax(a.data(), a.size()), argmax(b.data(), b.size())) << what << " step " << step;
  };
  compare(random_tokens(280), "prefill", 0);
  // Past the capacity: 20 tokens to fill it, then ≥ 300 evictions (a rebase at the 300th).
  for (int s = 0; s < 340; ++s) compare(random_tokens(1), "decode", s);
  ASSERT_EQ(with.cache().evicted(), 320u);
  // The copy was rebased at the 300th eviction: the window's shift is the 20 evictions since.
  std::vector<int32_t> rot;
  EXPECT_EQ(with.cache().rotation_list(rot), 4u);
  EXPECT_EQ(rot[4] - 4, 20);
  // A chunk that evicts its own predecessors, then a truncation.
  compare(random_tokens(40), "evicting chunk", 0);
  for (Engine* e : {&with, &without}) e->cache().truncate(e->cache().used() - 10);
  for (int s = 0; s < 5; ++s) compare(random_tokens(1), "after truncate", s);
  // Restore both from the rows and go on: the copy is rebuilt from the restored cache.
  const std::vector<int32_t> toks = with.cache().tokens();
  const std::vector<uint8_t> rows = with.cache().read_rows(with.cache().used());
  for (Engine* e : {&with, &without}) ASSERT_TRUE(e->cache().restore(toks, 4, with.cache().evicted(), rows));
  for (int s = 0; s < 20; ++s) compare(random_tokens(1), "after restore", s);
  RecordProperty("max_dlogit", std::to_string(worst));
  std::cout << "largest logit difference: " << worst << "\n";
  // A capacity whose doubled rope table one dispatch cannot fill (a workgroup row per position)
  // keeps no copy, and decodes.
  o.rotated_k = true;
  o.cache.capacity = 40000;
  Engine big(test::vk(), test::pipelines(), model, o);
  EXPECT_EQ(big.cache().k_rotated(0) != nullptr, 80000 <= test::vk().limits().maxComputeWorkGroupCount[1]);
  EXPECT_EQ(big.decode(random_tokens(3), LogitsMode::Last).size(), c.n_vocab);
}

// A decode step of several sequences (decode_batch, as the server runs them): every sequence's
// logits are bit for bit those it gets in a step of its own (as the server decodes a lone
// sequence), over caches of different lengths, with more sequences than one batched dispatch takes
// (k_batch_seqs), with and without the rotated copy of K;
// on a device that takes them, the K/V stores and the attention ran batched. One sequence grows
// past 256 slots, where its attention (attention_decode.comp on CPU drivers) reads the rotated
// copy's rows that the batched steps stored.
using EngineBatch = test::VulkanTest;

TEST_F(EngineBatch, DecodeStepOfSeveralSequencesGivesEachItsLogitsAlone) {
  const std::string model_rel = "models/synth-llama-q4_0.gguf";
  VKLLM_REQUIRE_SHARED(model_rel);
  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  const Model model(test::vk(), file);
  const ModelConfig& c = model.config();
  RandomTokens random_tokens(11, c.n_vocab);
  const AttentionShape shape{c.n_head, c.n_head_kv, c.head_dim};
  RopeConfig rope;
  rope.head_dim = c.head_dim;
  rope.n_rot = c.n_rot;
  const bool batched_here = batch_attention_fits(test::vk(), CacheType::F16, CacheType::F16, shape, rope, 200);
  const bool cpu_driver = test::vk().info().type == "cpu";
  for (const bool rotated : {true, false}) {
    EngineOptions o;
    o.cache.capacity = 300;
    o.rotated_k = rotated;
    o.profile = true;
    constexpr size_t kSeqs = k_batch_seqs + 2;
    std::vector<std::unique_ptr<Engine>> batch, alone, run;
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < kSeqs; ++i) {
      prompts.push_back(random_tokens(i + 1 < kSeqs ? 3 + 29 * i : 250));
      for (auto* list : {&batch, &alone, &run}) {
        if (list == &run && !cpu_driver) continue;
        list->push_back(std::make_unique<Engine>(test::vk(), test::pipelines(), model, o));
        list->back()->decode(prompts[i], LogitsMode::Last);
      }
    }
    std::vector<Engine*> seqs;
    for (auto& e : batch) seqs.push_back(e.get());
    ASSERT_TRUE(seqs[0]->can_decode_batch(seqs));
    EXPECT_EQ(seqs[0]->cache().k_rotated(0) != nullptr, rotated && decode_kernels_fit(test::vk(), shape, o.cache.capacity));
    for (int step = 0; step < 10; ++step) {
      const std::vector<int32_t> tokens = random_tokens(kSeqs);
      const std::vector<float> together = seqs[0]->decode_batch(seqs, tokens);
      ASSERT_EQ(together.size(), kSeqs * c.n_vocab);
      for (size_t i = 0; i < kSeqs; ++i) {
        Engine* const self = alone[i].get();
        const std::vector<float> one = self->decode_batch(std::span(&self, 1), std::span(&tokens[i], 1));
        ASSERT_EQ(one.size(), c.n_vocab);
        size_t differ = 0;
        for (uint32_t v = 0; v < c.n_vocab; ++v) differ += one[v] != together[i * c.n_vocab + v];
        EXPECT_EQ(differ, 0u) << "sequence " << i << " step " << step << (rotated ? " (rotated copy of K)" : "");
        // `vkllm run`'s decode step: the same arithmetic on CPU drivers (matvec_simd's columns); on
        // GPUs its lone matvec is a specialization of its own (docs/server.md), not compared.
        if (cpu_driver) {
          EXPECT_EQ(run[i]->decode(std::span(&tokens[i], 1), LogitsMode::Last), one)
              << "sequence " << i << " step " << step << ": its step differs from decode()";
        }
      }
    }
    const auto& t = seqs[0]->timings();
    const bool ran_batched = std::any_of(t.begin(), t.end(), [](const DispatchTiming& d) { return d.label == "attention_lanes_f16_batch"; });
    EXPECT_EQ(ran_batched, batched_here) << test::vk().info().name;
  }
}

// A pass of several sequences with several tokens each (the server's batched step where sequences
// speculate: each runs its sampled token and a draft): every token's logits are bit for bit what
// the token gets in a one-token step of its sequence alone, for the kernels a CPU driver picks and
// for the GPUs' tiled kernel, over caches of different lengths (one past 256 slots), and a pass
// of one token per sequence is still the batched step.
TEST_F(EngineBatch, VerifyPassesOfSeveralSequencesGiveEachTokenItsLogitsAlone) {
  const std::string model_rel = "models/synth-llama-q4_0.gguf";
  VKLLM_REQUIRE_SHARED(model_rel);
  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  const Model model(test::vk(), file);
  const ModelConfig& c = model.config();
  RandomTokens random_tokens(12, c.n_vocab);
  for (const AttentionKernel kernel : {AttentionKernel::Auto, AttentionKernel::Tiled}) {
    EngineOptions o;
    o.cache.capacity = 320;
    o.attention = kernel;
    constexpr size_t kSeqs = 4;
    std::vector<std::unique_ptr<Engine>> batch, alone;
    for (size_t i = 0; i < kSeqs; ++i) {
      const std::vector<int32_t> prompt = random_tokens(i + 1 < kSeqs ? 5 + 40 * i : 250);
      for (auto* list : {&batch, &alone}) {
        list->push_back(std::make_unique<Engine>(test::vk(), test::pipelines(), model, o));
        list->back()->decode(prompt, LogitsMode::Last);
      }
    }
    std::vector<Engine*> seqs;
    for (auto& e : batch) seqs.push_back(e.get());
    const std::vector<std::vector<uint32_t>> steps = {{1, 4, 2, 1}, {5, 1, 1, 3}, {1, 1, 1, 1}, {2, 6, 3, 4}};
    for (size_t step = 0; step < steps.size(); ++step) {
      const std::vector<uint32_t>& counts = steps[step];
      std::vector<int32_t> tokens;
      for (uint32_t n : counts) {
        const std::vector<int32_t> t = random_tokens(n);
        tokens.insert(tokens.end(), t.begin(), t.end());
      }
      ASSERT_TRUE(seqs[0]->can_decode_batch(seqs, counts));
      const std::vector<float> together = seqs[0]->decode_batch(seqs, tokens, counts);
      ASSERT_EQ(together.size(), tokens.size() * c.n_vocab);
      size_t row = 0;
      for (size_t i = 0; i < kSeqs; ++i) {
        Engine* const self = alone[i].get();
        for (uint32_t j = 0; j < counts[i]; ++j, ++row) {
          const std::vector<float> one = self->decode_batch(std::span(&self, 1), std::span(&tokens[row], 1));
          size_t differ = 0;
          for (uint32_t v = 0; v < c.n_vocab; ++v) differ += one[v] != together[row * c.n_vocab + v];
          EXPECT_EQ(differ, 0u) << "sequence " << i << " token " << j << " of pass " << step << " ("
                                << (kernel == AttentionKernel::Tiled ? "tiled" : "auto") << ")";
        }
      }
    }
    // More tokens than one pass holds (each sequence's within its own), a sequence's count past
    // its own pass, none, or a count missing are refused.
    const uint32_t most = seqs[0]->max_batch_tokens() + 1;
    std::vector<uint32_t> over(kSeqs, most / kSeqs);
    over[0] += most % kSeqs;
    ASSERT_LE(over[0], seqs[0]->max_chunk(true));
    EXPECT_FALSE(seqs[0]->can_decode_batch(seqs, over));
    over.assign(kSeqs, 1);
    over[1] = seqs[1]->max_chunk(true) + 1;
    EXPECT_FALSE(seqs[0]->can_decode_batch(seqs, over));
    EXPECT_FALSE(seqs[0]->can_decode_batch(seqs, std::vector<uint32_t>{1, 0, 1, 1}));
    EXPECT_FALSE(seqs[0]->can_decode_batch(seqs, std::vector<uint32_t>{1, 1, 1}));
  }
}

std::vector<std::string> reference_cases() {
  std::vector<std::string> ids;
  if (!test::shared_exists("reference/index.json")) return {"missing-index"};
  std::ifstream in(test::shared_path("reference/index.json"));
  const json index = json::parse(in);
  for (const auto& [k, v] : index.items()) ids.push_back(k);
  return ids;
}

// A model load with a Pipelines to prepare starts the projections' kernels (matvec_simd on CPU
// drivers) while the weights upload, and they are all the engine then takes: a prefill and decode
// steps on one sequence and on several ask for no matvec_simd kernel it did not prepare. And the
// logits are those of a load that prepared nothing.
using EnginePrepare = test::VulkanTest;

TEST_F(EnginePrepare, ModelLoadPreparesTheKernelsTheEngineTakes) {
  const std::string model_rel = "models/synth-llama-q4_0.gguf";
  VKLLM_REQUIRE_SHARED(model_rel);
  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  Pipelines pipes(test::vk(), "");
  const Model model(test::vk(), file, {}, &pipes);
  pipes.wait_prepared();
  auto simd_kernels = [&] {
    std::vector<std::string> keys;
    for (const std::string& k : pipes.made())
      if (k.rfind("matvec_simd_", 0) == 0) keys.push_back(k);
    return keys;
  };
  const std::vector<std::string> prepared = simd_kernels();
  EXPECT_EQ(prepared.empty(), test::vk().info().type != "cpu");

  EngineOptions o;
  o.cache.capacity = 64;
  const std::vector<int32_t> prompt{1, 15, 27, 300, 41, 5, 9};
  Engine a(test::vk(), pipes, model, o), b(test::vk(), pipes, model, o);
  const std::vector<float> logits = a.decode(prompt, LogitsMode::Last);
  b.decode(prompt, LogitsMode::Last);
  a.decode(std::vector<int32_t>{7}, LogitsMode::Last);
  std::vector<Engine*> both{&a, &b};
  if (a.can_decode_batch(both)) a.decode_batch(both, std::vector<int32_t>{3, 4});
  EXPECT_EQ(simd_kernels(), prepared);

  const Model plain(test::vk(), file);
  Engine c(test::vk(), test::pipelines(), plain, o);
  EXPECT_EQ(c.decode(prompt, LogitsMode::Last), logits);
}

// A load told which kernels its run takes prepares only those: a streamed perplexity's one-column
// kernels, then runs token by token without making any other matvec_simd kernel.
TEST_F(EnginePrepare, ModelLoadPreparesOnlyTheKernelsOfItsUse) {
  const std::string model_rel = "models/synth-llama-q4_0.gguf";
  VKLLM_REQUIRE_SHARED(model_rel);
  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  Pipelines all(test::vk(), ""), single(test::vk(), "");
  const Model full(test::vk(), file, {}, &all);
  const Model model(test::vk(), file, {}, &single, MatmulUse{.one_column = true, .columns = false});
  all.wait_prepared();
  single.wait_prepared();
  if (test::vk().info().type != "cpu") GTEST_SKIP() << "only CPU drivers prepare kernels";
  ASSERT_EQ(single.made().size() * 2, all.made().size());
  EngineOptions o;
  o.cache.capacity = 64;
  Engine engine(test::vk(), single, model, o);
  const auto simd_kernels = [&] {
    std::vector<std::string> keys;
    for (const std::string& k : single.made())
      if (k.rfind("matvec_simd_", 0) == 0) keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    return keys;
  };
  const std::vector<std::string> prepared = simd_kernels();
  for (int32_t t : {1, 15, 27}) engine.decode(std::vector<int32_t>{t}, LogitsMode::AllLogProbs);
  EXPECT_EQ(simd_kernels(), prepared);
}

// Both perplexity modes report, with their progress, the estimate over the tokens scored so far
// (llama-perplexity's per-chunk figures): one report per chunk, and the last is the result.
using EnginePerplexity = test::VulkanTest;

TEST_F(EnginePerplexity, ProgressCarriesTheRunningEstimate) {
  const std::string model_rel = "models/stories260K.gguf";
  VKLLM_REQUIRE_SHARED(model_rel);
  const gguf::File file = gguf::File::open(test::shared_path(model_rel));
  const Model model(test::vk(), file);
  EngineOptions o;
  o.cache.capacity = 32;
  Engine engine(test::vk(), test::pipelines(), model, o);
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(100);
  for (int32_t& t : tokens) t = int32_t(rng() % model.config().n_vocab);
  tokens[0] = 1;

  struct Report {
    uint64_t done, total;
    double estimate;
  };
  std::vector<Report> reports;
  const auto record = [&](uint64_t done, uint64_t total, double estimate) { reports.push_back({done, total, estimate}); };
  const PerplexityResult chunked = perplexity_chunked(engine, tokens, 32, 1, record);
  ASSERT_EQ(reports.size(), 3u);  // 100 tokens: three chunks of 32
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].done, i + 1);
    EXPECT_EQ(reports[i].total, 3u);
    EXPECT_TRUE(std::isfinite(reports[i].estimate) && reports[i].estimate > 1.0) << reports[i].estimate;
  }
  EXPECT_NE(reports[0].estimate, reports[2].estimate);  // each chunk moves it
  EXPECT_EQ(reports.back().estimate, chunked.perplexity);

  reports.clear();
  const PerplexityResult streamed = perplexity_stream(engine, tokens, 1, record);
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().done, reports.back().total);
  EXPECT_EQ(reports.back().estimate, streamed.perplexity);
}

INSTANTIATE_TEST_SUITE_P(AllCases, EngineReference, ::testing::ValuesIn(reference_cases()), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
});

}  // namespace
