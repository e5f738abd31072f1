#!/usr/bin/env bash
# vkllm against upstream llama.cpp's Vulkan backend (../shared/anchor) on the same device, in one
# run: prefill (pp) and decode (tg) tok/s of both on each model, and vkllm's ratio.
#
# usage: scripts/bench-anchor.sh [MODEL…]
#   Without models: the 1b benchmark models (make_model --preset 1b, q4_0 q4_k q8_0 q6_k), made in
#   $VKLLM_BENCH_MODELS (default models/) when missing. PP (64) and TG (16) set the test sizes,
#   REPS (1) the repetitions (median), ANCHOR_GPU (vulkan) the anchor's backend.
set -euo pipefail
. "$(dirname "$0")/bench-lib.sh"
pp=${PP:-64}
tg=${TG:-16}
reps=${REPS:-1}
gpu=${ANCHOR_GPU:-vulkan}
models=("$@")
if ((${#models[@]} == 0)); then
  for t in q4_0 q4_k q8_0 q6_k; do
    m=$(bench_1b_model "$t")
    models+=("$m")
  done
fi
bench_require "${models[@]}"
anchor=$(bash "$shared/anchor/setup.sh" 2>/dev/null | tail -1)
[ -f "$anchor/bench.mjs" ] || { echo "$bench: the anchor did not install (bash $shared/anchor/setup.sh)" >&2; exit 1; }

# json_num PATH: the number at a dotted PATH of the JSON object on stdin ("nan" when absent).
json_num() { node -e 'const j=JSON.parse(require("fs").readFileSync(0,"utf8")); const v=process.argv[1].split(".").reduce((o,k)=>o==null?o:o[k], j); console.log(v==null?"nan":v)' "$1"; }

device=$("$vkllm" devices 2>/dev/null | sed -n 's/^device 0: //p' | head -1)
echo "$(date -u +%Y-%m-%d) · ${device:-device 0} · pp$pp, tg$tg, median of $reps · anchor: llama.cpp $gpu"
printf '| %-20s | %10s | %10s | %6s | %10s | %10s | %6s | %8s |\n' model "vkllm pp" "llama pp" ratio "vkllm tg" "llama tg" ratio "vk GB/s"
printf '|----------------------|-----------:|-----------:|-------:|-----------:|-----------:|-------:|---------:|\n'
for m in "${models[@]}"; do
  v=$("$vkllm" bench -m "$m" -p "$pp" -n "$tg" -r "$reps" --json 2>/dev/null)
  a=$(node "$anchor/bench.mjs" "$m" --gpu "$gpu" -p "$pp" -n "$tg" --reps "$reps" --warmup 1 2>/dev/null | tail -1)
  vpp=$(printf '%s' "$v" | json_num prefill.tok_s)
  vtg=$(printf '%s' "$v" | json_num decode.tok_s)
  vgb=$(printf "%s" "$v" | json_num decode.effective_gb_s)
  app=$(printf "%s" "$a" | json_num llama_perf_pp_tok_s)
  atg=$(printf "%s" "$a" | json_num llama_perf_tg_tok_s)
  awk -v n="$(basename "$m" .gguf)" -v a="$vpp" -v b="$app" -v c="$vtg" -v d="$atg" -v g="$vgb" \
    'BEGIN { printf "| %-20s | %10.2f | %10.2f | %5.2fx | %10.2f | %10.2f | %5.2fx | %8.2f |\n", n, a, b, a / b, c, d, c / d, g }'
done
