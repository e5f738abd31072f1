// Chat templates: parsing, the Hugging Face rendering globals, built-in templates, and
// resolution from flags or the GGUF file.
#include "chat/template.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "base/ascii.h"
#include "base/error.h"
#include "base/input_file.h"
#include "gguf.h"
#include "jinja/eval.h"
#include "jinja/parser.h"

namespace vkllm {
namespace {

using jinja::CallArgs;
using jinja::Value;

struct Builtin {
  const char* name;
  const char* source;
};

// Each follows its model family's published template for plain user/assistant/system turns.
const Builtin k_builtins[] = {
    {"chatml",
     "{%- for message in messages -%}\n"
     "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"},
    {"gemma",
     "{{- bos_token -}}\n"
     "{%- set ns = namespace(system='') -%}\n"
     "{%- for message in messages -%}\n"
     "{%- if message['role'] == 'system' -%}{%- set ns.system = message['content'] + '\\n\\n' -%}\n"
     "{%- else -%}\n"
     "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
     "{{- '<start_of_turn>' + role + '\\n' + ns.system + message['content'] | trim + '<end_of_turn>\\n' -}}\n"
     "{%- set ns.system = '' -%}\n"
     "{%- endif -%}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n"},
    {"llama2",
     "{%- set ns = namespace(system='') -%}\n"
     "{%- for message in messages -%}\n"
     "{%- if message['role'] == 'system' -%}{%- set ns.system = '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' -%}\n"
     "{%- elif message['role'] == 'user' -%}\n"
     "{{- bos_token + '[INST] ' + ns.system + message['content'] | trim + ' [/INST]' -}}\n"
     "{%- set ns.system = '' -%}\n"
     "{%- elif message['role'] == 'assistant' -%}{{- ' ' + message['content'] | trim + ' ' + eos_token -}}\n"
     "{%- else -%}{{- raise_exception('llama2 renders system, user and assistant messages, not ' + message['role']) -}}\n"
     "{%- endif -%}\n"
     "{%- endfor -%}\n"},
    {"llama3",
     "{{- bos_token -}}\n"
     "{%- for message in messages -%}\n"
     "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
     "'<|eot_id|>' -}}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n"},
    {"mistral",
     "{{- bos_token -}}\n"
     "{%- set ns = namespace(system='') -%}\n"
     "{%- for message in messages -%}\n"
     "{%- if message['role'] == 'system' -%}{%- set ns.system = message['content'] + '\\n\\n' -%}\n"
     "{%- elif message['role'] == 'user' -%}{{- '[INST] ' + ns.system + message['content'] + ' [/INST]' -}}\n"
     "{%- set ns.system = '' -%}\n"
     "{%- elif message['role'] == 'assistant' -%}{{- message['content'] + eos_token -}}\n"
     "{%- else -%}{{- raise_exception('mistral renders system, user and assistant messages, not ' + message['role']) -}}\n"
     "{%- endif -%}\n"
     "{%- endfor -%}\n"},
    {"phi3",
     "{%- for message in messages -%}\n"
     "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}\n"},
    {"zephyr",
     "{%- for message in messages -%}\n"
     "{{- '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' -}}\n"
     "{%- endfor -%}\n"
     "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}\n"},
};

// The date strftime_now formats: date_override ("YYYY-MM-DD") at midnight, or now.
std::tm render_date(const std::string& date_override) {
  std::tm tm{};
  if (date_override.empty()) {
    const std::time_t now = std::time(nullptr);
    localtime_r(&now, &tm);
    return tm;
  }
  int y = 0, m = 0, d = 0;
  if (std::sscanf(date_override.c_str(), "%d-%d-%d", &y, &m, &d) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
    throw Error("chat template: date '" + date_override + "' is not YYYY-MM-DD");
  tm.tm_year = y - 1900;
  tm.tm_mon = m - 1;
  tm.tm_mday = d;
  const std::time_t t = timegm(&tm);  // fills tm_wday and tm_yday
  gmtime_r(&t, &tm);
  return tm;
}

Value make_range() {
  return Value::callable(
      [](CallArgs& a) -> Value {
        int64_t start = 0, stop = 0, step = 1;
        for (const Value& v : a.args)
          if (v.kind() != jinja::Kind::Int && v.kind() != jinja::Kind::Bool)
            throw Error("range() needs integers, got " + v.type_name());
        if (a.args.size() == 1) stop = a.args[0].as_int();
        else if (a.args.size() == 2 || a.args.size() == 3) {
          start = a.args[0].as_int();
          stop = a.args[1].as_int();
          if (a.args.size() == 3) step = a.args[2].as_int();
        } else {
          throw Error("range() takes 1 to 3 arguments");
        }
        if (step == 0) throw Error("range() arg 3 must not be zero");
        jinja::ValueList out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (out.size() >= 100'000) throw Error("range() is longer than 100000 items");
          out.emplace_back(i);
        }
        return Value::list(std::move(out));
      },
      "range");
}

Value make_namespace() {
  return Value::callable(
      [](CallArgs& a) -> Value {
        // Built whole (a later keyword replacing a dict's key), so its depth counts what it holds.
        jinja::ValueDict attrs;
        const auto put = [&](const Value& k, const Value& v) {
          const auto at = std::find_if(attrs.begin(), attrs.end(), [&](const auto& e) { return e.first == k; });
          if (at != attrs.end()) at->second = v;
          else attrs.emplace_back(k, v);
        };
        for (const Value& v : a.args) {
          if (!v.is_mapping()) throw Error("namespace() takes keyword arguments or a dict");
          for (const auto& [k, e] : v.entries()) put(k, e);
        }
        for (auto& [k, v] : a.kwargs) put(Value(k), v);
        return Value::namespace_(std::move(attrs));
      },
      "namespace");
}

}  // namespace

ChatTemplate ChatTemplate::from_source(std::string source) {
  ChatTemplate t;
  try {
    auto p = std::make_shared<jinja::Program>(jinja::parse_template(source, jinja::LexOptions{}));
    jinja::check_program(*p);
    t.program_ = std::move(p);
  } catch (const Error& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
  t.source_ = std::make_shared<const std::string>(source);
  // A system text no template prints by itself, after which a user message follows.
  const std::string probe = "vkllm-system-probe-7f3a";
  const nlohmann::ordered_json msgs = {{{"role", "system"}, {"content", probe}}, {{"role", "user"}, {"content", "Hi"}}};
  try {
    t.system_role_ = t.render(msgs, ChatRenderOptions{}).find(probe) != std::string::npos;
  } catch (const Error&) {
    t.system_role_ = false;  // raise_exception("System role not supported") and the like
  }
  return t;
}

std::vector<std::string> ChatTemplate::builtin_names() {
  std::vector<std::string> names;
  for (const Builtin& b : k_builtins) names.emplace_back(b.name);
  return names;
}

ChatTemplate ChatTemplate::builtin(std::string_view name) {
  for (const Builtin& b : k_builtins)
    if (name == b.name) return from_source(b.source);
  std::string list;
  for (const Builtin& b : k_builtins) list += std::string(list.empty() ? "" : ", ") + b.name;
  throw Error("unknown chat template '" + std::string(name) + "'; built-in templates: " + list);
}

ChatTemplate ChatTemplate::resolve(const gguf::File* model, const std::string& name_or_file) {
  if (!name_or_file.empty()) {
    const auto names = builtin_names();
    if (std::find(names.begin(), names.end(), name_or_file) != names.end()) return builtin(name_or_file);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(name_or_file, ec)) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw Error("--chat-template '" + name_or_file + "' is neither a built-in template (" + list +
                  ") nor a readable file");
    }
    std::string text = read_text_input(name_or_file, "the chat template file");
    if (ascii_lower(std::filesystem::path(name_or_file).extension().string()) == ".json") {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text);
      } catch (const nlohmann::json::parse_error& e) {
        throw Error(name_or_file + ": not valid JSON: " + json_error_text(e));
      }
      if (!j.is_object()) throw Error(name_or_file + ": not a JSON object (a tokenizer_config.json is one)");
      for (const char* key : {"chat_template", "template"}) {
        if (!j.contains(key)) continue;
        if (j[key].is_string()) return from_source(j[key].get<std::string>());
        // A list of named templates (Hermes, Command-R: "default", "tool_use", …): Hugging Face
        // renders with the one named "default".
        if (j[key].is_array()) {
          std::string names;
          for (const auto& t : j[key]) {
            if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
            if (t["name"] == "default" && t.contains("template") && t["template"].is_string())
              return from_source(t["template"].get<std::string>());
            names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
          }
          throw Error(name_or_file + ": '" + key + "' is a list of named templates with no 'default' one (" + names + ")");
        }
      }
      throw Error(name_or_file + ": no 'chat_template' or 'template' field holding a template");
    }
    try {
      return from_source(std::move(text));
    } catch (const Error& e) {
      throw Error(name_or_file + ": " + e.what());
    }
  }
  if (model) {
    std::string src = model->get_string_or("tokenizer.chat_template", "");
    if (!src.empty()) {
      try {
        return from_source(std::move(src));
      } catch (const Error& e) {
        throw Error(model->path() + ": tokenizer.chat_template: " + e.what());
      }
    }
  }
  return builtin("chatml");
}

