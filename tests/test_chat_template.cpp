// Chat templates: every shared test vector renders byte-identical to Jinja2's output, the
// unrendered templates render without error, and unit tests pin down tricky Jinja semantics.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_template.h"
#include "error.h"
#include "test_support.h"

namespace vkllm {
namespace {

using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChatRenderOptions options_of(const json& c) {
  ChatRenderOptions o;
  o.add_generation_prompt = c.value("add_generation_prompt", true);
  o.bos_token = c.value("bos_token", "");
  o.eos_token = c.value("eos_token", "");
  o.date_override = "2026-01-15";
  return o;
}

TEST(ChatTemplateVectors, AllCasesRenderByteIdentical) {
  VKLLM_REQUIRE_SHARED("templates/README.md");
  int total = 0, passed = 0;
  for (const std::string& path : test::shared_files("templates", ".json")) {
    const json doc = json::parse(read_text(path));
    ChatTemplate t;
    try {
      t = ChatTemplate::from_source(doc.at("template").get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << path << ": " << e.what();
      total += static_cast<int>(doc.at("cases").size());
      continue;
    }
    for (const json& c : doc.at("cases")) {
      ++total;
      try {
        const std::string got = t.render(c.at("messages"), options_of(c));
        if (got == c.at("expected").get<std::string>()) ++passed;
        else ADD_FAILURE() << path << " case " << c.value("case", "?") << " gen=" << c.value("add_generation_prompt", true)
                           << "\n--- expected ---\n" << c.at("expected").get<std::string>() << "\n--- got ---\n" << got;
      } catch (const Error& e) {
        ADD_FAILURE() << path << " case " << c.value("case", "?") << ": " << e.what();
      }
    }
  }
  std::printf("chat template vectors: %d / %d byte-identical\n", passed, total);
  EXPECT_GT(total, 0);
  EXPECT_EQ(passed, total);
}

}  // namespace
}  // namespace vkllm
