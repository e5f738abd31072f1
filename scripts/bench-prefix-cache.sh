#!/usr/bin/env bash
# The prefix-cache scenario: a ~2,000-token manual (stories.txt) + question A, then the same
# manual + question B — the second run should report the manual's tokens as cached and a TTFT
# ≥ 10× lower. Then the same with a timestamp line at the top: the second run reports where its
# prompt diverged from the cached one (at the timestamp), and reuses almost nothing.
# Usage: scripts/bench-prefix-cache.sh [MODEL] [MANUAL]
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
model="${1:-$shared/models/stories260K.gguf}"
manual="${2:-$shared/reference/stories.txt}"
bench_require "$model" "$manual"
bench_workdir
cache="$work/prompt-cache"
n_tok=$(count_tokens "$model" "$manual")
ctx=$(( (n_tok + 128 + 255) / 256 * 256 ))

ask() {  # ask LABEL PREFIX QUESTION: one run; prints its prompt-cache lines, returns TTFT ms in $ttft
  { printf '%s' "$2"; cat "$manual"; printf '\nQuestion: %s\nAnswer:' "$3"; } >"$work/prompt.txt"
  "$vkllm" run -m "$model" --ctx "$ctx" --temp 0 -n 8 -f "$work/prompt.txt" --prompt-cache "$cache" </dev/null >/dev/null 2>"$work/err"
  grep -E 'prompt cache|· cached' "$work/err" | sed "s/^/  $1: /"
  ttft=$(sed -n 's/.*· TTFT \([0-9.]*\) \(m\?s\)$/\1 \2/p' "$work/err" | awk '{ print ($2 == "s") ? $1 * 1000 : $1 }')
}

echo "manual: $manual ($n_tok tokens), model: $(basename "$model"), ctx $ctx"
echo "1. manual first, question last"
ask A "" "Who was Lily?";        t_a=$ttft
ask B "" "What did the dog do?"; t_b=$ttft
awk -v a="$t_a" -v b="$t_b" 'BEGIN { printf "  TTFT %.0f ms -> %.0f ms: %.1fx lower\n", a, b, (b > 0 ? a / b : 0) }'
echo "2. a timestamp line first (the mistake)"
ask A "Date: 2026-11-30 07:02:13
" "Who was Lily?";        t_a=$ttft
ask B "Date: 2026-11-30 07:04:51
" "What did the dog do?"; t_b=$ttft
awk -v a="$t_a" -v b="$t_b" 'BEGIN { printf "  TTFT %.0f ms -> %.0f ms: %.1fx\n", a, b, (b > 0 ? a / b : 0) }'