namespace {

// The messages with each run of system messages' text moved into the user message after it
// ("system\nuser"), or into a user message of its own where another role, or nothing, follows.
template <class Json>
Json system_into_user(const Json& messages) {
  const auto text_of = [](const Json& m, const char* role) -> const std::string* {
    if (!m.is_object() || !m.contains("role") || m["role"] != role || !m.contains("content") || !m["content"].is_string()) return nullptr;
    return &m["content"].template get_ref<const std::string&>();
  };
  Json out = Json::array();
  std::string pending;
  const auto flush = [&] {
    if (!pending.empty()) out.push_back({{"role", "user"}, {"content", pending}});
    pending.clear();
  };
  for (const Json& m : messages) {
    if (const std::string* sys = text_of(m, "system")) {
      if (!sys->empty()) pending += (pending.empty() ? "" : "\n") + *sys;
    } else if (const std::string* user = text_of(m, "user"); user && !pending.empty()) {
      Json joined = m;
      joined["content"] = pending + (user->empty() ? "" : "\n" + *user);
      out.push_back(std::move(joined));
      pending.clear();
    } else {
      flush();
      out.push_back(m);
    }
  }
  flush();
  return out;
}

}  // namespace

template <class Json>
std::string ChatTemplate::render_json(const Json& messages, const ChatRenderOptions& o) const {
  if (!messages.is_array()) throw Error("chat template: messages must be a JSON list");
  if (o.system_into_user && !system_role_) return render_value(Value::from_json(system_into_user(messages)), o);
  return render_value(Value::from_json(messages), o);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const ChatRenderOptions& o) const { return render_json(messages, o); }

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& o) const {
  return render_json(messages, o);
}

