// Prompts as tokens: raw completion text, or a conversation rendered through a chat template
// with message content tokenized as plain text (so "<|im_end|>" typed by a user stays text).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/template.h"
#include "text/tokenizer.h"

namespace vkllm {

struct PromptTokens {
  std::vector<int32_t> tokens;
  uint32_t pinned = 0;  // leading tokens to pin in the cache: BOS, plus the system prompt
};

// Completion text: BOS when the model asks for it; special-token strings stay text.
PromptTokens raw_prompt(const Tokenizer& tok, std::string_view text, bool parse_special = false);
// Whether tokens the model added a BOS to begin with BOS twice (that one, then a "<s>" parsed from
// text under --special): llama.cpp warns of it, and so do run and tokenize. (Callers pass tokens
// tokenized with BOS added: a model that adds none is never warned of.)
bool starts_with_two_bos(const Tokenizer& tok, const std::vector<int32_t>& tokens);
// The warning's text (one line, no newline).
std::string two_bos_warning(const Tokenizer& tok);

// Tokenizes a rendered template: the spans holding message content are plain text, the markup
// around them has its special tokens parsed. BOS is added when the model asks for it and the
// template did not already write it.
std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const RenderedPrompt& rendered);
// The same, locating the content by searching the text (find_content_spans).
std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const std::string& rendered, const nlohmann::json& messages);

// The BOS/EOS strings a template sees, from the vocabulary; system messages folded into the user's
// where the template has no system role (ChatRenderOptions::system_into_user).
ChatRenderOptions render_options(const Tokenizer& tok, bool add_generation_prompt);

// A one-message chat prompt (with an optional system prompt) for `vkllm run --chat`.
PromptTokens chat_prompt(const gguf::File& model, const Tokenizer& tok, const std::string& template_name,
                         const std::string& system, const std::string& user);

}  // namespace vkllm
