// JSON as grammars: the GBNF of any JSON object (the server's response_format json_object), and a
// JSON Schema turned into GBNF (llama.cpp's --json-schema, the server's json_schema), so that the
// generated text is a JSON value the schema accepts (docs/sampling.md, "JSON schemas").
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "text/grammar.h"

namespace vkllm {

// One JSON object, whitespace bounded to one blank or a newline and an indent of up to 24.
std::string_view json_object_gbnf();

// GBNF whose sentences are the JSON texts `schema` accepts. The keywords that shape a value
// (type, properties, required, additionalProperties, items, minItems, maxItems, minLength,
// maxLength, enum, const, anyOf, oneOf, a one-element allOf, local $ref into $defs/definitions)
// are followed; annotations (title, description, default, examples, …) are skipped; any other
// keyword (minimum, pattern, format, …) throws a vkllm::Error naming it and where it is (a
// JSON pointer), as does a malformed schema: the text is never held to less than was asked.
// An ordered JSON keeps the properties in the order the schema lists them, which is the order the
// reply writes them in.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// That GBNF, parsed: the grammar a JSON schema asks for (errors as above, or the grammar's own).
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);

}  // namespace vkllm
