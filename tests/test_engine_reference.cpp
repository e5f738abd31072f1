// End to end: the engine's logits and greedy tokens against llama.cpp / llama2.c reference
// outputs (../shared/reference), for every case in index.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "test_support.h"
#include "vk_test_env.h"

using namespace vkllm;
using nlohmann::json;

namespace {

int argmax(const float* x, size_t n) { return int(std::max_element(x, x + n) - x); }

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

std::vector<std::string> reference_cases() {
  std::vector<std::string> ids;
  if (!test::shared_exists("reference/index.json")) return {"missing-index"};
  std::ifstream in(test::shared_path("reference/index.json"));
  const json index = json::parse(in);
  for (const auto& [k, v] : index.items()) ids.push_back(k);
  return ids;
}

INSTANTIATE_TEST_SUITE_P(AllCases, EngineReference, ::testing::ValuesIn(reference_cases()), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
});

}  // namespace