std::string ChatTemplate::render_value(const Value& messages, const ChatRenderOptions& o) const {
  VKLLM_CHECK(program_ != nullptr, "ChatTemplate used before from_source/builtin/resolve");
  const std::tm date = render_date(o.date_override);
  std::vector<std::pair<std::string, Value>> globals = {
      {"messages", messages},
      {"add_generation_prompt", Value(o.add_generation_prompt)},
      {"bos_token", Value(o.bos_token)},
      {"eos_token", Value(o.eos_token)},
      {"range", make_range()},
      {"namespace", make_namespace()},
      {"dict", Value::callable(
                   [](CallArgs& a) -> Value {
                     Value d = Value::dict();
                     for (auto& [k, v] : a.kwargs) d.set(Value(k), v);
                     return d;
                   },
                   "dict")},
      {"raise_exception", Value::callable(
                              [](CallArgs& a) -> Value {
                                throw Error("raise_exception: " + (a.args.empty() ? std::string() : a.args[0].to_str()));
                              },
                              "raise_exception")},
      {"strftime_now", Value::callable(
                           [date](CallArgs& a) -> Value {
                             if (a.args.empty() || !a.args[0].is_string()) throw Error("strftime_now() needs a format string");
                             char buf[256];
                             const size_t n = std::strftime(buf, sizeof buf, a.args[0].str().c_str(), &date);
                             return Value(std::string(buf, n));
                           },
                           "strftime_now")},
  };
  try {
    return jinja::render_program(*program_, globals, jinja::RenderLimits{});
  } catch (const Error& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
}

size_t common_prefix_length(std::string_view a, std::string_view b) {
  const auto m = std::mismatch(a.begin(), a.begin() + static_cast<long>(std::min(a.size(), b.size())), b.begin());
  return static_cast<size_t>(m.first - a.begin());
}

}  // namespace vkllm
