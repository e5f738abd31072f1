#!/usr/bin/env bash
# Tokenizer throughput: ~1 MiB of English (stories.txt repeated) through `vkllm tokenize --bench`
# for each vocabulary given (default: llama-spm and llama-bpe). Prints MiB/s per vocabulary;
# the time covers tokenize() only, not loading the vocabulary.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
story="$shared/reference/stories.txt"
bench_require "$story"
bench_workdir
text="$work/text.txt"
: >"$text"
while [ "$(stat -c %s "$text")" -lt $((1024 * 1024)) ]; do cat "$story" >> "$text"; done
vocabs=("$@")
[ ${#vocabs[@]} -gt 0 ] || vocabs=("$shared/vocab/ggml-vocab-llama-spm.gguf" "$shared/vocab/ggml-vocab-llama-bpe.gguf")
for v in "${vocabs[@]}"; do
  "$vkllm" tokenize -m "$v" -f "$text" --count --bench 2>&1 >/dev/null | grep 'MiB/s'
done
