#!/usr/bin/env bash
# The two attention kernels on this device, in one run: a chat turn's prefill (PROMPT new tokens
# over FILL cached ones) and decode at that depth, with attention.comp (shared-memory tiles, for
# GPUs) and attention_simd.comp (for CPU drivers; head dim ≤ 64), and their ratios.
#
# usage: scripts/bench-attention.sh [MODEL] [FILL] [PROMPT] [GEN]
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
model=${1:-${VKLLM_MODEL:-$shared/models/stories260K.gguf}}
fill=${2:-1600}
prompt=${3:-56}
gen=${4:-16}
bench_require "$model"

declare -A pp tg
for k in tiled simd; do
  out=$("$vkllm" bench -m "$model" -p "$prompt" -n "$gen" --ctx-fill "$fill" -r 3 --attention "$k" --json 2>/dev/null)
  pp[$k]=$(printf '%s' "$out" | sed -n '/"prefill"/,/}/s/.*"tok_s": \([0-9.e+-]*\).*/\1/p' | head -1)
  tg[$k]=$(printf '%s' "$out" | sed -n '/"decode"/,/}/s/.*"tok_s": \([0-9.e+-]*\).*/\1/p' | head -1)
done
echo "model $(basename "$model"), $fill tokens cached, median of 3"
printf '| %-16s | %12s | %12s | %7s |\n' "test" "tiled tok/s" "simd tok/s" "ratio"
printf '|------------------|-------------:|-------------:|--------:|\n'
awk -v a="${pp[tiled]}" -v b="${pp[simd]}" -v t="pp$prompt @ d$fill" 'BEGIN { printf "| %-16s | %12.1f | %12.1f | %6.1fx |\n", t, a, b, b / a }'
awk -v a="${tg[tiled]}" -v b="${tg[simd]}" -v t="tg$gen @ d$fill" 'BEGIN { printf "| %-16s | %12.1f | %12.1f | %6.1fx |\n", t, a, b, b / a }'
