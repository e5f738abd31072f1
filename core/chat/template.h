// Chat templates: a model's Jinja chat template (or a built-in one) rendered exactly as Hugging
// Face's apply_chat_template renders it with Jinja2 (trim_blocks, lstrip_blocks, loopcontrols,
// tojson with ensure_ascii=False, raise_exception, strftime_now).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gguf {
class File;
}

namespace vkllm {

namespace jinja {
struct Program;
class Value;
}

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  std::string date_override;  // "YYYY-MM-DD" for strftime_now; "" = today (local time)
  // For a template that has no system role (it raises on a system message, as Gemma 2's does, or
  // drops it): the system messages' text begins the next user message instead, joined by "\n"
  // (a user message of its own where none follows), as llama.cpp's templates do. Off, the
  // messages reach the template as given (Hugging Face's apply_chat_template, `vkllm template`).
  bool system_into_user = false;
};

// A rendered prompt and the byte ranges [begin, end) of it that came from message content
// (user- or model-controlled text), in order. The caller tokenizes those ranges as plain text,
// so content such as "<|im_end|>" never becomes a special token.
struct RenderedPrompt {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content_spans;
};

// Cheap to copy (the parsed template is shared and immutable; render may run concurrently).
// A default-constructed one must be assigned from one of the factories before rendering.
class ChatTemplate {
 public:
  // Parse errors → vkllm::Error("chat template: line L, column C: …").
  static ChatTemplate from_source(std::string source);
  // A built-in template by name; an unknown name → Error listing the names.
  static ChatTemplate builtin(std::string_view name);
  static std::vector<std::string> builtin_names();
  // From --chat-template NAME|FILE (a built-in name, a Jinja file, or a JSON file holding
  // "chat_template" or "template"), else the GGUF's tokenizer.chat_template, else chatml.
  static ChatTemplate resolve(const gguf::File* model, const std::string& name_or_file);

  // messages: a JSON list of {"role", "content", …} objects. Template errors (including
  // raise_exception) → Error naming the template line and column.
  std::string render(const nlohmann::json& messages, const ChatRenderOptions& o) const;
  // The same; objects keep their key order (what templates see when iterating a message or
  // applying tojson to it), as with Python dicts.
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& o) const;
  // Renders and locates the message content in the result; see RenderedPrompt.
  RenderedPrompt render_with_spans(const nlohmann::ordered_json& messages, const ChatRenderOptions& o) const;

  // Whether a system message reaches the rendered text (probed once, when the template is made:
  // a system message and a user message rendered, the system text looked for).
  bool has_system_role() const { return system_role_; }
  // The Jinja text it was made from (what llama-server's /props shows as chat_template).
  const std::string& source() const { return *source_; }

 private:
  template <class Json>
  std::string render_json(const Json& messages, const ChatRenderOptions& o) const;
  std::string render_value(const jinja::Value& messages, const ChatRenderOptions& o) const;
  std::shared_ptr<const jinja::Program> program_;
  std::shared_ptr<const std::string> source_;
  bool system_role_ = true;
};

// Byte ranges [begin, end) of the rendered text that are message content (user-controlled
// text), found by searching the text for each content in message order, so the caller can
// tokenize them without special-token parsing. A content the template changed (e.g. trimmed)
// is located by its trimmed text; one that cannot be found is left out. Text search can
// mistake template text for content that repeats it (a content of exactly "<|im_end|>");
// ChatTemplate::render_with_spans does not, and falls back to this only when it must.
std::vector<std::pair<size_t, size_t>> find_content_spans(const std::string& rendered, const nlohmann::json& messages);

// Length of the longest common byte prefix: how much of a previous rendering (and the KV cache
// built from it) a new rendering can reuse.
size_t common_prefix_length(std::string_view a, std::string_view b);

}  // namespace vkllm
