// Grammars: GBNF parsing (llama.cpp's syntax, its rewrites, the errors), the matcher on texts fed
// a byte at a time (characters past ASCII split across tokens), end of generation, the batched
// mask against the single-token check, and the JSON grammar. Greedy generation under a grammar
// against llama.cpp is in test_cli (Grammar.GreedyTokensMatchLlamaCpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "gguf.h"
#include "test_support.h"
#include "text/grammar.h"
#include "text/json_schema.h"
#include "text/tokenizer.h"

using namespace vkllm;

namespace {

constexpr const char* k_vocab = "vocab/ggml-vocab-llama-spm.gguf";

// The LLaMA SentencePiece vocabulary: byte tokens <0x00> … <0xFF> spell any text a byte a time.
struct Vocab {
  Tokenizer tok;
  std::shared_ptr<const GrammarVocab> gv;
  std::map<uint8_t, int32_t> byte_token;
  explicit Vocab(const std::string& path) : tok(Tokenizer::from_gguf(gguf::File::open(path))) {
    gv = std::make_shared<const GrammarVocab>(tok);
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
      const std::string& t = tok.token_text(id);
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') byte_token[uint8_t(std::stoi(t.substr(3, 2), nullptr, 16))] = id;
    }
  }
};

const Vocab& vocab() {
  static const Vocab v(test::shared_path(k_vocab));
  return v;
}

// "ok": the grammar takes every byte of `text` and is complete after it; "incomplete": it takes
// every byte but wants more; "rejected at N": byte N is refused.
std::string feed(const std::string& gbnf, const std::string& text) {
  const Vocab& v = vocab();
  GrammarMatcher m(Grammar::parse(gbnf, "test"), v.gv);
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t t = v.byte_token.at(uint8_t(text[i]));
    if (!m.allows(t)) return "rejected at " + std::to_string(i);
    m.accept(t);
  }
  return m.complete() ? "ok" : "incomplete";
}

std::string parse_error(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf, "g.gbnf");
  } catch (const Error& e) {
    return e.what();
  }
  return "(parsed)";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(Grammar, LiteralsClassesAndRepetitions) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  const std::string yes_no = R"(root ::= "yes" | "no")";
  EXPECT_EQ(feed(yes_no, "yes"), "ok");
  EXPECT_EQ(feed(yes_no, "no"), "ok");
  EXPECT_EQ(feed(yes_no, "ye"), "incomplete");
  EXPECT_EQ(feed(yes_no, "yess"), "rejected at 3");
  EXPECT_EQ(feed(yes_no, "maybe"), "rejected at 0");

  const std::string classes = R"(root ::= [a-c]+ [^x\n] .)";
  EXPECT_EQ(feed(classes, "abcay!"), "ok");
  EXPECT_EQ(feed(classes, "ax"), "rejected at 1");  // [a-c]+ then [^x]: x is neither
  EXPECT_EQ(feed(classes, "a\n"), "rejected at 1");
  EXPECT_EQ(feed(classes, "a-"), "incomplete");

  // {m}, {m,n}, {m,} and ? * + on groups, as llama.cpp rewrites them.
  EXPECT_EQ(feed(R"(root ::= "ab"{2})", "abab"), "ok");
  EXPECT_EQ(feed(R"(root ::= "ab"{2})", "ababa"), "rejected at 4");
  EXPECT_EQ(feed(R"(root ::= [0-9]{1,3} ";")", "123;"), "ok");
  EXPECT_EQ(feed(R"(root ::= [0-9]{1,3} ";")", "1234"), "rejected at 3");
  EXPECT_EQ(feed(R"(root ::= [0-9]{1,3} ";")", ";"), "rejected at 0");
  EXPECT_EQ(feed(R"(root ::= "x"{2,} "y")", "xy"), "rejected at 1");
  EXPECT_EQ(feed(R"(root ::= "x"{2,} "y")", "xxxxxy"), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a" | "bc")* "!" "?"?)", "abcbca!"), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a" | "bc")* "!" "?"?)", "!?"), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a" | "bc")+ "!")", "!"), "rejected at 0");
  EXPECT_EQ(feed(R"(root ::= "a" {0} "b")", "b"), "ok");
  // Repetitions of items that can match the empty text (taken, as llama.cpp takes them).
  EXPECT_EQ(feed(R"(root ::= ("a"?)* "b")", "aab"), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a"?)* "b")", "b"), "ok");
  EXPECT_EQ(feed("root ::= (ws | [a-z]+)* \".\"\nws ::= [ ]*", "ab  c d."), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a"? "b"?)+ ".")", "."), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a"? "b"?)+ ".")", "abba."), "ok");
  // Alternatives that can each be empty reach the same stacks by many ways: each expanded once.
  EXPECT_EQ(feed(R"(root ::= ("a"? | "b"?){0,16} ".")", "abba."), "ok");
  EXPECT_EQ(feed(R"(root ::= ("a"? | "b"?){0,16} ".")", "."), "ok");

  // Escapes, comments, rules over several lines inside groups and after '|', a rule used before
  // its definition, a name with '-' and digits.
  const std::string multi = "# a comment\n"
                            "root ::= greeting-2 (\n"
                            "    \"\\x21\" | \"\\u00e9\"  # either\n"
                            "  ) \"\\n\\t\\\\\\\"\\[\\]\"\n"
                            "greeting-2 ::= \"hi\" |\n"
                            "  \"yo\"\n";
  EXPECT_EQ(feed(multi, "yo\xC3\xA9\n\t\\\"[]"), "ok");
  EXPECT_EQ(feed(multi, "hi!\n\t\\\"[]"), "ok");
  EXPECT_EQ(feed(multi, "hi?"), "rejected at 2");
}

