// `vkllm template`: render a conversation with a chat template and print the prompt exactly.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/input_file.h"
#include "chat/template.h"
#include "commands.h"
#include "base/error.h"
#include "gguf.h"

namespace vkllm::cli {
namespace {

struct TemplateOptions {
  std::string model;
  std::string chat_template;
  std::string messages_file;
  bool no_generation_prompt = false;
  bool system_into_user = false;
  std::optional<std::string> bos, eos;
  std::string date;
};

// Parsed keeping key order, as Python's json module does.
nlohmann::ordered_json read_messages(const std::string& path) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(read_text_input(path, "the messages file"));
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": not valid JSON: " + json_error_text(e));
  }
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array()) throw Error(path + ": expected a list of messages or an object with a 'messages' list");
  for (const auto& m : j)
    if (!m.is_object() || !m.contains("role")) throw Error(path + ": every message needs a 'role'");
  return j;
}

// The text of token `key` (e.g. tokenizer.ggml.bos_token_id) in the model's vocabulary, or "".
std::string token_text(const gguf::File& f, const char* key) {
  const uint32_t id = f.get_u32_or(key, UINT32_MAX);
  if (id == UINT32_MAX || !f.find("tokenizer.ggml.tokens")) return "";
  const auto& tokens = f.get_array("tokenizer.ggml.tokens").strings;
  return id < tokens.size() ? tokens[id] : "";
}

}  // namespace

void add_template_command(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  CLI::App* cmd = app.add_subcommand("template", "Render a conversation with a chat template and print the prompt");
  cmd->add_option("-m,--model", o->model, "GGUF model whose tokenizer.chat_template and BOS/EOS to use");
  cmd->add_option("--chat-template", o->chat_template,
                  "Built-in template name (" + [] {
                    std::string s;
                    for (const auto& n : ChatTemplate::builtin_names()) s += (s.empty() ? "" : ", ") + n;
                    return s;
                  }() + ") or a Jinja/JSON file");
  cmd->add_option("--messages", o->messages_file, "JSON file: a list of {role, content} or {\"messages\": [...]}")
      ->required();
  cmd->add_flag("--no-generation-prompt", o->no_generation_prompt, "Do not open an assistant turn at the end");
  cmd->add_flag("--system-into-user", o->system_into_user,
                "Where the template has no system role, begin the next user message with the system text, as chat, run --chat and serve do");
  cmd->add_option("--bos", o->bos, "BOS token text (default: the model's)");
  cmd->add_option("--eos", o->eos, "EOS token text (default: the model's)");
  cmd->add_option("--date", o->date, "Date strftime_now formats, YYYY-MM-DD (default: today)")
      ->check(CLI::Validator(
          [](std::string& v) {
            // Exactly YYYY-MM-DD, a day the month has.
            const bool shape = v.size() == 10 && v[4] == '-' && v[7] == '-' &&
                               std::all_of(v.begin(), v.end(), [](char ch) { return ch == '-' || (ch >= '0' && ch <= '9'); });
            const int y = shape ? std::stoi(v.substr(0, 4)) : 0, m = shape ? std::stoi(v.substr(5, 2)) : 0, d = shape ? std::stoi(v.substr(8, 2)) : 0;
            const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
            const bool ok = shape && m >= 1 && m <= 12 && d >= 1 && d <= days[m - 1];
            return ok ? std::string() : "'" + v + "' is not a date YYYY-MM-DD";
          },
          "YYYY-MM-DD"));
  cmd->callback([o] {
    std::optional<gguf::File> model;
    if (!o->model.empty()) model.emplace(gguf::File::open(o->model));
    const ChatTemplate t = ChatTemplate::resolve(model ? &*model : nullptr, o->chat_template);
    ChatRenderOptions r;
    r.add_generation_prompt = !o->no_generation_prompt;
    r.bos_token = o->bos ? *o->bos : model ? token_text(*model, "tokenizer.ggml.bos_token_id") : "";
    r.eos_token = o->eos ? *o->eos : model ? token_text(*model, "tokenizer.ggml.eos_token_id") : "";
    r.date_override = o->date;
    r.system_into_user = o->system_into_user;
    const nlohmann::ordered_json messages = read_messages(o->messages_file);
    std::string prompt;
    try {
      prompt = t.render(messages, r);
    } catch (const Error& e) {
      // The template's own error (line and column in the template) with the messages it refused.
      throw Error(o->messages_file + ": " + e.what());
    }
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  });
}

}  // namespace vkllm::cli
