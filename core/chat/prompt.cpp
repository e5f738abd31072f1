// Prompt tokenization for completion and chat.
#include "chat/prompt.h"

namespace vkllm {

PromptTokens raw_prompt(const Tokenizer& tok, std::string_view text, bool parse_special) {
  PromptTokens p;
  p.tokens = tok.tokenize(text, true, parse_special);
  p.pinned = (!p.tokens.empty() && p.tokens[0] == tok.bos()) ? 1 : 0;
  return p;
}

bool starts_with_two_bos(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  return tok.add_bos() && tok.bos() >= 0 && tokens.size() >= 2 && tokens[0] == tok.bos() && tokens[1] == tok.bos();
}

std::string two_bos_warning(const Tokenizer& tok) {
  return "the prompt starts with two BOS tokens: the one the model adds, then " + tok.token_text(tok.bos()) +
         " parsed from the text (--special)";
}

std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const std::string& rendered, const nlohmann::json& messages) {
  return tokenize_rendered(tok, RenderedPrompt{rendered, find_content_spans(rendered, messages)});
}

std::vector<int32_t> tokenize_rendered(const Tokenizer& tok, const RenderedPrompt& r) {
  const std::string& rendered = r.text;
  std::vector<TextPiece> pieces;
  size_t at = 0;
  for (const auto& [begin, end] : r.content_spans) {
    if (begin > at) pieces.push_back({std::string_view(rendered).substr(at, begin - at), true});
    pieces.push_back({std::string_view(rendered).substr(begin, end - begin), false});
    at = end;
  }
  if (at < rendered.size()) pieces.push_back({std::string_view(rendered).substr(at), true});
  const bool has_bos_text = tok.bos() >= 0 && rendered.starts_with(tok.token_text(tok.bos()));
  return tok.tokenize(pieces, !has_bos_text);
}

ChatRenderOptions render_options(const Tokenizer& tok, bool add_generation_prompt) {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.system_into_user = true;
  if (tok.bos() >= 0) o.bos_token = tok.token_text(tok.bos());
  if (tok.eos() >= 0) o.eos_token = tok.token_text(tok.eos());
  return o;
}

PromptTokens chat_prompt(const gguf::File& model, const Tokenizer& tok, const std::string& template_name,
                         const std::string& system, const std::string& user) {
  const ChatTemplate tmpl = ChatTemplate::resolve(&model, template_name);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  PromptTokens p;
  if (!system.empty()) {
    // Pin what the system prompt alone renders to (its tokens shared with the full prompt).
    const std::vector<int32_t> sys = tokenize_rendered(tok, tmpl.render_with_spans(messages, render_options(tok, false)));
    messages.push_back({{"role", "user"}, {"content", user}});
    p.tokens = tokenize_rendered(tok, tmpl.render_with_spans(messages, render_options(tok, true)));
    while (p.pinned < sys.size() && p.pinned < p.tokens.size() && sys[p.pinned] == p.tokens[p.pinned]) ++p.pinned;
  } else {
    messages.push_back({{"role", "user"}, {"content", user}});
    p.tokens = tokenize_rendered(tok, tmpl.render_with_spans(messages, render_options(tok, true)));
    p.pinned = (!p.tokens.empty() && p.tokens[0] == tok.bos()) ? 1 : 0;
  }
  return p;
}

}  // namespace vkllm