TEST(Grammar, CharactersSplitAcrossTokens) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  // é is C3 A9, я is D1 8F, 😀 is F0 9F 98 80: fed a byte at a time, the matcher keeps the
  // unfinished character and refuses a lead byte no allowed character starts with.
  const std::string g = R"(root ::= [à-ÿ] [а-я] "😀")";
  EXPECT_EQ(feed(g, "é" "я" "😀"), "ok");
  EXPECT_EQ(feed(g, "\xC3"), "incomplete");
  EXPECT_EQ(feed(g, "a"), "rejected at 0");
  EXPECT_EQ(feed(g, "\xD1"), "rejected at 0");       // Cyrillic first: [à-ÿ] is U+00E0 … U+00FF
  EXPECT_EQ(feed(g, "\xC3\x80"), "rejected at 1");   // U+00C0 is below à
  EXPECT_EQ(feed(g, "é" "\xD1\x8F" "\xF0\x9F\x98\x81"), "rejected at 7");
  EXPECT_EQ(feed(R"(root ::= .)", "\x80"), "rejected at 0");  // a stray continuation byte is no character
  EXPECT_EQ(feed(R"(root ::= [^a])", "\xE2\x82\xAC"), "ok");   // € is not a
}

TEST(Grammar, EndOfGenerationOnlyWhenComplete) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  const Vocab& v = vocab();
  GrammarMatcher m(Grammar::parse(R"(root ::= "a" "b"?)", "test"), v.gv);
  const int32_t eos = v.tok.eos();
  EXPECT_FALSE(m.allows(eos));
  m.accept(v.byte_token.at('a'));
  EXPECT_TRUE(m.allows(eos));  // "a" is a whole sentence; "ab" would be too
  EXPECT_TRUE(m.allows(v.byte_token.at('b')));
  m.accept(v.byte_token.at('b'));
  std::vector<float> logits(size_t(v.tok.n_vocab()), 0.0f);
  EXPECT_EQ(m.mask(logits), 1u);  // nothing can follow "ab": end of generation alone
  EXPECT_EQ(logits[size_t(eos)], 0.0f);
  EXPECT_FALSE(m.try_accept(v.byte_token.at('b')));  // refused, and the state is as it was
  EXPECT_TRUE(m.allows(eos));
  EXPECT_THROW(m.accept(v.byte_token.at('b')), Error);
  // Not inside a character: "a" then the first byte of Ω (CE A9) is no whole sentence, though "a" was.
  GrammarMatcher omega(Grammar::parse("root ::= \"a\" | \"a\xCE\xA9\"", "test"), v.gv);
  omega.accept(v.byte_token.at('a'));
  EXPECT_TRUE(omega.allows(eos));
  omega.accept(v.byte_token.at(0xCE));
  EXPECT_FALSE(omega.allows(eos));
  omega.accept(v.byte_token.at(0xA9));
  EXPECT_TRUE(omega.allows(eos));
}

