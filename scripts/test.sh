#!/usr/bin/env bash
# Runs every test: set up and build (scripts/setup.sh), the parser tests under ASan+UBSan, a
# short libFuzzer run of the GGUF reader and of the grammars (when clang is present), then the full ctest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

echo "== parser tests under AddressSanitizer + UndefinedBehaviorSanitizer" >&2
parser_tests=$(sed -n 's/^set(VKLLM_PARSER_TESTS \(.*\))$/\1/p' tests/CMakeLists.txt)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVKLLM_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs" --target $parser_tests
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest -L parser --output-on-failure)

if command -v clang++ >/dev/null; then
  echo "== libFuzzer: GGUF reader, 30 s" >&2
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DVKLLM_FUZZ=ON -DVKLLM_TESTS=ON >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fuzz_gguf
  corpus=build-fuzz/corpus
  mkdir -p "$corpus"
  for f in ../shared/models/stories260K.gguf ../shared/vocab/ggml-vocab-llama-spm.gguf; do
    [ -f "$f" ] && head -c 65536 "$f" >"$corpus/$(basename "$f").head"
  done
  build-fuzz/tests/fuzz_gguf -max_total_time=30 -max_len=65536 -rss_limit_mb=2048 -print_final_stats=0 "$corpus" 2>&1 |
    tail -n 3 >&2
  echo "== libFuzzer: GBNF grammars, JSON schemas and the matcher, 30 s" >&2
  cmake --build build-fuzz -j"$jobs" --target fuzz_grammar
  grammar_corpus=build-fuzz/grammar-corpus
  mkdir -p "$grammar_corpus"
  cp tests/data/grammar/*.gbnf "$grammar_corpus/"
  printf '%s' '{"type":"object","properties":{"a":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":3}},"$defs":{"n":{"enum":[1,"x",null]}}}' \
    >"$grammar_corpus/schema.json"
  build-fuzz/tests/fuzz_grammar -max_total_time=30 -max_len=4096 -rss_limit_mb=2048 -timeout=10 -print_final_stats=0 "$grammar_corpus" 2>&1 |
    tail -n 3 >&2
fi

echo "== ctest (Release, Vulkan on the default device with validation layers)" >&2
(cd build && ctest --output-on-failure -j1)
