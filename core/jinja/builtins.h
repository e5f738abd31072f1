// Jinja's built-in filters, tests and the Python methods of str, list and dict values.
#pragma once
#include <optional>
#include <string>

#include "jinja/value.h"

namespace vkllm::jinja {

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
// `value | name(args)`. Throws Error on bad arguments.
Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, CallArgs& args);
// `obj.name` as a bound method when `obj` (str, list, dict) has one; nullopt otherwise.
std::optional<Value> bound_method(const Value& obj, const std::string& name);

// Python slicing `v[start:stop:step]` of a str, list or tuple; null bounds are omitted.
Value slice_value(const Value& v, const Value* start, const Value* stop, const Value* step);

}  // namespace vkllm::jinja
