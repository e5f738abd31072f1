#!/usr/bin/env bash
# Session restore vs re-prefill: prefill ~2,000 tokens (stories.txt on stories260K) and save the
# session, then restore it in a fresh process. Reports the restore time (reading, validating and
# uploading the KV rows), the prefill time it replaces, and their ratio (target ≥ 20×); then the
# saves: the first (the file written whole) against the next call's (8 more tokens, appended).
# Usage: scripts/bench-session.sh [MODEL] [TEXT]
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
model="${1:-$shared/models/stories260K.gguf}"
text="${2:-$shared/reference/stories.txt}"
bench_require "$model" "$text"
bench_workdir
ses="$work/bench.vkv"
n_tok=$(count_tokens "$model" "$text")
ctx=$(( (n_tok + 64 + 255) / 256 * 256 ))

# 1. Prefill from scratch (and one token) and save.
"$vkllm" run -m "$model" --ctx "$ctx" --temp 0 -f "$text" -n 1 --json --session "$ses" </dev/null >"$work/a.json" 2>"$work/a.err"
prefill_ms=$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["ttft_ms"])' "$work/a.json")
# 2. Restore it in a new process (three times; best of three).
#    The session is copied first so every try restores the same 2,341 tokens. TTFT also counts
#    recomputing the last token's logits (one decode step over the whole context).
best=""
best_ttft=""
for i in 1 2 3; do
  cp "$ses" "$work/try.vkv"
  "$vkllm" run -m "$model" --ctx "$ctx" --temp 0 -p '' -n 1 --json --session "$work/try.vkv" </dev/null >"$work/b.json" 2>"$work/b.err"
  ms=$(sed -n 's/.*tokens restored in \([0-9.]*\) ms.*/\1/p' "$work/b.err")
  ttft=$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["ttft_ms"])' "$work/b.json")
  if [ -z "$best" ] || awk "BEGIN{exit !($ms < $best)}"; then best=$ms; fi
  if [ -z "$best_ttft" ] || awk "BEGIN{exit !($ttft < $best_ttft)}"; then best_ttft=$ttft; fi
done
size=$(stat -c %s "$ses")
echo "session: $n_tok prompt tokens, file $size bytes"
echo "prefill (from scratch): ${prefill_ms} ms"
echo "restore (read + validate + upload): ${best} ms"
echo "TTFT of the continued run (restore + last token's logits + sampling): ${best_ttft} ms"
awk -v p="$prefill_ms" -v r="$best" -v t="$best_ttft" \
  'BEGIN { printf "ratio: restore %.0fx faster than prefill; first token %.1fx sooner\n", (r > 0 ? p / r : 0), (t > 0 ? p / t : 0) }'
# 3. The saves: the first call's wrote the file whole; a call that goes on for 8 tokens appends
#    their rows and the state (docs/session-format.md, "Appending").
save_ms() { sed -n 's/.*vkllm: session .*: saved .* in \([0-9.]*\) ms.*/\1/p' "$1"; }
cp "$ses" "$work/next.vkv"
"$vkllm" run -m "$model" --ctx "$ctx" --temp 0 -p '' -n 8 --session "$work/next.vkv" </dev/null >/dev/null 2>"$work/c.err"
appended=$(sed -n 's/.*(\(.*\) appended).*/\1/p' "$work/c.err")
echo "save, written whole ($n_tok tokens, $size bytes): $(save_ms "$work/a.err") ms"
echo "save of the next call (8 more tokens, ${appended:-nothing} appended): $(save_ms "$work/c.err") ms"
