# Sourced by the scripts/bench-*.sh: where things are, and the checks and scratch directory they
# share. Sets root (the repository), shared (../shared or $VKLLM_SHARED_DIR), vkllm (the binary,
# build/vkllm or $VKLLM_BIN) and bench (this script's name, for messages).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${VKLLM_SHARED_DIR:-$root/../shared}"
vkllm="${VKLLM_BIN:-$root/build/vkllm}"
bench="$(basename "$0" .sh)"

# bench_require FILE...: the binary is built and every input exists, or one line and exit 1.
bench_require() {
  [ -x "$vkllm" ] || { echo "$bench: $vkllm is missing: build first (cmake --build build --target vkllm)" >&2; exit 1; }
  local f
  for f in "$@"; do [ -f "$f" ] || { echo "$bench: $f is missing" >&2; exit 1; }; done
}

# bench_1b_model TYPE: the path of the 1b benchmark model of TYPE (make_model --preset 1b, the
# llama SentencePiece vocabulary) in $VKLLM_BENCH_MODELS (default models/), made when missing.
bench_1b_model() {
  local m="${VKLLM_BENCH_MODELS:-$root/models}/bench-1b-$1.gguf"
  if [ ! -f "$m" ]; then
    local make_model="${VKLLM_MAKE_MODEL:-$root/build/tests/tools/make_model}"
    [ -x "$make_model" ] || { echo "$bench: $make_model is missing: build first" >&2; exit 1; }
    mkdir -p "$(dirname "$m")"
    echo "$bench: making $m" >&2
    "$make_model" --preset 1b --type "$1" --vocab-from "$shared/vocab/ggml-vocab-llama-spm.gguf" -o "$m" >&2
  fi
  echo "$m"
}

# bench_workdir: a scratch directory in $work, removed on exit.
bench_workdir() {
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
}

# count_tokens MODEL FILE: how many tokens FILE is for MODEL.
count_tokens() { "$vkllm" tokenize -m "$1" -f "$2" --count 2>/dev/null | tail -1 | tr -dc 0-9; }
