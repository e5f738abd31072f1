// Jinja lexer: template source → text and tag tokens, applying trim_blocks, lstrip_blocks and
// the '-'/'+' whitespace markers exactly as Jinja2's lexer does.
#pragma once
#include <string>
#include <vector>

namespace vkllm::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok kind = Tok::Eof;
  std::string text;  // Text: the data; Name/Op: the spelling; String: the decoded value; numbers: digits
  int line = 1, col = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws Error("line L, column C: …") on an unterminated tag, string or comment.
std::vector<Token> lex_template(const std::string& source, const LexOptions& o);

}  // namespace vkllm::jinja
