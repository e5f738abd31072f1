// Jinja parser: tokens → Program (statements and expressions), with line:column in every error.
#pragma once
#include <string>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace vkllm::jinja {

// Throws Error("line L, column C: …") on a syntax error or an unsupported construct.
Program parse_template(const std::string& source, const LexOptions& o);

}  // namespace vkllm::jinja
