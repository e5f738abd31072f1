// Jinja evaluator: renders a parsed Program against global variables, with Jinja2's scoping
// (for-loop and macro scopes, namespaces), loop variables and loop controls.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace vkllm::jinja {

// Guards against runaway templates; exceeding one throws Error.
struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;
  size_t max_items = size_t{1} << 18;   // items of a list or tuple an operator or filter builds (a Value is ~100 bytes)
  int max_call_depth = 100;          // nested macro calls
  uint64_t max_steps = 2'000'000;    // statements executed plus loop iterations
};

// Jinja2's compile-time checks: every filter and test named in `p` exists. Throws Error with
// the line and column of the first unknown one.
void check_program(const Program& p);

// Renders `p`. Errors (including raise_exception) throw Error("line L, column C: …").
std::string render_program(const Program& p, const std::vector<std::pair<std::string, Value>>& globals,
                           const RenderLimits& limits);

}  // namespace vkllm::jinja