// The mask (candidates of a level sorted by code point, each stack taking those its element
// matches, following them down) and the single-token check (a copy of the stacks walked a code
// point at a time) agree on every token of the vocabulary, at every point of texts through the
// JSON grammar, overlapping classes and ranges, negated classes, an enum of many alternatives,
// stacks taking the same characters, repetitions of items that can be empty, and inside
// unfinished characters.
TEST(Grammar, MaskAgreesWithSingleTokenChecks) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  const Vocab& v = vocab();
  std::string many = "root ::= (";
  for (int i = 0; i < 300; ++i) many += (i ? " | " : "") + std::string("\"w") + std::to_string(i) + "\"";
  many += ") (\" \" [a-z]+)?";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(json_object_gbnf()), "{\"k\xC3\xA9y\": [1, -2.5e3, true, {\"x\": null}], \"s\": \"a\\u00e9\xC3"},
      {"root ::= (\"ab\" | [a-c]+ | [b-dcb] \"!\" | [^x\\n] \"y\" | \"\xC3\xA9\" . | [a-z\xCE\xB1-\xCF\x89]{2,3})+", "abc\xC3\xA9!zyab\xCE\xB2\xCE"},
      {many, "w12 abc"},
      // Stacks that take the same characters, and repetitions of items that can be empty.
      {"root ::= ([a-z]+ | [a-m] [a-z]* | ws)* \".\"\nws ::= [ ]*", "ab cd  ef"},
      {"root ::= (\"a\"? [b-z]?)+ \"!\"", "abzz"},
  };
  for (const auto& [gbnf, text] : cases) {
    GrammarMatcher m(Grammar::parse(gbnf, "test"), v.gv);
    for (size_t i = 0; i <= text.size(); ++i) {
      std::vector<float> logits(size_t(v.tok.n_vocab()), 0.0f);
      const size_t allowed = m.mask(logits);
      size_t agreed = 0;
      for (int32_t t = 0; t < v.tok.n_vocab(); ++t) {
        const bool kept = logits[size_t(t)] != -std::numeric_limits<float>::infinity();
        EXPECT_EQ(kept, m.allows(t)) << "token " << t << " '" << v.tok.token_text(t) << "' after " << i << " bytes of " << text;
        agreed += kept;
      }
      EXPECT_EQ(agreed, allowed);
      EXPECT_GT(allowed, 0u) << "after " << i << " bytes of " << text;
      if (i < text.size()) m.accept(v.byte_token.at(uint8_t(text[i])));
    }
  }
}

TEST(Grammar, JsonObject) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  const std::string json(json_object_gbnf());
  EXPECT_EQ(feed(json, R"({"a": [1, 2.5e3, -0.25, true, false, null, "x\"y\u00e9"], "b": {}})"), "ok");
  EXPECT_EQ(feed(json, "{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}"), "ok");
  EXPECT_EQ(feed(json, "{}"), "ok");
  EXPECT_EQ(feed(json, "[1]"), "rejected at 0");          // an object, as OpenAI's json_object
  EXPECT_EQ(feed(json, R"({"a": 01})"), "rejected at 7");  // no leading zeros
  EXPECT_EQ(feed(json, R"({"a": 1,})"), "rejected at 8");
  EXPECT_EQ(feed(json, "{\"a\nb\": 1}"), "rejected at 3");  // a control character inside a string
  EXPECT_EQ(feed(json, "{}  "), "rejected at 3");  // whitespace is bounded: one blank, or a newline and an indent
  EXPECT_EQ(feed(json, "{\"a\": 1"), "incomplete");
  // tests/data/grammar/json-object.gbnf is the text the llama.cpp references were made with.
  EXPECT_EQ(json, slurp(std::string(VKLLM_TEST_DATA) + "/grammar/json-object.gbnf"));
}

