#!/usr/bin/env bash
# Speculative decoding (docs/speculative.md) against upstream llama.cpp's (../shared/anchor) on the
# same device, in one run: greedy generation of N tokens from each prompt, plain and with
# n-gram drafts, in vkllm (`--spec-type ngram-simple`) and in llama.cpp (node-llama-cpp's
# prompt-lookup drafts verified by llama.cpp's batched decode). Prints decode tok/s of each, the
# speed-up speculation gives each, vkllm's ratio to llama.cpp with speculation, the drafts taken,
# and whether each engine's tokens are its plain ones. vkllm's figures are the better of two runs
# each (after a warm-up run); llama.cpp's one run each (0.1–1 tok/s on lavapipe).
#
# usage: scripts/bench-spec.sh [MODEL]
#   MODEL: default the 1b q4_0 benchmark model (made in models/ when missing). N (64) tokens,
#   SPEC ("--spec-type ngram-simple") vkllm's flags, ANCHOR_GPU (vulkan) the anchor's backend,
#   ANCHOR=0 skips llama.cpp. Prompts: "free" (a story opening: drafts are rarely right, what
#   trying them costs) and "loop" (text the model repeats: what taking them gains).
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
n=${N:-64}
spec=${SPEC:---spec-type ngram-simple}
gpu=${ANCHOR_GPU:-vulkan}
model=${1:-$(bench_1b_model q4_0)}
bench_require "$model"
bench_workdir
anchor=""
if [ "${ANCHOR:-1}" != 0 ]; then
  anchor=$(bash "$shared/anchor/setup.sh" 2>/dev/null | tail -1)
  [ -f "$anchor/bench.mjs" ] || { echo "$bench: the anchor did not install (bash $shared/anchor/setup.sh)" >&2; exit 1; }
fi
printf 'Once upon a time there was a little' >"$work/free.txt"
printf ' minimum minimum minimum minimum' >"$work/loop.txt"

# field NAME: the number, or the array of numbers, NAME holds in the one-line JSON object on stdin
# ("nan" when absent; no node needed where the anchor is not run).
field() { local v; v=$(sed -n "s/.*\"$1\": *\(\[[^]]*\]\|[^,}]*\).*/\1/p"); echo "${v:-nan}"; }

device=$("$vkllm" devices 2>/dev/null | sed -n 's/^device 0: //p' | head -1)
echo "$(date -u +%Y-%m-%d) · ${device:-device 0} · $(basename "$model") · $n tokens greedy · vkllm $spec · llama.cpp ${anchor:+$gpu, prompt lookup}"
printf '| %-6s | %9s | %9s | %7s | %11s | %9s | %9s | %7s | %11s | %8s |\n' prompt "vk plain" "vk spec" speedup "vk drafts" \
  "lc plain" "lc spec" speedup "lc drafts" "vk/lc"
printf '|--------|----------:|----------:|--------:|------------:|----------:|----------:|--------:|------------:|---------:|\n'
# best RUN…: the run (one --json line) with the higher decode_tok_s of two.
best() {
  local a b
  a=$("$@" 2>/dev/null)
  b=$("$@" 2>/dev/null)
  if awk -v x="$(printf '%s' "$a" | field decode_tok_s)" -v y="$(printf '%s' "$b" | field decode_tok_s)" 'BEGIN { exit !(x >= y) }'; then
    printf '%s' "$a"
  else
    printf '%s' "$b"
  fi
}
"$vkllm" run -m "$model" -p warm -n 2 -q >/dev/null 2>&1 || true  # the weights in the page cache, the kernels made
for p in free loop; do
  plain=$(best "$vkllm" run -m "$model" -f "$work/$p.txt" --temp 0 --ignore-eos -n "$n" --json -q)
  fast=$(best "$vkllm" run -m "$model" -f "$work/$p.txt" --temp 0 --ignore-eos -n "$n" --json -q $spec)
  vp=$(printf '%s' "$plain" | field decode_tok_s)
  vs=$(printf '%s' "$fast" | field decode_tok_s)
  vd="$(printf '%s' "$fast" | field draft_accepted)/$(printf '%s' "$fast" | field draft_tokens)"
  same=$([ "$(printf '%s' "$plain" | field tokens)" = "$(printf '%s' "$fast" | field tokens)" ] && echo "" || echo " (vkllm tokens differ!)")
  ap=nan as=nan ad=-
  if [ -n "$anchor" ]; then
    out=$(node "$root/scripts/anchor-spec.mjs" "$anchor" "$model" "$work/$p.txt" "$n" --gpu "$gpu" 2>/dev/null)
    a_plain=$(printf '%s\n' "$out" | grep '"mode":"plain"')
    a_fast=$(printf '%s\n' "$out" | grep '"mode":"lookup"')
    ap=$(printf '%s' "$a_plain" | field tg_tok_s)
    as=$(printf '%s' "$a_fast" | field tg_tok_s)
    ad="$(printf '%s' "$a_fast" | field validated)/$(( $(printf '%s' "$a_fast" | field validated) + $(printf '%s' "$a_fast" | field refuted) ))"
    [ "$(printf '%s' "$a_plain" | field tokens)" = "$(printf '%s' "$a_fast" | field tokens)" ] || same="$same (llama.cpp tokens differ!)"
  fi
  awk -v p="$p" -v a="$vp" -v b="$vs" -v d="$vd" -v c="$ap" -v e="$as" -v f="$ad" -v s="$same" \
    'BEGIN { printf "| %-6s | %9.2f | %9.2f | %6.2fx | %11s | %9.2f | %9.2f | %6.2fx | %11s | %7.2fx |%s\n", p, a, b, b / a, d, c, e, e / c, f, b / e, s }'
done
echo "drafts: taken/drafted (llama.cpp: validated/validated+refuted)"
