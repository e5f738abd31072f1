#!/usr/bin/env bash
# TTFT versus history: drives a TURNS-turn conversation through piped `vkllm chat` (with /stats
# after each message) and prints, per turn, the context size, the tokens reused from the cache,
# the tokens prefilled and the time to first token. With incremental prefill TTFT stays flat
# while the context grows; the last column is what re-running the whole context would cost at
# turn 1's prefill speed.
#
# usage: scripts/bench-chat-ttft.sh [MODEL] [TURNS] [TOKENS_PER_REPLY]
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
model=${1:-${VKLLM_MODEL:-$shared/models/stories260K.gguf}}
turns=${2:-20}
n=${3:-32}
bench_require "$model"

messages=("Hello" "Tell me more" "What happened next?" "Who else was there?" "Why?" "And then?")
input=""
for ((i = 0; i < turns; i++)); do
  input+="${messages[i % ${#messages[@]}]}"$'\n/stats\n'
done

printf '%s' "$input" | "$vkllm" chat -m "$model" --temp 0 -n "$n" --ctx 4096 -q |
  awk -v model="$(basename "$model")" -v n="$n" '
    /^last turn/ { gsub(",", ""); prompt = $3; cached = $6; prefilled = $8 }
    /^speed/ {
      ttft = $3; unit = $4; ms = (unit == "s") ? ttft * 1000 : ttft
      rate = $7
      turn++
      if (turn == 1) { first_rate = rate; print "model " model ", " n " tokens per reply, greedy"; \
        printf "| %4s | %8s | %7s | %9s | %8s | %22s |\n", "turn", "context", "cached", "prefilled", "TTFT ms", "full re-prefill est. ms"; \
        printf "|-----:|---------:|--------:|----------:|---------:|-----------------------:|\n" }
      est = first_rate > 0 ? prompt / first_rate * 1000 : 0
      printf "| %4d | %8d | %7d | %9d | %8.0f | %22.0f |\n", turn, prompt, cached, prefilled, ms, est
    }'