TEST(Grammar, ParseErrorsNameTheLineAndColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "grammar g.gbnf has no rules"},
      {"# only a comment\n", "grammar g.gbnf has no rules"},
      {"start ::= \"a\"", "has no rule 'root'"},
      {"root ::= foo", "line 1, column 10: rule 'foo' is used but never defined"},
      {"root ::= \"a\"\nroot2 ::= bar \"b\"", "line 2, column 11: rule 'bar' is used but never defined"},
      {"my_rule ::= \"a\"", "line 1, column 3: expecting '::=' after the rule name 'my'"},
      {"root ::= \"abc", "line 1, column 10: this string literal never ends"},
      {"root ::= [a-", "unexpected end of the grammar"},
      {"root ::= [abc", "this character class never ends"},
      {"root ::= [z-a]", "column 13: the range's end is below its start"},
      {"root ::= []", "an empty character class"},
      {"root ::= \"a\"{3,1}", "the repetition's maximum is below its minimum"},
      {"root ::= \"a\"{2001}", "more than 2,000 repetitions"},
      {"root ::= \"a\"{1,", "expecting '}'"},
      {"root ::= \"a\"{x}", "expecting a number"},
      {"root ::= *\"a\"", "column 10: a repetition needs an item before it"},
      {"root ::= (\"a\" ", "expecting ')' to close the group opened at line 1"},
      {"root ::= \"\\q\"", "unknown escape '\\q'"},
      {"root ::= \"\\x4\"", "expecting 2 hex digits"},
      {"root ::= <think> \"a\"", "token references (<…>) are not supported"},
      {"root ::= \"a\" )", "expecting the end of the line after rule 'root'"},
      {"root ::= \"a\"\n  \"b\"", "line 2, column 3: expecting a rule name"},
      {std::string("root ::= \"a\0\"", 14), "a NUL byte"},
      {"root ::= \"\xC3\"", "not UTF-8"},
      // Left recursion, also through rules that match the empty text (which llama.cpp misses and
      // then recurses on until its stack overflows).
      {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
      {"root ::= e root \"x\" | \"y\"\ne ::= f\nf ::= ", "rule 'root' is left-recursive"},
      {"root ::= \"a\"\nlist ::= x \",\" list | x\nx ::= list \"y\" | \"z\"", "line 2, column 1: rule 'list' is left-recursive"},
      {"root ::= (root \"a\")? \"b\"", "line 1, column 1: rule 'root' is left-recursive"},
      // Groups inside groups: the parser recurses into each.
      {"root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'), "groups nest deeper than 256 levels"},
      {"root ::= a\na ::= a", "line 1, column 1: rule 'root' can never end"},
      // A long item repeated repeatedly: refused before it takes the memory.
      {"root ::= \"" + std::string(1000, 'a') + "\"{2000}{2000}", "the grammar grows past 4,194,304 elements"},
  };
  for (const auto& [gbnf, expected] : cases) {
    const std::string error = parse_error(gbnf);
    EXPECT_NE(error.find(expected), std::string::npos) << "grammar: " << gbnf.substr(0, 60) << "\nerror: " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;  // one line
  }
  // What llama.cpp takes is taken: a rule defined twice (the last holds), an empty alternative.
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\" | \n"), "(parsed)");
  // A chain of 200,000 rules, the last empty: finding which rules match the empty text is linear
  // (a pass over every rule per rule found took 4·10^10 steps).
  std::string chain = "root ::= a0 \"x\"\n";
  for (int i = 0; i < 200000; ++i) chain += "a" + std::to_string(i) + " ::= a" + std::to_string(i + 1) + "\n";
  chain += "a200000 ::= \n";
  EXPECT_EQ(parse_error(chain), "(parsed)");
}

