// Content spans of a rendered chat prompt: which bytes came from message content rather than
// from the template, so they can be tokenized without special-token parsing.
//
// render_with_spans renders twice: once with every content replaced by a unique sentinel, which
// splits the output into template pieces, and once for real. The real text is the same pieces
// in order with content between them, so each gap between consecutive pieces is a content span.
// A gap's expected text (the content, or it trimmed) settles where a piece also occurs inside
// the content, and narrows a gap that also holds text from a branch the skeleton did not take.
// When the pieces do not line up at all, it falls back to searching for the content.
#include <algorithm>

#include "chat/template.h"
#include "base/error.h"
#include "jinja/text.h"

namespace vkllm {
namespace {

// Private-use code points: no filter, method or case mapping changes them, and no real
// template prints them.
const std::string k_open = "\xee\x80\x80";   // U+E000
const std::string k_close = "\xee\x80\x81";  // U+E001

std::string sentinel(size_t i) {
  std::string s = k_open;
  for (char d : std::to_string(i)) s += "\xee\x80" + std::string(1, static_cast<char>(0x90 + (d - '0')));  // U+E010+d
  return s + k_close;
}

// Replaces each string content (and each text part of a list content) with a sentinel and
// returns the original texts, indexed by sentinel number.
std::vector<std::string> mark_contents(nlohmann::ordered_json& messages) {
  std::vector<std::string> texts;
  auto mark = [&](nlohmann::ordered_json& slot) {
    if (!slot.is_string() || slot.get_ref<const std::string&>().empty()) return;
    texts.push_back(slot.get<std::string>());
    slot = sentinel(texts.size() - 1);
  };
  for (auto& m : messages) {
    if (!m.is_object() || !m.contains("content")) continue;
    auto& c = m["content"];
    if (c.is_array()) {
      for (auto& part : c)
        if (part.is_object() && part.contains("text")) mark(part["text"]);
    } else {
      mark(c);
    }
  }
  return texts;
}

struct Piece {
  std::string text;     // template text before the slot
  long slot = -1;       // sentinel number after `text`, or -1 for the final piece
};

// Splits a sentinel rendering into template pieces; false when a sentinel was cut apart.
bool split_pieces(const std::string& s, std::vector<Piece>& out) {
  size_t pos = 0;
  while (true) {
    const size_t open = s.find(k_open, pos);
    if (open == std::string::npos) {
      if (s.find(k_close, pos) != std::string::npos) return false;
      out.push_back({s.substr(pos), -1});
      return true;
    }
    const size_t close = s.find(k_close, open);
    if (close == std::string::npos) return false;
    std::string digits;
    for (size_t i = open + k_open.size(); i + 3 <= close; i += 3) {
      if (s.compare(i, 2, "\xee\x80") != 0) return false;
      digits += static_cast<char>('0' + (static_cast<unsigned char>(s[i + 2]) - 0x90));
    }
    if (digits.empty() || digits.size() > 9) return false;
    out.push_back({s.substr(pos, open - pos), std::stol(digits)});
    pos = close + k_close.size();
  }
}

// Lays the pieces over the real text; false when they do not fit.
bool match_pieces(const std::string& real, const std::vector<Piece>& pieces, const std::vector<std::string>& texts,
                  std::vector<std::pair<size_t, size_t>>& spans) {
  if (real.compare(0, pieces[0].text.size(), pieces[0].text) != 0) return false;
  size_t pos = pieces[0].text.size();
  for (size_t i = 0; i + 1 < pieces.size(); ++i) {
    const std::string& next = pieces[i + 1].text;
    const bool last = i + 2 == pieces.size();
    const std::string& content = texts.at(static_cast<size_t>(pieces[i].slot));
    // The gap is most likely the content itself, or it trimmed; else the first place the next
    // piece fits (the template transformed the content).
    size_t end = std::string::npos;
    for (const std::string& expect : {content, jinja::py_strip(content, std::nullopt, true, true)}) {
      const size_t e = pos + expect.size();
      if (real.compare(pos, expect.size(), expect) != 0) continue;
      if (last ? real.size() - e == next.size() && real.compare(e, next.size(), next) == 0
               : real.compare(e, next.size(), next) == 0) {
        end = e;
        break;
      }
    }
    if (end == std::string::npos) {
      end = last ? (real.size() >= next.size() && real.size() - next.size() >= pos ? real.size() - next.size()
                                                                                  : std::string::npos)
                 : real.find(next, pos);
      if (end == std::string::npos || (last && real.compare(end, next.size(), next) != 0)) return false;
    }
    size_t b = pos, e = end;
    if (real.compare(pos, content.size(), content) != 0 || end - pos != content.size()) {
      // Not the content verbatim: if the content (or it trimmed) lies inside the gap, the rest of
      // the gap is text the template added on a branch the skeleton did not take.
      for (const std::string& expect : {content, jinja::py_strip(content, std::nullopt, true, true)}) {
        const size_t at = expect.empty() ? std::string::npos : real.substr(pos, end - pos).find(expect);
        if (at == std::string::npos) continue;
        b = pos + at;
        e = b + expect.size();
        break;
      }
    }
    if (e > b) spans.emplace_back(b, e);
    pos = end + next.size();
  }
  return pos == real.size();
}

}  // namespace

RenderedPrompt ChatTemplate::render_with_spans(const nlohmann::ordered_json& messages, const ChatRenderOptions& o) const {
  RenderedPrompt out;
  out.text = render(messages, o);
  nlohmann::ordered_json marked = messages;
  const std::vector<std::string> texts = mark_contents(marked);
  std::vector<Piece> pieces;
  try {
    const std::string skeleton = render(marked, o);
    if (split_pieces(skeleton, pieces) &&
        std::all_of(pieces.begin(), pieces.end(),
                    [&](const Piece& p) { return p.slot < static_cast<long>(texts.size()); }) &&
        match_pieces(out.text, pieces, texts, out.content_spans))
      return out;
  } catch (const Error&) {
    // The template rejects sentinel content (e.g. parses it as JSON): search instead.
  }
  out.content_spans = find_content_spans(out.text, nlohmann::json::parse(messages.dump()));
  return out;
}

std::vector<std::pair<size_t, size_t>> find_content_spans(const std::string& rendered, const nlohmann::json& messages) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t cursor = 0;
  auto locate = [&](const std::string& text) {
    if (text.empty()) return;
    for (const std::string& needle : {text, jinja::py_strip(text, std::nullopt, true, true)}) {
      if (needle.empty()) continue;
      const size_t p = rendered.find(needle, cursor);
      if (p == std::string::npos) continue;
      spans.emplace_back(p, p + needle.size());
      cursor = p + needle.size();
      return;
    }
  };
  if (!messages.is_array()) return spans;
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("content")) continue;
    const auto& c = m["content"];
    if (c.is_string()) {
      locate(c.get<std::string>());
    } else if (c.is_array()) {
      for (const auto& part : c)
        if (part.is_object() && part.contains("text") && part["text"].is_string()) locate(part["text"].get<std::string>());
    }
  }
  return spans;
}

}  // namespace vkllm
