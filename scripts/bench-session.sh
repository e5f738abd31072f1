#!/usr/bin/env bash
# Session restore vs re-prefill: prefill ~2,000 tokens (stories.txt on stories260K) and save the
# session, then restore it in a fresh process. Reports the restore time (reading, validating and
# uploading the KV rows), the prefill time it replaces, and their ratio (target ≥ 20×).
# Usage: scripts/bench-session.sh [MODEL] [TEXT]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
shared="${VKLLM_SHARED_DIR:-$root/../shared}"
vkllm="${VKLLM_BIN:-$root/build/vkllm}"
model="${1:-$shared/models/stories260K.gguf}"
text="${2:-$shared/reference/stories.txt}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ses="$work/bench.vkv"
n_tok=$("$vkllm" tokenize -m "$model" -f "$text" --count 2>/dev/null | tail -1 | tr -dc 0-9)
ctx=$(( (n_tok + 64 + 255) / 256 * 256 ))

# 1. Prefill from scratch (and one token) and save.
"$vkllm" run -m "$model" --ctx "$ctx" --temp 0 -f "$text" -n 1 --json --session "$ses" </dev/null >"$work/a.json" 2>"$work/a.err"
prefill_ms=$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["ttft_ms"])' "$work/a.json")
# 2. Restore it in a new process (three times; best of three).
best=""
for i in 1 2 3; do
  "$vkllm" run -m "$model" --ctx "$ctx" --temp 0 -p '' -n 1 --session "$ses" </dev/null >/dev/null 2>"$work/b.err"
  ms=$(sed -n 's/.*tokens restored in \([0-9.]*\) \(m\?s\).*/\1 \2/p' "$work/b.err" | awk '{ print ($2 == "s") ? $1 * 1000 : $1 }')
  if [ -z "$best" ] || awk "BEGIN{exit !($ms < $best)}"; then best=$ms; fi
done
size=$(stat -c %s "$ses")
echo "session: $n_tok prompt tokens, file $size bytes"
echo "prefill (from scratch): ${prefill_ms} ms"
echo "restore (read + validate + upload): ${best} ms"
awk -v p="$prefill_ms" -v r="$best" 'BEGIN { printf "ratio: %.1fx faster to restore\n", (r > 0 ? p / r : 0) }'