TEST(Grammar, AmbiguityIsBounded) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  // Each "a" leaves a choice of closing "b" or "c" for later: 2^n stacks after n of them. The
  // matcher stops with an error past its bound instead of growing without one.
  const std::string g = "root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | ";
  const std::string error = [&] {
    try {
      feed(g, std::string(20, 'a'));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(fed)");
  }();
  EXPECT_NE(error.find("the grammar is too ambiguous"), std::string::npos) << error;
  EXPECT_EQ(feed(g, "aaacbb"), "ok");
  EXPECT_EQ(feed(g, "aaab"), "incomplete");
  // A thousand alternatives alike: every stack leads to a thousand more for each character. The
  // work on one token is bounded (an error at once rather than seconds a token, or minutes on a
  // large vocabulary).
  std::string alike = "root ::= (";
  for (int i = 0; i < 1000; ++i) alike += (i ? " | " : "") + std::string("[A-Z]");
  alike += ")+";
  const std::string work_error = [&] {
    try {
      feed(alike, "ABC");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(fed)");
  }();
  EXPECT_NE(work_error.find("steps to decide the next token (the grammar is too ambiguous)"), std::string::npos) << work_error;
}

namespace {

std::string schema_gbnf(const std::string& schema) { return json_schema_to_gbnf(nlohmann::ordered_json::parse(schema)); }

std::string schema_error(const std::string& schema) {
  try {
    Grammar::parse(schema_gbnf(schema), "schema");
  } catch (const Error& e) {
    return e.what();
  }
  return "(converted)";
}

}  // namespace

TEST(JsonSchema, ObjectsTakeTheirPropertiesInOrder) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  const std::string g = schema_gbnf(R"({"type": "object", "title": "a pet owner",
    "properties": {"name": {"type": "string", "maxLength": 5, "description": "first name"}, "age": {"type": "integer"},
                   "happy": {"type": "boolean"}, "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}},
    "required": ["name", "age"]})");
  EXPECT_EQ(feed(g, R"({"name": "Ann", "age": 30})"), "ok");
  EXPECT_EQ(feed(g, R"({"name": "Ann", "age": -3, "pets": ["cat"]})"), "ok");  // "happy" left out
  EXPECT_EQ(feed(g, R"({"name": "Ann", "age": 3, "happy": true, "pets": []})"), "ok");
  EXPECT_EQ(feed(g, "{\n  \"name\": \"Bo\",\n  \"age\": 0\n}"), "ok");
  EXPECT_EQ(feed(g, R"({"age": 3, "name": "Ann"})"), "rejected at 2");   // the schema's order
  EXPECT_EQ(feed(g, R"({"name": "Ann"})"), "rejected at 14");           // "age" is required
  EXPECT_EQ(feed(g, R"({"name": "Ann", "age": 3,})"), "rejected at 25");
  EXPECT_EQ(feed(g, R"({"name": "Ann", "age": 3.5})"), "rejected at 24");  // an integer
  EXPECT_EQ(feed(g, R"({"name": "Annabel")"), "rejected at 15");        // maxLength 5
  EXPECT_EQ(feed(g, R"({"name": "A", "age": 1, "pets": ["cat", "dog", "cat"]})"), "rejected at 45");  // maxItems 2
  EXPECT_EQ(feed(g, R"({"name": "A", "age": 1, "pets": ["cow"]})"), "rejected at 35");
  EXPECT_EQ(feed(g, R"({"name": "A", "age": 1, "color": 1})"), "rejected at 25");  // only the listed properties

  // Every property optional: any ordered subset, commas between those present only.
  const std::string opt = schema_gbnf(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"const": "x"}}})");
  EXPECT_EQ(feed(opt, "{}"), "ok");
  EXPECT_EQ(feed(opt, R"({"b": 1})"), "ok");
  EXPECT_EQ(feed(opt, R"({"a": 1, "c": "x"})"), "ok");
  EXPECT_EQ(feed(opt, R"({"a": 1, "b": 2, "c": "x"})"), "ok");
  EXPECT_EQ(feed(opt, R"({"c": "x", "a": 1})"), "rejected at 9");
  EXPECT_EQ(feed(opt, R"({, "b": 1})"), "rejected at 1");

  // Without properties: any keys, their values per additionalProperties.
  const std::string map = schema_gbnf(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_EQ(feed(map, R"({"x": 1, "y z": -2})"), "ok");
  EXPECT_EQ(feed(map, R"({"x": "1"})"), "rejected at 6");
  EXPECT_EQ(feed(schema_gbnf(R"({"type": "object", "additionalProperties": false})"), R"({"x": 1})"), "rejected at 1");
}

