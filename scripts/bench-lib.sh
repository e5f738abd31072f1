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

# bench_workdir: a scratch directory in $work, removed on exit.
bench_workdir() {
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
}

# count_tokens MODEL FILE: how many tokens FILE is for MODEL.
count_tokens() { "$vkllm" tokenize -m "$1" -f "$2" --count 2>/dev/null | tail -1 | tr -dc 0-9; }