TEST(JsonSchema, ValuesEnumsAlternativesAndReferences) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  const std::string e = schema_gbnf(R"({"enum": ["red", 1, null, {"k": [true]}]})");
  for (const char* ok : {"\"red\"", "1", "null", "{\"k\":[true]}"}) EXPECT_EQ(feed(e, ok), "ok") << ok;
  EXPECT_EQ(feed(e, "\"blue\""), "rejected at 1");
  const std::string typed_enum = schema_gbnf(R"({"type": "integer", "enum": ["1", 1, 2.0, 2.5]})");  // "1" and 2.5 are no integers
  EXPECT_EQ(feed(typed_enum, "1"), "ok");
  EXPECT_EQ(feed(typed_enum, "2.0"), "ok");
  EXPECT_EQ(feed(typed_enum, "\"1\""), "rejected at 0");
  EXPECT_EQ(feed(typed_enum, "2.5"), "rejected at 2");
  const std::string any = schema_gbnf(R"({"anyOf": [{"type": "integer"}, {"type": ["string", "null"], "minLength": 2}]})");
  EXPECT_EQ(feed(any, "42"), "ok");
  EXPECT_EQ(feed(any, "null"), "ok");
  EXPECT_EQ(feed(any, "\"ab\""), "ok");
  EXPECT_EQ(feed(any, "\"a\""), "rejected at 2");
  EXPECT_EQ(feed(any, "4.5"), "rejected at 1");
  EXPECT_EQ(feed(schema_gbnf(R"({"type": "array", "minItems": 2, "items": {"type": "number"}})"), "[1.5]"), "rejected at 4");
  EXPECT_EQ(feed(schema_gbnf(R"({"type": "array", "minItems": 2, "items": {"type": "number"}})"), "[1.5, 2e3, -0]"), "ok");
  EXPECT_EQ(feed(schema_gbnf("{}"), "[{\"a\": \"b\"}, 2]"), "ok");  // any JSON value
  EXPECT_EQ(feed(schema_gbnf("true"), "\"s\""), "ok");
  // A tree through $defs: a rule that refers to itself.
  const std::string tree = schema_gbnf(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_EQ(feed(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"), "ok");
  EXPECT_EQ(feed(tree, R"({"v": 1, "kids": [{"kids": []}]})"), "rejected at 20");  // "v" is required
}

// Arrays of arrays: each level is one rule more (an item's expression written twice by its
// repetition doubled the grammar with every level: 24 levels took 2 GB).
TEST(JsonSchema, NestingGrowsTheGrammarLinearly) {
  VKLLM_REQUIRE_SHARED(k_vocab);
  nlohmann::ordered_json schema = {{"type", "integer"}};
  for (int i = 0; i < 60; ++i) schema = {{"type", "array"}, {"items", schema}, {"maxItems", 3}, {"minItems", 1.0}};
  const std::string g = json_schema_to_gbnf(schema);
  EXPECT_LT(g.size(), 20000u);
  EXPECT_EQ(feed(g, std::string(60, '[') + "7" + std::string(60, ']')), "ok");
  EXPECT_EQ(feed(g, std::string(60, '[') + "]"), "rejected at 60");  // minItems 1
}

TEST(JsonSchema, WhatItCannotHoldIsRefusedNamingWhere) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "object", "properties": {"a": {"type": "number", "minimum": 3}}})",
       "JSON schema at /properties/a: 'minimum' is not supported"},
      {R"({"type": "string", "pattern": "^a+$"})", "JSON schema: 'pattern' is not supported"},
      {R"({"properties": {"a/b": {"format": "date"}}})", "JSON schema at /properties/a~1b: 'format' is not supported"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b' is required but not among the properties"},
      {R"({"type": "array", "items": [{"type": "string"}]})", "'items' as an array (tuples) is not supported"},
      {R"({"type": "array", "maxItems": 5000})", "'maxItems' above 2,000 is not supported"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "'maxLength' is below 'minLength'"},
      {R"({"type": "strin"})", "unknown type 'strin'"},
      {R"({"$ref": "#/$defs/missing"})", "'#/$defs/missing' names no schema"},
      {R"({"$ref": "https://example.com/s.json"})", "only references into this schema's $defs or definitions are supported"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "'allOf' of more than one schema is not supported"},
      {R"({"enum": []})", "'enum' must be a non-empty array"},
      {"false", "the schema false accepts no value"},
      {"3", "a schema must be an object or a boolean"},
      // Beside a choice of values or schemas, a keyword would be dropped: refused (type beside
      // enum and const keeps the values of that type).
      {R"({"type": "string", "maxLength": 3, "anyOf": [{"type": "string"}, {"type": "null"}]})", "'type' beside 'anyOf' is not supported"},
      {R"({"enum": ["aaaa", "b"], "maxLength": 2})", "'maxLength' beside 'enum' is not supported"},
      {R"({"properties": {"a": {"const": 1}}, "required": ["a"], "oneOf": [{"type": "object"}]})", "'properties' beside 'oneOf' is not supported"},
      {R"({"enum": [1], "const": 1})", "'enum' beside 'const' is not supported"},
      {R"({"type": "string", "enum": [1, 2]})", "no value of 'enum' has the schema's 'type'"},
      {R"({"$defs": {"a": [1]}, "$ref": "#/$defs/a/99999999999999999999"})", "names no schema"},
      {R"({"$ref": "#"})", "rule 'root' can never end"},
  };
  for (const auto& [schema, expected] : cases) {
    const std::string error = schema_error(schema);
    EXPECT_NE(error.find(expected), std::string::npos) << schema << "\n" << error;
  }
  // A type list writes its schema once per type: the subschemas are converted once all the same
  // (each one was converted again for every type: 2^40 here).
  nlohmann::ordered_json listed = {{"type", "integer"}};
  for (int i = 0; i < 40; ++i) listed = {{"type", {"array", "array", "null"}}, {"items", listed}};
  EXPECT_LT(schema_gbnf(listed.dump()).size(), 20000u);
  // Schemas inside schemas past 64 levels.
  std::string deep = "{}";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(schema_error(deep).find("schemas nest deeper than 64 levels"), std::string::npos);
}
